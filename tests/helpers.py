"""Test helpers: references, tolerances, synthetic DLPack capsules, leak
and resource checks, child interpreters."""

import ctypes
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np
import pytest

import gpuaccel

ALL_DTYPES = list(gpuaccel.DTYPES)
FLOAT_DTYPES = ["float16", "bfloat16", "float32", "float64"]
INT_DTYPES = ["uint8", "int8", "int16", "int32", "int64"]
# ~0.5 s of GPU time at H100 clocks, for torch.cuda._sleep (it spins for cycles):
# long enough that work queued behind it is visibly still pending
LONG_SLEEP_CYCLES = 1_000_000_000


def seed_for(nodeid):
    """The seed of the test (or module) `nodeid`: fixed by its id, so every
    run draws the same inputs, unless GPUACCEL_TEST_SEED gives one (a
    number) or asks for a fresh one per test ("random")."""
    pinned = os.environ.get("GPUACCEL_TEST_SEED", "")
    if pinned == "random":
        return int.from_bytes(os.urandom(4), "little")
    if pinned:
        return int(pinned)
    return zlib.crc32(nodeid.encode())


def simulated():
    """True for a simulator build (GPUACCEL_SIM=1, kernels/sim/sim.c): its
    devices are simulated GPUs backed by host memory."""
    try:
        return gpuaccel.cuda_available() and gpuaccel.device_properties(0)["name"].startswith(
            "gpuaccel simulated")
    except Exception:  # noqa: BLE001 - no usable device 0 is not a simulator either
        return False


def assert_within(actual, expected, atol, rtol, reduction=1):
    """|actual - expected| <= atol * sqrt(reduction) + rtol * |expected| for
    every element, compared as float64 (NaN fails).  `reduction` is the
    length of the sums behind each element: their rounding error grows like
    its square root."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    bound = atol * np.sqrt(max(reduction, 1)) + rtol * np.abs(expected)
    err = np.abs(actual - expected)
    bad = ~(err <= bound)  # NaN counts as bad
    if bad.any():
        worst = np.unravel_index(np.argmax(np.where(bad, err, -1.0)), err.shape)
        raise AssertionError("%d of %d elements off; worst %g at %s (bound there %g)" % (
            bad.sum(), bad.size, err[worst], tuple(int(i) for i in worst), np.broadcast_to(bound, err.shape)[worst]))


# tolerances of the form atol + rtol * |reference|, per dtype
TOLERANCE = {
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 8e-3),
    "float32": (1e-6, 1e-6),
    "float64": (1e-12, 1e-12),
}


# Unit roundoff of each float dtype (half an ulp, relative): 2^-p for p
# bits of significand.
UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24, "float64": 2.0 ** -53}


def sum_tolerance(dtype, roundings=1):
    """(atol, rtol) for assert_within of a result of `dtype` computed as a
    sum of products and rounded `roundings` times to `dtype`, against a
    float64 reference computed from the *same* (already rounded) inputs.
    16-bit results accumulate in float32: a few float32 roundoffs per
    sqrt(term) (atol, times sqrt(reduction) in assert_within) plus each
    rounding to the output dtype, at most half an ulp of it, relative
    (rtol).  A 1% error in bfloat16 (2.5 ulps) fails this bound."""
    accumulate = "float64" if dtype == "float64" else "float32"
    return 16 * UNIT_ROUNDOFF[accumulate], roundings * UNIT_ROUNDOFF[dtype] * 1.01


def assert_sum_close(actual, expected, dtype, reduction, tolerance, flip=0.0):
    """actual within tolerance[dtype] = (atol, rtol) of expected, for a sum
    of `reduction` terms (assert_within).  `flip`: the largest term of the
    sum; where the kernels round an intermediate (the activation's
    gradient) to a 16-bit dtype, they and a float64 reference may round a
    term near a midpoint to different neighbours, each such term off by an
    ulp of it (allowed twice)."""
    atol, rtol = tolerance[dtype]
    extra = 2 * 2 * UNIT_ROUNDOFF[dtype] * flip if dtype in ("float16", "bfloat16") else 0.0
    assert_within(actual, expected, atol + extra / np.sqrt(max(reduction, 1)), rtol, reduction)


def assert_close(actual, expected, dtype, scale=1.0):
    """actual within `scale` times `dtype`'s TOLERANCE of expected."""
    atol, rtol = TOLERANCE[dtype]
    assert_within(actual, expected, scale * atol, scale * rtol)


