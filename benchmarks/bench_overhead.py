"""Host time per call of gpuaccel's torch integration, side by side with
torch eager, in one run.

    python benchmarks/bench_overhead.py                 # CPU, tiny shapes (host time) + bench sizes
    python benchmarks/bench_overhead.py --device cuda   # the same on a GPU
    python benchmarks/bench_overhead.py --crossover     # CPU: where torch's kernels overtake gpuaccel's

Tiny shapes (a 4x8 input into an 8->8 linear; a 1x3x4x4 input into a
3->4 3x3 conv) make the time per call the host's dispatch cost, not
arithmetic.  Each pair is timed interleaved (gpuaccel, torch, gpuaccel,
...) over many rounds on one torch thread; the table gives the median of
the rounds and the ratio of medians.  On CUDA every round ends with a
synchronize, so the numbers are host time while the GPU keeps up (tiny
shapes) — and the time per step at the bench sizes.

Goals: fwd+bwd <= 0.75x torch eager and the no-grad forward
<= 1.0x at tiny shapes; ga.from_dlpack(torch tensor) <= 0.5 us; at the bench
sizes on CPU, fused fwd+bwd >= 0.95x torch eager's speed.
"""

import argparse
import os
import statistics
import sys
import time

import torch

import gpuaccel as ga
import gpuaccel.torch as gt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine

F = torch.nn.functional


# --clock cpu: the process's CPU time (time.process_time), which leaves out
# the time other processes hold the cores: on a shared, loaded machine the
# wall clock measures the load as much as the code
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


def timed(fn, calls, sync):
    start = clock()
    for _ in range(calls):
        fn()
    sync()
    return (clock() - start) / calls * 1e6


def compare(pairs, calls, rounds, sync):
    """{name: (gpuaccel fn, torch fn)} -> {name: (median us, median us)}"""
    results = {}
    for name, (ours, theirs) in pairs.items():
        for fn in (ours, theirs):  # warm up: caches, allocators, tuning
            timed(fn, max(calls // 10, 3), sync)
        a, b = [], []
        for _ in range(rounds):
            a.append(timed(ours, calls, sync))
            b.append(timed(theirs, calls, sync))
        results[name] = (statistics.median(a), statistics.median(b))
    return results


def print_table(title, results, goals):
    print("\n" + title)
    print("| %-52s | %10s | %10s | %6s | %-7s |" % ("host us per call", "gpuaccel", "torch", "ratio", "goal"))
    print("|%s|%s|%s|%s|%s|" % ("-" * 54, "-" * 12, "-" * 12, "-" * 8, "-" * 9))
    for name, (ours, theirs) in results.items():
        ratio = ours / theirs
        goal = goals.get(name)
        mark = "" if goal is None else ("<= %.2f %s" % (goal, "ok" if ratio <= goal else "MISS"))
        print("| %-52s | %10.2f | %10.2f | %5.2fx | %-7s |" % (name, ours, theirs, ratio, mark))


def backward(make):
    def step():
        make().sum().backward()
    return step


def tiny_pairs(device):
    torch.manual_seed(0)
    dev = torch.device(device)
    x = torch.randn(4, 8, device=dev, requires_grad=True)
    xc = torch.randn(1, 3, 4, 4, device=dev, requires_grad=True)
    fl = gt.FusedLinear(8, 8, activation="gelu").to(dev)
    tl = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).to(dev)
    fc = gt.FusedConv2d(3, 4, 3, padding=1, activation="relu").to(dev)
    tc = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU()).to(dev)
    xd, xcd = x.detach(), xc.detach()
    w, b = fl.weight.detach(), fl.bias.detach()
    wc, bc = fc.weight.detach(), fc.bias.detach()
    y = torch.empty(4, 8, device=dev)
    yc = torch.empty(1, 4, 4, 4, device=dev)

    def no_grad(fn):
        def call():
            with torch.no_grad():
                return fn()
        return call

    def logger_pair():
        log = ga.LossLogger(every=50)
        loss = torch.tensor(1.5, device=dev)

        def torch_way():  # what LossLogger replaces: a host read per step
            loss.item()
        return (lambda: log.log(loss=loss)), torch_way

    tmp = torch.randn(256, device=dev)
    return {
        "FusedLinear(gelu) fwd+bwd vs Linear+GELU": (backward(lambda: fl(x)), backward(lambda: tl(x))),
        "FusedConv2d(relu) fwd+bwd vs Conv2d+ReLU": (backward(lambda: fc(xc)), backward(lambda: tc(xc))),
        "FusedLinear(gelu) no-grad forward": (no_grad(lambda: fl(x)), no_grad(lambda: tl(x))),
        "FusedConv2d(relu) no-grad forward": (no_grad(lambda: fc(xc)), no_grad(lambda: tc(xc))),
        "ga.linear(out=) on torch tensors vs F.linear+gelu": (
            lambda: ga.linear(xd, w, b, "gelu", out=y),
            lambda: F.gelu(F.linear(xd, w, b))),
        "ga.conv2d(out=) on torch tensors vs F.conv2d+relu": (
            lambda: ga.conv2d(xcd, wc, bc, padding=1, activation="relu", out=yc),
            lambda: F.relu(F.conv2d(xcd, wc, bc, padding=1))),
        "ga.from_dlpack(t) vs torch.from_dlpack(t)": (lambda: ga.from_dlpack(tmp), lambda: torch.from_dlpack(tmp)),
        "torch.from_dlpack(ga.from_dlpack(t)) round trip vs torch's": (
            lambda: torch.from_dlpack(ga.from_dlpack(tmp)), lambda: torch.from_dlpack(torch.from_dlpack(tmp))),
        "LossLogger.log(loss=t) vs loss.item()": logger_pair(),
    }


