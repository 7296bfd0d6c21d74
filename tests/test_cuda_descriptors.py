"""cuDNN's descriptors as kernels/cuda/conv.cu builds them, checked against
the real library on a machine without a GPU.

cuDNN loads and validates device-less: every tensor, convolution,
pointwise, operation and operation-graph descriptor finalizes, the variant
pack finalizes, and heuristics mode A returns engine configs.  This test
compiles conv.cu *from this tree* with GA_DESCRIPTOR_PROBE (a test-only
entry point at its end; the extension never has it) together with
descriptors/probe_stubs.cu into a small library linked to the real
libcudnn (torch's NVIDIA wheel, else the CUDA toolkit's), builds the graph
of every variant gpuaccel can build — forward, backward-data,
backward-filter; float16/bfloat16/float32/float64; NCHW/NHWC; groups,
dilation, stride and padding that differ; the fused forward with and
without bias, with none/relu/gelu and with and without a saved
pre-activation — reads every finalized descriptor back and checks that it
describes the intended math: dims, strides, data and compute types,
paddings, strides, dilations, the pointwise chain, the variant pack's
UIDs.  It also reports how many engine configs heuristics mode A offers
each graph (a fused graph with none is a fusion that never runs).

cuBLASLt's matmul descriptors are not covered here (see the closing note
of issue 19): its heuristic query needs a device.
"""

import ctypes
import glob
import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = [os.path.join(ROOT, "kernels", "cuda", "conv.cu"),
           os.path.join(ROOT, "tests", "descriptors", "probe_stubs.cu")]
HEADERS = (glob.glob(os.path.join(ROOT, "kernels", "*.h")) + glob.glob(os.path.join(ROOT, "kernels", "cuda", "*.h")) +
           glob.glob(os.path.join(ROOT, "kernels", "cuda", "*.cuh")))

FLOAT16, BFLOAT16, FLOAT32, FLOAT64 = 6, 7, 8, 9  # ga_dtype (kernels/kernels.h)
ITEMSIZE = {FLOAT16: 2, BFLOAT16: 2, FLOAT32: 4, FLOAT64: 8}
NAMES = {FLOAT16: "float16", BFLOAT16: "bfloat16", FLOAT32: "float32", FLOAT64: "float64"}
CUDNN_TYPE = {FLOAT16: 2, BFLOAT16: 9, FLOAT32: 0, FLOAT64: 1}  # cudnnDataType_t: HALF, BFLOAT16, FLOAT, DOUBLE
FWD, BWD_DATA, BWD_FILTER = 0, 1, 2
NONE, RELU, GELU = 0, 1, 2
UID_X, UID_W, UID_Y, UID_BIAS, UID_PREACT = 1, 2, 3, 4, 5


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * 32), ("strides", ctypes.c_int64 * 32)]


class Geometry(ctypes.Structure):
    _fields_ = [("stride", ctypes.c_int * 2), ("padding", ctypes.c_int * 2), ("dilation", ctypes.c_int * 2),
                ("groups", ctypes.c_int), ("allow_tf32", ctypes.c_int), ("deterministic", ctypes.c_int)]


