"""The registry of the ops the tests exercise, in the spirit of PyTorch's
OpInfo: each op once, with how to call it, its sample inputs, its float64
reference, the dtypes, activations and layouts it takes, and its tolerance.
The tests draw from here (tests/README.md says which test uses what), so
that a new activation or op is written down once:

- an activation: one Activation in ACTIVATIONS (its float64 function and
  derivative, in ACTIVATION_MATH if the function is new).  Every op test
  parametrized by ACTIVATIONS, the fuzzer, the fault, leak, simulator,
  CUDA, blocking and kernel-on-CPU tests then cover it;
- an op: one OpInfo in OPS (samples, reference, dtypes, tolerance).
  test_ops.py checks every sample against the reference in every dtype,
  test_faults.py injects an out-of-memory at every allocation of every
  sample, test_stress.py checks every sample for leaks, test_cuda_ops.py
  runs every sample on the CUDA backend (real or simulated) against the CPU.

References are float64 NumPy computed from the inputs as the op sees them
(already rounded to their dtype), independent of the code under test.
"""

import glob
import math
import os
import re
import warnings

import numpy as np

import gpuaccel as ga

from helpers import FLOAT_DTYPES, INT_DTYPES, assert_sum_close, numpy_dtype, sum_tolerance

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HALF_DTYPES = ("float16", "bfloat16")


def _torch():
    import torch  # the torch forms only: the NumPy references do not need it

    return torch


# ====================================================== activation math

_erf = np.vectorize(math.erf, otypes=[np.float64])
_GELU_C = math.sqrt(2.0 / math.pi)


def _sigmoid(z):
    e = np.exp(-np.abs(z))  # never overflows: exp of a non-positive number
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _gelu_tanh(z):
    return 0.5 * z * (1 + np.tanh(_GELU_C * (z + 0.044715 * z ** 3)))


def _gelu_tanh_grad(z):
    t = np.tanh(_GELU_C * (z + 0.044715 * z ** 3))
    return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _GELU_C * (1 + 3 * 0.044715 * z * z)


class ActivationMath:
    """One activation function: `forward` and `derivative` on float64 NumPy
    arrays (at a kink, the derivative is torch's one-sided choice, as
    autograd computes it), the torch form (a differentiable callable of a
    tensor) and the nn.Module a model uses for it, `max_slope` an upper
    bound of |derivative| (tolerances that scale with it), `kinks` the
    points where the derivative jumps (gradient checks keep away from
    them)."""

    def __init__(self, forward, derivative, torch_form, module, max_slope, kinks=()):
        self.forward, self.derivative, self._torch_form, self._module = forward, derivative, torch_form, module
        self.max_slope, self.kinks = max_slope, kinks

    def torch(self, z):
        return self._torch_form(_torch(), z)

    def module(self):
        return self._module(_torch().nn)


ACTIVATION_MATH = {
    "identity": ActivationMath(lambda z: z, np.ones_like, lambda torch, z: z, lambda nn: nn.Identity(), 1.0),
    "relu": ActivationMath(lambda z: np.maximum(z, 0.0), lambda z: (z > 0).astype(np.float64),
                           lambda torch, z: torch.relu(z), lambda nn: nn.ReLU(), 1.0, kinks=(0.0,)),
    "gelu_tanh": ActivationMath(_gelu_tanh, _gelu_tanh_grad,
                                lambda torch, z: torch.nn.functional.gelu(z, approximate="tanh"),
                                lambda nn: nn.GELU(approximate="tanh"), 1.13),
    "gelu_erf": ActivationMath(
        lambda z: 0.5 * z * (1 + _erf(z / math.sqrt(2.0))),
        lambda z: 0.5 * (1 + _erf(z / math.sqrt(2.0))) + z * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi),
        lambda torch, z: torch.nn.functional.gelu(z), lambda nn: nn.GELU(), 1.13),
    "sigmoid": ActivationMath(_sigmoid, lambda z: _sigmoid(z) * (1 - _sigmoid(z)),
                              lambda torch, z: torch.sigmoid(z), lambda nn: nn.Sigmoid(), 0.25),
    "silu": ActivationMath(lambda z: z * _sigmoid(z), lambda z: _sigmoid(z) * (1 + z * (1 - _sigmoid(z))),
                           lambda torch, z: torch.nn.functional.silu(z), lambda nn: nn.SiLU(), 1.1),
    "hardswish": ActivationMath(lambda z: z * np.clip(z + 3, 0, 6) / 6,
                                lambda z: np.where(z <= -3, 0.0, np.where(z < 3, z / 3 + 0.5, 1.0)),
                                lambda torch, z: torch.nn.functional.hardswish(z), lambda nn: nn.Hardswish(), 1.5,
                                kinks=(-3.0, 3.0)),
}


class Activation:
    """An activation gpuaccel's fused ops take.

    name: the public spelling (None for no activation); label: a name for
    test ids and the kernel driver ("none" for None).  math: its
    ActivationMath.  kernel_enum: its ga_activation enumerator in
    kernels/kernels.h.  saves: what save_preactivation=True hands back
    beside y, and so what the backward ops take to differentiate it --
    None (nothing: the gradient passes through), "output" (y itself, which
    determines the derivative; the backward takes y= or preactivation=) or
    "preactivation" (z = x @ w.T + b, the backward needs preactivation=).
    cudnn_mode: the cuDNN pointwise mode of a fused conv graph
    (kernels/cuda/cudnn_graph.cu's activation_mode), None where cuDNN has
    none: conv.cu then never builds the fused graph and takes the split
    route (conv + bias in cuDNN, the activation in gpuaccel's kernel).
    cublaslt: the stem of its cuBLASLt epilogues (CUBLASLT_EPILOGUE_<stem>_BIAS
    ...), None where cuBLASLt has none (matmul.cu runs the plain GEMM and
    gpuaccel's epilogue kernel)."""

    def __init__(self, name, math_name, kernel_enum, saves, cudnn_mode, cublaslt):
        self.name, self.label = name, name or "none"
        self.math = ACTIVATION_MATH[math_name]
        self.kernel_enum, self.saves = kernel_enum, saves
        self.cudnn_mode, self.cublaslt = cudnn_mode, cublaslt

    def __repr__(self):
        return "Activation(%r)" % (self.name,)

    def ref(self, z):
        """The activation of a float64 NumPy array."""
        return self.math.forward(np.asarray(z, np.float64))

    def grad(self, z):
        """Its derivative at z (z may also be the saved y of an activation
        that saves "output": its derivative is the same function of y)."""
        return self.math.derivative(np.asarray(z, np.float64))

    def torch(self, z):
        """The activation of a torch tensor, differentiable by autograd."""
        return self.math.torch(z)

    def module(self):
        """The nn.Module a model uses for it (a new one each call)."""
        return self.math.module()

    @property
    def exact_gradient(self):
        """Whether the derivative is 0 or 1 everywhere: the kernels' rounding
        of grad_y * act'(z) to a 16-bit dtype is then exact."""
        return self.saves != "preactivation"

    @property
    def code(self):
        """Its value in kernels/kernels.h (what the kernel driver takes)."""
        return kernel_enums()[self.kernel_enum]

    def backward_kwargs(self, y, aux, prefer_y=False):
        """The keyword arguments linear_backward / conv2d_backward take to
        differentiate this activation, from the forward's y and its
        save_preactivation aux."""
        if self.saves is None:
            return {}
        if self.saves == "output" and prefer_y:
            return {"y": y}
        return {"preactivation": aux}


