"""kernels/cuda's cuDNN descriptors, built by its own code against the real
cuDNN with no GPU, and checked against the math each call asks for.

The real libcudnn loads and validates descriptors without a device: every
attribute is set and every descriptor finalized by the library itself.
tests/descriptors/ is a small probe that includes kernels/cuda/conv.cu from
the source tree this file lives in (so a change there is tested without
reinstalling), builds each graph conv.cu would build for a case with conv.cu's
own functions, records every descriptor call it makes (the link wraps them),
reads back what cuDNN can read back of the finalized descriptors, builds the
variant pack, and asks heuristics mode A for engine configs.  This file sends
the cases, and checks what comes back against the convolution each case asks
for: dims and strides of every tensor in the layout asked for, the
convolution's paddings, strides and dilations, the data and compute types,
the operation chain conv [-> add bias] [-> activation] with the pre-activation
saved where asked, and the variant pack's pairing of tensor ids and pointers.

The libraries come from the NVIDIA wheels torch installs (nvidia-cudnn-cu13,
the CUDA 13 wheels) or from the CUDA toolkit (CUDA_HOME, /usr/local/cuda);
g++ builds the probe.  Without either the tests skip and say what is missing.
"""

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE_DIR = os.path.join(ROOT, "tests", "descriptors")
PROBE_SOURCES = ["main.cpp", "conv_probe.cpp", "matmul_probe.cpp"]
WRAPPED = ["cudnnBackendCreateDescriptor", "cudnnBackendSetAttribute", "cudnnBackendFinalize",
           "cudnnBackendDestroyDescriptor"]

# ------------------------------------------------------------ the libraries


def _site_dirs():
    dirs = [sysconfig.get_paths().get(k) for k in ("purelib", "platlib")] + list(sys.path)
    seen, out = set(), []
    for d in dirs:
        if d and os.path.isdir(d) and d not in seen:
            seen.add(d)
            out.append(d)
    return out


def _lib(folder, stem):
    """libSTEM.so.N (or libSTEM.so) in folder, else None."""
    hits = sorted(glob.glob(os.path.join(folder, "lib%s.so.[0-9]*" % stem)))
    hits = [h for h in hits if re.fullmatch(r"lib%s\.so\.\d+" % stem, os.path.basename(h))] or hits
    if hits:
        return hits[0]
    plain = os.path.join(folder, "lib%s.so" % stem)
    return plain if os.path.exists(plain) else None


def find_libraries():
    """(include dirs, library files) for cuDNN, cuBLASLt and the CUDA runtime,
    each header beside its own library; or (None, what is missing)."""
    cudnn, cuda = [], []
    for site in _site_dirs():
        cudnn.append((os.path.join(site, "nvidia", "cudnn", "include"), os.path.join(site, "nvidia", "cudnn", "lib")))
        cuda.append((os.path.join(site, "nvidia", "cu13", "include"), os.path.join(site, "nvidia", "cu13", "lib")))
    for home in filter(None, [os.environ.get("CUDNN_HOME"), os.environ.get("CUDA_HOME"),
                              os.environ.get("CUDA_PATH"), "/usr/local/cuda"]):
        cudnn.append((os.path.join(home, "include"), os.path.join(home, "lib64")))
    for home in filter(None, [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]):
        cuda.append((os.path.join(home, "include"), os.path.join(home, "lib64")))
    found_cudnn = next(((inc, _lib(lib, "cudnn")) for inc, lib in cudnn
                        if os.path.exists(os.path.join(inc, "cudnn_graph.h")) and _lib(lib, "cudnn")), None)
    found_cuda = next(((inc, _lib(lib, "cublasLt"), _lib(lib, "cudart")) for inc, lib in cuda
                       if all(os.path.exists(os.path.join(inc, h))
                              for h in ("cublasLt.h", "cuda_runtime.h", "nvtx3/nvToolsExt.h"))
                       and _lib(lib, "cublasLt") and _lib(lib, "cudart")), None)
    missing = []
    if not found_cudnn:
        missing.append("cuDNN 9 (cudnn_graph.h and libcudnn.so.9: the nvidia-cudnn-cu13 wheel or CUDA_HOME)")
    if not found_cuda:
        missing.append("cuBLASLt and the CUDA runtime (cublasLt.h, cuda_runtime.h, nvtx3, libcublasLt, "
                       "libcudart: the nvidia CUDA 13 wheels or CUDA_HOME)")
    if missing:
        return None, " and ".join(missing)
    return [found_cudnn[0], found_cuda[0]], [found_cudnn[1], found_cuda[1], found_cuda[2]]


INCLUDES, LIBRARIES = find_libraries()
CXX = shutil.which("g++")
SKIP_REASON = None
if INCLUDES is None:
    SKIP_REASON = "needs " + LIBRARIES
elif not CXX:
    SKIP_REASON = "needs g++ to build the descriptor probe"


def _inputs():
    """Every file the probe is built from."""
    files = [os.path.join(PROBE_DIR, f) for f in PROBE_SOURCES + ["probe.h"]]
    for pattern in ("kernels/*.h", "kernels/cuda/*.cu", "kernels/cuda/*.cuh", "kernels/cuda/*.h"):
        files += sorted(glob.glob(os.path.join(ROOT, pattern)))
    return files