# Every activation gpuaccel fuses, by the names the ops take ("gelu" is
# nn.GELU()'s exact erf form, "gelu_tanh" its tanh approximation).
ACTIVATIONS = ["relu", "gelu", "gelu_tanh", "silu", "hardswish", "sigmoid"]


def _erf(z):
    from math import erf

    return np.vectorize(erf, otypes=[np.float64])(z)


def activation_ref(z, activation):
    """gpuaccel's activation of a float64 NumPy array, from the textbook
    formulas (independent of torch, which torch_activation uses)."""
    z = np.asarray(z, dtype=np.float64)
    if activation == "relu":
        return np.maximum(z, 0)
    if activation == "gelu":
        return 0.5 * z * (1 + _erf(z / np.sqrt(2)))
    if activation == "gelu_tanh":
        return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
    if activation == "silu":
        return z / (1 + np.exp(-z))
    if activation == "hardswish":
        return z * np.clip(z + 3, 0, 6) / 6
    if activation == "sigmoid":
        return 1 / (1 + np.exp(-z))
    assert activation in (None, "none"), activation
    return z


def activation_grad_ref(z, activation):
    """The derivative of activation_ref at z (float64 NumPy arrays), with
    torch's values at the breakpoints: relu'(0) = 0, hardswish' = 0 at -3
    and 1 at 3."""
    z = np.asarray(z, dtype=np.float64)
    if activation == "relu":
        return (z > 0).astype(np.float64)
    if activation == "gelu":
        return 0.5 * (1 + _erf(z / np.sqrt(2))) + z * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)
    if activation == "gelu_tanh":
        t = np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3))
        return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * z * z)
    if activation == "silu":
        s = 1 / (1 + np.exp(-z))
        return s * (1 + z * (1 - s))
    if activation == "hardswish":
        return np.where(z <= -3, 0.0, np.where(z < 3, z / 3 + 0.5, 1.0))
    if activation == "sigmoid":
        s = 1 / (1 + np.exp(-z))
        return s * (1 - s)
    assert activation in (None, "none"), activation
    return np.ones_like(z)


def torch_activation(z, activation):
    """torch's own function for the activation of a tensor (the module a
    model would use), differentiable by autograd."""
    import torch
    import torch.nn.functional as F

    fns = {"relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
           "silu": F.silu, "hardswish": F.hardswish, "sigmoid": torch.sigmoid}
    if activation in (None, "none"):
        return z
    return fns[activation](z)


def torch_activation_module(activation):
    """The nn.Module a model uses for the activation."""
    import torch

    return {"relu": torch.nn.ReLU, "gelu": torch.nn.GELU, "gelu_tanh": lambda: torch.nn.GELU(approximate="tanh"),
            "silu": torch.nn.SiLU, "hardswish": torch.nn.Hardswish, "sigmoid": torch.nn.Sigmoid}[activation]()


def torch_dtype(name):
    import torch

    return getattr(torch, name)


def numpy_dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def random_values(rng, shape, dtype, wide=False):
    """A NumPy array of random values of a gpuaccel dtype.  Integers lie
    within +-2**40, which float64 holds exactly (so conversions compare
    exactly), floats are standard normal.  wide=True, for casts and bit
    patterns: integers span the dtype's whole range and each float is scaled
    by one of 1, 1e3 and 1e-3 (float16's overflow and subnormals)."""
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype in INT_DTYPES:
        info = np.iinfo(dtype)
        lo, hi = (info.min, info.max) if wide else (max(info.min, -(2**40)), min(info.max, 2**40))
        return rng.integers(lo, hi, size=shape, endpoint=True, dtype=np.int64).astype(dtype)
    values = rng.standard_normal(size=shape)
    if wide:
        values *= rng.choice([1.0, 1e3, 1e-3], size=shape)
    return values.astype(numpy_dtype(dtype))


def random_strided_view(rng, base_shape, dtype):
    """A NumPy array of random values viewed with random steps and offsets."""
    full = random_values(rng, tuple(s * 2 + 1 for s in base_shape), dtype)
    index = tuple(slice(int(rng.integers(0, 2)), None, int(rng.choice([1, 2, -1]))) for _ in base_shape)
    view = full[index]
    return view[tuple(slice(0, s) for s in base_shape)]


