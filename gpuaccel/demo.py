"""python -m gpuaccel demo: trains one small CNN twice on a procedural image
set, side by side:

- gpuaccel: FusedConv2d + FusedLinear (conv/matmul + bias + ReLU fused,
  forward and backward), fed by PinnedLoader (native threads, pinned ring,
  normalize fused into the copy), logged by LossLogger (no .item());
- torch, as the popular guides teach: nn.Conv2d/nn.Linear + ReLU, a
  DataLoader with workers and pin_memory, .to(non_blocking=True), the
  normalization on the device, loss.item() every step for the progress bar.

Both use bfloat16 autocast on a GPU (float32 on the CPU), AdamW, the same
initial weights and the same number of steps.  Printed side by side:
images/s, host syncs per step (counted by torch's sync debug mode on a GPU),
and the held-out accuracy.
"""

import argparse
import json
import os
import sys
import time
import warnings

import numpy as np

import gpuaccel as ga
from gpuaccel import dataset
from gpuaccel._cli import check_device

try:
    from tqdm.auto import tqdm
except ImportError:  # progress bars are optional
    tqdm = None


def _models(torch, gt, seed):
    """The two models, with identical initial weights."""
    def layers(conv, linear):
        return [conv(3, 32, 3, padding=1), torch.nn.MaxPool2d(2), conv(32, 64, 3, padding=1), torch.nn.MaxPool2d(2),
                conv(64, 96, 3, padding=1), torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(),
                linear(96 * 4, 128), linear(128, 10, final=True)]

    def fused_conv(i, o, k, padding):
        return gt.FusedConv2d(i, o, k, padding=padding, activation="relu")

    def fused_linear(i, o, final=False):
        return gt.FusedLinear(i, o, activation=None if final else "relu")

    def plain_conv(i, o, k, padding):
        return torch.nn.Sequential(torch.nn.Conv2d(i, o, k, padding=padding), torch.nn.ReLU())

    def plain_linear(i, o, final=False):
        return torch.nn.Linear(i, o) if final else torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU())

    torch.manual_seed(seed)
    fused = torch.nn.Sequential(*layers(fused_conv, fused_linear))
    torch.manual_seed(seed)
    plain = torch.nn.Sequential(*layers(plain_conv, plain_linear))
    return fused, plain


def _sync_counter(torch, device):
    """Counts the host syncs torch reports (its sync debug mode) while
    active; None on the CPU, where there is nothing to sync with."""
    if device.type != "cuda":
        return None

    class Counter:
        count = 0

        def __enter__(self):
            self._warn = warnings.catch_warnings(record=True)
            self.records = self._warn.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            return self

        def __exit__(self, *exc):
            torch.cuda.set_sync_debug_mode("default")
            self.count = sum(1 for w in self.records if "synchroniz" in str(w.message).lower())
            self._warn.__exit__(*exc)

    return Counter()


class _Timer:
    """Images/s over the steps after the warm-up ones."""

    def __init__(self, torch, device, warmup):
        self.torch, self.device, self.warmup = torch, device, warmup
        self.images, self.start, self.steps = 0, None, 0

    def step(self, batch):
        self.steps += 1
        if self.steps == self.warmup:
            self._sync()
            self.start = time.perf_counter()
        elif self.steps > self.warmup:
            self.images += batch

    def _sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def rate(self):
        self._sync()
        if self.start is None or not self.images:
            return float("nan")
        return self.images / (time.perf_counter() - self.start)


