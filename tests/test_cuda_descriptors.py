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

The same for kernels/cuda/matmul.cu's cuBLASLt call: for matmul and
linear with each epilogue (BIAS, RELU_BIAS, GELU_BIAS, GELU_AUX(_BIAS),
DGELU_BGRAD, BGRADB), each transpose and batch case and every dtype, the
four layouts, the matmul descriptor and the preference are built as
ga_cuda_matmul builds them and read back: the row-major to column-major
swap (cuBLASLt's A is our B^T, its m is our N), the leading dimensions,
the epilogue, the bias data type, the aux leading dimension, the compute
and scale types, the reduction schemes of deterministic mode.  (cuBLASLt's
heuristic query needs a device: not asked.)
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
SOURCES = [os.path.join(ROOT, "kernels", "cuda", "conv.cu"), os.path.join(ROOT, "kernels", "cuda", "matmul.cu"),
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


class Matrix(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("rows", ctypes.c_int64),
                ("cols", ctypes.c_int64), ("row_stride", ctypes.c_int64), ("col_stride", ctypes.c_int64),
                ("batch_stride", ctypes.c_int64)]


class MatmulDesc(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64), ("a", Matrix), ("b", Matrix), ("d", Matrix), ("bias", ctypes.c_void_p),
                ("bias_dtype", ctypes.c_int), ("activation", ctypes.c_int), ("preact", Matrix), ("dact", ctypes.c_int),
                ("dact_aux", Matrix), ("col_sums", ctypes.c_void_p), ("col_sums_dtype", ctypes.c_int),
                ("a_row_sums", ctypes.c_void_p), ("a_row_sums_dtype", ctypes.c_int), ("allow_tf32", ctypes.c_int),
                ("deterministic", ctypes.c_int)]


def nvcc():
    for candidate in (os.environ.get("CUDA_HOME") and os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"),
                      shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def library_dir(soname, wheel):
    """The folder of `soname`: torch's NVIDIA wheel's (what users load),
    else the CUDA toolkit's."""
    dirs = [os.path.join(p, "nvidia", wheel, "lib") for p in site.getsitepackages() + sys.path if p]
    dirs.append(os.path.join(os.path.dirname(os.path.dirname(nvcc() or "/x/y")), "lib64"))
    for d in dirs:
        if os.path.exists(os.path.join(d, soname)):
            return d
    return None


@pytest.fixture(scope="module")
def probe():
    compiler = nvcc()
    libdirs = [library_dir("libcudnn.so.9", "cudnn"), library_dir("libcublasLt.so.13", "cu13")]
    if not compiler or None in libdirs:
        pytest.skip("needs nvcc, cuDNN 9 and cuBLASLt 13 (the CUDA toolkit, or torch's NVIDIA wheels)")
    digest = hashlib.sha256()
    for path in sorted(SOURCES + HEADERS):
        with open(path, "rb") as f:
            digest.update(f.read())
    digest.update(repr(libdirs).encode())
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
        cmd = [compiler, "-shared", "-o", tmp, *objects, "-l:libcudnn.so.9", "-l:libcublasLt.so.13",
               "-Xlinker", "-z", "-Xlinker", "defs"]
        for d in libdirs:
            cmd += ["-L" + d, "-Xlinker", "-rpath=" + d]
        link = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert link.returncode == 0, link.stderr[-4000:]
        os.replace(tmp, lib)
    so = ctypes.CDLL(lib)
    so.ga_probe_conv_graph.restype = ctypes.c_int
    so.ga_probe_conv_graph.argtypes = [ctypes.c_int, ctypes.POINTER(Geometry), ctypes.POINTER(Tensor),
                                       ctypes.POINTER(Tensor), ctypes.POINTER(Tensor), ctypes.c_void_p, ctypes.c_int,
                                       ctypes.POINTER(Tensor), ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    so.ga_probe_matmul.restype = ctypes.c_int
    so.ga_probe_matmul.argtypes = [ctypes.POINTER(MatmulDesc), ctypes.c_char_p, ctypes.c_int]
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


# ------------------------------------------------------------------ cuBLASLt

CUDA_TYPE = {FLOAT16: 2, BFLOAT16: 14, FLOAT32: 0, FLOAT64: 1}  # cudaDataType_t
OP_N, OP_T = 0, 1
EPILOGUE = {"default": 1, "relu": 2, "bias": 4, "relu_bias": 6, "gelu": 32, "gelu_bias": 36, "gelu_aux": 160,
            "gelu_aux_bias": 164, "dgelu": 192, "dgelu_bgrad": 208, "bgradb": 512}  # cublasLtEpilogue_t
COMPUTE_32F, COMPUTE_32F_FAST_TF32, COMPUTE_64F = 68, 77, 70  # cublasComputeType_t


def row_major(data, dtype, rows, cols, batch_stride=0):
    return Matrix(data=data, dtype=dtype, rows=rows, cols=cols, row_stride=cols, col_stride=1,
                  batch_stride=batch_stride)


def transposed(data, dtype, rows, cols, batch_stride=0):
    """A rows x cols view of a row-major cols x rows matrix (e.g. weight.T)."""
    return Matrix(data=data, dtype=dtype, rows=rows, cols=cols, row_stride=1, col_stride=rows,
                  batch_stride=batch_stride)


def matmul_case(dtype, m, k, n, b_transposed=False, batch=1, bias=False, act=NONE, preact=False, dact=NONE,
                col_sums=False, a_row_sums=False, tf32=False, deterministic=False):
    d = MatmulDesc(batch=batch, bias_dtype=dtype, activation=act, dact=dact, allow_tf32=int(tf32),
                   deterministic=int(deterministic), col_sums_dtype=dtype, a_row_sums_dtype=dtype)
    d.a = row_major(0x100000, dtype, m, k, m * k if batch > 1 else 0)
    d.b = (transposed if b_transposed else row_major)(0x200000, dtype, k, n, k * n if batch > 1 else 0)
    d.d = row_major(0x300000, dtype, m, n, m * n if batch > 1 else 0)
    if bias:
        d.bias = 0x400000
    if preact:
        d.preact = row_major(0x500000, dtype, m, n, m * n if batch > 1 else 0)
    if dact != NONE:
        d.dact_aux = row_major(0x600000, dtype, m, n, m * n if batch > 1 else 0)
    if col_sums:
        d.col_sums = 0x700000
    if a_row_sums:
        d.a_row_sums = 0x800000
    return d


def probe_matmul(so, desc):
    out = ctypes.create_string_buffer(1 << 14)
    assert so.ga_probe_matmul(ctypes.byref(desc), out, len(out)) == 0
    return json.loads(out.value.decode())


MATMULS = {
    # name: (matmul_case kwargs, the epilogue cuBLASLt must be given)
    "plain": (dict(), "default"),
    "bias": (dict(bias=True), "bias"),
    "relu": (dict(act=RELU), "relu"),
    "relu_bias": (dict(bias=True, act=RELU), "relu_bias"),
    "gelu_bias": (dict(bias=True, act=GELU), "gelu_bias"),
    "gelu_aux": (dict(act=GELU, preact=True), "gelu_aux"),
    "gelu_aux_bias": (dict(bias=True, act=GELU, preact=True), "gelu_aux_bias"),
    "linear (weight.T)": (dict(b_transposed=True, bias=True, act=GELU), "gelu_bias"),
    "batched": (dict(batch=3, bias=True), "bias"),
    "batched gelu_aux": (dict(batch=3, act=GELU, preact=True), "gelu_aux"),
    "dgelu": (dict(dact=GELU), "dgelu"),
    "dgelu_bgrad": (dict(dact=GELU, col_sums=True), "dgelu_bgrad"),
    "bgradb": (dict(a_row_sums=True), "bgradb"),
}


@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16, FLOAT32, FLOAT64], ids=NAMES.get)
@pytest.mark.parametrize("case", list(MATMULS))
def test_cublaslt_descriptors_describe_the_intended_math(probe, case, dtype):
    kwargs, epilogue = MATMULS[case]
    m, k, n = 40, 24, 56  # multiples of 8: every aux/bias alignment cuBLASLt asks for holds
    batch = kwargs.get("batch", 1)
    r = probe_matmul(probe, matmul_case(dtype, m, k, n, **kwargs))
    assert r["fused"] and r["describable"], r
    assert "error" not in r, r
    # row-major D = A @ B is column-major D^T = B^T @ A^T: cuBLASLt's A is our B, its B our A, m = N, n = M
    if kwargs.get("b_transposed"):
        assert r["transa"] == OP_T and (r["a"]["rows"], r["a"]["cols"], r["a"]["ld"]) == (k, n, k), r["a"]
    else:
        assert r["transa"] == OP_N and (r["a"]["rows"], r["a"]["cols"], r["a"]["ld"]) == (n, k, n), r["a"]
    assert r["transb"] == OP_N and (r["b"]["rows"], r["b"]["cols"], r["b"]["ld"]) == (k, m, k), r["b"]
    for name in ("c", "d"):
        assert (r[name]["rows"], r[name]["cols"], r[name]["ld"]) == (n, m, n), r[name]
        assert r[name]["type"] == CUDA_TYPE[dtype]
    assert r["a"]["type"] == r["b"]["type"] == CUDA_TYPE[dtype]
    assert all(r[x]["order"] in (0, "null") for x in "abcd")  # column-major (the default)
    if batch > 1:
        assert [r[x]["batch"] for x in "abcd"] == [batch] * 4
        assert [r[x]["batch_stride"] for x in "abcd"] == [k * n, m * k, m * n, m * n]
    assert r["epilogue"] == EPILOGUE[epilogue], (r["epilogue"], epilogue)
    if epilogue in ("bias", "relu_bias", "gelu_bias", "gelu_aux_bias", "dgelu_bgrad", "bgradb"):
        assert r["bias_type"] == CUDA_TYPE[dtype]
        pointer = {"dgelu_bgrad": 0x700000, "bgradb": 0x800000}.get(epilogue, 0x400000)
        assert r["bias_pointer"] == pointer
    if "aux" in epilogue or epilogue.startswith("dgelu"):
        assert r["aux_ld"] == n and r["aux_pointer"] == (0x600000 if epilogue.startswith("dgelu") else 0x500000)
        if batch > 1:
            assert r["aux_batch_stride"] == m * n
    assert r["compute"] == (COMPUTE_64F if dtype == FLOAT64 else COMPUTE_32F)
    assert r["scale_type"] == (CUDA_TYPE[FLOAT64] if dtype == FLOAT64 else CUDA_TYPE[FLOAT32])


@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_cublaslt_compute_type_and_reduction_follow_the_settings(probe, tf32, deterministic):
    r = probe_matmul(probe, matmul_case(FLOAT32, 16, 16, 16, tf32=tf32, deterministic=deterministic))
    assert r["compute"] == (COMPUTE_32F_FAST_TF32 if tf32 else COMPUTE_32F)
    assert r["reduction_scheme_mask"] == (0 if deterministic else 7)  # NONE: no split-K reduction at all


def test_cublaslt_refuses_what_it_cannot_describe(probe):
    # a column-strided operand (no unit stride): the unfused path's generic kernel takes it
    d = matmul_case(FLOAT32, 8, 8, 8)
    d.a.col_stride, d.a.row_stride = 2, 16
    assert probe_matmul(probe, d)["describable"] is False
    # an aux (pre-activation) leading dimension that is not a multiple of 8: GELU_AUX cannot take it
    d = matmul_case(FLOAT16, 8, 8, 12, act=GELU, preact=True)
    assert probe_matmul(probe, d)["describable"] is False