def nvcc():
    for candidate in (os.environ.get("CUDA_HOME") and os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"),
                      shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def cudnn_library():
    """libcudnn.so.9: torch's NVIDIA wheel's (what users load), else the toolkit's."""
    dirs = [os.path.join(p, "nvidia", "cudnn", "lib") for p in site.getsitepackages() + sys.path if p]
    dirs.append(os.path.join(os.path.dirname(os.path.dirname(nvcc() or "/x/y")), "lib64"))
    for d in dirs:
        if os.path.exists(os.path.join(d, "libcudnn.so.9")):
            return d
    return None


@pytest.fixture(scope="module")
def probe():
    compiler, libdir = nvcc(), cudnn_library()
    if not compiler or not libdir:
        pytest.skip("needs nvcc and cuDNN 9 (the CUDA toolkit, or torch's nvidia-cudnn wheel)")
    digest = hashlib.sha256()
    for path in sorted(SOURCES + HEADERS):
        with open(path, "rb") as f:
            digest.update(f.read())
    digest.update(libdir.encode())
    folder = os.path.join(tempfile.gettempdir(), "gpuaccel-descriptor-probe-" + digest.hexdigest()[:16])
    lib = os.path.join(folder, "libprobe.so")
    if not os.path.exists(lib):
        os.makedirs(folder, exist_ok=True)
        include = os.path.join(os.path.dirname(os.path.dirname(compiler)), "include")
        objects = []
        for src in SOURCES:
            obj = os.path.join(folder, os.path.basename(src) + ".o")
            cmd = [compiler, "-c", src, "-o", obj, "-std=c++17", "-O0", "-Xcompiler", "-fPIC",
                   "-DGA_DESCRIPTOR_PROBE", "-I" + ROOT, "-I" + include]
            build = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            assert build.returncode == 0, build.stderr[-4000:]
            objects.append(obj)
        tmp = lib + ".%d.tmp" % os.getpid()
        cmd = [compiler, "-shared", "-o", tmp, *objects, "-L" + libdir, "-l:libcudnn.so.9",
               "-Xlinker", "-rpath=" + libdir, "-Xlinker", "-z", "-Xlinker", "defs"]
        link = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert link.returncode == 0, link.stderr[-4000:]
        os.replace(tmp, lib)
    so = ctypes.CDLL(lib)
    so.ga_probe_conv_graph.restype = ctypes.c_int
    so.ga_probe_conv_graph.argtypes = [ctypes.c_int, ctypes.POINTER(Geometry), ctypes.POINTER(Tensor),
                                       ctypes.POINTER(Tensor), ctypes.POINTER(Tensor), ctypes.c_void_p, ctypes.c_int,
                                       ctypes.POINTER(Tensor), ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    return so


def packed(dims, nhwc):
    """Element strides of a packed NCHW-ordered tensor in the layout."""
    n, c, h, w = dims
    return (h * w * c, 1, w * c, c) if nhwc else (c * h * w, h * w, w, 1)


def tensor(dims, dtype, nhwc, address):
    t = Tensor(data=address, dtype=dtype, ndim=4)
    for i, (d, s) in enumerate(zip(dims, packed(dims, nhwc))):
        t.shape[i] = d
        t.strides[i] = s * ITEMSIZE[dtype]
    return t


def out_size(h, r, stride, pad, dil):
    return (h + 2 * pad - dil * (r - 1) - 1) // stride + 1


GEOMETRIES = {
    # name: (N, C, H, W, K, R, S, stride, padding, dilation, groups)
    "3x3": (2, 8, 11, 9, 16, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    "strided-dilated-grouped": (3, 8, 13, 17, 12, 3, 5, (2, 1), (0, 2), (1, 2), 4),
    "1x1": (2, 32, 7, 7, 24, 1, 1, (1, 1), (0, 0), (1, 1), 1),
}


def run_probe(so, op, dtype, nhwc, geometry, bias=False, act=NONE, preact=False, fused=False):
    n, c, h, w, k, r, s, stride, pad, dil, groups = GEOMETRIES[geometry]
    p, q = out_size(h, r, stride[0], pad[0], dil[0]), out_size(w, s, stride[1], pad[1], dil[1])
    dims = {"x": (n, c, h, w), "w": (k, c // groups, r, s), "y": (n, k, p, q)}
    x, wt, y = (tensor(dims[name], dtype, nhwc, address) for name, address in
                (("x", 0x100000), ("w", 0x200000), ("y", 0x300000)))
    z = tensor(dims["y"], dtype, nhwc, 0x400000) if preact else Tensor()
    geom = Geometry()
    geom.stride[:], geom.padding[:], geom.dilation[:], geom.groups = stride, pad, dil, groups
    out = ctypes.create_string_buffer(1 << 16)
    rc = so.ga_probe_conv_graph(op, ctypes.byref(geom), ctypes.byref(x), ctypes.byref(wt), ctypes.byref(y),
                                0x500000 if bias else None, act, ctypes.byref(z), int(fused), out, len(out))
    assert rc == 0
    report = json.loads(out.value.decode())
    expected = dict(dims=dims, stride=list(stride), pad=list(pad), dil=list(dil))
    return report, expected


def check_graph(report, expected, dtype, nhwc, op, bias=False, act=NONE, preact=False, fused=False):
    assert "error" not in report, report.get("error")
    assert report["eligible"] and report["nhwc"] == nhwc
    parts = report["parts"]
    tensors = {t["uid"]: t for t in parts if t["kind"] == "tensor"}
    real = [UID_X, UID_W, UID_Y]
    if fused and bias:
        real.append(UID_BIAS)
    if fused and preact and act != NONE:
        real.append(UID_PREACT)
    assert sorted(uid for uid, t in tensors.items() if not t["virtual"]) == sorted(real)
    # the variant pack execute_plan builds (UIDs and data pointers of the real tensors) finalizes
    assert not report["variant_pack_error"], report["variant_pack_error"]
    assert sorted(report["real_uids"]) == sorted(real)
    for uid, role in ((UID_X, "x"), (UID_W, "w"), (UID_Y, "y")):
        t = tensors[uid]
        assert t["dims"] == list(expected["dims"][role]), (role, t)
        assert t["strides"] == list(packed(expected["dims"][role], nhwc)), (role, t)
        assert t["type"] == CUDNN_TYPE[dtype], (role, t)
    if UID_BIAS in tensors:  # one value per output channel, broadcast over N, H, W
        assert tensors[UID_BIAS]["dims"] == [1, expected["dims"]["y"][1], 1, 1]
    if UID_PREACT in tensors:
        assert tensors[UID_PREACT]["dims"] == list(expected["dims"]["y"])
    compute = CUDNN_TYPE[FLOAT64] if dtype == FLOAT64 else CUDNN_TYPE[FLOAT32]
    for t in tensors.values():
        if t["virtual"]:  # intermediates in the compute type, y's shape
            assert t["type"] == compute and t["dims"] == list(expected["dims"]["y"]), t
    convs = [pt for pt in parts if pt["kind"] == "conv"]
    assert len(convs) == 1
    conv = convs[0]
    assert conv["spatial"] == 2 and conv["compute_type"] == compute, conv
    assert conv["mode"] == "cross_correlation", conv  # what DL frameworks call a convolution
    assert conv["pre_paddings"] == expected["pad"] and conv["post_paddings"] == expected["pad"]
    assert conv["strides"] == expected["stride"] and conv["dilations"] == expected["dil"]
    # cuDNN 9 reads pointwise and operation descriptors back not at all: the chain is checked by its
    # length (conv, [+ bias], [act]); its modes only by heuristics and, on a GPU, by the results
    pointwise = int(fused and bias) + int(fused and act != NONE)
    assert report["operations"] in (1 + pointwise, -1), report["operations"]
    assert sum(pt["kind"] == "other" for pt in parts) == 1 + 2 * pointwise  # conv op, pointwise desc + op each


CONFIGS = {}  # variant -> engine configs, reported at the end


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("nhwc", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16, FLOAT32, FLOAT64], ids=NAMES.get)
@pytest.mark.parametrize("op", [FWD, BWD_DATA, BWD_FILTER], ids=["fwd", "bwd_data", "bwd_filter"])
def test_convolution_graphs_describe_the_intended_math(probe, op, dtype, nhwc, geometry):
    report, expected = run_probe(probe, op, dtype, nhwc, geometry)
    check_graph(report, expected, dtype, nhwc, op)
    CONFIGS["%s %s %s %s" % (["fwd", "bwd_data", "bwd_filter"][op], NAMES[dtype], "NHWC" if nhwc else "NCHW",
                              geometry)] = report["engine_configs"]
    # every plain convolution gpuaccel builds has engines (3 to 30 here): none would mean a graph
    # cuDNN can describe but never run
    assert report["engine_configs"] > 0, (report["engine_configs"], report["heuristics_error"])


FUSED = [pytest.param(bias, act, preact, id="%s-%s%s" % ("bias" if bias else "nobias", ["none", "relu", "gelu"][act],
                                                          "-preact" if preact else ""))
         for bias in (False, True) for act in (NONE, RELU, GELU) for preact in (False, True)
         if bias or act != NONE]  # a conv with neither is the plain graph above


@pytest.mark.parametrize("bias, act, preact", FUSED)
@pytest.mark.parametrize("nhwc", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16, FLOAT32], ids=NAMES.get)
def test_fused_forward_graphs_describe_the_intended_math(probe, dtype, nhwc, bias, act, preact):
    report, expected = run_probe(probe, FWD, dtype, nhwc, "3x3", bias, act, preact, fused=True)
    check_graph(report, expected, dtype, nhwc, FWD, bias, act, preact, fused=True)
    CONFIGS["fused %s %s bias=%d act=%s preact=%d" % (NAMES[dtype], "NHWC" if nhwc else "NCHW", bias,
                                                      ["none", "relu", "gelu"][act], preact)] = \
        report["engine_configs"]
    assert report["engine_configs"] >= 0, report["heuristics_error"]


def test_report_engine_configs(probe):
    """Last: heuristics mode A's engine configs per variant (see -s)."""
    if not CONFIGS:
        pytest.skip("no variant ran")
    width = max(map(len, CONFIGS))
    print("\nengine configs (cuDNN heuristics mode A, device-less):")
    for name, count in sorted(CONFIGS.items()):
        print("  %-*s  %d" % (width, name, count))