def count_live(kind):
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o).__name__ == kind)


# ---------------------------------------------------------------- DLPack

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class SyntheticTensor:
    """A DLPack producer built by hand, to test what real producers rarely
    send: byte offsets, NULL strides, odd versions and flags, bad fields.
    `deleted` counts deleter calls."""

    def __init__(self, buffer, dtype_code, bits, shape, strides=None, byte_offset=0, device=(1, 0),
                 versioned=True, version=(1, 1), flags=0, data=None, lanes=1, ndim=None):
        self.buffer = buffer  # keeps the memory alive
        self.deleted = 0
        self._shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self._strides = None if strides is None else (ctypes.c_int64 * max(len(strides), 1))(*strides)
        if data is None:
            data = ctypes.addressof(ctypes.c_char.from_buffer(buffer)) if len(memoryview(buffer)) else None
        tensor = DLTensor(
            data, DLDevice(*device), len(shape) if ndim is None else ndim, DLDataType(dtype_code, bits, lanes),
            ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64)),
            ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64)) if self._strides is not None else None,
            byte_offset,
        )

        def on_delete(ptr):
            self.deleted += 1

        self._deleter = DELETER(on_delete)
        if versioned:
            self.managed = DLManagedTensorVersioned(DLPackVersion(*version), None, self._deleter, flags, tensor)
            self.name = b"dltensor_versioned"
        else:
            self.managed = DLManagedTensor(tensor, None, self._deleter)
            self.name = b"dltensor"

    def capsule(self):
        # no destructor: the test checks `deleted` to see who called it
        return _PyCapsule_New(ctypes.addressof(self.managed), self.name, None)


_PyCapsule_GetName = ctypes.pythonapi.PyCapsule_GetName
_PyCapsule_GetName.restype = ctypes.c_char_p
_PyCapsule_GetName.argtypes = [ctypes.py_object]


def capsule_name(capsule):
    """The capsule's name as bytes, None for a NULL name (a producer may
    name a capsule anything, not only valid UTF-8)."""
    return _PyCapsule_GetName(capsule)


def refcount(obj):
    return sys.getrefcount(obj)


# ---------------------------------------------------------------- leaks

class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]


def _libc():
    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def heap_in_use():
    """Bytes the C heap (glibc malloc, every arena, mmapped blocks included)
    has handed out and not got back; None where mallinfo2 is missing."""
    if _LIBC is None:
        return None
    info = _LIBC.mallinfo2()
    return info.uordblks + info.hblkhd


def sanitized():
    """Whether this is the ASan + UBSan build, whose allocator quarantines
    freed memory and maps shadow pages of its own: resident memory and page
    faults measure it, not gpuaccel."""
    from gpuaccel import _build_config

    return bool(getattr(_build_config, "SANITIZE", False))


def rss_bytes():
    """Resident memory, after giving freed heap pages back to the system;
    None under a sanitizer build (sanitized()) or without psutil."""
    if sanitized():
        return None
    try:
        import psutil
    except ImportError:
        return None
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    return psutil.Process().memory_info().rss


def cpu_allocated():
    """Bytes gpuaccel's CPU pool has handed out and not got back."""
    return gpuaccel.memory_stats("cpu")["allocated_bytes"]


def _leak_snapshot(watch):
    gc.collect()
    gc.collect()
    return {
        "totalrefcount": sys.gettotalrefcount() if hasattr(sys, "gettotalrefcount") else None,
        "gc_objects": len(gc.get_objects()),
        "watched_refcounts": [sys.getrefcount(o) for o in watch],
        "pool_bytes": cpu_allocated(),
        "heap_bytes": heap_in_use(),
        "rss": rss_bytes(),
    }


