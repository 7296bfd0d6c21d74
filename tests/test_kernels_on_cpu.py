"""The CUDA kernels' own source, run on the CPU.

kernels/cudacpu compiles kernels/cuda with the host C++ compiler and runs
every CUDA thread as a fiber, so barriers and shared memory keep CUDA's
semantics (see kernels/cudacpu/cudacpu.h).  This file builds, from the
source tree it lives in, a driver (tests/cudacpu/driver.cpp) that makes the
CUDA backend's calls through that layer and the CPU backend's twin calls on
copies of the same buffers.  Every __global__ kernel of kernels/cuda runs
on odd sizes that cross block and tile boundaries, in every dtype it takes,
and is checked against its CPU twin and a float64 reference, under forward,
reverse and random orders of threads and blocks (they must also agree bit
for bit), then again under AddressSanitizer and ThreadSanitizer builds.
The layer itself is checked on kernels with one defect each
(tests/cudacpu/selftest.cu): a missing barrier, an index past an array, a
barrier some threads miss, warp collectives that disagree.

No GPU is needed; a C++17 compiler (g++) and the CUDA toolkit's headers
are, and the tests are skipped without them.
"""

import glob
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from helpers import TOLERANCE, assert_within, build_native, cuda_include_dir, numpy_dtype, seed_for, tool_env
from ops import (
    ACTIVATIONS,
    activation,
    cast_ref,
    conv_bwd_data64,
    conv_bwd_filter64,
    conv_fwd64,
    conv_out_hw,
    f64,
    resize_weights64,
    round_to,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEDULES = ["forward", "reverse", "random:1"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64"] + FLOATS

# ------------------------------------------------------------------ build


def kernel_sources():
    """Every kernels/cuda/*.cu that defines a kernel: the files the layer
    compiles (the simulator build compiles the same ones)."""
    return sorted(f for f in glob.glob(os.path.join(ROOT, "kernels", "cuda", "*.cu"))
                  if "__global__" in open(f).read())


def global_kernels():
    names = set()
    for path in kernel_sources():
        text = open(path).read()
        names.update(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)", text))
    return names


CXX = shutil.which("g++")
CC = shutil.which("gcc")
# the CUDA toolkit's headers: cuda_runtime.h and the host implementations of cuda_fp16.h / cuda_bf16.h
CUDA_INCLUDE = cuda_include_dir("cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h")
pytestmark = pytest.mark.skipif(
    not (CXX and CC and CUDA_INCLUDE),
    reason="needs g++, gcc and the CUDA toolkit's headers (CUDA_HOME) to build kernels/cudacpu")

SANITIZER_FLAGS = {
    "plain": [],
    "asan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"],
    "tsan": ["-fsanitize=thread"],
}


def backend_c_sources():
    """The CPU backend (kernels/cpu) and the C shared by the backends
    (kernels/*.c; the CPU-only stand-ins and the simulator live in
    kernels/nocuda and kernels/sim)."""
    return sorted(glob.glob(os.path.join(ROOT, "kernels", "cpu", "*.c"))) + sorted(
        glob.glob(os.path.join(ROOT, "kernels", "*.c")))


def build_driver(variant):
    """tests/cudacpu/driver.cpp linked with kernels/cuda (through the
    layer) and kernels/cpu (helpers.build_native: only what changed is
    rebuilt)."""
    headers = [p for pattern in ("kernels/*.h", "kernels/*/*.h", "kernels/*/*.cuh")
               for p in glob.glob(os.path.join(ROOT, pattern))]
    san = SANITIZER_FLAGS[variant]
    common = ["-g", "-O1", "-pthread", "-I" + ROOT, "-I" + CUDA_INCLUDE, "-Wall", "-Wno-unknown-pragmas"]
    cxx = [CXX, "-std=c++17"] + common
    through_layer = ["-include", os.path.join(ROOT, "kernels", "cudacpu", "cudacpu.h"), "-x", "c++"]
    jobs = []  # (source, command prefix)
    for src in kernel_sources() + [os.path.join(ROOT, "tests", "cudacpu", "selftest.cu")]:
        jobs.append((src, cxx + san + through_layer))
    # the scheduler's own bookkeeping is not the kernels': TSan is told
    # about fibers and barriers through annotations instead; this build
    # also switches fibers with ucontext, the others with registers
    layer_san = ["-DCUDACPU_TSAN=1", "-DCUDACPU_UCONTEXT=1"] if variant == "tsan" else san
    for name in ("fiber.cpp", "cudart.cpp"):
        jobs.append((os.path.join(ROOT, "kernels", "cudacpu", name), cxx + layer_san))
    jobs.append((os.path.join(ROOT, "tests", "cudacpu", "driver.cpp"), cxx + san))
    for src in backend_c_sources():
        jobs.append((src, [CC, "-std=c11"] + common + san))
    return build_native("cudacpu-" + variant, jobs, ([CXX], ["-pthread", "-lm"] + san), depends=headers)


_built = {}


def driver(variant):
    if variant not in _built:
        _built[variant] = build_driver(variant)
    return _built[variant]


# ------------------------------------------------------------------ cases


def raw_extent(arr):
    """Byte offsets [lo, hi) that a (possibly strided) array touches,
    relative to its element [0, ..., 0]."""
    if arr.size == 0:
        return 0, 0
    lo = sum(min(0, s * (n - 1)) for s, n in zip(arr.strides, arr.shape))
    hi = sum(max(0, s * (n - 1)) for s, n in zip(arr.strides, arr.shape)) + arr.itemsize
    return lo, hi


def element_mask(nbytes, offset, arr):
    """True at the bytes of `arr`'s elements in a buffer of nbytes where
    element [0, ..., 0] sits at `offset`."""
    mask = np.zeros(nbytes, bool)
    if arr.size:
        starts = offset + sum(np.indices(arr.shape)[k] * arr.strides[k] for k in range(arr.ndim))
        for b in range(arr.itemsize):
            mask[starts.ravel() + b] = True
    return mask


class Directives:
    """The scalar directives of driver.cpp's case.txt, written into
    self.lines (Case here, ShapeCase in test_launch_shapes.py)."""

    def ints(self, field, *values):
        self.lines.append("int %s %s" % (field, " ".join(str(int(v)) for v in values)))

    def floats(self, field, *values):
        self.lines.append("float %s %s" % (field, " ".join(repr(float(v)) for v in values)))

    def dtype(self, field, name):
        self.lines.append("dtype %s %s" % (field, name))

    def text(self, field, word):
        self.lines.append("text %s %s" % (field, word))

    def limit_grid(self, kernel, x, y=65535, z=65535):
        self.lines.append("limit_grid %s %d %d %d" % (kernel, x, y, z))


class Case(Directives):
    """One kernel call for the driver: its buffers are the byte extents of
    NumPy arrays (views with any strides, gaps included), its fields the
    directives of driver.cpp's case.txt."""

    def __init__(self, name, op, sides=("cuda", "cpu")):
        self.name, self.op = name, op
        self.lines = ["op " + op, "sides " + " ".join(sides)]
        self.buffers = {}   # name -> bytes
        self.arrays = {}    # name -> (offset, array as placed)
        self.written = []   # buffers the call may write, at the elements of their array only
        self.check = None   # check(outputs): raises on a wrong result
        self.twin = "bits"  # how the cpu side must agree: bit for bit, or "close" (sums in another order)

    def place(self, name, arr, written=False):
        lo, hi = raw_extent(arr)
        if arr.size:
            start = arr.__array_interface__["data"][0] + lo
            base = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * (hi - lo)).from_address(start))
            raw = bytes(base)
        else:
            raw = b""
        self.buffers[name] = raw
        self.arrays[name] = (-lo, arr)
        self.lines.append("buffer %s %d" % (name, len(raw)))
        if written:
            self.written.append(name)
        return -lo

    def tensor(self, field, arr, written=False):
        offset = self.place(field, arr, written)
        self.lines.append("tensor %s %s %d %s %d %s %s" % (
            field, field, offset, dtype_name(arr.dtype), arr.ndim,
            " ".join(str(n) for n in arr.shape), " ".join(str(s) for s in arr.strides)))

    def no_data(self, field, dtype):
        self.lines.append("tensor %s - 0 %s 0" % (field, dtype))

    def matrix(self, field, arr, written=False):
        """arr: (batch, rows, cols); strides in elements, as ga_matrix has them."""
        offset = self.place(field, arr, written)
        item = arr.itemsize
        assert all(s % item == 0 for s in arr.strides)
        self.lines.append("matrix %s %s %d %s %d %d %d %d %d" % (
            field, field, offset, dtype_name(arr.dtype), arr.shape[1], arr.shape[2],
            arr.strides[1] // item, arr.strides[2] // item, arr.strides[0] // item))

    def ptr(self, field, arr, written=False):
        offset = self.place(field, arr, written)
        self.lines.append("ptr %s %s %d" % (field, field, offset))

    def write(self, directory):
        os.makedirs(directory, exist_ok=True)
        for name, raw in self.buffers.items():
            with open(os.path.join(directory, name + ".bin"), "wb") as f:
                f.write(raw)
        with open(os.path.join(directory, "case.txt"), "w") as f:
            f.write("\n".join(self.lines) + "\n")

    def read(self, directory, side):
        """(status, {buffer: array as placed, holding what the call left})."""
        with open(os.path.join(directory, "status." + side)) as f:
            status = f.read().strip()
        out = {}
        for name, (offset, arr) in self.arrays.items():
            raw = np.fromfile(os.path.join(directory, "%s.%s.out" % (name, side)), np.uint8)
            if name in self.written:
                gaps = ~element_mask(raw.size, offset, arr)
                before = np.frombuffer(self.buffers[name], np.uint8)
                assert (raw[gaps] == before[gaps]).all(), "%s: %s wrote outside its elements" % (self.name, name)
            out[name] = (np.ndarray(arr.shape, arr.dtype, buffer=raw, offset=offset, strides=arr.strides)
                         if arr.size else arr.copy())
        return status, out


def dtype_name(dt):
    dt = np.dtype(dt)
    if dt == numpy_dtype("bfloat16"):
        return "bfloat16"
    return {np.dtype(np.bool_): "bool"}.get(dt, dt.name)


def strided(rng, values, reverse_axis=None):
    """values viewed in a larger buffer: every axis stepped by 1 or 2 with
    a random start, one axis optionally reversed; same contents."""
    shape = values.shape
    step = [int(rng.integers(1, 3)) for _ in shape]
    start = [int(rng.integers(0, 2)) for _ in shape]
    big = np.zeros([st + n * s for st, n, s in zip(start, shape, step)], values.dtype)
    big[...] = np.asarray(rng.standard_normal(big.shape) * 100, np.float64).astype(values.dtype) \
        if values.dtype.kind == "f" or values.dtype == numpy_dtype("bfloat16") else 0
    view = big[tuple(slice(st, st + n * s, s) for st, n, s in zip(start, shape, step))]
    if reverse_axis is not None:
        view = view[tuple(slice(None, None, -1) if k == reverse_axis else slice(None) for k in range(len(shape)))]
    view[...] = values
    return view


def values(rng, shape, dtype, scale=1.0):
    """Random values; integers small enough that every float dtype's cast
    of them is one rounding in NumPy as in kernels/convert.h."""
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype in ("uint8", "int8", "int16", "int32", "int64"):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), size=shape, endpoint=True).astype(dtype)
    return (rng.standard_normal(size=shape) * scale).astype(numpy_dtype(dtype))


