"""Plain matmul and fused linear (forward + backward), gpuaccel vs torch,
side by side in one run.

- matmul: TFLOP/s for fp16, bf16 and tf32 at 1024...8192 (square), ga.matmul
  on torch tensors vs torch.matmul, and as a fraction of the H100's 989
  TFLOP/s dense bf16/fp16 peak (494 for tf32).
- linear: FusedLinear (GEMM + bias + relu/gelu_tanh fused in cuBLASLt, gelu
  (erf) and silu by the split route: GEMM + bias in cuBLASLt, then gpuaccel's
  activation kernel; backward: the activation and bias gradients in one pass)
  vs F.linear + the activation in torch eager and under
  torch.compile, for MLP shapes (tokens 4096 and 8192; 4096->16384 and
  16384->4096).

Goals on an H100: plain matmul >= 0.97x torch; fused fwd+bwd >= 1.15x eager
and >= 1.0x torch.compile.  On a CPU-only machine it runs the CPU path at
small sizes (informational only).

    python benchmarks/bench_matmul.py [--quick] [--no-compile]
"""

import argparse

import torch

import gpuaccel as ga
from gpuaccel import bench

from common import machine, print_table

H100_PEAK = {"float16": 989.0, "bfloat16": 989.0, "tf32": 494.0}  # dense TFLOP/s, SXM


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile comparison")
    args = parser.parse_args()
    device = "cuda" if ga.cuda_available() and torch.cuda.is_available() else "cpu"
    print(machine(), "-", bench.device_description(torch, device))
    sizes = None
    if device == "cuda" and not args.quick:
        sizes = (1024, 2048, 4096, 8192)
    rows = bench.bench_matmul(torch, device, full=not args.quick, sizes=sizes)
    on_h100 = device == "cuda" and "H100" in torch.cuda.get_device_name()
    print_table("matmul (%s)" % rows[0]["unit"], ["case", "gpuaccel", "torch", "ratio", "of H100 peak"],
                [(r["case"], "%.1f" % r["gpuaccel"], "%.1f" % r["torch"], "%.3fx" % r["ratio"],
                  "%.0f%%" % (100 * r["gpuaccel"] / H100_PEAK[r["case"].split()[0]]) if on_h100 else "-")
                 for r in rows])
    shapes = None
    if device == "cuda":
        shapes = [(4096, 4096, 16384, "gelu_tanh"), (4096, 4096, 16384, "gelu"), (4096, 16384, 4096, "gelu"),
                  (8192, 4096, 16384, "gelu"), (8192, 16384, 4096, "gelu_tanh"), (4096, 4096, 16384, "silu"),
                  (4096, 4096, 16384, "relu"), (8192, 16384, 4096, "relu")]
        if args.quick:
            shapes = shapes[:2]
    rows = bench.bench_linear(torch, device, full=True, shapes=shapes, compiled=not args.no_compile)
    print_table("fused linear, forward + backward (%s)" % rows[0]["unit"], ["case", "gpuaccel", "torch", "ratio"],
                [(r["case"], "%.1f" % r["gpuaccel"], "%.1f" % r["torch"], "%.3fx" % r["ratio"]) for r in rows])
    print("\nmatmul_stats:", ga.matmul_stats())


if __name__ == "__main__":
    main()