# The activations gpuaccel takes: the one place a new activation goes.
ACTIVATIONS = {act.name: act for act in [
    Activation(None, "identity", "GA_ACT_NONE", None, None, None),
    Activation("relu", "relu", "GA_ACT_RELU", "output", "CUDNN_POINTWISE_RELU_FWD", "RELU"),
    Activation("gelu", "gelu_erf", "GA_ACT_GELU", "preactivation", "CUDNN_POINTWISE_GELU_FWD", None),
    Activation("gelu_tanh", "gelu_tanh", "GA_ACT_GELU_TANH", "preactivation", "CUDNN_POINTWISE_GELU_APPROX_TANH_FWD",
               "GELU"),
    Activation("silu", "silu", "GA_ACT_SILU", "preactivation", "CUDNN_POINTWISE_SWISH_FWD", None),
    Activation("hardswish", "hardswish", "GA_ACT_HARDSWISH", "preactivation", None, None),
    Activation("sigmoid", "sigmoid", "GA_ACT_SIGMOID", "preactivation", "CUDNN_POINTWISE_SIGMOID_FWD", None),
]}
ACTIVATION_NAMES = list(ACTIVATIONS)
# other names the ops take for a registered activation (csrc/opcall.c's
# table): the exact GELU by a name that never warns that "gelu" changed
ACTIVATION_ALIASES = {"gelu_erf": "gelu"}
# the activations that take a slope other than 0 or 1 (their gradient rounds)
SMOOTH_ACTIVATIONS = [name for name, act in ACTIVATIONS.items() if not act.exact_gradient]


def activation(name):
    """The Activation of a public name, alias or label ("none" for None)."""
    return ACTIVATIONS[None if name == "none" else ACTIVATION_ALIASES.get(name, name)]


def act_ref(z, name):
    return activation(name).ref(z)


def act_grad_ref(z, name):
    return activation(name).grad(z)


def torch_act(z, name):
    return activation(name).torch(z)


# near misses of real names among them: another case, torch's spellings of
# other functions, an exact GELU by a name gpuaccel does not take
_NOT_ACTIVATIONS = ["Relu", "tanh", "swish", "elu", "GELU", "gelu_exact", "", "none ", "None", 0, 1.5, b"relu",
                    ("relu",), "\ud800"]
_WITH_NUL = ["gelu\0", "relu\0junk"]


def invalid_activations(embedded_nul=True):
    """Values that are not an activation (spellings close to real ones among
    them); `embedded_nul`: also names with a NUL inside."""
    return [v for v in _NOT_ACTIVATIONS + (_WITH_NUL if embedded_nul else [])
            if v not in ACTIVATIONS and v not in ACTIVATION_ALIASES]


