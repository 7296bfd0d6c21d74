"""FusedConv2d (conv + bias + ReLU, forward and backward) vs nn.Conv2d +
nn.ReLU (cudnn.benchmark=True) in torch eager and under torch.compile, side by
side in one run: ResNet-50 layer shapes, batch 128, bfloat16, channels-last on
a GPU; small float32 shapes on the CPU (informational only).

Goals on an H100: >= 1.1x eager, >= 1.0x torch.compile.

    python benchmarks/bench_conv.py [--quick] [--no-compile]
"""

import argparse

import torch

import gpuaccel as ga
from gpuaccel import bench

from common import machine, print_table

# (batch, in channels, out channels, height = width, kernel): the 3x3 and
# 1x1 convolutions of ResNet-50's four stages (tests/test_launch_shapes.py
# checks every gpuaccel kernel's launch shape at these sizes)
RESNET50_SHAPES = [(128, 64, 64, 56, 3), (128, 64, 256, 56, 1), (128, 128, 128, 28, 3), (128, 512, 128, 28, 1),
                   (128, 256, 256, 14, 3), (128, 1024, 256, 14, 1), (128, 512, 512, 7, 3), (128, 2048, 512, 7, 1)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile comparison")
    args = parser.parse_args()
    device = "cuda" if ga.cuda_available() and torch.cuda.is_available() else "cpu"
    print(machine(), "-", bench.device_description(torch, device))
    shapes = None
    if device == "cuda":
        shapes = RESNET50_SHAPES
        if args.quick:
            shapes = shapes[:2]
    rows = bench.bench_conv(torch, device, full=not args.quick, shapes=shapes, compiled=not args.no_compile)
    print_table("conv2d + bias + relu, forward + backward (%s)" % rows[0]["unit"],
                ["case", "gpuaccel", "torch", "ratio"],
                [(r["case"], "%.2f" % r["gpuaccel"], "%.2f" % r["torch"], "%.3fx" % r["ratio"]) for r in rows])
    print("\nconv_stats:", ga.conv_stats())


if __name__ == "__main__":
    main()