def tool_env(**extra):
    """The compiler's and the probe's environment: without the sanitizer
    runtime CI's ASan step preloads into Python (under it, g++'s own leaks
    fail the build)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(extra)
    return env


def build_probe():
    """The probe, built under the temp dir in a folder named by the hash of
    its sources, flags and libraries: a changed kernels/cuda rebuilds it."""
    flags = ["-std=c++17", "-O0", "-Wall", "-Wno-unused-function", "-ffunction-sections", "-fdata-sections",
             "-I" + ROOT] + ["-I" + d for d in INCLUDES]
    digest = hashlib.sha256()
    for path in _inputs():
        digest.update(path.encode() + b"\0" + open(path, "rb").read())
    digest.update(json.dumps([CXX, flags, LIBRARIES]).encode())
    out = os.path.join(tempfile.gettempdir(), "gpuaccel-descriptor-probe-" + digest.hexdigest()[:20])
    probe = os.path.join(out, "probe")
    if os.path.exists(probe):
        return probe
    work = tempfile.mkdtemp(prefix="gpuaccel-probe-build-")
    objects = []
    procs = []
    for src in PROBE_SOURCES:
        obj = os.path.join(work, src + ".o")
        objects.append(obj)
        procs.append((src, subprocess.Popen([CXX] + flags + ["-c", os.path.join(PROBE_DIR, src), "-o", obj],
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                            env=tool_env())))
    for src, proc in procs:
        text = proc.communicate()[0]
        if proc.returncode:
            raise RuntimeError("compiling tests/descriptors/%s failed:\n%s" % (src, text[-8000:]))
    lib_dirs = sorted({os.path.dirname(p) for p in LIBRARIES})
    link = [CXX] + objects + ["-o", os.path.join(work, "probe"), "-Wl,--gc-sections",
                              "-Wl," + ",".join("--wrap=" + f for f in WRAPPED)]
    link += ["-L" + d for d in lib_dirs] + ["-l:" + os.path.basename(p) for p in LIBRARIES]
    link += ["-Wl,-rpath," + d for d in lib_dirs] + ["-pthread", "-ldl"]
    proc = subprocess.run(link, capture_output=True, text=True, env=tool_env())
    if proc.returncode:
        raise RuntimeError("linking the descriptor probe failed:\n" + proc.stderr[-8000:])
    os.makedirs(out, exist_ok=True)
    os.replace(os.path.join(work, "probe"), probe)  # atomic: a parallel run sees all or nothing
    shutil.rmtree(work, ignore_errors=True)
    return probe


def run_probe(lines):
    """(versions, replies) for the case lines."""
    env = tool_env(LD_LIBRARY_PATH=os.pathsep.join(sorted({os.path.dirname(p) for p in LIBRARIES})
                                                   + [os.environ.get("LD_LIBRARY_PATH", "")]))
    proc = subprocess.run([build_probe()], input="\n".join(lines) + "\n", capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, "the probe failed (%d):\n%s" % (proc.returncode, proc.stderr[-4000:])
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert len(out) == len(lines) + 1, proc.stderr[-4000:]
    for reply in out[1:]:
        assert "protocol_error" not in reply, reply
    return out[0], out[1:]


# --------------------------------------------------------- cuDNN's enums


def _term(text, values):
    text = text.strip().strip("()").strip()
    if re.fullmatch(r"0x[0-9a-fA-F]+|\d+", text):
        return int(text, 0)
    return values.get(text)


def header_enums(header):
    """NAME -> value of every enum constant in a cuDNN or CUDA header (implicit
    values counted on), so that the checks name attributes and types as
    cuDNN's documentation does."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", open(header).read(), flags=re.S)
    values = {}
    for body in re.findall(r"typedef\s+enum\s*\w*\s*\{(.*?)\}", text, flags=re.S):
        nxt = 0
        for item in body.split(","):
            m = re.match(r"\s*(\w+)(?:\s+CUDNN_DEPRECATED_ENUM)?\s*(?:=\s*(.+))?$", item.strip(), flags=re.S)
            if not m:
                continue
            name, expr = m.group(1), m.group(2)
            if expr is not None:
                expr = expr.strip()
                if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", expr):
                    nxt = int(expr, 0)
                elif all(_term(part, values) is not None for part in expr.strip("()").split("|")):
                    nxt = 0
                    for part in expr.strip("()").split("|"):
                        nxt |= _term(part, values)
                else:
                    continue  # a computed value these checks do not use
            values[name] = nxt
            nxt += 1
    return values


@pytest.fixture(scope="module")
def cudnn_enums():
    return header_enums(os.path.join(INCLUDES[0], "cudnn_graph.h"))


# ----------------------------------------------------------------- cases

DTYPES = ["float16", "bfloat16", "float32", "float64"]
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
IO_TYPE = {"float16": "CUDNN_DATA_HALF", "bfloat16": "CUDNN_DATA_BFLOAT16", "float32": "CUDNN_DATA_FLOAT",
           "float64": "CUDNN_DATA_DOUBLE"}
POINTER = {"x": 0x1000000, "w": 0x2000000, "y": 0x3000000, "bias": 0x4000000, "preact": 0x5000000,
           "ws": 0x6000000}
WORKSPACE = 1 << 20

# (N, C, H, W, K, R, S, stride, padding, dilation, groups): odd sizes,
# stride != padding, dilation, groups (depthwise too), a 1x1 filter over a
# batch of one (size-1 dims, whose strides the graph normalizes)
GEOMETRIES = [
    (2, 6, 9, 11, 10, 3, 5, (2, 1), (1, 2), (1, 1), 1),
    (3, 8, 13, 7, 12, 3, 3, (1, 2), (2, 0), (2, 1), 2),
    (1, 9, 5, 6, 9, 1, 1, (1, 1), (0, 0), (1, 1), 3),
    (2, 4, 7, 9, 8, 3, 3, (2, 2), (1, 3), (2, 2), 4),
]

# (bias, activation, preact): every forward epilogue gpuaccel fuses, each
# activation with and without a bias and a saved pre-activation
EPILOGUES = [(True, "none", False), (True, "none", True), (False, "relu", False), (True, "relu", False),
             (True, "relu", True), (False, "relu", True), (False, "gelu_tanh", False), (True, "gelu_tanh", False),
             (True, "gelu_tanh", True), (False, "gelu_tanh", True), (True, "gelu", False), (False, "gelu", True),
             (True, "gelu", True), (False, "silu", False), (True, "silu", True), (True, "sigmoid", False),
             (False, "sigmoid", True), (True, "hardswish", False), (True, "hardswish", True),
             (False, "hardswish", False)]
# cuDNN's pointwise mode for each activation (cudnn_graph.h); hardswish has none
POINTWISE_MODE = {"relu": "CUDNN_POINTWISE_RELU_FWD", "gelu": "CUDNN_POINTWISE_GELU_FWD",
                  "gelu_tanh": "CUDNN_POINTWISE_GELU_APPROX_TANH_FWD", "silu": "CUDNN_POINTWISE_SWISH_FWD",
                  "sigmoid": "CUDNN_POINTWISE_SIGMOID_FWD"}


def packed_strides(dims, nhwc):
    """Element strides of a packed NCHW-ordered tensor stored NCHW or NHWC."""
    n, c, h, w = dims
    return [c * h * w, 1, w * c, c] if nhwc else [c * h * w, h * w, w, 1]


def out_size(size, k, stride, pad, dil):
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


