"""`python -m gpuaccel demo` on the CPU as a newcomer runs it, repeated: the
numbers README.md and RESULTS.md quote.

    python benchmarks/bench_demo.py                    # 3 runs of the default demo
    python benchmarks/bench_demo.py --busy 1           # with one other busy process on the machine
    python benchmarks/bench_demo.py --runs 5 --threads 1
    python benchmarks/bench_demo.py --intra-op         # torch's intra-op threads: 1 against one per CPU

Each run is a fresh `python -m gpuaccel demo --json --quiet` (both sides in
one process, in alternating blocks of steps), timed from start to end as a
user waits for it.  --busy N starts N processes that spin on the CPU for the
whole measurement (a second training job, a build): the machine of a
newcomer who is doing something else too.  The machine's load average is
printed with every run: on a shared machine the numbers say as much about
the others as about gpuaccel.  Extra arguments after -- go to the demo.

--intra-op measures what makes a busy machine slow: the demo's model (torch's
layers; the fused ones run the same torch kernels on the CPU) trained on one
fixed batch, in one process, with torch.set_num_threads(1) and with one
thread per CPU, in alternating rounds; no loader, no gpuaccel thread.
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

from common import machine, print_table

SPIN = "import signal, sys\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nwhile True:\n    pass\n"


@contextlib.contextmanager
def busy(count):
    """`count` other processes spinning on the CPU meanwhile."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]
    try:
        yield
    finally:
        for p in spinners:
            p.terminate()
            p.wait()


def run_demo(extra):
    start = time.perf_counter()
    load = os.getloadavg()[0]
    out = subprocess.run([sys.executable, "-m", "gpuaccel", "demo", "--device", "cpu", "--json", "--quiet", *extra],
                         capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit("the demo failed:\n" + out.stderr[-3000:])
    data = json.loads(out.stdout)
    return dict(data, wall_s=wall, load_start=load, load_end=os.getloadavg()[0])


def spread(values, fmt):
    values = sorted(values)
    if len(values) == 1:
        return fmt % values[0]
    return (fmt + " - " + fmt + " (median " + fmt + ")") % (values[0], values[-1], statistics.median(values))


def intra_op(rounds, steps):
    import torch

    import gpuaccel.torch as gt
    from gpuaccel import demo

    _, model = demo._models(torch, gt, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))

    def images_per_s():
        start = time.perf_counter()
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return steps * 64 / (time.perf_counter() - start)

    counts = (1, len(os.sched_getaffinity(0)))
    rates = {n: [] for n in counts}
    loads = []
    images_per_s()  # warm-up
    for i in range(rounds):
        loads.append(os.getloadavg()[0])
        for n in (counts if i % 2 == 0 else counts[::-1]):
            torch.set_num_threads(n)
            rates[n].append(images_per_s())
    print_table("the demo's model on one batch of 64, %d rounds of %d steps, load average %.1f - %.1f"
                % (rounds, steps, min(loads), max(loads)), ["torch intra-op threads", "images/s min - max (median)"],
                [(str(n), spread(rates[n], "%.0f")) for n in counts])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="demo runs (default: 3)")
    parser.add_argument("--busy", type=int, default=0, help="other processes spinning meanwhile (default: 0)")
    parser.add_argument("--threads", type=int, default=None, help="passed to the demo (torch's intra-op threads)")
    parser.add_argument("--intra-op", action="store_true",
                        help="instead: torch's intra-op threads, 1 against one per CPU, in alternating rounds")
    args, extra = parser.parse_known_args()
    if args.intra_op:
        print(machine(), "-", len(os.sched_getaffinity(0)), "CPUs")
        with busy(args.busy):
            intra_op(rounds=6, steps=8)
        return
    extra = [a for a in extra if a != "--"] + (["--threads", str(args.threads)] if args.threads else [])
    print(machine(), "-", len(os.sched_getaffinity(0)), "CPUs; demo arguments:", " ".join(extra) or "(defaults)")
    with busy(args.busy):
        runs = []
        for i in range(args.runs):
            r = run_demo(extra)
            runs.append(r)
            g, t = r["results"]["gpuaccel"], r["results"]["torch"]
            print("run %d: %.1f s, gpuaccel %.0f / torch %.0f images/s, %.2fx (blocks %.2f-%.2f), load average "
                  "%.1f -> %.1f" % (i + 1, r["wall_s"], g["images_per_s"], t["images_per_s"], r["ratio"]["median"],
                                    r["ratio"]["min"], r["ratio"]["max"], r["load_start"], r["load_end"]),
                  flush=True)
    rows = [
        ("wall time, s", spread([r["wall_s"] for r in runs], "%.1f")),
        ("gpuaccel images/s", spread([r["results"]["gpuaccel"]["images_per_s"] for r in runs], "%.0f")),
        ("torch images/s", spread([r["results"]["torch"]["images_per_s"] for r in runs], "%.0f")),
        ("gpuaccel/torch", spread([r["ratio"]["median"] for r in runs], "%.2fx")),
        ("load average", spread([max(r["load_start"], r["load_end"]) for r in runs], "%.1f")),
    ]
    print_table("python -m gpuaccel demo on the CPU, %d runs%s" % (
        len(runs), ", %d other busy process%s" % (args.busy, "es" if args.busy > 1 else "") if args.busy else ""),
        ["", "min - max (median)"], rows)


if __name__ == "__main__":
    main()