def poison(shape, dtype):
    """An output's initial contents: NaN (or -1), so an element the
    kernel forgets is seen."""
    dt = numpy_dtype(dtype)
    return np.full(shape, np.nan if dt.kind == "f" or dtype == "bfloat16" else -1).astype(dt)


EPS = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}


def acc_of(*dtypes):
    return "float64" if "float64" in dtypes else "float32"


def rounding_bound(reference, dtype):
    atol, rtol = TOLERANCE[dtype]
    return atol + rtol * np.abs(reference)


LABELS = [act.label for act in ACTIVATIONS.values()]


def with_every_activation(plans, index, templates):
    """plans, and for each activation no plan uses, a copy of each template
    with that activation (its label at `index`): a new activation runs
    through every kernel that applies one."""
    used = {plan[index] for plan in plans}
    return plans + [t[:index] + (label,) + t[index + 1:] for label in LABELS if label not in used for t in templates]


# ---------------------------------------------------------- copy and fill


def copy_cases(rng):
    cases = []
    pairs = [(d, s) for d in DTYPES for s in DTYPES]
    for k, (dst_dtype, src_dtype) in enumerate(pairs):
        shape = (3, 7, 11) if k % 2 else (301,)
        src = values(rng, shape, src_dtype)
        c = Case("copy %s<-%s" % (dst_dtype, src_dtype), "copy")
        c.tensor("src", strided(rng, src, reverse_axis=0 if k % 3 == 0 else None))
        c.tensor("dst", strided(rng, poison(shape, dst_dtype)), written=True)
        if k % 5 == 0:
            c.limit_grid("copy_kernel", 1)  # one block walks the whole grid-stride loop

        def check(out, src=src, dst_dtype=dst_dtype):
            np.testing.assert_array_equal(f64(out["dst"]), f64(cast_ref(src, dst_dtype)))
        c.check = check
        cases.append(c)
    # dense float arrays of one order (an astype): the 16-byte path, with
    # the values where a conversion's rounding shows (NaN with a payload,
    # infinities, overflow, subnormals, halfway cases) among random ones
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 70000.0, -1e-6, 3e-8, 1e-40, 1 + 2.0**-11,
                        1 + 3 * 2.0**-11, 1 + 2.0**-8, 256.5, -0.0])
    for k, (dst_dtype, src_dtype) in enumerate((d, s_) for d in FLOATS for s_ in FLOATS if d != s_):
        n = 301 + 2 * k
        src = values(rng, (n,), src_dtype, scale=100.0)
        with np.errstate(over="ignore"):  # 70000 is inf in float16: on purpose
            src[:special.size] = special.astype(numpy_dtype(src_dtype))
        if src_dtype != "float64":  # a NaN payload beyond the quiet bit
            raw = src.view({2: np.uint16, 4: np.uint32}[src.itemsize])
            raw[0] |= 0x5 if src.itemsize == 2 else 0x2a000
        c = Case("astype %s<-%s dense" % (dst_dtype, src_dtype), "copy")
        c.tensor("src", src)
        c.tensor("dst", poison((n,), dst_dtype), written=True)
        if k % 4 == 0:
            c.limit_grid("convert_dense_kernel", 1)

        def check(out, src=src, dst_dtype=dst_dtype):
            with np.errstate(over="ignore"):
                ref = cast_ref(src, dst_dtype)
            np.testing.assert_array_equal(f64(out["dst"]), f64(ref))
        c.check = check
        cases.append(c)
    for k, dtype in enumerate(DTYPES):
        # 1-D too: there an element past the end is past the buffer (in more
        # dims the outermost index wraps around to an element already written)
        shape = (5, 13, 9) if k % 2 else (301,)
        c = Case("fill %s" % dtype, "fill")
        # every other element: the kernel, not a memset, writes it
        dst = strided(rng, poison(shape, dtype)) if k % 2 else poison((2 * shape[0],), dtype)[::2]
        c.tensor("dst", dst, written=True)
        if dtype in FLOATS:
            value = float(rng.standard_normal() * 10)
            c.ints("is_integer", 0)
            c.floats("f", value)
        else:
            value = int(rng.integers(-100, 100)) if dtype != "bool" else 1
            c.ints("is_integer", 1)
            c.ints("i", value)
        if k % 2:
            c.limit_grid("fill_kernel", 2)

        def check(out, value=value, dtype=dtype):
            want = np.array(value).astype(np.float64).astype(numpy_dtype(dtype))
            if dtype in ("uint8",):
                want = np.array(value % 256, np.uint8)
            np.testing.assert_array_equal(f64(out["dst"]), np.broadcast_to(f64(want), out["dst"].shape))
        c.check = check
        cases.append(c)
    return cases


# ------------------------------------------------------- epilogue kernels