def kernel_enums():
    """GA_ACT_* name -> value, as kernels/*.h define the ga_activation
    enumerators (implicit values counted on; a trailing *_COUNT is a count,
    not an activation)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "kernels", "**", "*.h"), recursive=True)):
        with open(path) as f:
            text = re.sub(r"/\*.*?\*/|//[^\n]*", "", f.read(), flags=re.S)
        for body in re.findall(r"typedef\s+enum\s*\w*\s*\{([^}]*\bGA_ACT_\w+[^}]*)\}\s*ga_activation\s*;", text):
            value = -1
            for item in filter(None, (i.strip() for i in body.split(","))):
                m = re.fullmatch(r"(GA_ACT_\w+)\s*(?:=\s*(\d+))?", item)
                assert m, "kernels' ga_activation has an enumerator this parser does not read: %r" % item
                value = int(m.group(2)) if m.group(2) else value + 1
                if not m.group(1).endswith("_COUNT"):
                    found[m.group(1)] = value
    return found


# ========================================================= conv geometry

def pair(v):
    """An int or a pair as a pair (conv2d's stride, padding, dilation)."""
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def conv_out_size(size, kernel, stride=1, padding=0, dilation=1):
    """The output length of a convolution along one axis; 0 where the
    padded input is shorter than the dilated kernel."""
    span = dilation * (kernel - 1) + 1
    if size + 2 * padding < span:
        return 0
    return (size + 2 * padding - span) // stride + 1


def conv_out_hw(hw, rs, stride=1, padding=0, dilation=1):
    """(P, Q) of an (H, W) input under an (R, S) kernel."""
    return tuple(conv_out_size(n, k, s, p, d)
                 for n, k, s, p, d in zip(hw, rs, pair(stride), pair(padding), pair(dilation)))


def _conv_patches(x, R, S, P, Q, stride, padding, dilation):
    """x (N, C, H, W) -> patches[r][s]: (N, C, P, Q) of the padded input."""
    N, C, H, W = x.shape
    xp = np.zeros((N, C, H + 2 * padding[0], W + 2 * padding[1]))
    xp[:, :, padding[0]:padding[0] + H, padding[1]:padding[1] + W] = x
    return [[xp[:, :, r * dilation[0]: r * dilation[0] + stride[0] * (P - 1) + 1: stride[0],
                s * dilation[1]: s * dilation[1] + stride[1] * (Q - 1) + 1: stride[1]]
             for s in range(S)] for r in range(R)]


def conv_fwd64(x, w, stride=1, padding=0, dilation=1, groups=1):
    """The convolution of x (N, C, H, W) by w (K, C/groups, R, S), float64,
    NCHW: a sum of shifted patches, no im2col and no FFT."""
    stride, padding, dilation = pair(stride), pair(padding), pair(dilation)
    N, C, H, W = x.shape
    K, Cg, R, S = w.shape
    P, Q = conv_out_hw((H, W), (R, S), stride, padding, dilation)
    patches = _conv_patches(np.asarray(x, np.float64), R, S, P, Q, stride, padding, dilation)
    y = np.zeros((N, K, P, Q))
    Kg = K // groups
    for g in range(groups):
        for r in range(R):
            for s in range(S):
                y[:, g * Kg:(g + 1) * Kg] += np.einsum("ncpq,kc->nkpq", patches[r][s][:, g * Cg:(g + 1) * Cg],
                                                       w[g * Kg:(g + 1) * Kg, :, r, s])
    return y


def conv_bwd_data64(dy, w, x_shape, stride=1, padding=0, dilation=1, groups=1):
    """The gradient of conv_fwd64 with respect to x, given dy (N, K, P, Q)."""
    stride, padding, dilation = pair(stride), pair(padding), pair(dilation)
    N, C, H, W = x_shape
    K, Cg, R, S = w.shape
    P, Q = dy.shape[2:]
    dxp = np.zeros((N, C, H + 2 * padding[0], W + 2 * padding[1]))
    Kg = K // groups
    for g in range(groups):
        for r in range(R):
            for s in range(S):
                dxp[:, g * Cg:(g + 1) * Cg,
                    r * dilation[0]: r * dilation[0] + stride[0] * (P - 1) + 1: stride[0],
                    s * dilation[1]: s * dilation[1] + stride[1] * (Q - 1) + 1: stride[1]] += np.einsum(
                    "nkpq,kc->ncpq", dy[:, g * Kg:(g + 1) * Kg], w[g * Kg:(g + 1) * Kg, :, r, s])
    return dxp[:, :, padding[0]:padding[0] + H, padding[1]:padding[1] + W]


def conv_bwd_filter64(x, dy, w_shape, stride=1, padding=0, dilation=1, groups=1):
    """The gradient of conv_fwd64 with respect to w."""
    stride, padding, dilation = pair(stride), pair(padding), pair(dilation)
    K, Cg, R, S = w_shape
    P, Q = dy.shape[2:]
    patches = _conv_patches(np.asarray(x, np.float64), R, S, P, Q, stride, padding, dilation)
    dw = np.zeros(w_shape)
    Kg = K // groups
    for g in range(groups):
        for r in range(R):
            for s in range(S):
                dw[g * Kg:(g + 1) * Kg, :, r, s] = np.einsum(
                    "nkpq,ncpq->kc", dy[:, g * Kg:(g + 1) * Kg], patches[r][s][:, g * Cg:(g + 1) * Cg])
    return dw


# ================================================================ images

def resize_weights64(origin, scale, lo, hi, n):
    """torch's antialiased bilinear weights (upsample_bilinear2d_aa) of n
    output pixels over input pixels [lo, hi): a float64 matrix."""
    support = scale if scale >= 1 else 1.0
    inv = 1.0 / scale if scale >= 1 else 1.0
    weights = np.zeros((n, hi - lo))
    for k in range(n):
        center = origin - lo + scale * (k + 0.5)
        first, last = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), hi - lo)
        for j in range(first, last):
            weights[k, j] = max(0.0, 1.0 - abs((j - center + 0.5) * inv))
        weights[k] /= weights[k].sum()
    return weights


# ============================================================ conversions

def f64(x):
    """x (a gpuaccel Array on any device, a torch tensor, a NumPy array or a
    number) as a float64 NumPy array."""
    if isinstance(x, ga.Array):
        return np.asarray(x.to("cpu").astype("float64").numpy())
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().double().numpy()
    return np.asarray(x).astype(np.float64)


def round_to(x64, dtype):
    """A float64 array rounded once to `dtype` and back (what a kernel that
    stores an intermediate in `dtype` reads back)."""
    return np.asarray(x64).astype(numpy_dtype(dtype)).astype(np.float64)


def round_to_small_float(value, sig_bits, min_exp, max_finite):
    """value (a Python int or float) rounded once, to nearest even, to a
    binary float with sig_bits significant bits and smallest quantum
    2**min_exp, in exact rational arithmetic: the reference for casts to
    float16/bfloat16."""
    from fractions import Fraction

    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return value
    if value == 0:
        return math.copysign(0.0, value) if isinstance(value, float) else 0.0
    exact = Fraction(value)
    sign = -1.0 if exact < 0 else 1.0
    exact = abs(exact)
    # exponent of the leading bit, exactly
    e = exact.numerator.bit_length() - exact.denominator.bit_length()
    if Fraction(2) ** e > exact:
        e -= 1
    q = max(e - (sig_bits - 1), min_exp)
    k = exact / Fraction(2) ** q
    n = math.floor(k)
    rem = k - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2):
        n += 1
    r = Fraction(n) * Fraction(2) ** q
    if r > max_finite:
        return sign * math.inf
    return sign * float(r)


def _max_finite(dtype):
    from fractions import Fraction

    return Fraction(255) * Fraction(2) ** 120 if dtype == "bfloat16" else Fraction(65504)


def ga_dtype_of_numpy(dt):
    """gpuaccel's name for a NumPy dtype, or None when gpuaccel lacks it."""
    dt = np.dtype(dt)
    if not dt.isnative:
        dt = dt.newbyteorder("=")
    for name in ga.DTYPES:
        if numpy_dtype(name) == dt:
            return name
    return None