def train_gpuaccel(torch, model, files, args, device, bar_position=0):
    model = model.to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    mean, std = dataset.mean_std()
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    layout = "NHWC" if device.type == "cuda" else "NCHW"  # channels_last batches for the channels_last model
    loader = ga.PinnedLoader([files["train_x"], files["train_y"]], args.batch_size, shuffle=True, seed=args.seed,
                             drop_last=True, device=str(device),
                             transform=ga.ImageNormalize(mean, std, dtype=dtype, layout=layout))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    steps = min(args.steps, args.epochs * len(loader))
    bar = tqdm(total=steps, desc="gpuaccel", position=bar_position, leave=True) if tqdm and not args.quiet else None
    log = ga.LossLogger(every=20, progress=bar)
    timer, step = _Timer(torch, device, args.warmup), 0
    counter = _sync_counter(torch, device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    with (counter or _Null()):
        while step < steps:
            for images, labels in loader:
                if step >= steps:
                    break
                with autocast:
                    loss = torch.nn.functional.cross_entropy(model(images), labels)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                log.log(loss=loss.detach())
                timer.step(images.shape[0])
                if bar is not None:
                    bar.update(1)
                step += 1
    rate = timer.rate()
    log.close()
    if bar is not None:
        bar.close()
    syncs = None if counter is None else counter.count / max(step, 1)
    return {"images_per_s": rate, "syncs_per_step": syncs, "steps": step, "final_loss": log.latest().get("loss")}


def train_torch(torch, model, files, args, device, bar_position=1):
    model = model.to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    mean, std = dataset.mean_std()
    mean_t = torch.tensor(mean, device=device).view(1, 3, 1, 1) * 255
    std_t = torch.tensor(std, device=device).view(1, 3, 1, 1) * 255

    class Images(torch.utils.data.Dataset):
        def __init__(self):
            self.x = np.load(files["train_x"], mmap_mode="r")
            self.y = np.load(files["train_y"], mmap_mode="r")

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return torch.from_numpy(np.array(self.x[i])), int(self.y[i])

    workers = min(4, len(os.sched_getaffinity(0)))
    loader = torch.utils.data.DataLoader(Images(), batch_size=args.batch_size, shuffle=True, drop_last=True,
                                         num_workers=workers, pin_memory=device.type == "cuda",
                                         persistent_workers=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    steps = min(args.steps, args.epochs * len(loader))
    bar = tqdm(total=steps, desc="torch   ", position=bar_position, leave=True) if tqdm and not args.quiet else None
    timer, step, last = _Timer(torch, device, args.warmup), 0, None
    counter = _sync_counter(torch, device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    with (counter or _Null()):
        while step < steps:
            for images, labels in loader:
                if step >= steps:
                    break
                images = images.to(device, non_blocking=True).permute(0, 3, 1, 2).float()
                images = ((images - mean_t) / std_t).contiguous(
                    memory_format=torch.channels_last if device.type == "cuda" else torch.contiguous_format)
                labels = labels.to(device, non_blocking=True)
                with autocast:
                    loss = torch.nn.functional.cross_entropy(model(images), labels)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                last = loss.item()  # what the guides do: one host sync per step
                if bar is not None:
                    bar.set_postfix(loss="%.4g" % last, refresh=False)
                    bar.update(1)
                timer.step(images.shape[0])
                step += 1
    rate = timer.rate()
    if bar is not None:
        bar.close()
    syncs = None if counter is None else counter.count / max(step, 1)
    return {"images_per_s": rate, "syncs_per_step": syncs, "steps": step, "final_loss": last}


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def evaluate(torch, model, files, device, batch_size):
    """Accuracy on the held-out split (the same path for both models)."""
    mean, std = dataset.mean_std()
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    layout = "NHWC" if device.type == "cuda" else "NCHW"  # channels_last, as the model on the GPU
    loader = ga.PinnedLoader([files["test_x"], files["test_y"]], batch_size, device=str(device),
                             transform=ga.ImageNormalize(mean, std, dtype=dtype, layout=layout))
    correct = total = 0
    model.eval()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    with torch.no_grad(), autocast:
        for images, labels in loader:
            correct += (model(images.float() if device.type == "cpu" else images).argmax(1) == labels).sum()
            total += labels.shape[0]
    model.train()
    return float(correct) / total


def _table(results, device):
    names = list(results)
    rows = [("images/s", ["%.0f" % results[n]["images_per_s"] for n in names]),
            ("host syncs per step", ["n/a (CPU)" if results[n]["syncs_per_step"] is None
                                     else "%.2f" % results[n]["syncs_per_step"] for n in names]),
            ("held-out accuracy", ["%.1f%%" % (100 * results[n]["accuracy"]) for n in names]),
            ("steps", ["%d" % results[n]["steps"] for n in names])]
    if len(names) == 2:
        ratio = results["gpuaccel"]["images_per_s"] / results["torch"]["images_per_s"]
        rows[0][1].append("%.2fx" % ratio)
    width = max(len(r[0]) for r in rows)
    header = "  ".join("%-12s" % n for n in names) + ("  gpuaccel/torch" if len(names) == 2 else "")
    lines = ["", "Side by side on %s (chance is 10%%):" % device, "  %-*s  %s" % (width, "", header)]
    for label, cells in rows:
        lines.append("  %-*s  %s" % (width, label, "  ".join("%-12s" % c for c in cells)))
    return "\n".join(lines)


# The CPU run's defaults: about two minutes in all on a 2-core machine
# (benchmarks/RESULTS.md has the measured time); the same training set as
# examples/train.py's default, so the two share one cached copy.
CPU_STEPS = 300
CPU_SAMPLES = 20000
GPU_SAMPLES = 50000

DESCRIPTION = """Train one small CNN twice on a procedural 10-class image set, side by side: the gpuaccel way
(FusedConv2d/FusedLinear, PinnedLoader, LossLogger) and the way the popular guides teach (nn.Conv2d + ReLU,
DataLoader with workers and pin_memory, loss.item() every step), with the same initial weights and steps.
Prints images/s, host syncs per step and held-out accuracy for both."""


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m gpuaccel demo", description=DESCRIPTION)
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when usable, else cpu)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="passes over the data (default: 3 on a GPU, 1 on the CPU)")
    parser.add_argument("--steps", type=int, default=None,
                        help="cap on training steps (default: none on a GPU, %d on the CPU)" % CPU_STEPS)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="images per step (default: 256 on a GPU, 64 on the CPU)")
    parser.add_argument("--samples", type=int, default=None,
                        help="training images to generate (default: %d on a GPU, %d on the CPU; held-out: a fifth, "
                             "at least 1000)" % (GPU_SAMPLES, CPU_SAMPLES))
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (default: 3e-3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the initial weights (default: 0)")
    parser.add_argument("--only", choices=["gpuaccel", "torch"], help="train one side only")
    parser.add_argument("--data", default=None,
                        help="where generated sets are kept "
                             "(default: $GPUACCEL_CACHE_DIR/data or ~/.cache/gpuaccel/data)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    args.quiet = args.quiet or args.json  # JSON alone on stdout, no bars on stderr
    try:
        import torch

        import gpuaccel.torch as gt
    except ImportError:
        print("the demo needs torch: pip install torch", file=sys.stderr)
        return 2
    for name in ("epochs", "steps", "batch_size", "samples"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error("--%s must be at least 1, got %d" % (name.replace("_", "-"), getattr(args, name)))
    device = check_device(torch, args.device or ("cuda" if ga.cuda_available() and torch.cuda.is_available()
                                                 else "cpu"))
    if device is None:
        return 2
    on_gpu = device.type == "cuda"
    args.epochs = args.epochs or (3 if on_gpu else 1)
    args.batch_size = args.batch_size or (256 if on_gpu else 64)
    args.steps = args.steps or (10 ** 9 if on_gpu else CPU_STEPS)
    args.samples = args.samples or (GPU_SAMPLES if on_gpu else CPU_SAMPLES)
    args.warmup = min(10, max(1, args.steps // 10))
    folder = args.data or dataset.default_folder()
    if not args.quiet and not args.json:
        print("gpuaccel demo on %s: generating (once) %d training and %d held-out images in %s"
              % (device, args.samples, args.samples // 5, folder))
    files = dataset.ensure(folder, args.samples, max(1000, args.samples // 5), seed=args.seed)
    fused, plain = _models(torch, gt, args.seed)
    results = {}
    runs = [("gpuaccel", train_gpuaccel, fused), ("torch", train_torch, plain)]
    for position, (name, train, model) in enumerate(runs):
        if args.only and args.only != name:
            continue
        results[name] = train(torch, model, files, args, device, position)
        results[name]["accuracy"] = evaluate(torch, model.to(device), files, device, 512)
    if args.json:
        print(json.dumps({"device": str(device), "results": results}, indent=2))
    else:
        print(_table(results, device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