def bias_act_cases(rng):
    cases = []
    combos = [("float32", "float32", "float32", "gelu"), ("float16", "float16", "float32", "relu"),
              ("bfloat16", "bfloat16", "bfloat16", "gelu_tanh"), ("float64", "float64", "float64", "gelu"),
              ("float32", "float16", "float64", "none"), ("float16", "bfloat16", "float16", "silu"),
              ("float64", "float64", "float64", "hardswish"), ("float32", "bfloat16", "float32", "sigmoid"),
              ("float32", "float32", "float32", "silu"), ("float64", "float64", "float64", "sigmoid"),
              ("float16", "float16", "float16", "hardswish"), ("float64", "float64", "float64", "gelu_tanh")]
    combos = with_every_activation(combos, 3, combos[:1])
    for k, (x_dtype, y_dtype, b_dtype, act) in enumerate(combos):
        shape, channel_dim = [((3, 37, 29), 2), ((2, 5, 7, 9), 1), ((301,), 0)][k % 3]
        x = values(rng, shape, x_dtype)
        bias = values(rng, (shape[channel_dim],), b_dtype)
        c = Case("bias_act %s/%s/%s %s" % (x_dtype, y_dtype, b_dtype, act), "bias_act")
        c.tensor("x", strided(rng, x))
        c.tensor("y", strided(rng, poison(shape, y_dtype), reverse_axis=0), written=True)
        with_preact = k % 2 == 0
        if with_preact:
            c.tensor("preact", strided(rng, poison(shape, y_dtype)), written=True)
        else:
            c.no_data("preact", y_dtype)
        c.ptr("bias", bias)
        c.dtype("bias_dtype", b_dtype)
        c.ints("channel_dim", channel_dim)
        c.ints("activation", activation(act).code)
        if k == 1:
            c.limit_grid("bias_act_kernel", 1)
        add_bias_act_check(c, x, bias, shape, channel_dim, act, y_dtype, with_preact, acc_of(x_dtype, y_dtype, b_dtype))
        cases.append(c)
    # dense tensors of one dtype in one memory order (channels-last too):
    # the 16-byte path, with element counts past the last whole vector, and
    # channels shorter than a vector, across vectors, or one per element
    dense = [("bfloat16", "bfloat16", (3, 5, 7, 9), 1, True, "relu", True),
             ("float32", "float32", (2, 6, 5, 7), 1, False, "gelu", False),
             ("float16", "float32", (301,), 0, False, "gelu", True),
             ("float64", "float64", (4, 33), 1, False, "relu", True),
             ("bfloat16", "float32", (2, 9, 3, 5), 1, True, "none", True),
             ("bfloat16", "bfloat16", (2, 11, 3, 5), 1, True, "silu", False),
             ("float32", "float32", (1003,), 0, False, "hardswish", True),
             ("float16", "float32", (7, 45), 1, False, "sigmoid", False),
             ("float64", "float64", (3, 4, 5, 6), 1, True, "gelu_tanh", True)]
    # no bias: the split route's y = act(z) after the library's GEMM or
    # conv + bias (matmul_unfused.cu's ga_cuda_matmul_activation, conv.cu)
    dense += [("bfloat16", None, (37, 29), 1, False, act, False) for act in ("gelu", "silu", "hardswish")]
    dense += [("float16", None, (2, 13, 5, 3), 1, True, act, False) for act in ("sigmoid", "gelu_tanh", "relu")]
    for k, (dtype, b_dtype, shape, channel_dim, last, act, with_preact) in enumerate(dense):
        x = values(rng, shape, dtype)
        bias = values(rng, (shape[channel_dim],), b_dtype) if b_dtype else np.zeros(shape[channel_dim])
        c = Case("bias_act dense %s/%s %s %s %s" % (dtype, b_dtype, shape, "channels-last" if last else "row-major",
                                                  act), "bias_act")

        def placed(arr, last=last):
            return np.moveaxis(np.moveaxis(arr, 1, 3).copy(), 3, 1) if last else arr.copy()
        c.tensor("x", placed(x))
        c.tensor("y", placed(poison(shape, dtype)), written=True)
        if with_preact:
            c.tensor("preact", placed(poison(shape, dtype)), written=True)
        else:
            c.no_data("preact", dtype)
        if b_dtype:
            c.ptr("bias", bias)
        c.dtype("bias_dtype", b_dtype or dtype)
        c.ints("channel_dim", channel_dim)
        c.ints("activation", activation(act).code)
        if k == 0:
            c.limit_grid("bias_act_dense_kernel", 1)
        add_bias_act_check(c, x, bias, shape, channel_dim, act, dtype, with_preact, acc_of(dtype, b_dtype or dtype))
        cases.append(c)
    return cases


def add_bias_act_check(c, x, bias, shape, channel_dim, act, y_dtype, pre, acc):
    """y = act(x + bias) (and the pre-activation), against float64."""
    bshape = [1] * len(shape)
    bshape[channel_dim] = shape[channel_dim]

    def check(out, x=x, bias=bias.reshape(bshape)):
        z = f64(x) + f64(bias)
        z_bound = EPS[acc] * np.abs(z)
        if pre:
            assert_within(out["preact"], z, z_bound + rounding_bound(z, y_dtype), what="preact")
        y = activation(act).ref(z)
        assert_within(out["y"], y, 2 * z_bound + 8 * EPS[acc] * np.abs(y) + rounding_bound(y, y_dtype), what="y")
    c.check = check