def assert_no_leak(fn, iterations=1000, warmup=100, *, watch=(), object_slack=64, refcount_slack=200,
                   heap_slack=256 << 10, rss_slack=4 << 20, pool=True, label=None):
    """Runs fn() `warmup` times, then `iterations` times, and asserts that the
    second run left nothing behind: no growth of the interpreter's total
    reference count (debug builds only), of the number of gc-tracked objects
    beyond `object_slack`, of the reference count of each object in `watch`
    (exactly), of gpuaccel's CPU pool (allocated bytes, exactly, with
    pool=True), of the C heap in use beyond `heap_slack` (glibc only) or of
    the resident set beyond `rss_slack` (psutil only).

    Returns the growth figures, for a report."""
    watch = tuple(watch)
    for _ in range(warmup):
        fn()
    before = _leak_snapshot(watch)
    for _ in range(iterations):
        fn()
    after = _leak_snapshot(watch)
    name = label or getattr(fn, "__name__", repr(fn))
    growth = {}
    for key in ("totalrefcount", "gc_objects", "pool_bytes", "heap_bytes", "rss"):
        if before[key] is not None and after[key] is not None:
            growth[key] = after[key] - before[key]
    problems = []
    if "totalrefcount" in growth and growth["totalrefcount"] > refcount_slack:
        problems.append("total refcount grew by %d" % growth["totalrefcount"])
    if growth["gc_objects"] > object_slack:
        counts = {}
        for o in gc.get_objects():
            counts[type(o).__name__] = counts.get(type(o).__name__, 0) + 1
        problems.append("gc-tracked objects grew by %d (most common now: %s)" % (
            growth["gc_objects"], sorted(counts.items(), key=lambda kv: -kv[1])[:5]))
    for i, (b, a) in enumerate(zip(before["watched_refcounts"], after["watched_refcounts"])):
        if a != b:
            problems.append("refcount of watched object %d (%s) went from %d to %d"
                            % (i, type(watch[i]).__name__, b, a))
    if pool and growth["pool_bytes"] != 0:
        problems.append("gpuaccel's CPU pool holds %d more bytes" % growth["pool_bytes"])
    if "heap_bytes" in growth and growth["heap_bytes"] > heap_slack:
        problems.append("C heap in use grew by %d bytes (%.1f per call)"
                        % (growth["heap_bytes"], growth["heap_bytes"] / max(iterations, 1)))
    if "rss" in growth and growth["rss"] > rss_slack:
        problems.append("RSS grew by %d bytes" % growth["rss"])
    assert not problems, "%s leaked over %d calls: %s" % (name, iterations, "; ".join(problems))
    return growth


def settle(condition, timeout=5.0):
    """True once condition() holds, False after `timeout` seconds (a joined
    thread's OS thread, or a closed descriptor, may take a moment to be gone
    from /proc)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def native_threads():
    """The names of this process's OS threads (Linux /proc), sorted; a
    thread that ends meanwhile is left out."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % tid) as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return sorted(names)


def open_fds():
    return len(os.listdir("/proc/self/fd"))


# ---------------------------------------------------------------- the CUDA toolkit

def cuda_include_dir(*headers):
    """The CUDA toolkit's include folder that holds every one of `headers`
    (CUDA_HOME, CUDA_PATH, nvcc's, /usr/local/cuda), or None."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        homes.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    homes.append("/usr/local/cuda")
    for home in filter(None, homes):
        inc = os.path.join(home, "include")
        if all(os.path.exists(os.path.join(inc, h)) for h in headers):
            return inc
    return None


# ---------------------------------------------------------------- child interpreters

def python_env(**overrides):
    """This process's environment for a child interpreter: the folder this
    gpuaccel was imported from first on PYTHONPATH (so that an in-place build
    is found from any folder), no pinned test seed, and `overrides`."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(gpuaccel.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    env.pop("GPUACCEL_TEST_SEED", None)
    env.update(overrides)
    return env


def run_python(*argv, timeout=120, env=None, text=True, cwd=None):
    """Runs this interpreter with `argv` (e.g. "-c", code) in `cwd` (default:
    the temporary folder, outside the checkout), with python_env(**env);
    returns the CompletedProcess, output captured.
    A run past `timeout` seconds is killed and fails the test."""
    try:
        return subprocess.run([sys.executable, *map(str, argv)], timeout=timeout, capture_output=True, text=text,
                              cwd=cwd or tempfile.gettempdir(), env=python_env(**(env or {})))
    except subprocess.TimeoutExpired as e:
        err = e.stderr or b""
        if isinstance(err, bytes):
            err = err.decode(errors="replace")
        pytest.fail("the subprocess hung (killed after %d s); stderr so far:\n%s" % (timeout, err[-3000:]))