class ConvCase:
    def __init__(self, name, dtype, layout, op, geometry, bias=False, act="none", preact=False):
        self.name, self.dtype, self.op = name, dtype, op
        self.nhwc = layout == "nhwc"
        n, c, h, w, k, r, s, self.stride, self.padding, self.dilation, self.groups = geometry
        p = out_size(h, r, self.stride[0], self.padding[0], self.dilation[0])
        q = out_size(w, s, self.stride[1], self.padding[1], self.dilation[1])
        self.dims = {"x": [n, c, h, w], "w": [k, c // self.groups, r, s], "y": [n, k, p, q]}
        self.dims["preact"] = self.dims["y"]
        self.dims["bias"] = [1, k, 1, 1]
        self.bias, self.act, self.preact = bias, act, preact

    def line(self):
        size = ITEMSIZE[self.dtype]

        def spec(role):
            strides = [s * size for s in packed_strides(self.dims[role], self.nhwc)]
            return "%s=%#x:%s:%s" % (role, POINTER[role], ",".join(map(str, self.dims[role])),
                                     ",".join(map(str, strides)))

        words = ["probe=conv", "id=" + self.name, "dtype=" + self.dtype, "op=" + self.op, spec("x"), spec("w"),
                 spec("y"), "stride=%d,%d" % self.stride, "padding=%d,%d" % self.padding,
                 "dilation=%d,%d" % self.dilation, "groups=%d" % self.groups, "act=" + self.act,
                 "ws=%#x" % POINTER["ws"], "ws_size=%d" % WORKSPACE]
        if self.bias:
            words.append("bias=%#x" % POINTER["bias"])
        if self.preact:
            words.append(spec("preact"))
        return " ".join(words)

    @property
    def fused(self):
        """A forward epilogue cuDNN can fuse into the graph (its activation
        one of cuDNN's pointwise modes)."""
        return self.op == "fwd" and (self.bias or self.act != "none") and (
            self.act == "none" or self.act in POINTWISE_MODE)


def conv_cases():
    cases = []
    for di, dtype in enumerate(DTYPES):
        for li, layout in enumerate(["nchw", "nhwc"]):
            tag = "%s-%s" % (dtype, layout)
            for oi, op in enumerate(["fwd", "bwd_data", "bwd_filter"]):
                geometry = GEOMETRIES[(di + li + oi) % len(GEOMETRIES)]
                cases.append(ConvCase("%s-%s-g%d" % (tag, op, GEOMETRIES.index(geometry)), dtype, layout, op,
                                      geometry))
            for ei, (bias, act, preact) in enumerate(EPILOGUES):
                geometry = GEOMETRIES[(di + li + ei) % len(GEOMETRIES)]
                name = "%s-fwd-%s%s%s-g%d" % (tag, "bias-" if bias else "", act, "-preact" if preact else "",
                                               GEOMETRIES.index(geometry))
                cases.append(ConvCase(name, dtype, layout, "fwd", geometry, bias, act, preact))
    return cases


CONV_CASES = conv_cases()


@pytest.fixture(scope="module")
def conv_replies():
    if SKIP_REASON:
        pytest.skip(SKIP_REASON)
    versions, replies = run_probe([c.line() for c in CONV_CASES])
    return versions, {r["id"]: r for r in replies}


# -------------------------------------------------------------- checking


class Graph:
    """A graph as the recorded descriptor calls describe it."""

    def __init__(self, reply, enums):
        self.e = enums
        self.descs = {d["id"]: d for d in reply["descriptors"]}
        self.reply = reply

    def attrs(self, desc):
        return {a["name"]: a for a in desc["attrs"]}

    def value(self, desc, name, type_name, count=None):
        """The values set for attribute `name`, checked to be set once with
        cuDNN's documented type (and element count)."""
        attr_id = self.e[name]
        found = [a for a in desc["attrs"] if a["name"] == attr_id]
        assert len(found) == 1, "%s set %d times on descriptor %d" % (name, len(found), desc["id"])
        a = found[0]
        assert a["type"] == self.e[type_name], "%s set as type %d, cuDNN wants %s" % (name, a["type"], type_name)
        if count is not None:
            assert a["count"] == count, "%s set with %d elements, cuDNN wants %d" % (name, a["count"], count)
        assert a["status"] == 0, "cuDNN refused %s (status %d)" % (name, a["status"])
        return a["values"]

    def one(self, desc, name, type_name):
        return self.value(desc, name, type_name, 1)[0]

    def of_type(self, type_name):
        return [d for d in self.descs.values() if d["type"] == self.e[type_name]]

    def linked(self, desc, name):
        return self.descs[self.one(desc, name, "CUDNN_TYPE_BACKEND_DESCRIPTOR")]


def check_tensor(g, t, dims, strides, data_type, virtual):
    """A tensor descriptor: as set (types and counts as cuDNN documents) and
    as cuDNN reads it back after finalization."""
    assert g.value(t, "CUDNN_ATTR_TENSOR_DIMENSIONS", "CUDNN_TYPE_INT64", 4) == dims
    assert g.value(t, "CUDNN_ATTR_TENSOR_STRIDES", "CUDNN_TYPE_INT64", 4) == strides
    assert g.one(t, "CUDNN_ATTR_TENSOR_DATA_TYPE", "CUDNN_TYPE_DATA_TYPE") == g.e[data_type]
    uid = g.one(t, "CUDNN_ATTR_TENSOR_UNIQUE_ID", "CUDNN_TYPE_INT64")
    assert g.one(t, "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT", "CUDNN_TYPE_INT64") == 16
    is_virtual = [a for a in t["attrs"] if a["name"] == g.e["CUDNN_ATTR_TENSOR_IS_VIRTUAL"]]
    if virtual:
        assert g.one(t, "CUDNN_ATTR_TENSOR_IS_VIRTUAL", "CUDNN_TYPE_BOOLEAN") is True
    else:
        assert not is_virtual or is_virtual[0]["values"] == [False]
    back = t["readback"]
    assert (back["uid"], back["dims"], back["strides"], back["data_type"], back["virtual"]) == (
        uid, dims, strides, g.e[data_type], virtual), back
    return uid


def check_conv_graph(case, g, kind):
    """kind: "conv" (the convolution alone), "fused" (conv [-> add bias] [->
    act]) or "split" (conv -> add bias into the saved pre-activation, or y;
    the activation runs after it)."""
    fused = kind == "fused"
    e = g.e
    comp = "CUDNN_DATA_DOUBLE" if case.dtype == "float64" else "CUDNN_DATA_FLOAT"
    io = IO_TYPE[case.dtype]
    for d in g.descs.values():
        assert d["finalized"] == 0, "descriptor %d (type %d) did not finalize" % (d["id"], d["type"])
        assert all(a["status"] == 0 for a in d["attrs"]), d
    op_graphs = g.of_type("CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR")
    assert [d["id"] for d in op_graphs] == [g.reply["op_graph"]]
    ops = [g.descs[i] for i in g.value(op_graphs[0], "CUDNN_ATTR_OPERATIONGRAPH_OPS",
                                       "CUDNN_TYPE_BACKEND_DESCRIPTOR")]
    expected_ops = 1 + (fused and case.bias) + (fused and case.act != "none") + (kind == "split")
    assert len(ops) == expected_ops

    # the convolution itself
    conv_op = ops[0]
    prefix, roles = {
        "fwd": ("CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_", ("X", "W", "Y")),
        "bwd_data": ("CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_", ("DX", "W", "DY")),
        "bwd_filter": ("CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_", ("X", "DW", "DY")),
    }[case.op]
    op_type = {"fwd": "CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR",
               "bwd_data": "CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR",
               "bwd_filter": "CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR"}[case.op]
    assert conv_op["type"] == e[op_type]
    scalar = "CUDNN_TYPE_DOUBLE" if case.dtype == "float64" else "CUDNN_TYPE_FLOAT"
    assert g.one(conv_op, prefix + "ALPHA", scalar) == 1
    assert g.one(conv_op, prefix + "BETA", scalar) == 0
    conv = g.linked(conv_op, prefix + "CONV_DESC")
    assert conv["type"] == e["CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR"]
    geometry = {"CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES": list(case.stride),
                "CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS": list(case.padding),
                "CUDNN_ATTR_CONVOLUTION_POST_PADDINGS": list(case.padding),
                "CUDNN_ATTR_CONVOLUTION_DILATIONS": list(case.dilation)}
    for name, want in geometry.items():
        assert g.value(conv, name, "CUDNN_TYPE_INT64", 2) == want, name
    assert g.one(conv, "CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS", "CUDNN_TYPE_INT64") == 2
    assert g.one(conv, "CUDNN_ATTR_CONVOLUTION_COMP_TYPE", "CUDNN_TYPE_DATA_TYPE") == e[comp]
    assert g.one(conv, "CUDNN_ATTR_CONVOLUTION_CONV_MODE", "CUDNN_TYPE_CONVOLUTION_MODE") == \
        e["CUDNN_CROSS_CORRELATION"]
    back = conv["readback"]
    assert back["comp_type"] == e[comp] and back["spatial_dims"] == [2]
    assert back["filter_strides"] == list(case.stride) and back["dilations"] == list(case.dilation)
    assert back["pre_paddings"] == list(case.padding) and back["post_paddings"] == list(case.padding)

    pointer_of = {}  # uid -> the pointer the variant pack must pair it with

    def real(role, desc):
        uid = check_tensor(g, desc, case.dims[role], packed_strides(case.dims[role], case.nhwc), io, False)
        assert uid not in pointer_of, "uid %d names two tensors" % uid
        pointer_of[uid] = POINTER[role]

    def virtual(desc):
        check_tensor(g, desc, case.dims["y"], packed_strides(case.dims["y"], case.nhwc), comp, True)

    x, w, y = (g.linked(conv_op, prefix + r) for r in roles)
    real("x", x)
    real("w", w)
    if kind == "conv":
        real("y", y)
    elif kind == "split":
        # conv -> c (virtual) -> c + bias -> the pre-activation when saved, else y
        virtual(y)
        (add,) = ops[1:]
        assert add["type"] == e["CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR"]
        assert g.linked(add, "CUDNN_ATTR_OPERATION_POINTWISE_XDESC")["id"] == y["id"]
        pw = g.linked(add, "CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR")
        assert g.one(pw, "CUDNN_ATTR_POINTWISE_MODE", "CUDNN_TYPE_POINTWISE_MODE") == e["CUDNN_POINTWISE_ADD"]
        assert g.one(pw, "CUDNN_ATTR_POINTWISE_MATH_PREC", "CUDNN_TYPE_DATA_TYPE") == e[comp]
        real("bias", g.linked(add, "CUDNN_ATTR_OPERATION_POINTWISE_BDESC"))
        real("preact" if case.preact else "y", g.linked(add, "CUDNN_ATTR_OPERATION_POINTWISE_YDESC"))
    else:
        # conv -> c [-> c + bias -> z] [-> act(z) -> y]; the activation's
        # input is the real preact tensor when it is saved
        chain = [y]
        pointwise = ops[1:]
        for op in pointwise:
            assert op["type"] == e["CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR"]
            assert g.linked(op, "CUDNN_ATTR_OPERATION_POINTWISE_XDESC")["id"] == chain[-1]["id"], \
                "the pointwise chain is broken"
            assert g.one(op, "CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1", "CUDNN_TYPE_FLOAT") == 1
            assert g.one(op, "CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2", "CUDNN_TYPE_FLOAT") == 1
            chain.append(g.linked(op, "CUDNN_ATTR_OPERATION_POINTWISE_YDESC"))
        modes = []
        for op in pointwise:
            pw = g.linked(op, "CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR")
            modes.append(g.one(pw, "CUDNN_ATTR_POINTWISE_MODE", "CUDNN_TYPE_POINTWISE_MODE"))
            assert g.one(pw, "CUDNN_ATTR_POINTWISE_MATH_PREC", "CUDNN_TYPE_DATA_TYPE") == e[comp]
        want_modes = (["CUDNN_POINTWISE_ADD"] if case.bias else []) + (
            [POINTWISE_MODE[case.act]] if case.act != "none" else [])
        assert modes == [e[m] for m in want_modes]
        if case.act == "silu":  # swish(x) = x sigmoid(beta x): silu is beta 1
            pw = g.linked(pointwise[-1], "CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR")
            assert g.one(pw, "CUDNN_ATTR_POINTWISE_SWISH_BETA", "CUDNN_TYPE_DOUBLE") == 1.0
        if case.bias:
            add = pointwise[0]
            real("bias", g.linked(add, "CUDNN_ATTR_OPERATION_POINTWISE_BDESC"))
        for op in pointwise[len(pointwise) - (case.act != "none"):]:
            assert not any(a["name"] == e["CUDNN_ATTR_OPERATION_POINTWISE_BDESC"] for a in op["attrs"])
        real("y", chain[-1])
        saved = case.preact and case.act != "none"
        act_input = chain[-2] if case.act != "none" else None
        for t in chain[:-1]:
            if saved and t is act_input:
                real("preact", t)
            else:
                virtual(t)

    # the variant pack: every real tensor once, with its own pointer
    pack = g.reply["variant_pack"]
    assert pack["status"] is None, pack
    (vp,) = pack["descriptors"]
    assert vp["finalized"] == 0
    uids = g.value(vp, "CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS", "CUDNN_TYPE_INT64")
    pointers = g.value(vp, "CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS", "CUDNN_TYPE_VOID_PTR", len(uids))
    assert sorted(uids) == sorted(pointer_of), "the variant pack's ids are not the graph's real tensors"
    assert dict(zip(uids, pointers)) == pointer_of, "the variant pack pairs an id with another tensor's data"
    assert g.value(vp, "CUDNN_ATTR_VARIANT_PACK_WORKSPACE", "CUDNN_TYPE_VOID_PTR", 1) == [POINTER["ws"]]


def engine_report(versions, rows):
    lines = ["", "cuDNN %d (built against %d), heuristics mode A with no GPU: engine configs offered per graph"
             % (versions["cudnn"], versions["cudnn_built"])]
    for name, kind, heur in rows:
        lines.append("  %-52s %-6s %s" % (name, kind, heur.get("offered", heur)))
    return "\n".join(lines)


@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
def test_conv_graphs_describe_the_convolution(conv_replies, cudnn_enums, capsys):
    versions, replies = conv_replies
    rows, failures = [], []
    for case in CONV_CASES:
        reply = replies[case.name]
        assert reply["eligible"] and reply["nhwc"] == case.nhwc, (case.name, reply)
        assert reply["has_epilogue"] == (case.op == "fwd" and (case.bias or case.act != "none"))
        assert reply["fusable"] == case.fused
        kinds = [g["kind"] for g in reply["graphs"]]
        split = case.op == "fwd" and case.bias and case.act != "none"
        assert kinds == ["conv"] + ["fused"] * case.fused + ["split"] * split, case.name
        for graph in reply["graphs"]:
            if graph["status"] is not None:
                failures.append("%s %s graph: %s" % (case.name, graph["kind"], graph["status"]))
                continue
            try:
                check_conv_graph(case, Graph(graph, cudnn_enums), graph["kind"])
            except AssertionError as err:
                failures.append("%s %s graph: %s" % (case.name, graph["kind"], err))
            rows.append((case.name, graph["kind"], graph["heuristics_a"]))
    with capsys.disabled():
        print(engine_report(versions, rows))
    assert not failures, "\n".join(failures[:20]) + ("\n... %d in all" % len(failures))
    # a conv-only graph that no engine takes is a wrong graph: cuDNN has
    # engines for every plain convolution gpuaccel asks for
    empty = [(name, heur) for name, kind, heur in rows if kind == "conv" and not heur.get("offered")]
    assert not empty, empty
    # the split route exists because conv -> add -> GELU / SiLU (saved
    # pre-activation or not) fuses only on runtime-fusion engines (1-2 configs
    # offered here); conv -> add, the split route's graph, on as many as the
    # convolution alone.  conv -> add -> sigmoid, like ReLU, also has cuDNN's
    # precompiled conv-bias-activation engines: its fused graph is offered as
    # widely as the split one
    offered = {(name, kind): heur.get("offered", 0) for name, kind, heur in rows}
    for case in CONV_CASES:
        if (case.name, "split") not in offered:
            continue
        split, conv = offered[case.name, "split"], offered[case.name, "conv"]
        assert split == conv, (case.name, split, conv)
        if case.dtype not in ("float16", "bfloat16"):
            continue
        if case.act in ("gelu_tanh", "gelu", "silu"):
            assert split >= 10 and split > 4 * offered[case.name, "fused"], (case.name, offered)
        if case.act == "sigmoid" and not case.preact:
            assert offered[case.name, "fused"] >= split, (case.name, offered)


@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
def test_cudnn_failure_reported_with_its_own_text():
    """cuDNN's last-error string outlives the call that wrote it (a failure
    nobody read, the warnings of a successful heuristics query): a failure
    in conv.cu is reported with the text of that failure, read right after
    it, and leaves no text behind for the next one."""
    _, (reply,) = run_probe(["probe=cudnn_last_error id=stale"])
    st = reply["status"]
    assert st is not None and st["call"] == "cudnnBackendFinalize(conv.get())", st
    assert "nullptr == handle" not in st["message"], "a failure was reported with an earlier call's text"
    assert st["message"] and st["message"] != "cuDNN rejected this graph", "cuDNN's own reason was dropped"
    assert reply["left"] == ""


# ---------------------------------------------------------------- matmul


@pytest.fixture(scope="module")
def lt_enums():
    values = {}
    for header in ("cublasLt.h", "cublas_api.h", "library_types.h"):
        values.update(header_enums(os.path.join(INCLUDES[1], header)))
    return values


LT_TYPE = {"float16": "CUDA_R_16F", "bfloat16": "CUDA_R_16BF", "float32": "CUDA_R_32F", "float64": "CUDA_R_64F"}
M, K, N = 37, 29, 23  # odd, not multiples of any tile


class MatmulCase:
    """D[b] = epilogue(A[b] @ B[b]); A (M x K) and B (K x N) row-major or
    transposed views; leading dimensions padded to multiples of 8 (cuBLASLt
    wants that of an aux matrix)."""

    def __init__(self, name, dtype, epilogue, a_t=False, b_t=False, batch=1, **extra):
        self.name, self.dtype, self.want, self.batch, self.extra = name, dtype, epilogue, batch, extra
        self.a_t, self.b_t = a_t, b_t
        ld = lambda n: (n + 7) // 8 * 8  # noqa: E731
        self.mats = {}
        # (rows, cols, row_stride, col_stride): a transposed view has row_stride 1
        self.mats["a"] = (M, K, 1, ld(M)) if a_t else (M, K, ld(K), 1)
        self.mats["b"] = (K, N, 1, ld(K)) if b_t else (K, N, ld(N), 1)
        self.mats["d"] = (M, N, ld(N), 1)
        for aux in ("preact", "dact_aux"):
            if aux in extra:
                self.mats[aux] = (M, N, ld(N) + 8, 1)
        self.batch_stride = {k: (ld(max(r, c)) * ld(max(r, c)) if batch > 1 else 0) for k, (r, c, _, _) in
                             self.mats.items()}

    def line(self):
        words = ["probe=matmul", "id=" + self.name, "batch=%d" % self.batch, "ws_size=%d" % WORKSPACE]
        for key, (r, c, rs, cs) in self.mats.items():
            words.append("%s=%#x:%s:%d,%d:%d,%d,%d" % (key, POINTER_MM[key], self.dtype, r, c, rs, cs,
                                                       self.batch_stride[key]))
        for key, value in self.extra.items():
            if key in ("preact", "dact_aux"):
                continue
            words.append("%s=%s" % (key, "%#x" % POINTER_MM[key] if key in POINTER_MM else value))
        return " ".join(words)


POINTER_MM = {"a": 0x1000000, "b": 0x2000000, "d": 0x3000000, "bias": 0x4000000, "preact": 0x5000000,
              "dact_aux": 0x6000000, "col_sums": 0x7000000, "a_row_sums": 0x8000000}


def matmul_cases():
    """Every epilogue matmul.cu fuses, in every dtype and transposition;
    in float64 the GELU ones are not fused (cuBLASLt's are not
    float64-accurate): their cases check the plain GEMM instead."""
    cases = []
    for dtype in DTYPES:
        for a_t, b_t in [(False, False), (True, False), (False, True), (True, True)]:
            tag = "%s-%s%s" % (dtype, "at" if a_t else "a", "bt" if b_t else "b")
            cases.append(MatmulCase(tag + "-default", dtype, "CUBLASLT_EPILOGUE_DEFAULT", a_t, b_t))
            cases.append(MatmulCase(tag + "-bias", dtype, "CUBLASLT_EPILOGUE_BIAS", a_t, b_t, bias=1))
            cases.append(MatmulCase(tag + "-relu-bias", dtype, "CUBLASLT_EPILOGUE_RELU_BIAS", a_t, b_t, bias=1,
                                    act="relu"))
            cases.append(MatmulCase(tag + "-gelu-bias", dtype, "CUBLASLT_EPILOGUE_GELU_BIAS", a_t, b_t, bias=1,
                                    act="gelu_tanh"))
            cases.append(MatmulCase(tag + "-gelu-aux", dtype, "CUBLASLT_EPILOGUE_GELU_AUX", a_t, b_t,
                                    act="gelu_tanh", preact=1))
            cases.append(MatmulCase(tag + "-gelu-aux-bias", dtype, "CUBLASLT_EPILOGUE_GELU_AUX_BIAS", a_t, b_t,
                                    bias=1, act="gelu_tanh", preact=1))
            cases.append(MatmulCase(tag + "-dgelu-bgrad", dtype, "CUBLASLT_EPILOGUE_DGELU_BGRAD", a_t, b_t,
                                    dact="gelu_tanh", dact_aux=1, col_sums=1))
            cases.append(MatmulCase(tag + "-bgradb", dtype, "CUBLASLT_EPILOGUE_BGRADB", a_t, b_t, a_row_sums=1))
            for want, extra in [("CUBLASLT_EPILOGUE_BIAS", {"bias": 1}),
                                ("CUBLASLT_EPILOGUE_GELU_AUX_BIAS", {"bias": 1, "act": "gelu_tanh", "preact": 1})]:
                cases.append(MatmulCase(tag + "-batch3-" + want.split("EPILOGUE_")[1].lower(), dtype, want, a_t,
                                        b_t, batch=3, **extra))
    for case in cases:
        if case.dtype == "float64" and "GELU" in case.want:
            case.want = "CUBLASLT_EPILOGUE_DEFAULT"
    return cases


MATMUL_CASES = matmul_cases()


def check_matmul(case, reply, e):
    assert reply["fused"] == (case.want != "CUBLASLT_EPILOGUE_DEFAULT") or case.want == "CUBLASLT_EPILOGUE_DEFAULT"
    call = reply["fused_call"] if reply["fused"] else reply["plain_call"]
    assert reply.get("epilogue", e["CUBLASLT_EPILOGUE_DEFAULT"]) == e[case.want]
    assert call["described"], "matmul.cu cannot describe the call to cuBLASLt"
    # every layout and preference attribute accepted: only the heuristic,
    # which needs a device, may fail
    st = call["plan_status"]
    assert st is None or st["call"] == "cublasLtMatmulAlgoGetHeuristic", st
    assert call["desc_status"] is None, call["desc_status"]
    t = e[LT_TYPE[case.dtype]]
    # row-major D = A @ B is column-major D^T = B^T @ A^T: cuBLASLt's A is
    # our B, its B our A, m = N, n = M, k = K
    a, b, d = call["a"], call["b"], call["d"]
    desc = call["desc"]
    op_n, op_t = e["CUBLAS_OP_N"], e["CUBLAS_OP_T"]
    assert desc["transa"] == (op_t if case.b_t else op_n) and desc["transb"] == (op_t if case.a_t else op_n)
    op_a = (a["cols"], a["rows"]) if case.b_t else (a["rows"], a["cols"])
    op_b = (b["cols"], b["rows"]) if case.a_t else (b["rows"], b["cols"])
    assert op_a == (N, K) and op_b == (K, M), (op_a, op_b)
    assert (d["rows"], d["cols"]) == (N, M) and call["c"] == d
    assert a["ld"] == (case.mats["b"][3] if case.b_t else case.mats["b"][2])
    assert b["ld"] == (case.mats["a"][3] if case.a_t else case.mats["a"][2])
    assert d["ld"] == case.mats["d"][2]
    assert a["type"] == b["type"] == d["type"] == t
    assert all(x["order"] == e["CUBLASLT_ORDER_COL"] for x in (a, b, d))
    assert [a["batch_count"], b["batch_count"], d["batch_count"]] == [case.batch] * 3
    if case.batch > 1:
        assert [a["batch_offset"], b["batch_offset"], d["batch_offset"]] == [
            case.batch_stride["b"], case.batch_stride["a"], case.batch_stride["d"]]
    compute = "CUBLAS_COMPUTE_64F" if case.dtype == "float64" else "CUBLAS_COMPUTE_32F"
    assert desc["compute_type"] == e[compute]
    assert desc["scale_type"] == e["CUDA_R_64F" if case.dtype == "float64" else "CUDA_R_32F"]
    assert desc["epilogue"] == e[case.want]
    bias_source = {"CUBLASLT_EPILOGUE_DGELU_BGRAD": "col_sums", "CUBLASLT_EPILOGUE_BGRADB": "a_row_sums"}.get(
        case.want, "bias" if "BIAS" in case.want else None)
    if bias_source:
        assert desc["bias_pointer"] == POINTER_MM[bias_source]
        assert desc["bias_data_type"] == t  # the cases give D's dtype
    aux = "preact" if "AUX" in case.want else "dact_aux" if "DGELU" in case.want else None
    if aux:
        assert desc["aux_pointer"] == POINTER_MM[aux]
        assert desc["aux_ld"] == case.mats[aux][2]
        if case.batch > 1:
            assert desc["aux_batch_stride"] == case.batch_stride[aux]
    check_split(case, reply, e, case.dtype)


@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
def test_matmul_descriptors_describe_the_gemm(lt_enums):
    versions, replies = run_probe([c.line() for c in MATMUL_CASES])
    failures = []
    for case, reply in zip(MATMUL_CASES, replies):
        try:
            check_matmul(case, reply, lt_enums)
        except AssertionError as err:
            failures.append("%s: %s" % (case.name, err))
    assert not failures, "\n".join(failures[:20]) + ("\n... %d in all" % len(failures))


@pytest.fixture(scope="module")
def reasons():
    """ga_fallback_reason's values, from kernels/kernels.h."""
    return header_enums(os.path.join(ROOT, "kernels", "kernels.h"))


# (name, dtype, epilogue fused or None, the reason when not, extra): what
# matmul.cu asks cuBLASLt for, by cublasLt.h's dtype rules (the bias has D's
# type, a bias gradient the output's), what cuBLASLt cannot express, and
# set_deterministic(True) keeping reductions out of cuBLASLt
ROUTES = [
    ("bias-d-type", "float16", "CUBLASLT_EPILOGUE_BIAS", None, {"bias": 1, "bias_dtype": "float16"}),
    ("bias-f32-for-f16", "float16", None, "GA_FALLBACK_EPILOGUE", {"bias": 1, "bias_dtype": "float32"}),
    ("bias-bf16-for-f32", "float32", None, "GA_FALLBACK_EPILOGUE", {"bias": 1, "bias_dtype": "bfloat16"}),
    ("gelu-bias-f32-for-bf16", "bfloat16", None, "GA_FALLBACK_EPILOGUE",
     {"bias": 1, "bias_dtype": "float32", "act": "gelu_tanh"}),
    ("bgradb-d-type", "bfloat16", "CUBLASLT_EPILOGUE_BGRADB", None, {"a_row_sums": 1}),
    ("bgradb-f32-for-bf16", "bfloat16", None, "GA_FALLBACK_EPILOGUE",
     {"a_row_sums": 1, "a_row_sums_dtype": "float32"}),
    ("dgelu-bgrad-f32-for-f16", "float16", None, "GA_FALLBACK_EPILOGUE",
     {"dact": "gelu_tanh", "dact_aux": 1, "col_sums": 1, "col_sums_dtype": "float32"}),
    ("relu-preact", "float16", None, "GA_FALLBACK_EPILOGUE", {"bias": 1, "act": "relu", "preact": 1}),
    ("drelu", "float32", None, "GA_FALLBACK_EPILOGUE", {"dact": "relu", "dact_aux": 1}),
    ("bgradb-deterministic", "float32", None, "GA_FALLBACK_DETERMINISTIC",
     {"a_row_sums": 1, "deterministic": 1}),
    ("dgelu-bgrad-deterministic", "float16", None, "GA_FALLBACK_DETERMINISTIC",
     {"dact": "gelu_tanh", "dact_aux": 1, "col_sums": 1, "deterministic": 1}),
    ("dgelu-deterministic", "float16", "CUBLASLT_EPILOGUE_DGELU", None,
     {"dact": "gelu_tanh", "dact_aux": 1, "deterministic": 1}),
    ("bias-deterministic", "float32", "CUBLASLT_EPILOGUE_BIAS", None, {"bias": 1, "deterministic": 1}),
    # cuBLASLt's GELU epilogues are not float64-accurate
    ("gelu-tanh-f64", "float64", None, "GA_FALLBACK_EPILOGUE", {"bias": 1, "act": "gelu_tanh"}),
    ("dgelu-f64", "float64", None, "GA_FALLBACK_EPILOGUE", {"dact": "gelu_tanh", "dact_aux": 1}),
    ("relu-bias-f64", "float64", "CUBLASLT_EPILOGUE_RELU_BIAS", None, {"bias": 1, "act": "relu"}),
    # activations cuBLASLt has no epilogue for: the split route's GEMM + bias
    ("gelu-erf-bias", "bfloat16", None, "GA_FALLBACK_EPILOGUE", {"bias": 1, "act": "gelu"}),
    ("gelu-erf-preact", "float16", None, "GA_FALLBACK_EPILOGUE", {"act": "gelu", "preact": 1}),
    ("silu-bias-preact", "float32", None, "GA_FALLBACK_EPILOGUE", {"bias": 1, "act": "silu", "preact": 1}),
    ("hardswish-bias", "float16", None, "GA_FALLBACK_EPILOGUE", {"bias": 1, "act": "hardswish"}),
    ("sigmoid-bias-preact", "bfloat16", None, "GA_FALLBACK_EPILOGUE", {"bias": 1, "act": "sigmoid", "preact": 1}),
    ("sigmoid-f64", "float64", None, "GA_FALLBACK_EPILOGUE", {"act": "sigmoid"}),
    ("silu-bias-f32-for-bf16", "bfloat16", None, "GA_FALLBACK_EPILOGUE",
     {"bias": 1, "bias_dtype": "float32", "act": "silu"}),
    ("dsilu", "float32", None, "GA_FALLBACK_EPILOGUE", {"dact": "silu", "dact_aux": 1}),
    ("dgelu-erf-bgrad", "bfloat16", None, "GA_FALLBACK_EPILOGUE", {"dact": "gelu", "dact_aux": 1, "col_sums": 1}),
]


@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
@pytest.mark.parametrize("route", ROUTES, ids=[r[0] for r in ROUTES])
def test_matmul_asks_cublaslt_only_for_what_it_documents(route, lt_enums, reasons):
    name, dtype, fused, reason, extra = route
    case = MatmulCase("route-" + name, dtype, fused or "CUBLASLT_EPILOGUE_DEFAULT", **extra)
    _, (reply,) = run_probe([case.line()])
    assert reply["fallback_reason"] == (reasons[reason] if reason else reasons["GA_FALLBACK_NONE"])
    assert reply["fused"] == (fused is not None)
    if fused:
        assert reply["epilogue"] == lt_enums[fused]
        desc = reply["fused_call"]["desc"]
        assert desc["epilogue"] == lt_enums[fused]
        if "bias_pointer" in desc and fused != "CUBLASLT_EPILOGUE_DGELU":
            assert desc["bias_data_type"] == lt_enums[LT_TYPE[dtype]]
    # the plain GEMM the unfused route runs is always describable here
    assert reply["plain_call"]["described"] and reply["plain_call"]["desc_status"] is None
    check_split(case, reply, lt_enums, dtype)


def check_split(case, reply, e, dtype):
    """The split route, for every forward activation — what runs when
    cuBLASLt cannot fuse it (relu with its pre-activation kept, any other
    activation but tanh-GELU) or refuses the fused call: the GEMM and its
    bias alone, in cuBLASLt's BIAS epilogue (DEFAULT without a bias),
    written to the pre-activation when it is kept (else to D, activated in
    place); never for a backward epilogue or a bias of another dtype than
    D's."""
    act, extra = case.extra.get("act", "none"), case.extra
    applies = (act != "none" and not {"dact", "col_sums", "a_row_sums"} & set(extra)
               and extra.get("bias_dtype", dtype) == dtype)
    assert reply["split"] == applies, reply
    if not applies:
        return
    assert not reply["split_keeps_activation"]
    want = "CUBLASLT_EPILOGUE_BIAS" if extra.get("bias") else "CUBLASLT_EPILOGUE_DEFAULT"
    assert reply["split_epilogue"] == e[want]
    z = "preact" if extra.get("preact") else "d"
    assert reply["split_d"] == POINTER_MM[z]
    call = reply["split_call"]
    assert call["described"] and call["desc_status"] is None, call
    st = call["plan_status"]
    assert st is None or st["call"] == "cublasLtMatmulAlgoGetHeuristic", st
    desc, d = call["desc"], call["d"]
    assert desc["epilogue"] == e[want]
    assert (d["rows"], d["cols"]) == (N, M) and call["c"] == d
    assert d["ld"] == case.mats[z][2] and d["type"] == e[LT_TYPE[dtype]]
    if extra.get("bias"):
        assert desc["bias_pointer"] == POINTER_MM["bias"] and desc["bias_data_type"] == e[LT_TYPE[dtype]]
    what = {"relu": "bit mask" if extra.get("preact") else "refused its relu epilogue",
            "gelu": "tanh approximation",
            "gelu_tanh": "not float64-accurate" if dtype == "float64" else "refused its tanh-GELU epilogue",
            }.get(act, "no epilogue for this activation")
    assert what in reply["split_why"] and "split route" in reply["split_why"], reply["split_why"]


# (statuses met in one search, floor, the reason reported, the status kept):
# cuDNN's status families become conv.cu's fallback reasons, and a search
# reports the most severe refusal it met, never less than its floor (a fused
# graph without an engine is not_supported, the conv alone without one
# no_engine)
REFUSALS = [
    ([3000], "GA_FALLBACK_NONE", "GA_FALLBACK_NOT_SUPPORTED", 3000),
    ([3007, 2002], "GA_FALLBACK_NONE", "GA_FALLBACK_BAD_PARAM", 2002),
    ([2000, 4001, 3000], "GA_FALLBACK_NONE", "GA_FALLBACK_COMPILATION", 4001),
    ([1008, 2000], "GA_FALLBACK_NONE", "GA_FALLBACK_SUBLIBRARY", 1008),
    ([-1], "GA_FALLBACK_NONE", "GA_FALLBACK_EXECUTION", -1),
    ([0], "GA_FALLBACK_NONE", "GA_FALLBACK_NOT_SUPPORTED", 0),
    ([3000], "GA_FALLBACK_NO_ENGINE", "GA_FALLBACK_NO_ENGINE", 3000),
    ([3000, 2000], "GA_FALLBACK_NO_ENGINE", "GA_FALLBACK_BAD_PARAM", 2000),
    ([], "GA_FALLBACK_NONE", "GA_FALLBACK_NONE", 0),
]


@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
def test_cudnn_refusals_become_fallback_reasons(reasons):
    lines = ["probe=cudnn_refusal id=r%d statuses=%s floor=%d" % (i, ",".join(map(str, st)), reasons[floor])
             for i, (st, floor, _, _) in enumerate(REFUSALS)]
    _, replies = run_probe(lines)
    for (statuses, _, want, status), reply in zip(REFUSALS, replies):
        assert (reply["reason"], reply["status"]) == (reasons[want], status), (statuses, reply)
        if statuses:
            assert reply["text"] == "STATUS at call: refusal %d" % statuses.index(status)


@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
def test_a_capturing_call_of_a_cold_problem_is_refused_before_any_setup():
    # no device here: cudaStreamIsCapturing cannot tell, which conv.cu treats
    # as a capture, so nothing that tunes may run
    cases = [ConvCase("cap-fwd", "float16", "nhwc", "fwd", GEOMETRIES[0], bias=True, act="gelu_tanh"),
             ConvCase("cap-dgrad", "float32", "nchw", "bwd_data", GEOMETRIES[1]),
             ConvCase("cap-wgrad", "bfloat16", "nhwc", "bwd_filter", GEOMETRIES[3])]
    _, replies = run_probe([c.line() + " run=1" for c in cases])
    for case, reply in zip(cases, replies):
        st = reply["run_status"]
        assert st is not None and st["name"] == "cudaErrorStreamCaptureUnsupported", (case.name, st)
        assert st["call"] == "cudaStreamIsCapturing"
        op = {"fwd": "conv2d: ", "bwd_data": "conv2d_backward (input gradient): ",
              "bwd_filter": "conv2d_backward (weight gradient): "}[case.op]
        assert st["message"].startswith(op) and "warm-up" in st["message"], st["message"]
        # (without a device no handle can be taken at all: the status above is what
        # shows the refusal came first — a later one would be cudnnCreate's)
        assert reply["run_cache_lookups"] == 1 and reply["run_took_handle"] is False


@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
def test_a_problem_cached_as_direct_runs_without_cudnn_even_when_capturing():
    # the direct kernels need no cuDNN handle: none is created (cudnnCreate,
    # which fails here without a device, would allocate inside a capture)
    cases = [ConvCase("direct-fwd", "float16", "nhwc", "fwd", GEOMETRIES[0], bias=True, act="gelu_tanh"),
             ConvCase("direct-wgrad", "float32", "nchw", "bwd_filter", GEOMETRIES[1])]
    _, replies = run_probe([c.line() + " run=1 cached=direct" for c in cases])
    for case, reply in zip(cases, replies):
        st = reply["run_status"]
        # the probe's stand-in for the direct kernels answered: nothing failed before them
        assert st is not None and st["call"] == "ga_conv_direct", (case.name, st)
        assert reply["run_cache_lookups"] == 0 and reply["run_took_handle"] is False


@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
def test_a_search_is_bounded_across_both_heuristic_modes():
    # first-call latency: a search finalizes (and may compile) at most 12 configs in all,
    # stops at the plans it can use (6 timed; 2 when deterministic, untimed)
    lines = ["probe=search_budget id=b%d deterministic=%d yield=%d" % (i, det, y)
             for i, (det, y) in enumerate([(0, 1), (1, 1), (0, 0), (1, 0)])]
    _, replies = run_probe(lines)
    assert [(r["finalizations"], r["plans"]) for r in replies] == [(6, 6), (2, 2), (12, 0), (12, 0)]


@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
def test_persisted_choices_name_their_route():
    # the tuning file's strings: the split route is kept apart from the others
    texts = {"eng12:k1=0,k3=2": 0, "unfused:eng3": 1, "direct": 2, "split:eng7:k2=1": 3}
    bad = ["split:", "split:direct", "eng", "fused:eng1", "eng1:k2", "split:eng-1"]
    lines = ["probe=choice id=c%d text=%s" % (i, t) for i, t in enumerate(list(texts) + bad)]
    _, replies = run_probe(lines)
    for text, reply in zip(texts, replies):
        assert reply["parsed"] and reply["route"] == texts[text] and reply["written"] == text, reply
    assert not any(r["parsed"] for r in replies[len(texts):]), replies[len(texts):]
