"""Training and inference steps of torchvision models: the original, its
gpuaccel.torch.fuse copy, torch.compile of the original and torch.compile
of the fused copy, side by side in one run.

    python benchmarks/bench_models.py                         # CPU, every model
    python benchmarks/bench_models.py --models resnet18 --batch 32 --size 112
    python benchmarks/bench_models.py --device cuda --batch 64 --size 224
    python benchmarks/bench_models.py --no-compile            # the eager pair only

A training step is forward, cross-entropy, backward and an SGD step (the
model in training mode); an inference step a forward under no_grad (the
model in eval mode: the fused copy's BatchNorms folded).  The variants run
interleaved (each variant's steps, then the next's, round after round), so
that load from other processes hits them alike; the table gives the median
time per step and each variant's speed relative to its baseline: the fused
model against the original, the compiled fused model against the compiled
original.  Goal on the CPU: both >= 0.95x.  Weights are random
(weights=None); timing does not depend on them.
"""

import argparse
import copy
import os
import statistics
import sys
import time

import torch

import gpuaccel.torch as gt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine

MODELS = ["vgg11", "resnet18", "mobilenet_v3_small", "convnext_tiny", "vit_b_16"]
GOAL = 0.95


def build(name, size):
    import torchvision.models as tvm

    torch.manual_seed(0)
    if name.startswith("vit"):
        return getattr(tvm, name)(image_size=size)
    return getattr(tvm, name)()


class Variant:
    """One model form and its optimizer; step(train) runs one step."""

    def __init__(self, label, module, params_owner, batch):
        self.label = label
        self.module = module
        self.owner = params_owner  # the nn.Module whose mode and parameters the step uses
        self.x, self.y = batch
        # plain SGD, gradients dropped after each step: four copies of VGG-11 stay in memory, not twelve
        self.opt = torch.optim.SGD(params_owner.parameters(), lr=1e-3)
        self.loss = torch.nn.CrossEntropyLoss()

    def step(self, train):
        if train:
            self.owner.train()
            self.loss(self.module(self.x), self.y).backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        else:
            self.owner.eval()
            with torch.no_grad():
                self.module(self.x)


def variants_for(name, args, device):
    model = build(name, args.size).to(device)
    fused = gt.fuse(model)
    gen = torch.Generator().manual_seed(1)
    batch = (torch.randn(args.batch, 3, args.size, args.size, generator=gen).to(device),
             torch.randint(0, 1000, (args.batch,), generator=gen).to(device))
    out = [Variant("original", model, model, batch), Variant("fuse", fused, fused, batch)]
    if args.compile:
        # compiled forms of separate copies: a compiled module's recompiles (train, eval) stay its own
        compiled_model = copy.deepcopy(model)
        compiled_fused = copy.deepcopy(fused)
        out += [Variant("compile", torch.compile(compiled_model), compiled_model, batch),
                Variant("compile(fuse)", torch.compile(compiled_fused), compiled_fused, batch)]
    return out


def measure(variants, train, args, sync):
    """{label: median seconds per step}, the variants interleaved."""
    for v in variants:  # warm up: compilation, allocator, fold caches
        for _ in range(args.warmup):
            v.step(train)
        sync()
    times = {v.label: [] for v in variants}
    for _ in range(args.rounds):
        for v in variants:
            start = time.perf_counter()
            for _ in range(args.steps):
                v.step(train)
            sync()
            times[v.label].append((time.perf_counter() - start) / args.steps)
    return {label: statistics.median(t) for label, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated torchvision model names")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=64, help="image side (ViT is built for it)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the median is reported)")
    parser.add_argument("--steps", type=int, default=2, help="steps per variant per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per variant (compilation included)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip the torch.compile variants")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_models: --device cuda needs a GPU torch can use", file=sys.stderr)
        return 2
    try:
        import torchvision  # noqa: F401
    except ImportError:
        print("bench_models: needs torchvision (pip install torchvision)", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    print(machine(), "|", time.strftime("%Y-%m-%d"))
    print("device %s, torch threads %d, batch %d, %dx%d images, median of %d interleaved rounds of %d steps"
          % (args.device, torch.get_num_threads(), args.batch, args.size, args.size, args.rounds, args.steps))
    header = ("model", "step", "original ms", "fuse ms", "compile ms", "compile(fuse) ms", "fuse speed",
              "compile(fuse) speed")
    rows = []
    for name in args.models.split(","):
        variants = variants_for(name, args, device)
        for train in (True, False):
            t = measure(variants, train, args, sync)
            speed = t["original"] / t["fuse"]
            row = [name, "train" if train else "infer", "%.1f" % (1e3 * t["original"]), "%.1f" % (1e3 * t["fuse"])]
            if args.compile:
                cspeed = t["compile"] / t["compile(fuse)"]
                row += ["%.1f" % (1e3 * t["compile"]), "%.1f" % (1e3 * t["compile(fuse)"])]
            else:
                cspeed = None
                row += ["-", "-"]
            row.append("%.2fx %s" % (speed, "ok" if speed >= GOAL else "MISS"))
            row.append("-" if cspeed is None else "%.2fx %s" % (cspeed, "ok" if cspeed >= GOAL else "MISS"))
            rows.append(row)
            print("  " + " | ".join(row), flush=True)
        del variants
    print("\nspeed = baseline time / variant time (fuse vs original, compile(fuse) vs compile); goal >= %.2fx"
          % GOAL)
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