def act_backward_cases(rng):
    """Without a bias gradient: act_backward_kernel (the dense path for dense
    tensors of one dtype).  With one: the bias gradient kernels, chosen by
    the shapes as the entry point does — a thread per channel (R <= 64), a
    block per channel (channel not the innermost dim), or tiles of 32
    channels (innermost) — in one pass, or (with a workspace) over chunks of
    the reduced index added up by bgrad_finish_kernel."""
    cases = []
    plans = [
        # (name, shape, channel_dim, dtypes (grad, aux, dz, bias_grad), act, limit)
        ("elementwise", (3, 37, 29), None, ("float32", "float32", "float32", None), "gelu", None),
        ("elementwise", (2, 5, 7, 9), None, ("float16", "float32", "bfloat16", None), "relu", "act_backward_kernel"),
        ("elementwise", (301,), None, ("float64", "float64", "float64", None), "gelu", None),
        ("elementwise", (5, 31), None, ("bfloat16", "bfloat16", "float16", None), "none", None),
        ("thread", (7, 9, 5), 1, ("float32", "float32", "float32", "float32"), "gelu", None),
        ("thread", (3, 300), 1, ("float64", "float64", "float64", "float64"), "relu", "bgrad_thread_kernel"),
        ("thread", (21, 67), 1, ("float16", "float16", "float16", "float32"), "none", None),
        ("block", (3, 5, 11, 7), 1, ("float32", "float32", "float32", "float32"), "gelu", None),
        ("block", (2, 3, 9, 13), 1, ("float64", "float64", "float64", "float64"), "relu", "bgrad_block_kernel"),
        ("block", (4, 3, 5, 17), 1, ("bfloat16", "bfloat16", "bfloat16", "float32"), "gelu", None),
        ("block", (2, 7, 8, 9), 1, ("float16", "float32", "float16", "float16"), "none", "bgrad_block_kernel"),
        ("tile", (67, 101), 1, ("float32", "float32", "float32", "float32"), "gelu", "bgrad_tile_kernel"),
        ("tile", (3, 23, 101), 2, ("float64", "float64", "float64", "float64"), "relu", None),
        ("tile", (71, 65), 1, ("float16", "float16", "float16", "float32"), "gelu", None),
        ("tile", (69, 77), 1, ("bfloat16", "bfloat16", "bfloat16", "bfloat16"), "none", "bgrad_tile_kernel"),
        ("tile", (65, 2049), 1, ("float32", "float32", "float32", "float32"), "relu", "bgrad_tile_kernel"),
        ("wide tile", (65, 4099), 1, ("float64", "float64", "float64", "float64"), "none", "bgrad_tile_kernel"),
        # dense grad, aux and dz of one dtype: the 16-byte path (element
        # counts past the last whole vector)
        ("dense", (3, 5, 7, 9), None, ("bfloat16", "bfloat16", "bfloat16", None), "relu", None),
        ("dense", (1001,), None, ("float32", "float32", "float32", None), "gelu", "act_backward_dense_kernel"),
        ("dense", (33, 7), None, ("float64", "float64", "float64", None), "none", None),
        # with the workspace csrc gives (split): chunks of the reduced index
        # summed by separate blocks, then added in chunk order
        ("tile split", (1100, 64), 1, ("float32", "float32", "float32", "float32"), "gelu", None),
        ("tile split", (2, 1100, 96), 2, ("bfloat16", "bfloat16", "bfloat16", "float32"), "relu",
         "bgrad_tile_kernel"),
        ("tile split", (1500, 65), 1, ("float16", "float32", "bfloat16", "float32"), "gelu", None),
        ("block split", (2, 3, 150, 120), 1, ("float16", "float16", "float16", "float32"), "none", None),
        ("block split", (3, 2, 101, 113), 1, ("float64", "float64", "float64", "float64"), "gelu",
         "bgrad_block_kernel"),
        # every activation through the dense path and the split bias gradient
        ("dense", (5, 7, 11), None, ("bfloat16", "bfloat16", "bfloat16", None), "silu", None),
        ("dense", (999,), None, ("float16", "float16", "float16", None), "hardswish", None),
        ("dense", (17, 9), None, ("float32", "float32", "float32", None), "sigmoid", None),
        ("dense", (3, 301), None, ("float64", "float64", "float64", None), "gelu_tanh", None),
        ("tile split", (1100, 64), 1, ("bfloat16", "bfloat16", "bfloat16", "float32"), "silu", None),
        ("block split", (2, 3, 150, 120), 1, ("float32", "float32", "float32", "float32"), "sigmoid", None),
        ("tile split", (1200, 33), 1, ("float16", "float16", "float16", "float32"), "hardswish", None),
        ("tile split", (2, 700, 40), 2, ("float64", "float64", "float64", "float64"), "gelu_tanh", None),
        ("elementwise", (3, 37, 29), None, ("float64", "float64", "float64", None), "gelu_tanh", None),
        ("elementwise", (4, 33), None, ("float32", "float32", "float32", None), "silu", None),
        ("elementwise", (301,), None, ("float64", "float64", "float64", None), "hardswish", None),
        ("elementwise", (5, 7, 9), None, ("bfloat16", "float32", "bfloat16", None), "sigmoid", None),
        ("thread", (9, 7, 3), 1, ("float64", "float64", "float64", "float64"), "silu", None),
        ("block", (2, 3, 9, 13), 1, ("float32", "float32", "float32", "float32"), "hardswish", None),
        ("tile", (67, 101), 1, ("float64", "float64", "float64", "float64"), "sigmoid", None),
        ("tile", (33, 45), 1, ("float16", "float16", "float16", "float32"), "gelu_tanh", None),
    ]
    plans = with_every_activation(plans, 4, [plans[0], plans[7], plans[11]])
    for k, (kind, shape, channel_dim, (g_dtype, a_dtype, dz_dtype, bg_dtype), act, limit) in enumerate(plans):
        g = values(rng, shape, g_dtype)
        aux = values(rng, shape, a_dtype)
        c = Case("act_backward %s %s %s" % (kind, shape, g_dtype), "act_backward")
        # dense (tiles: so that the innermost dim decides the bias-gradient kernel)
        dense = "tile" in kind or kind == "dense"
        c.tensor("grad_y", g if dense else strided(rng, g))
        if act != "none":
            c.tensor("aux", aux if dense else strided(rng, aux))
        has_dz = k % 3 != 2 or bg_dtype is None
        if has_dz:
            c.tensor("dz", poison(shape, dz_dtype) if dense else strided(rng, poison(shape, dz_dtype)),
                     written=True)
        else:
            c.no_data("dz", dz_dtype)
        c.ints("activation", activation(act).code)
        if bg_dtype:
            c.ptr("bias_grad", poison((shape[channel_dim],), bg_dtype), written=True)
            c.dtype("bias_grad_dtype", bg_dtype)
            c.ints("channel_dim", channel_dim)
        if "split" in kind:
            c.ints("split", 1)
        if limit:
            c.limit_grid(limit, 2)
        c.twin = "bits" if bg_dtype is None else "close"
        acc = acc_of(g_dtype, a_dtype, dz_dtype, bg_dtype or "float32")

        def check(out, g=g, aux=aux, act=act, dz_dtype=dz_dtype, bg_dtype=bg_dtype, channel_dim=channel_dim,
                  has_dz=has_dz, acc=acc):
            dz = f64(g) * activation(act).grad(f64(aux) if act != "none" else f64(g))
            dz_bound = 8 * EPS[acc] * np.abs(dz) + rounding_bound(dz, dz_dtype)
            if has_dz:
                assert_within(out["dz"], dz, dz_bound, what="dz")
            if bg_dtype:
                # the gradient sums dz as stored: the kernel's own dz when it
                # writes one, else dz rounded from float64 (which may differ
                # from the kernel's by one rounding per element)
                axes = tuple(d for d in range(g.ndim) if d != channel_dim)
                stored = f64(out["dz"]) if has_dz else round_to(dz, dz_dtype)
                total = stored.sum(axis=axes)
                magnitude = np.abs(stored).sum(axis=axes)
                bound = 4 * EPS[acc] * magnitude * max(2, np.log2(stored.size)) + rounding_bound(total, bg_dtype)
                if not has_dz:
                    bound = bound + 2 * EPS[dz_dtype] * magnitude
                assert_within(out["bias_grad"], total, bound, what="bias_grad")
        c.check = check
        cases.append(c)
    return cases


# ----------------------------------------------------------------- matmul


def epilogue_act(epilogue):
    """The activation a matmul plan's epilogue names ("bias_gelu_preact")."""
    return max((label for label in LABELS if label != "none" and label in epilogue), key=len, default="none")


