"""Host time of reading torch's TF32 flags, which every float32 CUDA matmul / conv does while
gpuaccel's own setter is not called (csrc/torch.c: torch._C._get_fp32_precision_getter, looked
up once, called with prebuilt arguments).

    python benchmarks/bench_tf32_read.py

No GPU needed: the read is host work.  ga._C._tf32_state(op) resolves a setting as an op does;
it is timed following torch (the read) and with gpuaccel's setter called (no read), interleaved
over many rounds; the difference of the medians is the read's cost per op.  torch's own Python
reads are timed alongside for scale.  CPU ops and other dtypes never read torch's flags.
"""

import statistics
import time

import torch

import gpuaccel as ga

CALLS = 20000
ROUNDS = 31


def per_call_ns(fn, *args):
    t0 = time.perf_counter_ns()
    for _ in range(CALLS):
        fn(*args)
    return (time.perf_counter_ns() - t0) / CALLS


def main():
    state = ga._C._tf32_state
    cases = {
        "follows torch (reads its flag)": lambda op: (ga.set_matmul_precision(None), ga.set_conv_allow_tf32(None)),
        "gpuaccel's setter (no read)": lambda op: (ga.set_matmul_precision("highest"), ga.set_conv_allow_tf32(True)),
    }
    for op in ("matmul", "conv"):
        times = {name: [] for name in cases}
        for _ in range(ROUNDS):
            for name, setup in cases.items():
                setup(op)
                times[name].append(per_call_ns(state, op))
        med = {name: statistics.median(t) for name, t in times.items()}
        for name, ns in med.items():
            print("%-7s _tf32_state, %-32s %6.1f ns" % (op, name, ns))
        print("%-7s the read of torch's flag costs             %6.1f ns per op" %
              (op, med["follows torch (reads its flag)"] - med["gpuaccel's setter (no read)"]))
    ga.set_matmul_precision(None)
    ga.set_conv_allow_tf32(None)
    for label, fn in (("torch.backends.cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
                      ("torch.backends.cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32),
                      ("torch.get_float32_matmul_precision()", torch.get_float32_matmul_precision)):
        print("torch's Python read %-40s %6.1f ns" % (label, statistics.median(per_call_ns(fn) for _ in range(11))))
    print("torch %s, gpuaccel %s" % (torch.__version__, ga.__version__))


if __name__ == "__main__":
    main()
