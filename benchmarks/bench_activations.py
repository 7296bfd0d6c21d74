"""Every activation of the fused layers, gpuaccel vs torch eager, side by
side in one run, with the route each call took:

- linear (bfloat16 on a GPU): FusedLinear vs nn.Linear + the activation's
  module, forward (no grad) and forward + backward, at a ViT-B MLP shape and
  an LLM MLP shape.  relu and gelu_tanh fuse into cuBLASLt's epilogue; the
  others take the split route (GEMM + bias in cuBLASLt, then gpuaccel's
  activation kernel): the gelu_tanh / gelu rows measure what the split
  costs against the fused epilogue on the same GEMM.
- conv2d (bfloat16 channels-last on a GPU): FusedConv2d vs nn.Conv2d + the
  module (cudnn.benchmark on), at a ResNet/MobileNet stage shape: cuDNN's
  fused graph for the activations it has a pointwise mode for, the split
  route for hardswish.

On a machine without a GPU: small float32 shapes on the CPU (informational
only: the layers run torch's kernels there above CPU_TORCH_THRESHOLD).

    python benchmarks/bench_activations.py [--quick]
"""

import argparse

import torch

import gpuaccel as ga
import gpuaccel.torch as gt
from gpuaccel import bench

from common import machine, print_table

ACTIVATIONS = ["relu", "gelu", "gelu_tanh", "silu", "hardswish", "sigmoid"]
MODULES = {"relu": torch.nn.ReLU, "gelu": torch.nn.GELU, "gelu_tanh": lambda: torch.nn.GELU(approximate="tanh"),
           "silu": torch.nn.SiLU, "hardswish": torch.nn.Hardswish, "sigmoid": torch.nn.Sigmoid}


def route(before, after):
    """What the calls between two stats snapshots ran as."""
    calls = after["cuda_calls"] - before["cuda_calls"]
    if not calls:
        return "cpu"
    fused = after["fused"] - before["fused"]
    reasons = {k: v - before["fallback_reasons"].get(k, 0) for k, v in after["fallback_reasons"].items()}
    why = ",".join(k for k, v in reasons.items() if v > 0)
    return "fused" if fused == calls else "split/unfused (%s)" % (why or "?")


def fwd(layer, x):
    def call():
        with torch.no_grad():
            layer(x)
    return call


def fwd_bwd(layer, x):
    def call():
        y = layer(x)
        y.backward(torch.ones_like(y))
    return call


def time_pair(ours, theirs, device):
    """Interleaved: ours, theirs, ours, theirs (each a median of batches)."""
    a1, b1 = bench.time_ms(ours, torch, device), bench.time_ms(theirs, torch, device)
    a2, b2 = bench.time_ms(ours, torch, device), bench.time_ms(theirs, torch, device)
    return min(a1, a2), min(b1, b2)


def linear_rows(device, dtype, shapes):
    rows = []
    for tokens, fin, fout in shapes:
        x = torch.randn(tokens, fin, device=device, dtype=dtype, requires_grad=True)
        for act in ACTIVATIONS:
            fused = gt.FusedLinear(fin, fout, activation="gelu_erf" if act == "gelu" else act, device=device,
                                   dtype=dtype)
            plain = torch.nn.Sequential(torch.nn.Linear(fin, fout, device=device, dtype=dtype), MODULES[act]())
            plain[0].load_state_dict(fused.state_dict())
            before = ga.matmul_stats()
            with torch.no_grad():
                fused(x)
            how = route(before, ga.matmul_stats())
            flop = 2.0 * tokens * fin * fout
            for what, make, mult in (("fwd", fwd, 1), ("fwd+bwd", fwd_bwd, 3)):
                ms_g, ms_t = time_pair(make(fused, x), make(plain, x), device)
                rows.append(("%-9s %dx%d->%d %s" % (act, tokens, fin, fout, what), how, ms_g, ms_t,
                             mult * flop / ms_g / 1e9))
    return rows


def conv_rows(device, dtype, fmt, shapes):
    rows = []
    for n, c, k, hw, r in shapes:
        x = torch.randn(n, c, hw, hw, device=device, dtype=dtype).to(memory_format=fmt).requires_grad_(True)
        for act in ACTIVATIONS:
            fused = gt.FusedConv2d(c, k, r, padding=r // 2, activation="gelu_erf" if act == "gelu" else act,
                                   device=device, dtype=dtype).to(memory_format=fmt)
            plain = torch.nn.Sequential(torch.nn.Conv2d(c, k, r, padding=r // 2, device=device, dtype=dtype),
                                        MODULES[act]()).to(memory_format=fmt)
            plain[0].load_state_dict(fused.state_dict())
            before = ga.conv_stats()
            with torch.no_grad():
                fused(x)
            how = route(before, ga.conv_stats())
            flop = 2.0 * n * k * hw * hw * c * r * r
            for what, make, mult in (("fwd", fwd, 1), ("fwd+bwd", fwd_bwd, 3)):
                ms_g, ms_t = time_pair(make(fused, x), make(plain, x), device)
                rows.append(("%-9s %dx%dx%dx%d %dx%d->%d %s" % (act, n, c, hw, hw, r, r, k, what), how, ms_g, ms_t,
                             mult * flop / ms_g / 1e9))
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="one shape each")
    args = parser.parse_args()
    device = "cuda" if ga.cuda_available() and torch.cuda.is_available() else "cpu"
    print(machine(), "-", bench.device_description(torch, device))
    if device == "cuda":
        torch.backends.cudnn.benchmark = True
        dtype, fmt, unit = torch.bfloat16, torch.channels_last, "TFLOP/s"
        linear_shapes = [(8 * 197, 768, 3072), (4096, 4096, 16384)]
        conv_shapes = [(64, 64, 64, 56, 3), (64, 96, 96, 28, 1)]
    else:
        dtype, fmt, unit = torch.float32, torch.contiguous_format, "TFLOP/s"
        linear_shapes = [(256, 128, 512)]
        conv_shapes = [(4, 16, 16, 16, 3)]
    if args.quick:
        linear_shapes, conv_shapes = linear_shapes[:1], conv_shapes[:1]
    header = ["case", "gpuaccel route", "gpuaccel ms", "torch ms", "torch/gpuaccel", "gpuaccel " + unit]

    def table(title, rows):
        print_table(title, header, [(case, how, "%.3f" % g, "%.3f" % t, "%.3fx" % (t / g), "%.1f" % tf)
                                    for case, how, g, t, tf in rows])

    table("linear + activation (%s)" % str(dtype).split(".")[1], linear_rows(device, dtype, linear_shapes))
    table("conv2d + bias + activation (%s, %s)" % (str(dtype).split(".")[1], "channels-last" if device == "cuda"
                                                   else "NCHW"), conv_rows(device, dtype, fmt, conv_shapes))
    print("\nmatmul_stats:", ga.matmul_stats())
    print("conv_stats:", ga.conv_stats())


if __name__ == "__main__":
    main()
