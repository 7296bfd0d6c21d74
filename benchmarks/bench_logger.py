"""LossLogger vs .item(), side by side in one run.

A host-bound training loop (a small MLP, batch 64, many steps) three ways:
loss.item() every step, LossLogger.log() every step, no logging.  Reports
steps/s, the ratios, and the host cost of one log() call in microseconds.

Goals ([logger], on a GPU): >= 1.2x the .item() loop, within 3% of no
logging, zero host syncs per step.  On a CPU-only machine the loop runs on
the CPU, where .item() costs no GPU sync: the numbers there only show the
host cost of log().

    python benchmarks/bench_logger.py [--steps N] [--device cpu|cuda]
"""

import argparse
import time

import gpuaccel as ga

from common import machine, print_table


def build(device):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    return model, opt, x, y


def loop(device, steps, mode):
    import torch

    model, opt, x, y = build(device)
    log = ga.LossLogger(50) if mode == "gpuaccel" else None
    total = 0.0

    def step():
        nonlocal total
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if mode == "item":
            total += loss.item()
        elif mode == "gpuaccel":
            log.log(loss=loss.detach())

    for _ in range(20):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if log is not None:
        log.flush()
    return steps / elapsed


def log_call_us(device, calls=20000):
    import torch

    log = ga.LossLogger(50)
    value = torch.tensor(1.0, device=device)
    for _ in range(200):
        log.log(loss=value)
    start = time.perf_counter()
    for _ in range(calls):
        log.log(loss=value)
    elapsed = time.perf_counter() - start
    log.flush()
    return elapsed / calls * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--device", default="cuda" if ga.cuda_available() else "cpu")
    args = parser.parse_args()
    rates = {mode: loop(args.device, args.steps, mode) for mode in ("item", "gpuaccel", "none")}
    rates_again = {mode: loop(args.device, args.steps, mode) for mode in ("none", "gpuaccel", "item")}
    rates = {m: max(rates[m], rates_again[m]) for m in rates}  # best of two, interleaved
    rows = [
        [".item() every step", "%.0f" % rates["item"], "1.00x", "%.3f" % (rates["item"] / rates["none"])],
        ["LossLogger every step", "%.0f" % rates["gpuaccel"], "%.2fx" % (rates["gpuaccel"] / rates["item"]),
         "%.3f" % (rates["gpuaccel"] / rates["none"])],
        ["no logging", "%.0f" % rates["none"], "%.2fx" % (rates["none"] / rates["item"]), "1.000"],
    ]
    print_table("Host-bound MLP loop (batch 64, %d steps), device=%s  [%s]" % (args.steps, args.device, machine()),
                ["loop", "steps/s", "vs .item()", "vs no logging"], rows)
    print("\nhost cost of one LossLogger.log(loss=<%s tensor>): %.2f us" % (args.device, log_call_us(args.device)))


if __name__ == "__main__":
    main()
