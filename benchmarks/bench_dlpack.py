"""DLPack exchange overhead: torch -> gpuaccel -> torch per round trip, side
by side with torch -> NumPy -> torch (CPU) and torch -> CuPy -> torch (CUDA,
when CuPy is installed), in one run.

Goal ([foundation]): gpuaccel's round trip within 1.5x of NumPy's.

    python benchmarks/bench_dlpack.py [--iterations N]
"""

import argparse

import numpy as np

import gpuaccel as ga

from common import machine, print_table, time_per_call_us


def main():
    import torch

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=20000)
    args = parser.parse_args()
    n = args.iterations
    rows = []

    def add(device, what, ours, theirs, other):
        ratio = ours / theirs
        rows.append((device, what, "%.2f" % ours, "%.2f" % theirs, other, "%.2fx" % ratio,
                     "yes" if ratio <= 1.5 else "NO"))

    t = torch.ones(1024)
    ours = time_per_call_us(lambda: torch.from_dlpack(ga.from_dlpack(t)), n)
    theirs = time_per_call_us(lambda: torch.from_dlpack(np.from_dlpack(t)), n)
    add("cpu", "torch->X->torch", ours, theirs, "numpy")

    x = np.ones(1024)
    ours = time_per_call_us(lambda: ga.from_dlpack(x), n)
    theirs = time_per_call_us(lambda: np.from_dlpack(x), n)
    add("cpu", "import from numpy", ours, theirs, "numpy")

    a, y = ga.asarray(x), np.ones(1024)
    ours = time_per_call_us(lambda: torch.from_dlpack(a), n)
    theirs = time_per_call_us(lambda: torch.from_dlpack(y), n)
    add("cpu", "export to torch", ours, theirs, "numpy")

    if ga.cuda_available():
        try:
            import cupy
        except ImportError:
            cupy = None
        tc = torch.ones(1024, device="cuda")
        ours = time_per_call_us(lambda: torch.from_dlpack(ga.from_dlpack(tc)), n)
        if cupy is not None:
            theirs = time_per_call_us(lambda: torch.from_dlpack(cupy.from_dlpack(tc)), n)
            add("cuda", "torch->X->torch", ours, theirs, "cupy")
        else:
            rows.append(("cuda", "torch->X->torch", "%.2f" % ours, "-", "-", "-", "-"))
        torch.cuda.synchronize()

    print_table(
        "DLPack round trip, microseconds per call (median of 7 runs of %d)  [%s]" % (n, machine()),
        ["device", "exchange", "gpuaccel us", "other us", "other", "ratio", "<=1.5x"],
        rows,
    )


if __name__ == "__main__":
    main()