def cast_ref(x, target):
    """x (a NumPy array of a gpuaccel dtype) cast by gpuaccel's rules
    (kernels/convert.h): floats to ints truncate and saturate (NaN to 0),
    ints wrap, anything to bool is != 0, and every cast to a float rounds
    once to nearest even."""
    x = np.asarray(x)
    src = ga_dtype_of_numpy(x.dtype)
    want = numpy_dtype(target)
    if target == src:
        return x.copy()
    if target == "bool":
        return (x.astype(np.float64) != 0) if src in FLOAT_DTYPES else (x != 0)
    small = {"bfloat16": (8, -133), "float16": (11, -24)}
    if src in FLOAT_DTYPES:
        f = x.astype(np.float64)
        if target in INT_DTYPES:
            lo, hi = int(np.iinfo(target).min), int(np.iinfo(target).max)
            out = np.zeros(f.shape, np.int64)
            big, low = f >= float(hi), f <= float(lo)
            mid = ~(np.isnan(f) | big | low)
            out[mid] = np.trunc(f[mid]).astype(np.int64)
            out[big], out[low] = hi, lo
            return out.astype(want)
        if target == "bfloat16":  # float64 -> bfloat16 in one rounding
            flat = [round_to_small_float(float(v), *small[target], _max_finite(target)) for v in f.ravel()]
            return np.array(flat, np.float64).reshape(f.shape).astype(want)
        with np.errstate(over="ignore", invalid="ignore"):
            return f.astype(want)  # NumPy rounds float64 -> float16/32 once
    # an integer or bool source
    if target in small:
        flat = [round_to_small_float(int(v), *small[target], _max_finite(target)) for v in x.astype(np.int64).ravel()]
        return np.array(flat, np.float64).reshape(x.shape).astype(want)
    with np.errstate(over="ignore"):
        return x.astype(want)  # int -> float32/64 rounds once; int -> int wraps


def fill_ref(value, shape, dtype):
    """full(shape, value, dtype): the value cast once (an int wraps)."""
    if dtype in INT_DTYPES and isinstance(value, int) and not isinstance(value, bool):
        return np.full(shape, value, np.int64).astype(numpy_dtype(dtype))
    return np.full(shape, cast_ref(np.array([float(value)]), dtype)[0], numpy_dtype(dtype))


def normalize_ref(images, mean, std, scale=1.0 / 255.0):
    """ImageNormalize(mean, std, scale=scale) of uint8 images (N, H, W, C)
    as float64 (N, C, H, W)."""
    return ((np.asarray(images, np.float64) * scale - np.asarray(mean, np.float64))
            / np.asarray(std, np.float64)).transpose(0, 3, 1, 2)


def logger_windows_ref(values, every):
    """(end step, mean) of each window of `every` logged values, in float64
    (NaN and inf propagate as in torch.mean)."""
    out = []
    for start in range(0, len(values), every):
        chunk = np.asarray(values[start:start + every], dtype=np.float64)
        with np.errstate(invalid="ignore"):
            out.append((start + len(chunk), chunk.mean()))
    return out


# ============================================================== samples

class Sample:
    """One call of an op: op.call(*args, **kwargs).  `dtype` is the dtype
    the sample was made in (the reference reads its inputs as float64)."""

    def __init__(self, name, args, kwargs=None, dtype="float32"):
        self.name, self.args, self.kwargs, self.dtype = name, tuple(args), dict(kwargs or {}), dtype

    def __repr__(self):
        return "Sample(%r, %s)" % (self.name, self.dtype)

    def inputs(self):
        """Every array the call reads or writes (a leak test watches their
        reference counts)."""
        found = []

        def walk(v):
            if isinstance(v, (tuple, list)):
                for item in v:
                    walk(item)
            elif isinstance(v, ga.Array) or hasattr(v, "__dlpack__"):
                found.append(v)

        walk(self.args)
        walk(list(self.kwargs.values()))
        return found

    def to(self, device):
        """The same call on `device`: its gpuaccel Arrays copied there, and a
        `device` keyword (an op that takes host data and a device, as the
        loader does) set to it; None when it has other inputs that cannot
        move (NumPy arrays or torch tensors)."""
        movable = True

        def move(v):
            nonlocal movable
            if isinstance(v, (tuple, list)):
                return type(v)(move(item) for item in v)
            if isinstance(v, ga.Array):
                return v.to(device)
            if isinstance(v, np.ndarray) or hasattr(v, "__dlpack__"):
                movable = False
            return v

        kwargs = {k: (device if k == "device" else move(v)) for k, v in self.kwargs.items()}
        moved = Sample(self.name, [move(a) for a in self.args], kwargs, self.dtype)
        return moved if movable or "device" in self.kwargs else None


class Expected:
    """A reference output: `value` (float64, or exact values for casts),
    `reduction` the length of the sums behind each element (tolerances grow
    with its square root), `flip` the largest term of those sums that the
    kernels round to a 16-bit dtype first (helpers.assert_sum_close),
    `before` the float64 sums before a bias and activation, which a kernel
    (the GPU's unfused route) may round to the output dtype on the way."""

    def __init__(self, value, reduction=1, flip=0.0, before=None):
        self.value, self.reduction, self.flip, self.before = value, reduction, flip, before


def _ga(rng, shape, dtype, scale=1.0):
    """A gpuaccel array of standard normal values rounded to dtype."""
    return ga.asarray(rng.standard_normal(shape) * scale).astype(dtype)


def _strided(rng, shape, dtype):
    """A view with steps and an offset holding random values of dtype."""
    base = _ga(rng, tuple(2 * n + 1 for n in shape), dtype)
    return base[tuple(slice(1, None, 2) for _ in shape)]


def _torch_view(a):
    """A torch tensor sharing a gpuaccel array's memory."""
    return _torch().from_dlpack(a)


# ---------------------------------------------------------------- matmul

