"""Fuse torchvision models with one call and read what was fused.

    python examples/fuse_torchvision.py                       # resnet50 and vit_b_16, eval mode
    python examples/fuse_torchvision.py --train               # the same models in training mode
    python examples/fuse_torchvision.py --models resnet18,mobilenet_v3_small --size 64

gpuaccel.torch.fuse(model, report=True) returns the fused model and a
report: every chain it replaced (Conv2d -> BatchNorm2d -> ReLU becomes one
FusedConv2dBN, whose BatchNorm folds into the conv in eval mode; Linear ->
GELU one FusedLinear) and every Conv2d / Linear it left as it was, with the
reason.  The fused model computes the same function: the script runs both
on one random batch and prints the largest difference.  No weights are
downloaded (weights=None).  Needs torchvision: pip install torchvision.
"""

import argparse
import sys

import torch


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet50,vit_b_16", help="comma-separated torchvision model names "
                        "(default: resnet50,vit_b_16)")
    parser.add_argument("--train", action="store_true", help="fuse the models in training mode (BatchNorms "
                        "then run as before, and fold once the model is put in eval mode)")
    parser.add_argument("--size", type=int, default=224, help="image side of the check batch (default: 224)")
    args = parser.parse_args(argv)
    try:
        import torchvision.models as tvm
    except ImportError:
        print("this example needs torchvision: pip install torchvision", file=sys.stderr)
        return 2
    import gpuaccel.torch as gt

    for name in args.models.split(","):
        torch.manual_seed(0)
        kwargs = {"image_size": args.size} if name.startswith("vit") else {}
        model = getattr(tvm, name)(weights=None, **kwargs).train(args.train)
        # ViT's head starts at zero: random weights, so that the comparison below means something
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and not module.weight.any():
                torch.nn.init.normal_(module.weight, std=0.02)
        fused, report = gt.fuse(model, report=True)
        print(report)
        x = torch.randn(2, 3, args.size, args.size)
        torch.manual_seed(1)
        with torch.no_grad():
            want = model(x)
            torch.manual_seed(1)
            got = fused(x)
        print("largest difference from the original on a random batch (%s mode): %.3g (outputs up to %.3g)\n"
              % ("training" if args.train else "eval", float((got - want).abs().max()), float(want.abs().max())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
