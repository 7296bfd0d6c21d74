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
import functools
import json
import os
import statistics
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
    active, over all the times it is entered; None on the CPU, where there
    is nothing to sync with."""
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
            self.count += sum(1 for w in self.records if "synchroniz" in str(w.message).lower())
            self._warn.__exit__(*exc)

    return Counter()


def _gpuaccel_steps(torch, model, files, args, device, bar, results):
    """The gpuaccel side, one step per iteration (the step's batch size is
    yielded); fills `results` when its steps are done."""
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
    if bar is not None:
        bar.total = steps
    log = ga.LossLogger(every=20, progress=bar)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    step = 0
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
            if bar is not None:
                bar.update(1)
            step += 1
            yield images.shape[0]
    loader.close()
    log.close()
    results.update(steps=step, final_loss=log.latest().get("loss"))


def _torch_steps(torch, model, files, args, device, bar, results):
    """The torch side as the popular guides write it, one step per
    iteration, like _gpuaccel_steps."""
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
    if bar is not None:
        bar.total = steps
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    step, last = 0, None
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
            step += 1
            yield images.shape[0]
    results.update(steps=step, final_loss=last)


class _Side:
    """One side of the comparison, run block by block: its step generator,
    its host-sync counter, and the images and seconds of each timed block."""

    def __init__(self, name, train, counter, bar):
        """train(bar, results): a step generator that fills `results` at its end."""
        self.name, self.counter, self.bar = name, counter, bar
        self.blocks, self.results, self.done = [], {}, False
        self.steps = train(bar, self.results)

    def run(self, count):
        """Up to `count` steps, host syncs counted; the images they trained
        on (0 when the side is done)."""
        images = 0
        with self.counter:
            for _ in range(count):
                try:
                    images += next(self.steps)
                except StopIteration:
                    self.done = True
                    break
        return images


def _interleave(torch, device, sides, warmup, block):
    """Trains the sides in alternating blocks of `block` steps (the order
    swapped each round), timing each block between device synchronizations:
    a change of the machine's load between blocks falls on both sides, where
    one side's run after the other's would compare two different machines.
    The first `warmup` steps of each side are not timed."""

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for side in sides:
        side.run(warmup)
    turn = 0
    while not all(side.done for side in sides):
        for side in (sides if turn % 2 == 0 else sides[::-1]):
            if side.done:
                continue
            sync()
            start = time.perf_counter()
            images = side.run(block)
            sync()
            if images:
                side.blocks.append((images, time.perf_counter() - start))
        turn += 1


def _block_ratios(first, second):
    """gpuaccel/torch of each pair of blocks run back to back."""
    return [(a / s) / (b / t) for (a, s), (b, t) in zip(first.blocks, second.blocks) if s > 0 and t > 0 and b]


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


def _table(results, device, ratio=None, load=None):
    names = list(results)
    rows = [("images/s", ["%.0f" % results[n]["images_per_s"] for n in names]),
            ("host syncs per step", ["n/a (CPU)" if results[n]["syncs_per_step"] is None
                                     else "%.2f" % results[n]["syncs_per_step"] for n in names]),
            ("held-out accuracy", ["%.1f%%" % (100 * results[n]["accuracy"]) for n in names]),
            ("steps", ["%d" % results[n]["steps"] for n in names])]
    if ratio:
        spread = " (%.2f-%.2f over %d block pairs)" % (ratio["min"], ratio["max"], ratio["pairs"]) \
            if ratio["pairs"] > 1 else ""
        rows[0][1].append("%.2fx%s" % (ratio["median"], spread))
    width = max(len(r[0]) for r in rows)
    header = "  ".join("%-12s" % n for n in names) + ("  gpuaccel/torch" if ratio else "")
    lines = ["", "Side by side on %s (chance is 10%%):" % device, "  %-*s  %s" % (width, "", header)]
    for label, cells in rows:
        lines.append("  %-*s  %s" % (width, label, "  ".join("%-12s" % c for c in cells)))
    if ratio:
        lines.append("  images/s: each side's images over its own timed blocks; gpuaccel/torch: the median of the "
                     "ratios of blocks run back to back")
    if load:
        lines.append("  " + load)
    return "\n".join(lines)


def _busy_note(load_before, load_after):
    """One line when other processes competed for the CPUs during the run
    (load average at least the number of CPUs), else None."""
    if not load_before or not load_after:
        return None
    load, cpus = max(load_before[0], load_after[0]), load_before[1]
    if load < cpus:
        return None
    return ("the machine was busy (load average %.1f on %d CPUs): both sides ran slower than on an idle machine, "
            "torch's intra-op threads most (--threads 1 avoids their waits)" % (load, cpus))


def _machine_load():
    try:
        return os.getloadavg()[0], len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


# The CPU run's defaults: about a minute in all on an idle 2-core machine
# (benchmarks/RESULTS.md has the measured time); the same training set as
# examples/train.py's default, so the two share one cached copy.
CPU_STEPS = 300
CPU_SAMPLES = 20000
GPU_SAMPLES = 50000
# Steps per timed block: the sides alternate block by block
CPU_BLOCK = 20
GPU_BLOCK = 50

DESCRIPTION = """Train one small CNN twice on a procedural 10-class image set, side by side: the gpuaccel way
(FusedConv2d/FusedLinear, PinnedLoader, LossLogger) and the way the popular guides teach (nn.Conv2d + ReLU,
DataLoader with workers and pin_memory, loss.item() every step), with the same initial weights and steps, in
alternating blocks of steps so that both see the same machine. Prints images/s, host syncs per step and held-out
accuracy for both."""


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
    parser.add_argument("--block", type=int, default=None,
                        help="steps per timed block; the two sides alternate block by block (default: %d on a GPU, "
                             "%d on the CPU)" % (GPU_BLOCK, CPU_BLOCK))
    parser.add_argument("--threads", type=int, default=None,
                        help="torch's intra-op threads, for both sides (default: torch's, one per CPU); 1 keeps a "
                             "machine that other processes load from slowing the run down many times")
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
    for name in ("epochs", "steps", "batch_size", "samples", "block", "threads"):
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
    args.block = args.block or (GPU_BLOCK if on_gpu else CPU_BLOCK)
    args.warmup = min(10, max(1, args.steps // 10))
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = args.data or dataset.default_folder()
    if not args.quiet and not args.json:
        print("gpuaccel demo on %s: generating (once) %d training and %d held-out images in %s"
              % (device, args.samples, args.samples // 5, folder))
    files = dataset.ensure(folder, args.samples, max(1000, args.samples // 5), seed=args.seed)
    fused, plain = _models(torch, gt, args.seed)
    models = {"gpuaccel": fused, "torch": plain}
    sides = []
    for position, (name, steps) in enumerate((("gpuaccel", _gpuaccel_steps), ("torch", _torch_steps))):
        if args.only and args.only != name:
            continue
        bar = tqdm(total=0, desc="%-8s" % name, position=position, leave=True) \
            if tqdm and not args.quiet else None
        train = functools.partial(steps, torch, models[name], files, args, device)
        sides.append(_Side(name, train, _sync_counter(torch, device) or _Null(), bar))
    load_before = _machine_load()
    _interleave(torch, device, sides, args.warmup, args.block)
    load_after = _machine_load()
    results = {}
    for side in sides:
        if side.bar is not None:
            side.bar.close()
        images = sum(i for i, _ in side.blocks)
        seconds = sum(t for _, t in side.blocks)
        r = dict(side.results, images_per_s=images / seconds if seconds else float("nan"),
                 syncs_per_step=None if isinstance(side.counter, _Null) else side.counter.count / max(
                     side.results["steps"], 1))
        r["accuracy"] = evaluate(torch, models[side.name].to(device), files, device, 512)
        results[side.name] = r
    ratio = None
    if len(sides) == 2:
        pairs = _block_ratios(*sides)
        if pairs:
            ratio = {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs), "pairs": len(pairs)}
    busy = _busy_note(load_before, load_after)
    if args.json:
        out = {"device": str(device), "results": results, "ratio": ratio, "torch_threads": torch.get_num_threads()}
        if load_before:
            out.update(load_average=[load_before[0], load_after[0]], cpus=load_before[1])
        print(json.dumps(out, indent=2))
    else:
        print(_table(results, device, ratio, busy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
