"""Export a model built with gpuaccel's fused layers to ONNX, then check it
in onnxruntime against torch: the deployment path (ONNX, then TensorRT or
any other runtime).

    python examples/export_onnx.py                      # TorchScript exporter
    python examples/export_onnx.py --dynamo             # torch.export-based exporter
    python examples/export_onnx.py --exported-program   # torch.export.export first, then ONNX
    python examples/export_onnx.py --out model.onnx

The fused layers are written with ONNX's standard operators (Conv, Gemm or
MatMul + Add, and the activation's: Relu, Gelu or its Erf form, Sigmoid,
...): no custom domain, so the file runs wherever ONNX does.  Needs onnx and onnxruntime (and onnxscript
for --dynamo): pip install onnx onnxscript onnxruntime.
"""

import argparse
import os
import sys
import tempfile

import numpy as np
import torch

from train import make_model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dynamo", action="store_true", help="use the torch.export-based exporter (dynamo=True)")
    parser.add_argument("--exported-program", action="store_true",
                        help="export with torch.export.export first (which keeps the fused ops), then convert "
                             "that ExportedProgram")
    parser.add_argument("--out", default=None, help="where to write the .onnx file (default: a temporary folder)")
    parser.add_argument("--batch-size", type=int, default=8, help="batch size of the exported graph (default: 8)")
    args = parser.parse_args(argv)
    try:
        import onnx
        import onnxruntime
    except ImportError:
        print("this example needs onnx and onnxruntime: pip install onnx onnxscript onnxruntime", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    model = make_model().eval()              # FusedConv2d / FusedLinear inside
    x = torch.randn(args.batch_size, 3, 32, 32)
    with tempfile.TemporaryDirectory() as folder:  # without --out, the file goes when checked
        path = args.out or os.path.join(folder, "model.onnx")
        if args.exported_program:
            torch.onnx.export(torch.export.export(model, (x,)), (x,), path, input_names=["images"],
                              output_names=["logits"])
        else:
            torch.onnx.export(model, (x,), path, dynamo=args.dynamo, input_names=["images"],
                              output_names=["logits"])
        graph = onnx.load(path).graph
        print("exported %s: %s" % (path, ", ".join(sorted({node.op_type for node in graph.node}))))
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        want = model(x).numpy()
    error = float(np.abs(got - want).max())
    print("onnxruntime vs torch: largest difference %.2g" % error)
    return 0 if error < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