def matmul_cases(rng):
    """The generic GEMM and the epilogue kernels after it: what
    ga_cuda_matmul runs when cuBLASLt cannot (kernels/cuda/fallback.h);
    and ("split_...") the split route's activation after a GEMM + bias
    (cuBLASLt's half done by the generic kernel here)."""
    cases = []
    plans = [
        # (dtype, d_dtype, batch, M, K, N, epilogue)
        ("float32", "float32", 2, 37, 45, 29, "bias_gelu_preact"),
        ("float64", "float64", 1, 33, 17, 31, "dact_relu_col_sums"),
        ("float16", "float32", 3, 19, 35, 17, "bias_relu"),
        ("bfloat16", "bfloat16", 1, 41, 23, 18, "a_row_sums"),
        ("float16", "float16", 2, 17, 16, 33, "dact_gelu"),
        ("float32", "float32", 1, 29, 0, 21, "col_sums"),
        ("float64", "float64", 2, 23, 19, 27, "bias_silu_preact"),
        ("float32", "float32", 1, 31, 21, 17, "bias_hardswish"),
        ("bfloat16", "float32", 2, 13, 29, 19, "bias_sigmoid_preact"),
        ("float64", "float64", 1, 25, 18, 22, "bias_gelu_tanh"),
        ("float32", "float32", 2, 19, 17, 23, "dact_silu_col_sums"),
        ("float64", "float64", 1, 21, 13, 29, "dact_hardswish"),
        ("float64", "float64", 1, 17, 22, 15, "dact_sigmoid_col_sums"),
        ("float32", "float32", 2, 15, 31, 18, "dact_gelu_tanh"),
        ("float32", "float32", 2, 21, 19, 25, "split_bias_silu_preact"),
        ("float64", "float64", 1, 27, 16, 13, "split_gelu"),
        ("bfloat16", "bfloat16", 2, 11, 33, 20, "split_bias_hardswish"),
        ("float16", "float32", 1, 23, 17, 29, "split_bias_sigmoid_preact"),
        ("float32", "float32", 1, 17, 23, 21, "split_bias_relu_preact"),
    ]
    plans += [extra for label in LABELS if label != "none" and not any(epilogue_act(p[6]) == label for p in plans)
              for extra in [("float32", "float32", 2, 37, 45, 29, "bias_%s_preact" % label),
                            ("float64", "float64", 1, 33, 17, 31, "dact_%s_col_sums" % label)]]
    for k, (dtype, d_dtype, batch, M, K, N, epilogue) in enumerate(plans):
        a = values(rng, (batch, M, K), dtype)
        b = values(rng, (batch, K, N), dtype)
        op = "matmul_split" if epilogue.startswith("split") else "matmul"
        c = Case("%s %s->%s %dx%dx%dx%d %s" % (op, dtype, d_dtype, batch, M, K, N, epilogue), op)
        c.ints("batch", batch)
        # A transposed in memory, B with gaps, D reversed along rows
        a_mem = np.swapaxes(strided(rng, np.swapaxes(a, 1, 2).copy()), 1, 2) if k % 2 else strided(rng, a)
        c.matrix("a", a_mem)
        c.matrix("b", strided(rng, b))
        c.matrix("d", strided(rng, poison((batch, M, N), d_dtype), reverse_axis=1 if k % 2 else None), written=True)
        c.twin = "close"
        if k % 2:
            c.ints("split", 1)  # the workspace ga_cuda_matmul hands over for the sums
        fields = {}
        if "bias" in epilogue:
            fields["bias"] = values(rng, (N,), d_dtype)
            c.ptr("bias", fields["bias"])
            c.dtype("bias_dtype", d_dtype)
        act = epilogue_act(epilogue)
        if epilogue.startswith("dact"):
            fields["aux"] = values(rng, (batch, M, N), d_dtype)
            c.ints("dact", activation(act).code)
            c.matrix("dact_aux", strided(rng, fields["aux"]))
        elif act != "none":
            c.ints("activation", activation(act).code)
        if "preact" in epilogue:
            c.matrix("preact", strided(rng, poison((batch, M, N), d_dtype)), written=True)
        if "col_sums" in epilogue:
            c.ptr("col_sums", poison((N,), "float32"), written=True)
            c.dtype("col_sums_dtype", "float32")
        if "a_row_sums" in epilogue:
            c.ptr("a_row_sums", poison((M,), d_dtype), written=True)
            c.dtype("a_row_sums_dtype", d_dtype)
        if k % 2 == 0:
            c.limit_grid("gemm_generic_kernel", 65535, 2, 1)  # x is not a grid-stride loop

        def check(out, a=a, b=b, d_dtype=d_dtype, epilogue=epilogue, act=act, fields=fields,
                  acc=acc_of(dtype, d_dtype), K=K):
            ab = np.matmul(f64(a), f64(b))
            ab_bound = 4 * (K + 1) * EPS[acc] * np.matmul(np.abs(f64(a)), np.abs(f64(b)))
            stored = ab_bound + rounding_bound(ab, d_dtype)  # D is written, then the epilogue reads it
            if epilogue.startswith("dact"):
                g = activation(act).grad(f64(fields["aux"]))
                d = ab * g
                bound = stored * np.abs(g) + 8 * EPS[acc] * np.abs(d) + rounding_bound(d, d_dtype)
                assert_within(out["d"], d, bound, what="d")
            else:
                z = ab + (f64(fields["bias"]) if "bias" in fields else 0)
                if "preact" in epilogue:
                    assert_within(out["preact"], z, 2 * stored + rounding_bound(z, d_dtype), what="preact")
                d = activation(act).ref(z)
                assert_within(out["d"], d, 2.5 * stored + 8 * EPS[acc] * np.abs(d) + rounding_bound(d, d_dtype),
                              what="d")
            if "col_sums" in epilogue:  # the sums of D as stored
                dd = f64(out["d"])
                total = dd.sum(axis=(0, 1))
                bound = 8 * EPS["float32"] * np.abs(dd).sum(axis=(0, 1)) + rounding_bound(total, "float32")
                assert_within(out["col_sums"], total, bound, what="col_sums")
            if "a_row_sums" in epilogue:
                s = f64(a[0]).sum(axis=1)
                bound = 8 * EPS[acc] * np.abs(f64(a[0])).sum(axis=1) * np.log2(a.shape[2] + 2)
                assert_within(out["a_row_sums"], s, bound + rounding_bound(s, d_dtype), what="a_row_sums")
        c.check = check
        cases.append(c)
    return cases


# ------------------------------------------------------------------- conv


def conv_geometry(case, stride, padding, dilation, groups):
    case.ints("stride", *stride)
    case.ints("padding", *padding)
    case.ints("dilation", *dilation)
    case.ints("groups", groups)