def matmul_samples(rng, dtype):
    M, K, N = 7, 13, 5
    a, b, bias = _ga(rng, (M, K), dtype), _ga(rng, (K, N), dtype), _ga(rng, (N,), dtype)
    samples = [Sample("bias-%s" % act.label, (a, b), dict(bias=bias, activation=act.name), dtype)
               for act in ACTIVATIONS.values()]
    samples += [
        Sample("plain", (a, b), {}, dtype),
        Sample("batched-broadcast", (_ga(rng, (3, 1, M, K), dtype), _ga(rng, (2, K, N), dtype)), {}, dtype),
        Sample("vector-times-matrix", (_ga(rng, (K,), dtype), b), dict(bias=bias), dtype),
        Sample("strided-and-transposed", (_strided(rng, (M, K), dtype), _ga(rng, (N, K), dtype).T), {}, dtype),
        Sample("out", (a, b), dict(bias=bias, activation="relu", out=ga.empty((M, N), dtype=dtype)), dtype),
        Sample("torch-inputs", (_torch_view(a), _torch_view(b)), dict(bias=bias), dtype),
    ]
    if dtype in HALF_DTYPES:
        samples.append(Sample("out-dtype-float32", (a, b), dict(bias=bias, out_dtype="float32"), dtype))
    return samples


def matmul_reference(s):
    a, b = f64(s.args[0]), f64(s.args[1])
    act = activation(s.kwargs.get("activation"))
    product = z = np.matmul(a, b)
    if s.kwargs.get("bias") is not None:
        bias = f64(s.kwargs["bias"])
        z = z + (bias if b.ndim > 1 else bias[0])
    return [Expected(act.ref(z), a.shape[-1], before=product)]


# ---------------------------------------------------------------- linear

def linear_samples(rng, dtype):
    K, N = 11, 6
    x, w, b = _ga(rng, (2, 5, K), dtype), _ga(rng, (N, K), dtype), _ga(rng, (N,), dtype)
    samples = [Sample("%s-save" % act.label, (x, w, b, act.name), dict(save_preactivation=True), dtype)
               for act in ACTIVATIONS.values()]
    samples += [
        Sample("no-bias", (x, w), {}, dtype),
        Sample("one-row", (_ga(rng, (K,), dtype), w, b, "relu"), {}, dtype),
        Sample("strided", (_strided(rng, (9, K), dtype), _ga(rng, (K, N), dtype).T, b), {}, dtype),
        Sample("out", (x, w, b), dict(activation="relu", out=ga.empty((2, 5, N), dtype=dtype)), dtype),
        Sample("torch-inputs", (_torch_view(x), _torch_view(w), b), {}, dtype),
    ]
    return samples


def linear_reference(s):
    act = activation(s.args[3] if len(s.args) > 3 else s.kwargs.get("activation"))
    x, w = f64(s.args[0]), f64(s.args[1])
    b = s.args[2] if len(s.args) > 2 else s.kwargs.get("bias")
    K = w.shape[1]
    product = x @ w.T
    z = product if b is None else product + f64(b)
    y = Expected(act.ref(z), K, before=product)
    if not s.kwargs.get("save_preactivation"):
        return [y]
    if act.saves is None:
        return [y, None]
    return [y, y if act.saves == "output" else Expected(z, K, before=product)]


def _dz(gy, aux, act, dtype):
    """grad_y * act'(z) as the backward kernels compute it: from the saved
    aux, stored in the input dtype before the reductions (exact for an
    activation whose derivative is 0 or 1)."""
    if act.saves is None:
        return gy
    dz = gy * act.grad(aux)
    return dz if act.exact_gradient else round_to(dz, dtype)


def linear_backward_samples(rng, dtype):
    K, N = 11, 6
    x, w, b = _ga(rng, (2, 5, K), dtype), _ga(rng, (N, K), dtype), _ga(rng, (N,), dtype)
    gy = _ga(rng, (2, 5, N), dtype)
    samples = []
    for act in ACTIVATIONS.values():
        y, aux = ga.linear(x, w, b, act.name, save_preactivation=True)
        samples.append(Sample(act.label, (gy, x, w), dict(activation=act.name, **act.backward_kwargs(y, aux)),
                              dtype))
    samples += [
        Sample("weight-grad-only", (gy, x, w), dict(needs_input_grad=False, needs_bias_grad=False), dtype),
        Sample("out", (gy, x, w), dict(out=(ga.empty(x.shape, dtype=dtype), None, ga.empty((N,), dtype=dtype))),
               dtype),
        Sample("torch-inputs", (_torch_view(gy), _torch_view(x), w), {}, dtype),
    ]
    return samples


def linear_backward_reference(s):
    gy, x, w = (f64(t) for t in s.args[:3])
    act = activation(s.kwargs.get("activation"))
    aux = s.kwargs.get("preactivation", s.kwargs.get("y"))
    dz = _dz(gy, None if aux is None else f64(aux), act, s.dtype)
    N, K = w.shape
    rows = dz.reshape(-1, N)
    flip = 0.0 if act.exact_gradient or s.dtype not in HALF_DTYPES else float(np.abs(dz).max(initial=0))
    need = [s.kwargs.get(k, True) for k in ("needs_input_grad", "needs_weight_grad", "needs_bias_grad")]
    outs = [Expected(dz @ w, N, flip * float(np.abs(w).max(initial=0))),
            Expected(rows.T @ x.reshape(-1, K), rows.shape[0], flip * float(np.abs(x).max(initial=0))),
            Expected(rows.sum(0), rows.shape[0])]
    return [o if n else None for o, n in zip(outs, need)]


# ------------------------------------------------------------------ conv

# (N, C, H, W, K, R, S, stride, padding, dilation, groups): odd sizes, a
# grouped dilated one
CONV_GEOMETRIES = [
    (2, 3, 9, 8, 4, 3, 2, (2, 1), (1, 0), 1, 1),
    (1, 4, 7, 10, 6, 3, 3, 1, (2, 1), (2, 1), 2),
]
LAYOUTS = ["NCHW", "NHWC"]


def _nhwc(a):
    """An (N, C, H, W) gpuaccel array stored (N, H, W, C)."""
    return ga.asarray(np.ascontiguousarray(a.numpy().transpose(0, 2, 3, 1)))


def _geometry_kwargs(geometry, layout):
    _, _, _, _, _, _, _, stride, padding, dilation, groups = geometry
    return dict(stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)


