"""The backward epilogue of a layer — dz = grad * act'(z) and the bias
gradient, the sum of dz over every dim but the channel — as gpuaccel's
kernels compute it (kernels/cuda/epilogue.cu: one pass that writes dz and
sums it, split across the GPU in chunks fixed by the shape), side by side
with torch's `grad * act'(z)` then `.sum(...)`, in one run:

  - ResNet-50's convolutions (bench_conv.py's shapes: batch 128, bfloat16,
    channels-last), conv2d_backward asked for the bias gradient alone
    (ReLU: its derivative reads the layer's output y), and every other
    activation at the first shape (the derivative reads the pre-activation);
  - an MLP's linear layers (bench_matmul.py's shapes and activations, and
    the rest of the activations at the first shape, bfloat16),
    linear_backward likewise (the derivative reads the pre-activation).

GB/s counts the bytes each must move at least (grad and the activation's
input read, dz written) over the time per call; the bias gradient's sums
are read back against torch's on the first call (float32 sums over
different orders: within a few bfloat16 roundings of the largest sum).
On a CPU: small float32 shapes, informational only.

    python benchmarks/bench_epilogue.py [--quick]
"""

import argparse

import torch
from bench_conv import RESNET50_SHAPES
from bench_matmul import LINEAR_SHAPES

import gpuaccel as ga
import gpuaccel.torch as gt
from gpuaccel import bench

from common import machine, print_table

# gpuaccel's activation names as torch computes them: gpuaccel.torch's own
# table, the forms its CPU path and ONNX decompositions use
TORCH_ACTIVATIONS = gt._TORCH_ACTIVATION
# "gelu" as gpuaccel spells the exact form without its warning about the
# name's change of meaning
GA_NAME = {"gelu": "gelu_erf"}


def conv_case(n, c, k, hw, r, act, device, dtype):
    fmt = torch.channels_last if device == "cuda" else torch.contiguous_format
    x = torch.randn(n, c, hw, hw, device=device, dtype=dtype).contiguous(memory_format=fmt)
    w = torch.randn(k, c, r, r, device=device, dtype=dtype) * 0.05
    z = torch.randn(n, k, hw, hw, device=device, dtype=dtype).contiguous(memory_format=fmt)
    y = torch.relu(z)
    g = torch.randn(n, k, hw, hw, device=device, dtype=dtype).contiguous(memory_format=fmt)
    # ReLU's derivative reads the layer's output, the others' the saved
    # pre-activation (one tensor either way)
    aux = {"y": y} if act == "relu" else {"preactivation": z}

    def ours():
        return ga.conv2d_backward(g, x, w, padding=r // 2, activation=GA_NAME.get(act, act), needs_input_grad=False,
                                  needs_weight_grad=False, needs_bias_grad=True, **aux)[2]

    def theirs():
        if act == "relu":
            return (g * (y > 0)).sum(dim=(0, 2, 3), dtype=torch.float32)
        zz = z.detach().float().requires_grad_(True)
        with torch.enable_grad():
            (dz,) = torch.autograd.grad(TORCH_ACTIVATIONS[act](zz), zz, g.float())
        return dz.to(dtype).float().sum(dim=(0, 2, 3))

    return ours, theirs, 3 * g.numel() * g.element_size()


def linear_case(tokens, fin, fout, act, device, dtype):
    x = torch.randn(tokens, fin, device=device, dtype=dtype)
    w = torch.randn(fout, fin, device=device, dtype=dtype) * 0.02
    z = torch.randn(tokens, fout, device=device, dtype=dtype)
    g = torch.randn(tokens, fout, device=device, dtype=dtype)

    def ours():
        return ga.linear_backward(g, x, w, activation=GA_NAME.get(act, act), preactivation=z, needs_input_grad=False,
                                  needs_weight_grad=False, needs_bias_grad=True)[2]

    def theirs():
        zz = z.detach().float().requires_grad_(True)
        with torch.enable_grad():
            (dz,) = torch.autograd.grad(TORCH_ACTIVATIONS[act](zz), zz, g.float())
        return dz.to(dtype).float().sum(dim=0)

    return ours, theirs, 3 * g.numel() * g.element_size()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    device = "cuda" if ga.cuda_available() and torch.cuda.is_available() else "cpu"
    print(machine(), "-", bench.device_description(torch, device))
    if device == "cuda":
        dtype, convs, linears = torch.bfloat16, RESNET50_SHAPES, LINEAR_SHAPES
    else:
        dtype, convs, linears = torch.float32, [(4, 16, 16, 14, 3), (4, 32, 64, 7, 1)], [(256, 64, 128, "gelu")]
    if args.quick:
        convs, linears = convs[:2], linears[:2]
    convs = [shape + ("relu",) for shape in convs]
    # every activation at the first shape of each kind (the derivative's
    # arithmetic differs; the memory traffic does not)
    others = [a for a in TORCH_ACTIVATIONS if a != "relu"]
    convs += [convs[0][:5] + (a,) for a in others]
    linears += [linears[0][:3] + (a,) for a in TORCH_ACTIVATIONS if a not in [s[3] for s in linears]]
    cases = [("conv %dx%dx%dx%d->%d r%d %s" % (n, c, hw, hw, k, r, a), conv_case(n, c, k, hw, r, a, device, dtype))
             for n, c, k, hw, r, a in convs]
    cases += [("linear %dx%d->%d %s" % (t, i, o, a), linear_case(t, i, o, a, device, dtype))
              for t, i, o, a in linears]
    rows = []
    for name, (ours, theirs, nbytes) in cases:
        got, want = torch.from_dlpack(ours()).float(), theirs().float()
        scale = float(want.abs().max()) + 1e-30
        worst = float((got - want).abs().max()) / scale
        ms_ours = bench.time_ms(ours, torch, device)
        ms_theirs = bench.time_ms(theirs, torch, device)
        rows.append((name, "%.1f" % (nbytes / ms_ours / 1e6), "%.1f" % (nbytes / ms_theirs / 1e6),
                     "%.3f" % ms_ours, "%.3f" % ms_theirs, "%.2fx" % (ms_theirs / ms_ours), "%.1e" % worst))
    print_table("backward epilogue: dz and the bias gradient (%s)" % str(dtype).replace("torch.", ""),
                ["case", "gpuaccel GB/s", "torch GB/s", "gpuaccel ms", "torch ms", "speed-up", "max |diff|/max"],
                rows)


if __name__ == "__main__":
    main()
