"""Train with activation checkpointing and gradient accumulation, the
memory-saving recipe of the training guides, with gpuaccel's fused layers.

    python examples/train_checkpointed.py --device cpu --steps 30
    python examples/train_checkpointed.py --micro-batches 4 --segments 2

Each optimizer step runs --micro-batches forward/backward passes of
--batch-size images and steps once (the loss divided by the number of
micro-batches, so the gradient is that of one big batch); the model's
forward is cut into --segments checkpointed segments, whose activations are
recomputed in the backward instead of kept.  The fused layers' backward
runs again on the recomputed activations like any torch layer's.
"""

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint_sequential

import gpuaccel as ga
from gpuaccel import dataset
from gpuaccel._cli import check_device

from train import make_model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when usable, else cpu)")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps (default: 100)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per micro-batch (default: 32)")
    parser.add_argument("--micro-batches", type=int, default=4,
                        help="micro-batches accumulated per optimizer step (default: 4)")
    parser.add_argument("--segments", type=int, default=3, help="checkpointed segments of the model (default: 3)")
    parser.add_argument("--samples", type=int, default=20000,
                        help="training images to generate (default: 20000; held-out: a fifth, at least 1000)")
    parser.add_argument("--data", default=dataset.default_folder(),
                        help="where generated sets are kept (default: %(default)s)")
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "micro_batches", "segments"):
        if getattr(args, name) < 1:
            parser.error("--%s must be at least 1, got %d" % (name.replace("_", "-"), getattr(args, name)))
    device = check_device(torch, args.device or ("cuda" if ga.cuda_available() and torch.cuda.is_available()
                                                 else "cpu"))
    if device is None:
        return 2
    files = dataset.ensure(args.data, args.samples, max(1000, args.samples // 5))
    mean, std = dataset.mean_std()
    model = make_model().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = ga.PinnedLoader([files["train_x"], files["train_y"]], args.batch_size, shuffle=True, drop_last=True,
                             device=str(device), transform=ga.ImageNormalize(mean, std, dtype="float32"))
    log = ga.LossLogger(every=10, on_log=lambda step, v: print("step %4d  loss %.4f" % (step, v["loss"])))
    step, micro = 0, 0
    while step < args.steps:
        for images, labels in loader:
            out = checkpoint_sequential(model, args.segments, images, use_reentrant=False)
            loss = F.cross_entropy(out, labels) / args.micro_batches
            loss.backward()
            micro += 1
            if micro % args.micro_batches:
                continue  # accumulate
            opt.step()
            opt.zero_grad(set_to_none=True)
            log.log(loss=loss.detach() * args.micro_batches)
            step += 1
            if step == args.steps:
                break
    log.close()
    print("final loss %.4f after %d steps of %d images" % (log.latest()["loss"], step,
                                                          args.batch_size * args.micro_batches))
    return 0


if __name__ == "__main__":
    sys.exit(main())
