"""A complete, short training script that uses the four parts of gpuaccel.

    FusedConv2d / FusedLinear   conv/matmul + bias + ReLU fused, forward and backward
    PinnedLoader                native threads -> pinned ring -> async copy -> normalize on arrival
    LossLogger                  per-step loss logging with no .item() (no host sync)
    DLPack                      the loader's batches are torch tensors that share gpuaccel's memory

    python examples/train.py                 # GPU when there is one, else CPU
    python examples/train.py --device cpu --steps 50

The data is gpuaccel's procedural 10-class image set (generated once into
--data; no download).
"""

import argparse
import sys

import torch
import torch.nn.functional as F

import gpuaccel as ga
import gpuaccel.torch as gt
from gpuaccel import dataset
from gpuaccel._cli import check_device


def make_model():
    return torch.nn.Sequential(
        gt.FusedConv2d(3, 32, 3, padding=1, activation="relu"), torch.nn.MaxPool2d(2),
        gt.FusedConv2d(32, 64, 3, padding=1, activation="relu"), torch.nn.MaxPool2d(2),
        gt.FusedConv2d(64, 96, 3, padding=1, activation="relu"), torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(),
        gt.FusedLinear(96 * 4, 128, activation="relu"),
        gt.FusedLinear(128, 10),
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="The four parts: FusedConv2d/FusedLinear, PinnedLoader, LossLogger, "
                                            "DLPack (the loader's batches are torch tensors).")
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when usable, else cpu)")
    parser.add_argument("--steps", type=int, default=600, help="training steps (default: 600)")
    parser.add_argument("--batch-size", type=int, default=128, help="images per step (default: 128)")
    parser.add_argument("--samples", type=int, default=20000,
                        help="training images to generate (default: 20000; held-out: a fifth, at least 1000)")
    parser.add_argument("--data", default=dataset.default_folder(),
                        help="where generated sets are kept (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the initial weights and the shuffling: runs with the same seed on the same "
                             "machine train the same (default: 0)")
    args = parser.parse_args(argv)
    device = check_device(torch, args.device or ("cuda" if ga.cuda_available() and torch.cuda.is_available()
                                                 else "cpu"))
    if device is None:
        return 2
    on_gpu = device.type == "cuda"
    files = dataset.ensure(args.data, args.samples, max(1000, args.samples // 5))
    mean, std = dataset.mean_std()
    dtype = "bfloat16" if on_gpu else "float32"
    layout = "NHWC" if on_gpu else "NCHW"  # NHWC: channels_last batches for the channels_last model

    torch.manual_seed(args.seed)
    model = make_model().to(device)
    if on_gpu:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = ga.PinnedLoader([files["train_x"], files["train_y"]], args.batch_size, shuffle=True, seed=args.seed,
                             drop_last=True, device=str(device),
                             transform=ga.ImageNormalize(mean, std, dtype=dtype, layout=layout))
    log = ga.LossLogger(every=50, on_log=lambda step, v: print("step %5d  loss %.4f" % (step, v["loss"])))

    step = 0
    while step < args.steps:  # each pass over the loader is a new, reshuffled epoch
        for images, labels in loader:  # torch tensors on `device`, already normalized
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
                loss = F.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            log.log(loss=loss.detach())  # queued on the GPU: the loop never waits
            step += 1
            if step == args.steps:
                break
    log.close()  # flushes the last window

    # held-out accuracy, reading the test split through the same loader
    test = ga.PinnedLoader([files["test_x"], files["test_y"]], 500, device=str(device),
                           transform=ga.ImageNormalize(mean, std, dtype=dtype, layout=layout))
    model.eval()
    correct = total = 0
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
        for images, labels in test:
            correct += int((model(images).argmax(1) == labels).sum())
            total += labels.shape[0]
    accuracy = correct / total
    print("held-out accuracy: %.1f%% (chance: 10%%)" % (100 * accuracy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