TINY_GOALS = {
    "FusedLinear(gelu) fwd+bwd vs Linear+GELU": 0.75,
    "FusedConv2d(relu) fwd+bwd vs Conv2d+ReLU": 0.75,
    "FusedLinear(gelu) no-grad forward": 1.0,
    "FusedConv2d(relu) no-grad forward": 1.0,
}


def bench_size_pairs(device):
    torch.manual_seed(0)
    dev = torch.device(device)
    x = torch.randn(512, 256, device=dev, requires_grad=True)
    xc = torch.randn(8, 32, 28, 28, device=dev, requires_grad=True)
    fl = gt.FusedLinear(256, 1024, activation="gelu").to(dev)
    tl = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU()).to(dev)
    fc = gt.FusedConv2d(32, 32, 3, padding=1, activation="relu").to(dev)
    tc = torch.nn.Sequential(torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU()).to(dev)
    return {
        "512x256 -> 1024 linear+gelu fwd+bwd": (backward(lambda: fl(x)), backward(lambda: tl(x))),
        "8x32x28x28 3x3 conv+relu fwd+bwd": (backward(lambda: fc(xc)), backward(lambda: tc(xc))),
    }


def fwd_bwd_pair(ours, theirs, x):
    return backward(lambda: ours(x)), backward(lambda: theirs(x))


def crossover():
    """gpuaccel's CPU kernels (the Function path, dispatch forced off) against
    torch's, fwd+bwd, over growing sizes: where CPU_TORCH_THRESHOLD belongs."""
    saved = dict(gt.CPU_TORCH_THRESHOLD)
    print("\nCPU crossover (us per fwd+bwd; gpuaccel's kernels vs torch's; multiply-adds of the forward)")
    print("| %-34s | %12s | %10s | %10s | %6s |" % ("shape", "MACs", "gpuaccel", "torch", "ratio"))
    try:
        gt.CPU_TORCH_THRESHOLD.update(linear=1 << 62, conv2d=1 << 62)
        for m, k, n in ((8, 32, 32), (16, 64, 64), (32, 64, 128), (64, 128, 128), (64, 128, 256),
                        (128, 256, 256), (256, 256, 512), (512, 256, 1024)):
            x = torch.randn(m, k, requires_grad=True)
            fl = gt.FusedLinear(k, n, activation="gelu")
            tl = torch.nn.Sequential(torch.nn.Linear(k, n), torch.nn.GELU())
            r = compare({"": fwd_bwd_pair(fl, tl, x)}, 20, 7, lambda: None)[""]
            print("| linear %4d x %4d -> %4d         | %12d | %10.1f | %10.1f | %5.2fx |"
                  % (m, k, n, m * k * n, r[0], r[1], r[0] / r[1]))
        for n, c, hw in ((1, 4, 6), (1, 8, 8), (2, 8, 12), (2, 16, 14), (4, 16, 16), (4, 32, 20), (8, 32, 28)):
            x = torch.randn(n, c, hw, hw, requires_grad=True)
            fc = gt.FusedConv2d(c, c, 3, padding=1, activation="relu")
            tc = torch.nn.Sequential(torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.ReLU())
            r = compare({"": fwd_bwd_pair(fc, tc, x)}, 20, 7, lambda: None)[""]
            macs = n * c * hw * hw * c * 9
            print("| conv %dx%dx%dx%d 3x3              | %12d | %10.1f | %10.1f | %5.2fx |"
                  % (n, c, hw, hw, macs, r[0], r[1], r[0] / r[1]))
    finally:
        gt.CPU_TORCH_THRESHOLD.update(saved)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--calls", type=int, default=300, help="calls per timed round (tiny shapes)")
    parser.add_argument("--rounds", type=int, default=21, help="interleaved rounds per pair")
    parser.add_argument("--crossover", action="store_true", help="CPU: find where torch's kernels win")
    parser.add_argument("--clock", default="wall", choices=sorted(CLOCKS),
                        help="wall (default) or cpu: the process's CPU time, for a shared, loaded machine (CPU only)")
    args = parser.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    if args.device == "cuda" and not (torch.cuda.is_available() and ga.cuda_available()):
        print("bench_overhead: --device cuda needs a GPU that torch and gpuaccel can both use", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    print(machine(), "|", time.strftime("%Y-%m-%d"))
    print("device %s, torch threads %d, median of %d interleaved rounds, %s clock" % (
        args.device, torch.get_num_threads(), args.rounds, args.clock))
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    if args.crossover:
        torch.set_num_threads(os.cpu_count() or 1)  # both sides use every core, as in training
        crossover()
        return 0
    print_table("Tiny shapes: host time (dispatch, not arithmetic)",
                compare(tiny_pairs(args.device), args.calls, args.rounds, sync), TINY_GOALS)
    if args.device == "cpu":
        torch.set_num_threads(os.cpu_count() or 1)
    big = compare(bench_size_pairs(args.device), 5, max(args.rounds // 3, 5), sync)
    print_table("Bench sizes, fwd+bwd (%d torch threads): us per step; goal: speed >= 0.95x torch, i.e. ratio "
                "<= 1.05" % torch.get_num_threads(), big, {k: 1.0 / 0.95 for k in big})
    return 0


if __name__ == "__main__":
    sys.exit(main())