def conv_cases(rng):
    """The direct convolution kernels: ga_cuda_conv2d_*'s route when cuDNN
    cannot (kernels/cuda/fallback.h)."""
    cases = []
    plans = [
        # (dtype, N, C, H, W, K, R, S, stride, padding, dilation, groups, act, channels_last)
        ("float32", 2, 3, 9, 11, 5, 3, 3, (2, 1), (1, 2), (1, 1), 1, "gelu", False),
        ("float64", 1, 4, 7, 8, 6, 3, 2, (1, 2), (0, 1), (2, 1), 2, "relu", True),
        ("float16", 2, 6, 6, 7, 3, 2, 3, (1, 1), (1, 0), (1, 2), 3, "none", False),
        ("bfloat16", 1, 2, 8, 5, 4, 3, 3, (2, 2), (1, 1), (1, 1), 1, "gelu", True),
        ("float64", 2, 3, 7, 6, 4, 3, 3, (1, 1), (1, 1), (1, 1), 1, "silu", False),
        ("float32", 1, 4, 9, 7, 4, 3, 2, (2, 1), (1, 1), (1, 2), 2, "hardswish", True),
        ("float64", 1, 3, 6, 9, 6, 2, 3, (1, 2), (0, 1), (1, 1), 3, "sigmoid", False),
        ("float32", 2, 2, 5, 8, 3, 3, 3, (1, 1), (2, 1), (2, 1), 1, "gelu_tanh", True),
    ]
    plans = with_every_activation(plans, 12, plans[:1])
    for k, (dtype, N, C, H, W, K, R, S, stride, padding, dilation, groups, act, last) in enumerate(plans):
        P, Q = conv_out_hw((H, W), (R, S), stride, padding, dilation)
        x = values(rng, (N, C, H, W), dtype)
        w = values(rng, (K, C // groups, R, S), dtype)
        dy = values(rng, (N, K, P, Q), dtype)
        bias = values(rng, (K,), dtype)

        def layout(arr, last=last):
            if last:  # channels-last memory, logical NCHW view
                return np.moveaxis(strided(rng, np.moveaxis(arr, 1, 3).copy()), 3, 1)
            return strided(rng, arr)
        acc = acc_of(dtype)
        geom = (stride, padding, dilation, groups)

        c = Case("conv_fwd %s" % dtype, "conv_fwd")
        conv_geometry(c, *geom)
        c.tensor("x", layout(x))
        c.tensor("w", layout(w))
        c.tensor("y", layout(poison((N, K, P, Q), dtype)), written=True)
        c.ptr("bias", bias)
        c.ints("activation", activation(act).code)
        if k % 2 == 0:
            c.tensor("preact", layout(poison((N, K, P, Q), dtype)), written=True)
            c.limit_grid("conv_fwd_direct", 2)
        c.twin = "close"

        def check_fwd(out, x=x, w=w, bias=bias, act=act, dtype=dtype, acc=acc, geom=geom, pre=k % 2 == 0):
            z = conv_fwd64(f64(x), f64(w), *geom) + f64(bias)[None, :, None, None]
            terms = conv_fwd64(np.abs(f64(x)), np.abs(f64(w)), *geom) + np.abs(f64(bias))[None, :, None, None]
            n = w.shape[1] * w.shape[2] * w.shape[3] + 1
            z_bound = 2 * n * EPS[acc] * terms
            if pre:
                assert_within(out["preact"], z, z_bound + rounding_bound(z, dtype), what="preact")
            y = activation(act).ref(z)
            assert_within(out["y"], y, 1.2 * z_bound + 8 * EPS[acc] * np.abs(y) + rounding_bound(y, dtype), what="y")
        c.check = check_fwd
        cases.append(c)

        c = Case("conv_bwd_data %s" % dtype, "conv_bwd_data")
        conv_geometry(c, *geom)
        c.tensor("dy", layout(dy))
        c.tensor("w", layout(w))
        c.tensor("dx", layout(poison((N, C, H, W), dtype)), written=True)
        if k % 2:
            c.limit_grid("conv_bwd_data_direct", 1)
        c.twin = "close"

        def check_data(out, dy=dy, w=w, dtype=dtype, acc=acc, geom=geom, shape=x.shape):
            dx = conv_bwd_data64(f64(dy), f64(w), shape, *geom)
            terms = conv_bwd_data64(np.abs(f64(dy)), np.abs(f64(w)), shape, *geom)
            n = w.shape[0] * w.shape[2] * w.shape[3]
            assert_within(out["dx"], dx, 2 * n * EPS[acc] * terms + rounding_bound(dx, dtype), what="dx")
        c.check = check_data
        cases.append(c)

        c = Case("conv_bwd_filter %s" % dtype, "conv_bwd_filter")
        conv_geometry(c, *geom)
        c.tensor("x", layout(x))
        c.tensor("dy", layout(dy))
        c.tensor("dw", layout(poison(w.shape, dtype)), written=True)
        if k % 2 == 0:
            c.limit_grid("conv_bwd_filter_direct", 3)  # a block sums several filter elements
        c.twin = "close"

        def check_filter(out, x=x, dy=dy, dtype=dtype, acc=acc, geom=geom, shape=w.shape):
            dw = conv_bwd_filter64(f64(x), f64(dy), shape, *geom)
            terms = conv_bwd_filter64(np.abs(f64(x)), np.abs(f64(dy)), shape, *geom)
            n = dy.shape[0] * dy.shape[2] * dy.shape[3]
            assert_within(out["dw"], dw, 2 * np.log2(n + 2) * EPS[acc] * terms * 4 + rounding_bound(dw, dtype),
                          what="dw")
        c.check = check_filter
        cases.append(c)
    return cases


# ---------------------------------------------------- normalize and logger


def normalize_cases(rng):
    """Every output dtype in both layouts, 16 bytes per store (and the
    outputs past the last whole vector one at a time); a destination that
    is not 16-byte aligned (skip: it starts one element into its buffer)
    takes one element at a time throughout; channels-first sources too,
    whose next image is not the last pixel's neighbour."""
    cases = []
    layouts = [(d, nchw, src_chw, 0) for k, d in enumerate(FLOATS)
               for nchw, src_chw in ((0, 0), (1, 0), (k % 2, 1))]  # channels-first sources: torchvision's tensors
    for k, (dtype, nchw, src_chw, skip) in enumerate(layouts + [("bfloat16", 0, 1, 1), ("float32", 1, 0, 1)]):
        n, h, w, ch = 3, 5, 7 + k % 4, 3
        src = rng.integers(0, 256, size=(n, h, w, ch)).astype(np.uint8)
        scale = rng.uniform(0.001, 0.05, ch)
        shift = rng.uniform(-2, 2, ch)
        c = Case("normalize %s nchw=%d src_chw=%d%s" % (dtype, nchw, src_chw, " misaligned" if skip else ""),
                 "normalize")
        c.ptr("src", np.ascontiguousarray(src.transpose(0, 3, 1, 2)) if src_chw else src)
        c.ints("src_chw", src_chw)
        out_shape = (n, ch, h, w) if nchw else (n, h, w, ch)
        c.ptr("dst", poison((skip + int(np.prod(out_shape)),), dtype), written=True)
        c.ints("dst_skip", skip)
        c.dtype("dtype", dtype)
        c.ints("n", n)
        c.ints("h", h)
        c.ints("w", w)
        c.ints("c", ch)
        c.ints("nchw", nchw)
        c.floats("scale", *scale)
        c.floats("shift", *shift)
        if nchw:
            c.limit_grid("normalize_kernel", 1)

        def check(out, src=src, scale=scale, shift=shift, dtype=dtype, nchw=nchw, skip=skip, shape=out_shape):
            ref = src.astype(np.float64) * scale + shift
            if nchw:
                ref = np.moveaxis(ref, 3, 1)
            acc = "float64" if dtype == "float64" else "float32"
            got = out["dst"][skip:].reshape(shape)
            assert_within(got, ref, 4 * EPS[acc] * (np.abs(ref) + 3) + rounding_bound(ref, dtype), what="dst")
        c.check = check
        cases.append(c)
    return cases


# ---------------------------------------------------------------- resize


def resize_cases(rng):
    """Crops of odd-sized images resized down and up, flipped or not, and a
    center crop larger than its image (zero padding), against float64."""
    cases = []
    for k in range(6):
        src_h, src_w = int(rng.integers(9, 70)), int(rng.integers(9, 70))
        pitch = src_w * 3 + int(rng.integers(0, 5))
        src = rng.integers(0, 256, size=(src_h, pitch), dtype=np.uint8)
        if k < 5:
            h, w = int(rng.integers(1, src_h + 1)), int(rng.integers(1, src_w + 1))
            top, left = int(rng.integers(0, src_h - h + 1)), int(rng.integers(0, src_w - w + 1))
            out = (int(rng.integers(3, 40)), int(rng.integers(3, 40)))
            placed = (0, 0) + out
            ry, rx = (top, h / out[0], top, top + h), (left, w / out[1], left, left + w)
        else:  # a center crop of the image at its size, larger than it: padded
            out = (src_h + 5, src_w + 2)
            placed = (2, 1, src_h, src_w)
            ry, rx = (0.0, 1.0, 0, src_h), (0.0, 1.0, 0, src_w)
        flip = k % 2
        c = Case("resize %dx%d -> %dx%d flip=%d" % (src_h, src_w, out[0], out[1], flip), "resize")
        c.ptr("src", src)
        c.ints("src_h", src_h)
        c.ints("src_w", src_w)
        c.ints("src_pitch", pitch)
        c.ptr("dst", poison(out + (3,), "uint8"), written=True)
        c.ints("out", *out)
        c.ints("placed", *placed)
        c.ints("flip", flip)
        c.floats("ry", ry[0], ry[1])
        c.ints("ry_span", ry[2], ry[3])
        c.floats("rx", rx[0], rx[1])
        c.ints("rx_span", rx[2], rx[3])
        c.twin = "units"
        image = src[:, :src_w * 3].reshape(src_h, src_w, 3).astype(np.float64)
        wy = resize_weights64(*ry, placed[2])
        wx = resize_weights64(*rx, placed[3])
        part = np.einsum("yi,ijc,xj->yxc", wy, image[ry[2]:ry[3], rx[2]:rx[3]], wx)
        ref = np.zeros(out + (3,))
        ref[placed[0]:placed[0] + placed[2], placed[1]:placed[1] + placed[3]] = part[:, ::-1] if flip else part

        def check(result, ref=ref):
            got = result["dst"].astype(np.float64)
            # the GPU sums in one pass (<= 1 unit off); the CPU rounds
            # between its two passes too (<= 2)
            assert np.abs(got - ref).max() <= 2, np.abs(got - ref).max()
            assert np.abs(got - ref).mean() < 0.5
        c.check = check
        cases.append(c)
    return cases


LOGGER_STATS = 6


def logger_layout(capacity, max_metrics):
    stats = 8
    present = stats + max_metrics * LOGGER_STATS * 8
    vals = present + capacity * 8
    return stats, present, vals, vals + capacity * max_metrics * 4


def logger_cases(rng):
    cases = []
    capacity, max_metrics = 5, 7
    stats_off, present_off, values_off, nbytes = logger_layout(capacity, max_metrics)
    for k, dtype in enumerate(FLOATS + ["int32", "int64"]):
        state = np.zeros(nbytes, np.uint8)
        step0 = int(rng.integers(1, 20))
        state[:8] = np.frombuffer(np.int64(step0).tobytes(), np.uint8)
        st = np.frombuffer(state[stats_off:present_off].tobytes(), np.float64).copy()
        st[:] = rng.standard_normal(st.size)
        state[stats_off:present_off] = np.frombuffer(st.tobytes(), np.uint8)
        nmetrics = 3 + k % 3
        metrics = rng.choice(max_metrics, size=nmetrics, replace=False)
        vals = values(rng, (nmetrics,), dtype, scale=10)
        if dtype in FLOATS and k % 2:
            vals[0] = np.inf
        c = Case("logger_update %s" % dtype, "logger_update")
        c.ptr("state", state, written=True)
        c.ints("capacity", capacity)
        c.ints("max_metrics", max_metrics)
        c.ints("n", nmetrics)
        c.ints("metric", *metrics)
        for j in range(nmetrics):
            c.ptr("value%d" % j, vals[j:j + 1])
            c.dtype("dtype%d" % j, dtype)
        present = int(sum(1 << int(m) for m in metrics))
        c.ints("present", present)
        explicit_step = k % 2 == 0
        c.ints("step", step0 + 3 if explicit_step else 0)

        def check(out, state=state, metrics=metrics, vals=vals, step0=step0, explicit=explicit_step,
                  present=present, before=st):
            s = out["state"]
            step = step0 + 3 if explicit else step0 + 1
            assert np.frombuffer(s[:8].tobytes(), np.int64)[0] == step
            row = (step - 1) % capacity
            assert np.frombuffer(s[present_off + 8 * row: present_off + 8 * row + 8].tobytes(), np.uint64)[0] == present
            ring = np.frombuffer(s[values_off:nbytes].tobytes(), np.float32).reshape(capacity, max_metrics)
            after = np.frombuffer(s[stats_off:present_off].tobytes(), np.float64).reshape(max_metrics, LOGGER_STATS)
            was = before.reshape(max_metrics, LOGGER_STATS)
            for m, v in zip(metrics, f64(vals)):
                assert ring[row, m] == np.float32(v)
                if np.isfinite(v):
                    assert after[m, 0] == was[m, 0] + v and after[m, 1] == was[m, 1] + 1
                    assert after[m, 3] == max(was[m, 3], v) and after[m, 4] == max(was[m, 4], -v)
                else:
                    assert after[m, 2] == was[m, 2] + 1 and after[m, 5] == max(was[m, 5], -step)
        c.check = check
        cases.append(c)
    for first, nsteps in ((3, 2), (1, 900), (4, 0)):
        capacity_r = 700 if nsteps > 100 else capacity
        _, present_r, _, nbytes_r = logger_layout(capacity_r, max_metrics)
        state = rng.integers(0, 256, size=nbytes_r).astype(np.uint8)
        c = Case("logger_reset %d+%d" % (first, nsteps), "logger_reset")
        c.ptr("state", state, written=True)
        c.ints("max_metrics", max_metrics)
        c.ints("capacity", capacity_r)
        c.ints("first_step", first)
        c.ints("nsteps", nsteps)

        def check(out, state=state, first=first, nsteps=nsteps, capacity=capacity_r, present=present_r):
            s = out["state"]
            stats = np.frombuffer(s[8:present].tobytes(), np.float64).reshape(max_metrics, LOGGER_STATS)
            assert (stats[:, :3] == 0).all() and (stats[:, 3:] == -np.inf).all()
            rows = np.frombuffer(s[present:present + 8 * capacity].tobytes(), np.uint64)
            old = np.frombuffer(state[present:present + 8 * capacity].tobytes(), np.uint64)
            cleared = {(first - 1 + j) % capacity for j in range(min(nsteps, capacity))}
            for r in range(capacity):
                assert rows[r] == (0 if r in cleared else old[r]), r
        c.check = check
        cases.append(c)
    return cases


FAMILIES = {
    "copy_fill": copy_cases,
    "bias_act": bias_act_cases,
    "act_backward": act_backward_cases,
    "matmul": matmul_cases,
    "conv": conv_cases,
    "normalize": normalize_cases,
    "logger": logger_cases,
    "resize": resize_cases,
}


# ---------------------------------------------------------------- running


def run_driver(variant, cases, directory, schedule="forward", timeout=600):
    dirs = []
    for k, case in enumerate(cases):
        d = os.path.join(directory, "%03d" % k)
        case.write(d)
        dirs.append(d)
    env = tool_env(GPUACCEL_CUDACPU_SCHEDULE=schedule, GPUACCEL_NUM_THREADS="1",
                    ASAN_OPTIONS="detect_leaks=1:abort_on_error=0", UBSAN_OPTIONS="print_stacktrace=1",
                    TSAN_OPTIONS="halt_on_error=0:report_signal_unsafe=0")
    proc = subprocess.run([driver(variant)] + dirs, capture_output=True, text=True, env=env, timeout=timeout)
    launched = dict((m.group(1), int(m.group(2))) for m in re.finditer(r"^launched (\S+) (\d+)$", proc.stdout, re.M))
    return proc, dirs, launched


def outcome(case, d):
    """The cuda side's status and outputs, checked against the twin."""
    status, out = case.read(d, "cuda")
    assert status == "ok", "%s: %s" % (case.name, status)
    if "cpu" in case.lines[1]:
        twin_status, twin = case.read(d, "cpu")
        assert twin_status == "ok", "%s (cpu twin): %s" % (case.name, twin_status)
        for name in case.written:
            if case.twin == "bits":
                assert out[name].tobytes() == twin[name].tobytes(), "%s: %s differs from the CPU twin" % (
                    case.name, name)
            elif case.twin == "units":  # integers from float sums in another order: a few units
                diff = np.abs(out[name].astype(np.int64) - twin[name].astype(np.int64))
                assert diff.max() <= 3, "%s: %s differs from the CPU twin by %d" % (case.name, name, diff.max())
            elif case.twin == "close":  # sums in another order: within a few roundings of the largest
                dtype = dtype_name(out[name].dtype)
                scale = np.nanmax(np.abs(f64(twin[name])), initial=0.0)
                assert_within(out[name], f64(twin[name]), 4 * rounding_bound(scale, dtype),
                              what="%s: %s vs the CPU twin" % (case.name, name))
        if case.twin in ("close", "units"):
            case.check(twin)
    case.check(out)
    return out


@pytest.fixture(scope="module")
def suite(tmp_path_factory, request):
    """Every family's cases (one seed per module run), run once per
    schedule on the plain build: {schedule: (cases, outputs, launched)}."""
    seed = seed_for(request.node.nodeid)
    rng = np.random.default_rng(seed)
    cases = {family: make(rng) for family, make in FAMILIES.items()}
    flat = [c for family in FAMILIES for c in cases[family]]
    results = {}
    for schedule in SCHEDULES:
        directory = str(tmp_path_factory.mktemp(schedule.replace(":", "_")))
        proc, dirs, launched = run_driver("plain", flat, directory, schedule)
        assert proc.returncode == 0, proc.stderr[-4000:]
        results[schedule] = (dict(zip((id(c) for c in flat), dirs)), launched, proc)
    return seed, cases, results


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_kernels_match_twin_and_float64(suite, family, schedule):
    seed, cases, results = suite
    dirs, _, _ = results[schedule]
    for case in cases[family]:
        try:
            outcome(case, dirs[id(case)])
        except AssertionError as e:
            raise AssertionError("GPUACCEL_TEST_SEED=%d GPUACCEL_CUDACPU_SCHEDULE=%s: %s" % (seed, schedule, e)) from e


@pytest.mark.parametrize("family", list(FAMILIES))
def test_same_bits_under_every_schedule(suite, family):
    """The kernels claim results that do not depend on thread or block
    order; a missing barrier usually breaks that first."""
    seed, cases, results = suite
    for case in cases[family]:
        outputs = {}
        for schedule in SCHEDULES:
            _, out = case.read(results[schedule][0][id(case)], "cuda")
            outputs[schedule] = {name: out[name].tobytes() for name in case.written}
        for schedule in SCHEDULES[1:]:
            for name in case.written:
                assert outputs[schedule][name] == outputs[SCHEDULES[0]][name], (
                    "GPUACCEL_TEST_SEED=%d: %s: %s differs between %s and %s" % (
                        seed, case.name, name, SCHEDULES[0], schedule))


def test_every_global_kernel_ran(suite):
    _, _, results = suite
    for schedule, (_, launched, _) in results.items():
        missing = global_kernels() - set(launched)
        assert not missing, "under %s, never launched: %s" % (schedule, sorted(missing))
    assert len(global_kernels()) >= 14


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_kernels_under_sanitizers(variant, tmp_path, request):
    """Every kernel again (fewer and smaller cases under TSan, which is
    slow) with AddressSanitizer + UBSan, or ThreadSanitizer told about
    the fibers and CUDA's barriers: no report, same results."""
    seed = seed_for(request.node.nodeid)
    rng = np.random.default_rng(seed)
    cases = [c for make in FAMILIES.values() for c in make(rng)]
    if variant == "tsan":  # a few copies and fills, the wide and the split bias-gradient sums once
        cases = [c for k, c in enumerate(cases)
                 if (c.op not in ("copy", "fill") or k % 8 == 0) and "wide tile" not in c.name
                 and ("split" not in c.name or "(1100, 64)" in c.name)]
    proc, dirs, launched = run_driver(variant, cases, str(tmp_path), "random:%d" % (seed % 1000))
    report = re.search(r"(AddressSanitizer|ThreadSanitizer|runtime error)", proc.stderr)
    assert not report and proc.returncode == 0, proc.stderr[-6000:]
    for case, d in zip(cases, dirs):
        outcome(case, d)
    assert global_kernels() <= set(launched), sorted(global_kernels() - set(launched))


# ------------------------------------------------------- the layer itself


def selftest_case(name, n=0, inputs=None, out_size=1024):
    c = Case("selftest " + name, "selftest", sides=("cuda",))
    c.text("name", name)
    c.ints("n", n)
    c.ptr("in", np.asarray(inputs if inputs is not None else [0], np.int32))
    c.ptr("out", np.zeros(out_size, np.int32), written=True)
    c.check = lambda out: None
    return c


def run_selftests(variant, cases, tmp_path, schedule="forward"):
    proc, dirs, _ = run_driver(variant, cases, str(tmp_path), schedule)
    results = []
    for case, d in zip(cases, dirs):
        if os.path.exists(os.path.join(d, "status.cuda")):
            results.append(case.read(d, "cuda"))
        else:
            results.append((None, None))
    return proc, results


@pytest.mark.parametrize("name", [
    "warp_collectives", "vote_after_exit", "barrier_counts", "atomics", "block_sum"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_layer_keeps_cuda_semantics(name, schedule, tmp_path, rng):
    inputs = rng.integers(-1000, 1000, size=203)
    proc, [(status, out)] = run_selftests("plain", [selftest_case(name, inputs.size, inputs)], tmp_path, schedule)
    assert status == "ok", "%s\n%s" % (status, proc.stderr[-2000:])
    if name == "block_sum":
        assert out["out"][0] == inputs.sum()


@pytest.mark.parametrize("name, message", [
    ("barrier_in_branch", "divergent barrier: thread 0 waits at __syncthreads at selftest.cu:"),
    ("return_before_barrier", "but thread 3 has returned without reaching it"),
    ("two_barriers", "divergent barrier"),
    ("full_mask_partial_warp", "names lanes that warp 1 of this block lacks (it has lanes 0-7)"),
    ("lanes_at_different_votes", "warp collectives disagree"),
    ("barrier_against_syncwarp", "deadlock: thread 0 waits at __syncthreads"),
    ("mask_without_caller", "the mask does not name the calling lane"),
    ("shuffle_from_exited_lane", "reads lane 5, which has exited"),
    ("oversized_block", "cudaErrorInvalidConfiguration"),
    ("dynamic_shared_memory", "dynamic shared memory"),
])
def test_layer_reports_what_a_gpu_would_not_survive(name, message, tmp_path):
    """Reported as the launch's error (cudaGetLastError), never an abort:
    the driver goes on to the next case."""
    cases = [selftest_case(name), selftest_case("block_sum", 3, [1, 2, 3])]
    proc, [(status, _), (after, out)] = run_selftests("plain", cases, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert status.startswith("error") and message in status, status
    assert after == "ok" and out["out"][0] == 6


def test_a_write_past_a_buffer_is_an_error_without_asan(tmp_path):
    """The driver's guard zones: in a build without AddressSanitizer a
    kernel's write past its buffer still fails the call."""
    proc, [(status, _)] = run_selftests("plain", [selftest_case("write_each", 32, out_size=32)], tmp_path)
    assert status == "error: wrote past the end of buffer out (at byte 128)", status


def test_missing_barrier_gives_a_wrong_sum_under_some_schedule(tmp_path, rng):
    """Each of the two barriers of a block sum, deleted: some schedule
    must see the wrong sum (and forward alone does not catch both)."""
    inputs = rng.integers(1, 1000, size=64)
    caught = {}
    for name in ("block_sum_no_barrier", "block_sum_no_tree_barrier"):
        for schedule in SCHEDULES:
            proc, [(status, out)] = run_selftests("plain", [selftest_case(name, inputs.size, inputs)],
                                                 tmp_path / name / schedule.replace(":", "_"), schedule)
            assert status == "ok", status
            if out["out"][0] != inputs.sum():
                caught.setdefault(name, []).append(schedule)
    assert set(caught) == {"block_sum_no_barrier", "block_sum_no_tree_barrier"}, caught


def test_record_order_follows_the_schedule(tmp_path):
    n = 96  # three blocks of 32
    orders = {}
    for schedule in ("forward", "reverse", "random:1", "random:2"):
        proc, [(status, out)] = run_selftests("plain", [selftest_case("record_order", n, out_size=n + 1)],
                                             tmp_path / schedule.replace(":", "_"), schedule)
        assert status == "ok", status
        orders[schedule] = list(out["out"][:n])
    assert orders["forward"] == list(range(n))
    assert orders["reverse"] == list(range(n))[::-1]
    for s in ("random:1", "random:2"):
        assert sorted(orders[s]) == list(range(n)) and orders[s] not in (orders["forward"], orders["reverse"])
    assert orders["random:1"] != orders["random:2"]


def test_bad_schedule_is_an_error(tmp_path):
    cases = [selftest_case("block_sum", 3, [1, 2, 3])]
    dirs = []
    for k, case in enumerate(cases):
        case.write(str(tmp_path / str(k)))
        dirs.append(str(tmp_path / str(k)))
    env = tool_env(GPUACCEL_CUDACPU_SCHEDULE="sideways")
    subprocess.run([driver("plain")] + dirs, capture_output=True, text=True, env=env)
    with open(os.path.join(dirs[0], "status.cuda")) as f:
        assert "GPUACCEL_CUDACPU_SCHEDULE=sideways" in f.read()


@pytest.mark.parametrize("name, report", [
    ("write_each", "AddressSanitizer: use-after-poison"),  # the driver's guard zone
    ("shared_past_end", "AddressSanitizer: global-buffer-overflow"),
])
def test_asan_reports_an_index_past_an_array(name, report, tmp_path):
    proc, _ = run_selftests("asan", [selftest_case(name, 32, out_size=32)], tmp_path)
    assert report in proc.stderr, proc.stderr[-3000:]
    assert re.search(r"#0 0x[0-9a-f]+ in %s .*selftest.cu:\d+" % name, proc.stderr), proc.stderr[-3000:]


def test_tsan_reports_the_race_of_a_missing_barrier(tmp_path, rng):
    inputs = rng.integers(1, 1000, size=64)
    proc, [(status, _)] = run_selftests("tsan", [selftest_case("block_sum_no_barrier", inputs.size, inputs)], tmp_path)
    assert "WARNING: ThreadSanitizer: data race" in proc.stderr, proc.stderr[-3000:]
    assert "block_sum<false, true>" in proc.stderr  # the kernel without its first barrier
    proc, [(status, out)] = run_selftests("tsan", [selftest_case("block_sum", inputs.size, inputs)], tmp_path / "clean")
    assert "ThreadSanitizer" not in proc.stderr and status == "ok", proc.stderr[-3000:]
    assert out["out"][0] == inputs.sum()