def _conv_operands(rng, geometry, dtype, layout):
    N, C, H, W, K, R, S, stride, padding, dilation, groups = geometry
    x, w, b = _ga(rng, (N, C, H, W), dtype), _ga(rng, (K, C // groups, R, S), dtype), _ga(rng, (K,), dtype)
    if layout == "NHWC":
        x, w = _nhwc(x), _nhwc(w)
    return x, w, b


def conv2d_samples(rng, dtype):
    samples = []
    for li, layout in enumerate(LAYOUTS):
        for ai, act in enumerate(ACTIVATIONS.values()):
            geometry = CONV_GEOMETRIES[(li + ai) % len(CONV_GEOMETRIES)]
            x, w, b = _conv_operands(rng, geometry, dtype, layout)
            samples.append(Sample("%s-%s-save" % (layout, act.label), (x, w, b),
                                  dict(activation=act.name, save_preactivation=True,
                                       **_geometry_kwargs(geometry, layout)), dtype))
    geometry = CONV_GEOMETRIES[0]
    x, w, b = _conv_operands(rng, geometry, dtype, "NCHW")
    N, K = geometry[0], geometry[4]
    P, Q = conv_out_hw(geometry[2:4], geometry[5:7], *geometry[7:10])
    samples += [
        Sample("no-bias", (x, w), _geometry_kwargs(geometry, "NCHW"), dtype),
        Sample("out", (x, w, b), dict(activation="relu", out=ga.empty((N, K, P, Q), dtype=dtype),
                                      **_geometry_kwargs(geometry, "NCHW")), dtype),
        Sample("strided-input", (_strided(rng, x.shape, dtype), w, b), _geometry_kwargs(geometry, "NCHW"), dtype),
        Sample("torch-channels-last", (_torch_view(x).contiguous(memory_format=_torch().channels_last), w, b),
               _geometry_kwargs(geometry, "NCHW"), dtype),
    ]
    return samples


def _as_nchw(a, layout):
    return a.transpose(0, 3, 1, 2) if layout == "NHWC" else a


def _as_layout(a, layout):
    return a.transpose(0, 2, 3, 1) if layout == "NHWC" else a


def _conv_geometry_of(s):
    return {k: s.kwargs.get(k, d) for k, d in (("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1))}


def conv2d_reference(s):
    layout = s.kwargs.get("layout", "NCHW")
    x, w = _as_nchw(f64(s.args[0]), layout), _as_nchw(f64(s.args[1]), layout)
    b = s.args[2] if len(s.args) > 2 else s.kwargs.get("bias")
    act = activation(s.kwargs.get("activation"))
    product = z = conv_fwd64(x, w, **_conv_geometry_of(s))
    if b is not None:
        z = z + f64(b)[None, :, None, None]
    reduction = w.shape[1] * w.shape[2] * w.shape[3]
    before = _as_layout(product, layout)
    y = Expected(_as_layout(act.ref(z), layout), reduction, before=before)
    if not s.kwargs.get("save_preactivation"):
        return [y]
    if act.saves is None:
        return [y, None]
    return [y, y if act.saves == "output" else Expected(_as_layout(z, layout), reduction, before=before)]


def conv2d_backward_samples(rng, dtype):
    samples = []
    for li, layout in enumerate(LAYOUTS):
        for ai, act in enumerate(ACTIVATIONS.values()):
            geometry = CONV_GEOMETRIES[(li + ai + 1) % len(CONV_GEOMETRIES)]
            x, w, b = _conv_operands(rng, geometry, dtype, layout)
            kw = _geometry_kwargs(geometry, layout)
            y, aux = ga.conv2d(x, w, b, activation=act.name, save_preactivation=True, **kw)
            gy = _ga(rng, y.shape, dtype)
            samples.append(Sample("%s-%s" % (layout, act.label), (gy, x, w),
                                  dict(activation=act.name, **act.backward_kwargs(y, aux, prefer_y=li == 0), **kw),
                                  dtype))
    geometry = CONV_GEOMETRIES[0]
    x, w, _ = _conv_operands(rng, geometry, dtype, "NCHW")
    kw = _geometry_kwargs(geometry, "NCHW")
    gy = _ga(rng, (geometry[0], geometry[4]) + conv_out_hw(geometry[2:4], geometry[5:7], *geometry[7:10]), dtype)
    samples += [
        Sample("filter-grad-only", (gy, x, w), dict(needs_input_grad=False, needs_bias_grad=False, **kw), dtype),
        Sample("out", (gy, x, w), dict(out=(ga.empty(x.shape, dtype=dtype), ga.empty(w.shape, dtype=dtype), None),
                                       **kw), dtype),
        Sample("torch-inputs", (_torch_view(gy), _torch_view(x), w), kw, dtype),
    ]
    return samples


def conv2d_backward_reference(s):
    layout = s.kwargs.get("layout", "NCHW")
    gy, x, w = (_as_nchw(f64(t), layout) for t in s.args[:3])
    act = activation(s.kwargs.get("activation"))
    aux = s.kwargs.get("preactivation", s.kwargs.get("y"))
    dz = _dz(gy, None if aux is None else _as_nchw(f64(aux), layout), act, s.dtype)
    geometry = _conv_geometry_of(s)
    K, _, R, S = w.shape
    pixels = dz.shape[0] * dz.shape[2] * dz.shape[3]
    flip = 0.0 if act.exact_gradient or s.dtype not in HALF_DTYPES else float(np.abs(dz).max(initial=0))
    need = [s.kwargs.get(k, True) for k in ("needs_input_grad", "needs_weight_grad", "needs_bias_grad")]
    outs = [Expected(_as_layout(conv_bwd_data64(dz, w, x.shape, **geometry), layout), K * R * S,
                     flip * float(np.abs(w).max(initial=0))),
            Expected(_as_layout(conv_bwd_filter64(x, dz, w.shape, **geometry), layout), pixels,
                     flip * float(np.abs(x).max(initial=0))),
            Expected(dz.sum((0, 2, 3)), pixels)]
    return [o if n else None for o, n in zip(outs, need)]


# -------------------------------------------------- copy, cast and fill

def _int_or_float(rng, shape, dtype):
    if dtype == "bool":
        return ga.asarray(rng.integers(0, 2, shape).astype(bool))
    if dtype in INT_DTYPES:
        info = np.iinfo(dtype)
        return ga.asarray(rng.integers(max(info.min, -1000), min(info.max, 1000), shape, endpoint=True).astype(dtype))
    return _ga(rng, shape, dtype, scale=300.0)  # past int8's and float16's ranges: saturation and overflow


def astype_samples(rng, dtype):
    """Casts from `dtype` to every dtype, one from a strided view."""
    x = _int_or_float(rng, (7, 9), dtype)
    view = _int_or_float(rng, (15, 19), dtype)[1::2, ::-2]
    samples = [Sample("to-%s" % target, (x, target), {}, dtype) for target in ga.DTYPES]
    samples.append(Sample("strided-to-float64", (view, "float64"), {}, dtype))
    return samples


def copy_samples(rng, dtype):
    view = _int_or_float(rng, (15, 19), dtype)[1::2, ::3]
    return [Sample("strided", (view,), {}, dtype), Sample("transposed", (_int_or_float(rng, (5, 7), dtype).T,), {},
                                                          dtype)]


def full_samples(rng, dtype):
    values = [0, 1, -3, 2.75, True] + ([1e30] if dtype not in INT_DTYPES else [300])
    return [Sample("%r" % (v,), ((13, 7), v), dict(dtype=dtype, device="cpu"), dtype) for v in values]


# --------------------------------------------------------------- loader

def _normalize(images, mean, std, dtype="float32", layout="NCHW", device="cpu"):
    """The loader's fused normalize: one batch of all `images` (uint8,
    N x H x W x C) through PinnedLoader with ImageNormalize."""
    transform = ga.ImageNormalize(mean, std, dtype=dtype, layout=layout)
    loader = ga.PinnedLoader([images], len(images), transform=transform, output="gpuaccel", device=device,
                             num_threads=1)
    (batch,) = next(iter(loader))
    return batch


def normalize_samples(rng, dtype):
    samples = []
    for layout, (h, w, c) in [("NCHW", (7, 9, 3)), ("NHWC", (5, 11, 3)), ("NCHW", (6, 5, 1)), ("NHWC", (3, 7, 4))]:
        images = rng.integers(0, 256, (9, h, w, c), dtype=np.uint8)
        mean, std = list(rng.uniform(0, 1, c)), list(rng.uniform(0.1, 0.5, c))
        samples.append(Sample("%s-%dch" % (layout, c), (images, mean, std),
                              dict(dtype=dtype, layout=layout, device="cpu"), dtype))
    return samples


def normalize_reference(s):
    images, mean, std = s.args
    return [Expected(normalize_ref(images, mean, std))]


# --------------------------------------------------------------- logger

def _log(values, every):
    """LossLogger(every) fed `values` as `loss`: (its window means, its
    per-step history), as float64 arrays."""
    means = []
    log = ga.LossLogger(every, on_log=lambda step, v: means.append(v["loss"]))
    for v in values:
        log.log(loss=v)
    log.flush()
    history = log.history("loss")
    log.close()
    return ga.asarray(np.array(means, np.float64)), ga.asarray(np.asarray(history, np.float64))


def logger_samples(rng, dtype):
    values = [_int_or_float(rng, (), dtype) for _ in range(23)]
    return [Sample("every-%d" % every, (values, every), {}, dtype) for every in (1, 5, 23, 30)]


def logger_reference(s):
    values, every = s.args
    exact = [float(f64(v)) for v in values]
    return [Expected(np.array([m for _, m in logger_windows_ref(exact, every)])),
            Expected(np.array(exact, np.float32).astype(np.float64))]


# ============================================================= the ops

class OpInfo:
    """An op as the tests see it.

    call(*args, **kwargs) runs it; samples(rng, dtype) -> [Sample]: calls on
    odd sizes, one per activation and layout it takes and per special input
    (strided, out=, torch tensors); reference(sample) -> [Expected or None]
    per output (None: the op returns None there); tolerance: dtype -> (atol,
    rtol) for helpers.assert_sum_close against the reference; sources: the
    files that implement it (tests/README.md maps them to their tests);
    device_check: how another backend's results compare with the CPU's --
    "bits" (the same bits), "sums" (sums in another order: within the
    roundings of both, test_cuda_ops.close) or "reference" (each within
    `tolerance` of the reference)."""

    def __init__(self, name, call, samples, reference, dtypes, tolerance, sources, activations=(), layouts=(),
                 device_check="sums"):
        self.name, self.call, self.samples, self.reference = name, call, samples, reference
        self.dtypes, self.tolerance, self.sources = list(dtypes), tolerance, list(sources)
        self.activations, self.layouts, self.device_check = list(activations), list(layouts), device_check

    def __repr__(self):
        return "OpInfo(%r)" % self.name

    def run(self, sample):
        """The op's outputs for `sample`, as a tuple."""
        out = self.call(*sample.args, **sample.kwargs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def check(self, sample, outputs):
        """outputs (from run) against the reference, output by output."""
        expected = self.reference(sample)
        assert len(outputs) == len(expected), (sample, len(outputs), len(expected))
        for k, (got, want) in enumerate(zip(outputs, expected)):
            if want is None:
                assert got is None, "%s %s: output %d should be None" % (self.name, sample, k)
                continue
            assert got is not None, "%s %s: output %d is None" % (self.name, sample, k)
            dtype = got.dtype if isinstance(got, ga.Array) else sample.dtype
            try:
                if self.tolerance[dtype] == (0.0, 0.0):  # exact: infinities compare too
                    np.testing.assert_array_equal(f64(got), f64(want.value))
                else:
                    assert_sum_close(f64(got), want.value, dtype, want.reduction, self.tolerance, want.flip)
            except AssertionError as e:
                raise AssertionError("%s %s, output %d: %s" % (self.name, sample, k, e)) from None


def _sum_tolerances(float32, float64):
    """16-bit results accumulate in float32 and round once to their dtype
    (helpers.sum_tolerance: a few ulps, not a percent)."""
    return {"float64": float64, "float32": float32, "float16": sum_tolerance("float16"),
            "bfloat16": sum_tolerance("bfloat16")}


MATMUL_TOLERANCE = _sum_tolerances((3e-6, 3e-6), (1e-13, 1e-12))
CONV_TOLERANCE = _sum_tolerances((3e-6, 3e-6), (1e-12, 1e-11))
EXACT = {dtype: (0.0, 0.0) for dtype in ga.DTYPES}
# one rounding of x * scale + shift (float32 arithmetic below float64), then of the dtype
NORMALIZE_TOLERANCE = {"float16": (1e-3, 1e-3), "bfloat16": (1e-2, 8e-3), "float32": (4e-6, 4e-6),
                       "float64": (1e-12, 1e-12)}
# window means summed in float64 from the values as logged; history kept in float32
LOGGER_TOLERANCE = {dtype: (1e-12, 1e-12) for dtype in ga.DTYPES}

OPS = {op.name: op for op in [
    OpInfo("matmul", lambda *a, **k: ga.matmul(*a, **k), matmul_samples, matmul_reference, FLOAT_DTYPES,
           MATMUL_TOLERANCE, ["csrc/matmul.c", "kernels/cpu/matmul.c", "kernels/cpu/epilogue.c",
                              "kernels/cuda/matmul.cu", "kernels/cuda/matmul_unfused.cu", "kernels/cuda/epilogue.cu"],
           activations=ACTIVATION_NAMES),
    OpInfo("linear", lambda *a, **k: ga.linear(*a, **k), linear_samples, linear_reference, FLOAT_DTYPES,
           MATMUL_TOLERANCE, ["csrc/matmul.c", "kernels/cpu/matmul.c", "kernels/cpu/epilogue.c",
                              "kernels/cuda/matmul.cu", "kernels/cuda/epilogue.cu"],
           activations=ACTIVATION_NAMES),
    OpInfo("linear_backward", lambda *a, **k: ga.linear_backward(*a, **k), linear_backward_samples,
           linear_backward_reference, FLOAT_DTYPES, MATMUL_TOLERANCE,
           ["csrc/matmul.c", "kernels/cpu/matmul.c", "kernels/cpu/epilogue.c", "kernels/cuda/matmul.cu",
            "kernels/cuda/epilogue.cu"], activations=ACTIVATION_NAMES),
    OpInfo("conv2d", lambda *a, **k: ga.conv2d(*a, **k), conv2d_samples, conv2d_reference, FLOAT_DTYPES,
           CONV_TOLERANCE, ["csrc/conv.c", "kernels/cpu/conv.c", "kernels/cpu/epilogue.c", "kernels/cuda/conv.cu",
                            "kernels/cuda/conv_direct.cu", "kernels/cuda/epilogue.cu"],
           activations=ACTIVATION_NAMES, layouts=LAYOUTS),
    OpInfo("conv2d_backward", lambda *a, **k: ga.conv2d_backward(*a, **k), conv2d_backward_samples,
           conv2d_backward_reference, FLOAT_DTYPES, CONV_TOLERANCE,
           ["csrc/conv.c", "kernels/cpu/conv.c", "kernels/cpu/epilogue.c", "kernels/cuda/conv.cu",
            "kernels/cuda/conv_direct.cu", "kernels/cuda/epilogue.cu"],
           activations=ACTIVATION_NAMES, layouts=LAYOUTS),
    OpInfo("astype", lambda x, dtype: x.astype(dtype), astype_samples,
           lambda s: [Expected(cast_ref(s.args[0].numpy(), s.args[1]))], ga.DTYPES, EXACT,
           ["csrc/transfer.c", "kernels/convert.h", "kernels/cpu/copy.c", "kernels/cuda/copy.cu"],
           device_check="bits"),
    OpInfo("copy", lambda x: x.copy(), copy_samples, lambda s: [Expected(s.args[0].numpy().copy())], ga.DTYPES,
           EXACT, ["csrc/transfer.c", "kernels/cpu/copy.c", "kernels/cuda/copy.cu"], device_check="bits"),
    OpInfo("full", lambda shape, value, **k: ga.full(shape, value, **k), full_samples,
           lambda s: [Expected(fill_ref(s.args[1], s.args[0], s.dtype))], ga.DTYPES, EXACT,
           ["csrc/transfer.c", "kernels/cpu/copy.c", "kernels/cuda/copy.cu"], device_check="bits"),
    OpInfo("normalize", _normalize, normalize_samples, normalize_reference, FLOAT_DTYPES, NORMALIZE_TOLERANCE,
           ["gpuaccel/loader.py", "csrc/loader.c", "kernels/cpu/normalize.c", "kernels/cuda/normalize.cu"],
           layouts=LAYOUTS, device_check="reference"),
    OpInfo("logger", _log, logger_samples, logger_reference, ["float32", "float64", "float16", "bfloat16", "int32",
                                                               "int64"],
           LOGGER_TOLERANCE, ["gpuaccel/logger.py", "csrc/logger.c", "kernels/logger_update.h",
                              "kernels/cpu/logger.c", "kernels/cuda/logger.cu"], device_check="reference"),
]}


def samples_of(op, rng, dtypes=None):
    """(dtype, sample) for every sample of `op` in `dtypes` (default: the
    op's)."""
    return [(dtype, s) for dtype in (dtypes or op.dtypes) for s in op.samples(rng, dtype)]


def op_calls(rng, dtypes=("float32",), extra_dtypes=("float16",)):
    """[(id, op, sample)]: every op's samples in each of `dtypes` it takes,
    and the samples only `extra_dtypes` have (the float16 -> float32
    matmul): the lists the fault and leak tests run.  They are made while
    pytest collects, outside conftest's filter: the registry asks for
    "gelu" in its present meaning, so the one-time notice that it once
    meant the tanh form is hidden here too (test_activations.py tests it)."""
    calls = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=ga.GeluChangedWarning)
        for op in OPS.values():
            names = set()
            for dtype in [d for d in dtypes if d in op.dtypes]:
                for s in op.samples(rng, dtype):
                    names.add(s.name)
                    calls.append(("%s-%s-%s" % (op.name, s.name, dtype), op, s))
            for dtype in [d for d in extra_dtypes if d in op.dtypes]:
                for s in op.samples(rng, dtype):
                    if s.name not in names:
                        names.add(s.name)
                        calls.append(("%s-%s-%s" % (op.name, s.name, dtype), op, s))
    return calls
