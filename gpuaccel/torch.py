"""gpuaccel for torch: fused linear and conv2d layers, and fuse(model).

    import gpuaccel.torch as gt
    layer = gt.FusedLinear(1024, 4096, activation="gelu")   # nn.Linear + nn.GELU()
    conv = gt.FusedConv2d(64, 128, 3, padding=1, activation="relu")
    model = gt.fuse(torchvision.models.resnet50().eval())   # every fusable pattern at once

Three paths compute the same thing:

- eager (the training loop as written): a lean ``torch.autograd.Function``
  around gpuaccel's C core, which reads torch tensors through torch's DLPack
  C exchange API and queues its kernels on torch's current stream.  With no
  gradient to record (``torch.no_grad()``, or no input that requires one) the
  C core is called directly, with no autograd node at all.
- torch.func (vmap, grad, jacrev, jvp, functional_call under a transform):
  the same work in a ``setup_context`` Function with vmap and jvp rules.
  The eager path does not use that form: torch binds a setup_context
  Function's arguments to its signature with ``inspect`` on every call,
  which would double the layer's host time.
- traced (torch.compile, torch.export, torch.jit tracing, fake and meta
  tensors, tensor subclasses): the ``torch.library`` custom ops
  ``gpuaccel::linear`` / ``gpuaccel::conv2d`` with fake and autograd
  implementations, so compiled graphs have no graph break and CUDA graphs
  capture them.  Under ``torch.onnx.export`` the layers are written with
  torch's standard ops, which every ONNX runtime knows.

Why not one: a custom op's Python dispatch costs tens of µs per call, more
than a small layer's whole host budget; the eager Function costs a few µs.

On the CPU, above a size where torch's own kernels (oneDNN/MKL) beat
gpuaccel's reference kernels, every path runs torch's kernels instead
(``CPU_TORCH_THRESHOLD``, multiply-adds per call, by op): a fused layer is
never slower than the torch layers it replaces.  torch.compile of CPU layers
writes torch's ops at every size, as the compiled original has them (a
custom op's per-call dispatch would cost compiled code more than gpuaccel's
kernels save at those sizes); torch.export keeps the custom ops below the
threshold.  gpuaccel's CPU kernels stay the tested reference and the eager
path for small layers, NumPy and gpuaccel arrays.

Gradients of gradients (``create_graph=True``) are computed with torch's
differentiable ops from the saved inputs, so double backward works for every
activation.

Under ``torch.autocast`` the layers compute in the autocast dtype, as
nn.Linear and nn.Conv2d do.  The modules take nn.Linear's / nn.Conv2d's
arguments, initialisation and state_dict keys, so a checkpoint of the plain
layers loads into them; they accept what those accept (an unbatched conv
input (C, H, W), a 1-D linear input).
"""

import math
import operator
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _C

__all__ = ["CPU_TORCH_THRESHOLD", "FuseReport", "FusedConv2d", "FusedConv2dBN", "FusedLinear", "fuse", "fused_conv2d",
           "fused_linear"]

# The activations by the names the layers take, each to its own name.  "gelu"
# (nn.GELU()'s exact erf form) is not here: its first use in a process goes
# through the C parser, which warns once that it meant the tanh form in
# earlier versions ("gelu_erf", the same activation, never warns).
_ACTIVATIONS = {None: "none", "none": "none", "relu": "relu", "gelu_erf": "gelu", "gelu_tanh": "gelu_tanh",
                "silu": "silu", "hardswish": "hardswish", "sigmoid": "sigmoid"}
# as the C ops take them: the exact GELU by its name that does not warn
_KERNEL_ACT = {"none": None, "relu": "relu", "gelu": "gelu_erf", "gelu_tanh": "gelu_tanh", "silu": "silu",
               "hardswish": "hardswish", "sigmoid": "sigmoid"}
# the activations whose derivative reads the pre-activation z, which the
# forward then saves; relu's reads its output y (y > 0 exactly when z > 0)
_SAVES_PREACTIVATION = frozenset(("gelu", "gelu_tanh", "silu", "hardswish", "sigmoid"))
# torch's own form of each, for the CPU path above the threshold and the
# ONNX decompositions (ONNX: Relu, Gelu or its Erf expansion, Gelu with
# approximate="tanh" or its Tanh expansion, x * Sigmoid(x), HardSwish, Sigmoid)
_TORCH_ACTIVATION = {
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda z: torch.nn.functional.gelu(z, approximate="tanh"),
    "silu": torch.nn.functional.silu,
    "hardswish": torch.nn.functional.hardswish,
    "sigmoid": torch.sigmoid,
}

# Multiply-adds of one CPU call above which the eager path runs torch's own
# kernels: where they overtake gpuaccel's reference kernels, fwd+bwd, as
# `python benchmarks/bench_overhead.py --crossover` measured on a 2-core
# x86-64 machine (RESULTS.md).  Below it, the cost of a call is host time,
# where gpuaccel's single fused call is cheaper.  A grouped conv counts its
# multiply-adds once per group: gpuaccel's CPU kernel runs one small GEMM per
# group (a depthwise conv: C GEMMs of one output channel), torch's a kernel
# made for the whole grouped conv.
# conv2d's 1 << 17: its crossover table puts the change near 0.2 M, and
# inside whole models (bench_models: MobileNetV3-small's 1x1 convs) torch's
# kernels already led above 0.13 M.
CPU_TORCH_THRESHOLD = {"linear": 1 << 14, "conv2d": 1 << 17}

_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)

_is_compiling = torch.compiler.is_compiling
_is_exporting = torch.compiler.is_exporting
_is_tracing = torch._C._is_tracing
_transforms_active = torch._C._are_functorch_transforms_active
_is_autocast = torch.is_autocast_enabled
_any_autocast = torch._C._is_any_autocast_enabled
_autocast_dtype = torch.get_autocast_dtype
_grad_enabled = torch.is_grad_enabled


def _compiling_for_the_cpu():
    """torch.compile (not torch.export) of a layer on CPU tensors: torch's
    ops at every size.  Inductor compiles them as it compiles torch's own
    layers (oneDNN for the GEMM or conv, the bias and activation in its own
    fused loop) and calls them from its generated code, while a custom op
    costs a Python dispatch per call, which the small layers gpuaccel's CPU
    kernels serve in eager mode cannot afford.  torch.export keeps the custom
    ops for small layers, so an exported program holds the fused kernels."""
    return _is_compiling() and not _is_exporting()


def _refuse_script(name):
    """torch.jit.script's hook (it calls an object's __prepare_scriptable__
    before compiling it, and each function or submodule it reaches): the
    layers call gpuaccel's C core, which TorchScript cannot compile, and
    without this the compiler fails deep inside them ("try blocks aren't
    supported", "is_autocast_enabled() expected at most 0 arguments")."""
    def prepare(*unused):
        raise RuntimeError("%s cannot be compiled by torch.jit.script: TorchScript cannot call gpuaccel's C kernels. "
                           "torch.jit.trace, torch.export.export and torch.compile work (they keep the fused ops), "
                           "and torch.onnx.export writes them with standard ONNX operators" % name)
    return prepare


def _activation(name):
    """The activation's own name ("none" for None); a ValueError for one
    gpuaccel does not have.  Called by the public functions and
    constructors only: its warning points at their caller."""
    try:
        return _ACTIVATIONS[name]
    except (KeyError, TypeError):
        # "gelu" (warned about, once, by the same parser as the C ops) or an
        # error; stacklevel 3: the caller of the function that called this
        parsed = _C._activation_name(name, "gpuaccel.torch", 3)
        if isinstance(name, str):  # "gelu", warned about: from now on a lookup like the others
            _ACTIVATIONS[name] = parsed
        return parsed


def _save_for_transforms(ctx, x, weight, bias, activation, output):
    """What the torch.func Functions of both layers keep: the inputs and the
    activation's saved operand, for backward and for forward-mode (jvp)."""
    y, z = output
    if z is not None:
        ctx.mark_non_differentiable(z)
    aux = _saved_aux(activation, y, z)
    ctx.activation = activation
    ctx.save_for_backward(x, weight, bias, aux)
    ctx.save_for_forward(x, weight, aux)


def _saved_aux(activation, y, z):
    """What the backward reads: z for an activation whose derivative needs
    the pre-activation, y for relu, nothing without an activation."""
    if activation in _SAVES_PREACTIVATION:
        return z
    return y if activation == "relu" else None


def _not_a_tensor(name, what, value):
    """The TypeError of a layer given something else than a torch tensor
    (a NumPy array, a list): what it got and what takes that."""
    hint = (" (torch.from_numpy(x) wraps a NumPy array without a copy; gpuaccel.%s takes NumPy and gpuaccel "
            "arrays directly)" % what) if type(value).__module__ == "numpy" or hasattr(value, "__dlpack__") else ""
    kind = type(value)
    kind = kind.__name__ if kind.__module__ == "builtins" else "%s.%s" % (kind.__module__, kind.__qualname__)
    return TypeError("%s: %s must be a torch.Tensor, got %s%s" % (what, name, kind, hint))


def _check_tensors(what, x, weight, bias):
    if not isinstance(x, Tensor):
        raise _not_a_tensor("x", what, x)
    if not isinstance(weight, Tensor):
        raise _not_a_tensor("weight", what, weight)
    if bias is not None and not isinstance(bias, Tensor):
        raise _not_a_tensor("bias", what, bias)


def _autocast(x, weight, bias):
    """The inputs in the autocast dtype when autocast is on for x's device."""
    device = "cuda" if x.is_cuda else ("cpu" if x.is_cpu else x.device.type)
    if not _is_autocast(device):
        return x, weight, bias
    dtype = _autocast_dtype(device)
    return (x.to(dtype) if x.is_floating_point() else x, weight.to(dtype),
            None if bias is None else bias.to(dtype))


def _torch_activation(y, activation):
    fn = _TORCH_ACTIVATION.get(activation)
    return y if fn is None else fn(y)


def _torch_activation_grad(grad_y, aux, activation):
    """grad_y * act'(z) with torch's own derivative ops, which torch can
    differentiate again (double backward) and batch (vmap); aux as
    _saved_aux gives it."""
    if activation == "relu":
        return torch.ops.aten.threshold_backward(grad_y, aux, 0)
    if activation == "gelu":
        return torch.ops.aten.gelu_backward(grad_y, aux)
    if activation == "gelu_tanh":
        return torch.ops.aten.gelu_backward(grad_y, aux, approximate="tanh")
    if activation == "silu":  # written out: aten.silu_backward has no derivative of its own
        s = torch.sigmoid(aux)
        return grad_y * s * (1 + aux * (1 - s))
    if activation == "hardswish":
        return torch.ops.aten.hardswish_backward(grad_y, aux)
    if activation == "sigmoid":
        return torch.ops.aten.sigmoid_backward(grad_y, torch.sigmoid(aux))
    return grad_y


def _empty(like):
    return like.new_empty((0,))


# ------------------------------------------------------------------ linear
# The work, shared by the eager Function and the custom ops: outputs are
# allocated by torch (its caching allocator, its stream bookkeeping), the
# kernels run on torch's current stream.

def _linear_forward(x, weight, bias, activation, keep_preactivation):
    """(y, preactivation) — the pre-activation only when asked and the
    activation's derivative reads it (relu's reads y; no activation reads
    nothing)."""
    y = x.new_empty((*x.shape[:-1], weight.shape[0]))
    if keep_preactivation and activation in _SAVES_PREACTIVATION:
        z = torch.empty_like(y)
        _C.linear(x, weight, bias, _KERNEL_ACT[activation], out=y, save_preactivation=True, preactivation_out=z,
                  stream="torch")
        return y, z
    _C.linear(x, weight, bias, _KERNEL_ACT[activation], out=y, stream="torch")
    return y, None


def _empty_contiguous(t):
    return torch.empty_like(t) if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)


def _linear_backward_into(grad_y, x, weight, aux, activation, need_x, need_w, need_b):
    gx = _empty_contiguous(x) if need_x else None
    gw = _empty_contiguous(weight) if need_w else None
    gb = weight.new_empty(weight.shape[:1]) if need_b else None
    _C.linear_backward(grad_y, x, weight, activation=_KERNEL_ACT[activation], preactivation=aux,
                       needs_input_grad=need_x, needs_weight_grad=need_w, needs_bias_grad=need_b,
                       out=(gx, gw, gb), stream="torch")
    return gx, gw, gb


def _linear_backward_torch(grad_y, x, weight, bias, aux, activation, need_x, need_w, need_b):
    """The backward with torch's differentiable ops: for gradients of
    gradients (create_graph=True) and under torch.func's transforms, where
    the tensors may be functorch's wrappers.  The pre-activation is computed
    again from x, weight and bias, so that its own dependence on them is in
    the graph (a saved copy would cut it)."""
    if activation in _SAVES_PREACTIVATION and _grad_enabled():
        aux = torch.nn.functional.linear(x, weight, bias)
    grad_z = _torch_activation_grad(grad_y, aux, activation)
    gx = grad_z.matmul(weight) if need_x else None
    flat = grad_z.reshape(-1, grad_z.shape[-1]) if (need_w or need_b) else None
    gw = flat.t().matmul(x.reshape(-1, x.shape[-1])) if need_w else None
    gb = flat.sum(0) if need_b else None
    return gx, gw, gb


class _LinearFunction(torch.autograd.Function):
    """The eager path (see the module's docstring for why ctx is set up in
    forward rather than in setup_context).  Its bodies are written for host
    time: one allocation per output, no helper calls."""

    @staticmethod
    def forward(ctx, x, weight, bias, activation):
        y = x.new_empty(*x.shape[:-1], weight.shape[0])  # sizes as arguments: torch parses them faster than a tuple
        if activation in _SAVES_PREACTIVATION:
            aux = torch.empty_like(y)
            _C.linear(x, weight, bias, _KERNEL_ACT[activation], out=y, save_preactivation=True, preactivation_out=aux,
                      stream="torch")
        else:
            _C.linear(x, weight, bias, _KERNEL_ACT[activation], out=y, stream="torch")
            aux = None if activation == "none" else y
        ctx.activation = activation
        ctx.bias = bias  # for a double backward only; not saved (a saved tensor costs host time in every step)
        ctx.save_for_backward(x, weight, aux)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, aux = ctx.saved_tensors
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        if _grad_enabled():  # create_graph=True
            gx, gw, gb = _linear_backward_torch(grad_y, x, weight, ctx.bias, aux, ctx.activation, need_x, need_w,
                                                need_b)
            return gx, gw, gb, None
        gx = torch.empty_like(x, memory_format=torch.contiguous_format) if need_x else None
        gw = torch.empty_like(weight, memory_format=torch.contiguous_format) if need_w else None
        gb = torch.empty_like(ctx.bias) if need_b else None  # 1-D: contiguous
        if need_x and need_w and need_b:  # the needs_*_grad defaults: each keyword costs the C parser time
            _C.linear_backward(grad_y, x, weight, activation=_KERNEL_ACT[ctx.activation], preactivation=aux,
                               out=(gx, gw, gb), stream="torch")
        else:
            _C.linear_backward(grad_y, x, weight, activation=_KERNEL_ACT[ctx.activation], preactivation=aux,
                               needs_input_grad=need_x, needs_weight_grad=need_w, needs_bias_grad=need_b,
                               out=(gx, gw, gb), stream="torch")
        return gx, gw, gb, None


class _LinearTransformsFunction(torch.autograd.Function):
    """The layer under torch.func's transforms: setup_context, a vmap rule
    that keeps gpuaccel's kernel for a batch of inputs through one layer,
    and a jvp rule (jvp, jacfwd, hessian).  The forward returns (y,
    pre-activation or None)."""

    @staticmethod
    def forward(x, weight, bias, activation):
        return _linear_forward(x, weight, bias, activation, True)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, activation = inputs
        _save_for_transforms(ctx, x, weight, bias, activation, output)

    @staticmethod
    def backward(ctx, grad_y, grad_z):
        x, weight, bias, aux = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        return (*_linear_backward_torch(grad_y, x, weight, bias, aux, ctx.activation, need_x, need_w, need_b),
                None)

    @staticmethod
    def jvp(ctx, x_t, weight_t, bias_t, _):
        x, weight, aux = ctx.saved_tensors
        z_t = _tangent_sum(torch.nn.functional.linear(x_t, weight) if x_t is not None else None,
                           torch.nn.functional.linear(x, weight_t) if weight_t is not None else None, bias_t)
        return _torch_activation_grad(z_t, aux, ctx.activation), None

    @staticmethod
    def vmap(info, in_dims, x, weight, bias, activation):
        x_dim, w_dim, b_dim, _ = in_dims
        if w_dim is None and b_dim is None:  # one layer, a batch of inputs: one more leading dimension of x
            y, z = _LinearTransformsFunction.apply(x.movedim(x_dim, 0), weight, bias, activation)
            return (y, z), (0, None if z is None else 0)
        # a batch of layers (an ensemble): torch's batched ops
        keep_z = activation in _SAVES_PREACTIVATION

        def one(x, weight, bias):
            z = torch.nn.functional.linear(x, weight, bias)
            return (_torch_activation(z, activation), z) if keep_z else _torch_activation(z, activation)

        out = torch.vmap(one, in_dims=(x_dim, w_dim, b_dim), randomness=info.randomness)(x, weight, bias)
        return (out if keep_z else (out, None)), ((0, 0) if keep_z else (0, None))


def _tangent_sum(*tangents):
    present = [t for t in tangents if t is not None]
    total = present[0]
    for t in present[1:]:
        total = total + t
    return total


@torch.library.custom_op("gpuaccel::linear", mutates_args=())
def _linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], activation: str) -> Tuple[Tensor, Tensor]:
    y, z = _linear_forward(x, weight, bias, activation, True)
    return y, (z if z is not None else _empty(x))


@_linear.register_fake
def _(x, weight, bias, activation):
    y = x.new_empty(x.shape[:-1] + (weight.shape[0],))
    return y, (x.new_empty(y.shape) if activation in _SAVES_PREACTIVATION else x.new_empty((0,)))


@torch.library.custom_op("gpuaccel::linear_backward", mutates_args=())
def _linear_backward(grad_y: Tensor, x: Tensor, weight: Tensor, aux: Optional[Tensor], activation: str,
                     needs: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    gx, gw, gb = _linear_backward_into(grad_y, x, weight, aux, activation, *needs)
    return (gx if needs[0] else _empty(x), gw if needs[1] else _empty(weight), gb if needs[2] else _empty(weight))


@_linear_backward.register_fake
def _(grad_y, x, weight, aux, activation, needs):
    return (torch.empty_like(x, memory_format=torch.contiguous_format) if needs[0] else x.new_empty((0,)),
            torch.empty_like(weight, memory_format=torch.contiguous_format) if needs[1] else weight.new_empty((0,)),
            weight.new_empty((weight.shape[0],)) if needs[2] else weight.new_empty((0,)))


def _linear_setup(ctx, inputs, output):
    x, weight, bias, activation = inputs
    y, pre = output
    ctx.activation = activation
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight, _saved_aux(activation, y, pre))


def _linear_grad(ctx, grad_y, grad_pre):
    x, weight, aux = ctx.saved_tensors
    needs = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
    gx, gw, gb = _linear_backward(grad_y, x, weight, aux, ctx.activation, needs)
    return (gx if needs[0] else None, gw if needs[1] else None, gb if needs[2] else None, None)


_linear.register_autograd(_linear_grad, setup_context=_linear_setup)


def _linear_traced(x, weight, bias, activation):
    if torch.onnx.is_in_onnx_export():
        return _torch_activation(torch.nn.functional.linear(x, weight, bias), activation)
    return _linear(x, weight, bias, activation)[0]


def _linear_torch(x, weight, bias, activation):
    """The layer as torch's ops, for the CPU paths that run torch's kernels."""
    if x.dim() >= 1 and weight.dim() == 2 and x.shape[-1] != weight.shape[1]:
        # the message gpuaccel's kernels give, not torch's "mat1 and mat2 shapes cannot be multiplied"
        raise ValueError("linear: x's last dimension (%d) must equal weight's in_features (%d)"
                         % (x.shape[-1], weight.shape[1]))
    return _torch_activation(torch.nn.functional.linear(x, weight, bias), activation)


def _linear_dispatch(x, weight, bias, activation):
    """fused_linear with its activation normalized: the path for the call
    (see the module's docstring), its checks ordered and inlined for the
    eager path's host time."""
    if (type(x) not in _PLAIN_TENSORS or type(weight) not in _PLAIN_TENSORS
            or (bias is not None and type(bias) not in _PLAIN_TENSORS)):
        _check_tensors("linear", x, weight, bias)  # a NumPy array or a list: one TypeError saying so
    cuda = x.is_cuda
    if _any_autocast() and _is_autocast("cuda" if cuda else "cpu"):
        x, weight, bias = _autocast(x, weight, bias)
    if _is_tracing():  # jit.trace (and the TorchScript ONNX exporter): sizes are traced values, no dispatch on them
        return _linear_traced(x, weight, bias, activation)
    # torch's kernels above the CPU threshold whatever the path: eager,
    # compiled (dynamo reads the sizes and the threshold and guards on them),
    # exported, under torch.func
    if not cuda and x.numel() * weight.shape[0] > CPU_TORCH_THRESHOLD["linear"]:
        return _linear_torch(x, weight, bias, activation)
    # compiling, exporting (jit tracing returned above), or tensors that are not plain torch
    # tensors holding data (fake, meta, subclasses): the custom ops; but torch.compile of a
    # CPU layer, whatever its size, torch's ops (see _compiling_for_the_cpu)
    if (_is_compiling() or type(x) not in _PLAIN_TENSORS or type(weight) not in _PLAIN_TENSORS
            or x.is_meta):
        if not cuda and _compiling_for_the_cpu():
            return _linear_torch(x, weight, bias, activation)
        return _linear_traced(x, weight, bias, activation)
    if _transforms_active():
        return _LinearTransformsFunction.apply(x, weight, bias, activation)[0]
    if _grad_enabled() and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
        return _LinearFunction.apply(x, weight, bias, activation)
    return _linear_forward(x, weight, bias, activation, False)[0]


def fused_linear(x, weight, bias=None, activation=None):
    """act(x @ weight.T + bias) in one fused kernel (forward and backward);
    x of shape (..., in_features), also 1-D.  activation: None, 'relu',
    'gelu' (exact, as nn.GELU()), 'gelu_tanh' (nn.GELU(approximate='tanh')),
    'silu', 'hardswish' or 'sigmoid'."""
    return _linear_dispatch(x, weight, bias, _activation(activation))


class FusedLinear(torch.nn.Module):
    """nn.Linear followed by an activation (fused_linear's), fused: same
    arguments, initialisation and state_dict keys (weight, bias) as
    nn.Linear."""

    def __init__(self, in_features, out_features, bias=True, activation=None, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.in_features, self.out_features = in_features, out_features
        self.activation = _activation(activation)
        self.weight = torch.nn.Parameter(torch.empty((out_features, in_features), **factory))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        # exactly nn.Linear's initialisation
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.in_features
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        params = self._parameters  # not self.weight: nn.Module's __getattr__ costs more than the layer's C call
        try:
            weight, bias = params["weight"], params["bias"]
        except KeyError:  # a parametrization (torch.nn.utils.parametrize) computes them
            weight, bias = self.weight, self.bias
        return _linear_dispatch(x, weight, bias, self.activation)

    __prepare_scriptable__ = _refuse_script("gpuaccel.torch.FusedLinear")

    def extra_repr(self):
        return "in_features=%d, out_features=%d, bias=%s, activation=%s" % (
            self.in_features, self.out_features, self.bias is not None, self.activation)


# ------------------------------------------------------------------ conv2d

def _conv_out_shape(x, weight, stride, padding, dilation):
    n, _, h, w = x.shape
    kh, kw = weight.shape[2], weight.shape[3]
    return (n, weight.shape[0], (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1,
            (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1)


def _check_conv_output(x, weight, padding, dilation, shape):
    """The ValueError gpuaccel's conv2d gives when the input is smaller than
    the dilated kernel (torch's new_empty would say "negative dimension")."""
    for k, name in ((0, "height"), (1, "width")):
        if shape[2 + k] < 1:
            size, span = x.shape[2 + k], dilation[k] * (weight.shape[2 + k] - 1) + 1
            raise ValueError("conv2d: the output %s would be empty: input %d + 2*padding %d is smaller than the "
                             "dilated kernel (%d); use a smaller kernel, dilation or more padding"
                             % (name, size, padding[k], span))


def _check_conv_channels(x, weight, groups):
    """gpuaccel's conv2d messages, for the inputs that run torch's kernels."""
    if weight.dim() != 4:
        raise ValueError("conv2d: weight must be 4-D (out_channels, in_channels/groups, kh, kw), got shape %s"
                         % (tuple(weight.shape),))
    if x.shape[1] % groups or weight.shape[0] % groups:
        raise ValueError("conv2d: groups=%d must divide the input channels (%d) and the output channels (%d)"
                         % (groups, x.shape[1], weight.shape[0]))
    if weight.shape[1] * groups != x.shape[1]:
        raise ValueError("conv2d: weight (out_channels, in_channels/groups, kh, kw) has %d input channels per group, "
                         "so x must have %d channels (groups=%d), but it has %d"
                         % (weight.shape[1], weight.shape[1] * groups, groups, x.shape[1]))


def _conv_empty(x, shape):
    """An output in x's memory order: channels-last in, channels-last out."""
    if x.is_contiguous() or not x.is_contiguous(memory_format=torch.channels_last):
        return x.new_empty(shape)
    return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)


def _conv_forward(x, weight, bias, stride, padding, dilation, groups, activation, keep_preactivation, shape=None):
    if shape is None:
        shape = _conv_out_shape(x, weight, stride, padding, dilation)
        if shape[2] < 1 or shape[3] < 1:
            _check_conv_output(x, weight, padding, dilation, shape)
    y = x.new_empty(*shape) if x.is_contiguous() else _conv_empty(x, shape)
    if keep_preactivation and activation in _SAVES_PREACTIVATION:
        z = _conv_empty(x, shape)
        _C.conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups,
                  activation=_KERNEL_ACT[activation], out=y, save_preactivation=True, preactivation_out=z,
                  stream="torch")
        return y, z
    _C.conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups,
              activation=_KERNEL_ACT[activation], out=y, stream="torch")
    return y, None


def _conv_backward_into(grad_y, x, weight, aux, stride, padding, dilation, groups, activation, need_x, need_w,
                        need_b):
    gx = torch.empty_like(x) if need_x else None
    gw = torch.empty_like(weight) if need_w else None
    gb = weight.new_empty((weight.shape[0],)) if need_b else None
    _C.conv2d_backward(grad_y, x, weight, stride=stride, padding=padding, dilation=dilation, groups=groups,
                       activation=_KERNEL_ACT[activation], preactivation=aux, needs_input_grad=need_x,
                       needs_weight_grad=need_w, needs_bias_grad=need_b, out=(gx, gw, gb), stream="torch")
    return gx, gw, gb


def _conv_backward_torch(grad_y, x, weight, bias, aux, stride, padding, dilation, groups, activation, need_x,
                         need_w, need_b):
    """_linear_backward_torch's twin: torch's differentiable ops."""
    if activation in _SAVES_PREACTIVATION and _grad_enabled():
        aux = torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups)
    grad_z = _torch_activation_grad(grad_y, aux, activation)
    gx, gw, gb = torch.ops.aten.convolution_backward(
        grad_z, x, weight, [weight.shape[0]] if need_b else None, list(stride), list(padding), list(dilation),
        False, [0, 0], groups, [need_x, need_w, need_b])
    return gx if need_x else None, gw if need_w else None, gb if need_b else None


class _Conv2dFunction(torch.autograd.Function):
    """The eager path, as _LinearFunction; shape is the output's, which the
    dispatch has computed."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups, activation, shape):
        y, z = _conv_forward(x, weight, bias, stride, padding, dilation, groups, activation, True, shape)
        ctx.geometry = (stride, padding, dilation, groups)
        ctx.activation = activation
        ctx.bias = bias  # for a double backward only, as _LinearFunction
        ctx.save_for_backward(x, weight, z if z is not None else (None if activation == "none" else y))
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, aux = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        stride, padding, dilation, groups = ctx.geometry
        if _grad_enabled():  # create_graph=True
            gx, gw, gb = _conv_backward_torch(grad_y, x, weight, ctx.bias, aux, stride, padding, dilation, groups,
                                              ctx.activation, need_x, need_w, need_b)
            return gx, gw, gb, None, None, None, None, None, None
        gx = torch.empty_like(x) if need_x else None
        gw = torch.empty_like(weight) if need_w else None
        gb = torch.empty_like(ctx.bias) if need_b else None
        if need_x and need_w and need_b:  # as _LinearFunction.backward
            _C.conv2d_backward(grad_y, x, weight, stride=stride, padding=padding, dilation=dilation, groups=groups,
                               activation=_KERNEL_ACT[ctx.activation], preactivation=aux, out=(gx, gw, gb),
                               stream="torch")
        else:
            _C.conv2d_backward(grad_y, x, weight, stride=stride, padding=padding, dilation=dilation, groups=groups,
                               activation=_KERNEL_ACT[ctx.activation], preactivation=aux, needs_input_grad=need_x,
                               needs_weight_grad=need_w, needs_bias_grad=need_b, out=(gx, gw, gb), stream="torch")
        return gx, gw, gb, None, None, None, None, None, None


class _Conv2dTransformsFunction(torch.autograd.Function):
    """_LinearTransformsFunction's twin."""

    @staticmethod
    def forward(x, weight, bias, stride, padding, dilation, groups, activation):
        return _conv_forward(x, weight, bias, stride, padding, dilation, groups, activation, True)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, stride, padding, dilation, groups, activation = inputs
        ctx.geometry = (stride, padding, dilation, groups)
        _save_for_transforms(ctx, x, weight, bias, activation, output)

    @staticmethod
    def backward(ctx, grad_y, grad_z):
        x, weight, bias, aux = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        return (*_conv_backward_torch(grad_y, x, weight, bias, aux, *ctx.geometry, ctx.activation, need_x, need_w,
                                      need_b), None, None, None, None, None)

    @staticmethod
    def jvp(ctx, x_t, weight_t, bias_t, *_):
        x, weight, aux = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.geometry
        conv = torch.nn.functional.conv2d
        z_t = _tangent_sum(conv(x_t, weight, None, stride, padding, dilation, groups) if x_t is not None else None,
                           conv(x, weight_t, None, stride, padding, dilation, groups) if weight_t is not None else None,
                           bias_t[:, None, None] if bias_t is not None else None)
        return _torch_activation_grad(z_t, aux, ctx.activation), None

    @staticmethod
    def vmap(info, in_dims, x, weight, bias, stride, padding, dilation, groups, activation):
        x_dim, w_dim, b_dim = in_dims[:3]
        geometry = (stride, padding, dilation, groups, activation)
        if w_dim is None and b_dim is None:  # one layer, a batch of inputs: folded into N
            x = x.movedim(x_dim, 0)
            batch, n = x.shape[:2]
            y, z = _Conv2dTransformsFunction.apply(x.flatten(0, 1), weight, bias, *geometry)
            y = y.unflatten(0, (batch, n))
            return (y, None if z is None else z.unflatten(0, (batch, n))), (0, None if z is None else 0)
        keep_z = activation in _SAVES_PREACTIVATION  # a batch of layers: torch's batched ops

        def one(x, weight, bias):
            z = torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups)
            return (_torch_activation(z, activation), z) if keep_z else _torch_activation(z, activation)

        out = torch.vmap(one, in_dims=(x_dim, w_dim, b_dim), randomness=info.randomness)(x, weight, bias)
        return (out if keep_z else (out, None)), ((0, 0) if keep_z else (0, None))


@torch.library.custom_op("gpuaccel::conv2d", mutates_args=())
def _conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: List[int], padding: List[int],
            dilation: List[int], groups: int, activation: str) -> Tuple[Tensor, Tensor]:
    y, z = _conv_forward(x, weight, bias, tuple(stride), tuple(padding), tuple(dilation), groups, activation, True)
    return y, (z if z is not None else _empty(x))


@_conv2d.register_fake
def _(x, weight, bias, stride, padding, dilation, groups, activation):
    shape = _conv_out_shape(x, weight, stride, padding, dilation)
    return _conv_empty(x, shape), (_conv_empty(x, shape) if activation in _SAVES_PREACTIVATION else x.new_empty((0,)))


@torch.library.custom_op("gpuaccel::conv2d_backward", mutates_args=())
def _conv2d_backward(grad_y: Tensor, x: Tensor, weight: Tensor, aux: Optional[Tensor], stride: List[int],
                     padding: List[int], dilation: List[int], groups: int, activation: str,
                     needs: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    gx, gw, gb = _conv_backward_into(grad_y, x, weight, aux, tuple(stride), tuple(padding), tuple(dilation),
                                     groups, activation, *needs)
    return (gx if needs[0] else _empty(x), gw if needs[1] else _empty(weight), gb if needs[2] else _empty(weight))


@_conv2d_backward.register_fake
def _(grad_y, x, weight, aux, stride, padding, dilation, groups, activation, needs):
    return (torch.empty_like(x) if needs[0] else x.new_empty((0,)),
            torch.empty_like(weight) if needs[1] else weight.new_empty((0,)),
            weight.new_empty((weight.shape[0],)) if needs[2] else weight.new_empty((0,)))


def _conv_setup(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, groups, activation = inputs
    y, pre = output
    ctx.geometry = (stride, padding, dilation, groups)
    ctx.activation = activation
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight, _saved_aux(activation, y, pre))


def _conv_grad(ctx, grad_y, grad_pre):
    x, weight, aux = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.geometry
    needs = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
    gx, gw, gb = _conv2d_backward(grad_y, x, weight, aux, stride, padding, dilation, groups, ctx.activation,
                                  needs)
    return (gx if needs[0] else None, gw if needs[1] else None, gb if needs[2] else None,
            None, None, None, None, None)


_conv2d.register_autograd(_conv_grad, setup_context=_conv_setup)


# ----------------------------------------------------- ONNX, from torch.export
# torch.onnx.export(model) writes the layers with torch's standard ops
# (torch.onnx.is_in_onnx_export() above).  A program exported first
# (torch.export.export, then torch.onnx.export(exported_program)) holds the
# custom ops instead: the ONNX exporter decomposes an op it has no ONNX
# function for with the decompositions registered in torch._decomp, so the
# ops' decompositions into torch's standard ops are registered there.
# ExportedProgram.run_decompositions()'s default table and torch.compile's
# do not take them: exported and compiled programs keep the fused kernels.

def _linear_decomposition(x, weight, bias, activation):
    z = torch.nn.functional.linear(x, weight, bias)
    return _torch_activation(z, activation), (z if activation in _SAVES_PREACTIVATION else x.new_empty((0,)))


def _conv2d_decomposition(x, weight, bias, stride, padding, dilation, groups, activation):
    z = torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups)
    return _torch_activation(z, activation), (z if activation in _SAVES_PREACTIVATION else x.new_empty((0,)))


def _register_decompositions():
    try:
        from torch._decomp import register_decomposition
    except ImportError:  # a torch without the table: the plain torch.onnx.export(model) still works
        return
    register_decomposition(torch.ops.gpuaccel.linear.default)(_linear_decomposition)
    register_decomposition(torch.ops.gpuaccel.conv2d.default)(_conv2d_decomposition)


_register_decompositions()


def _pair(value, name, least):
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= least for v in value):
        return tuple(value)
    raise ValueError("%s must be an int >= %d or a pair of them, got %r" % (name, least, value))


def _conv2d_traced(x, weight, bias, stride, padding, dilation, groups, activation):
    if torch.onnx.is_in_onnx_export():
        y = torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups)
        return _torch_activation(y, activation)
    return _conv2d(x, weight, bias, list(stride), list(padding), list(dilation), groups, activation)[0]


def _conv2d_torch(x, weight, bias, stride, padding, dilation, groups, activation):
    """The layer as torch's ops, for the CPU paths that run torch's kernels."""
    _check_conv_channels(x, weight, groups)
    return _torch_activation(torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups),
                             activation)


def _conv2d_checked(x, weight, bias, stride, padding, dilation, groups, activation):
    """fused_conv2d once its geometry is normalized (tuples of ints): the
    path for the call, its checks ordered and inlined for the eager path's
    host time, as _linear_dispatch."""
    if (type(x) not in _PLAIN_TENSORS or type(weight) not in _PLAIN_TENSORS
            or (bias is not None and type(bias) not in _PLAIN_TENSORS)):
        _check_tensors("conv2d", x, weight, bias)  # a NumPy array or a list: one TypeError saying so
    if x.dim() != 4:
        if x.dim() == 3:
            return _conv2d_checked(x.unsqueeze(0), weight, bias, stride, padding, dilation, groups,
                                   activation).squeeze(0)
        raise ValueError("fused_conv2d: x must be (N, C, H, W) or unbatched (C, H, W), got shape %s"
                         % (tuple(x.shape),))
    cuda = x.is_cuda
    if _any_autocast() and _is_autocast("cuda" if cuda else "cpu"):
        x, weight, bias = _autocast(x, weight, bias)
    if _is_tracing():  # as in _linear_dispatch
        return _conv2d_traced(x, weight, bias, stride, padding, dilation, groups, activation)
    n, _, h, w = x.shape
    try:
        k, c, r, s = weight.shape
    except ValueError:  # not 4-D: gpuaccel's message
        _check_conv_channels(x, weight, groups)
        raise
    shape = (n, k, (h + 2 * padding[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1,
             (w + 2 * padding[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1)
    if shape[2] < 1 or shape[3] < 1:  # an input smaller than the dilated kernel
        _check_conv_output(x, weight, padding, dilation, shape)
    # torch's kernels above the CPU threshold (multiply-adds, once per group) whatever the path, as fused_linear
    if not cuda and n * k * shape[2] * shape[3] * c * r * s * groups > CPU_TORCH_THRESHOLD["conv2d"]:
        return _conv2d_torch(x, weight, bias, stride, padding, dilation, groups, activation)
    if (_is_compiling() or type(x) not in _PLAIN_TENSORS or type(weight) not in _PLAIN_TENSORS
            or x.is_meta):  # the custom ops, as in _linear_dispatch
        if not cuda and _compiling_for_the_cpu():
            return _conv2d_torch(x, weight, bias, stride, padding, dilation, groups, activation)
        return _conv2d_traced(x, weight, bias, stride, padding, dilation, groups, activation)
    if _transforms_active():
        return _Conv2dTransformsFunction.apply(x, weight, bias, stride, padding, dilation, groups, activation)[0]
    if _grad_enabled() and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
        return _Conv2dFunction.apply(x, weight, bias, stride, padding, dilation, groups, activation, shape)
    return _conv_forward(x, weight, bias, stride, padding, dilation, groups, activation, False, shape)[0]


def fused_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None):
    """act(conv2d(x, weight) + bias) in one fused call (forward and
    backward); x of shape (N, C, H, W) in NCHW or channels-last memory (the
    result follows it), or unbatched (C, H, W).  activation: as
    fused_linear's."""
    try:
        count = operator.index(groups)
    except TypeError:
        count = 0
    if count < 1 or isinstance(groups, bool):
        raise ValueError("fused_conv2d: groups must be a positive int, got %r" % (groups,))
    return _conv2d_checked(x, weight, bias, _pair(stride, "fused_conv2d: stride", 1),
                           _pair(padding, "fused_conv2d: padding", 0), _pair(dilation, "fused_conv2d: dilation", 1),
                           count, _activation(activation))


class FusedConv2d(torch.nn.Conv2d):
    """nn.Conv2d followed by an activation (fused_linear's), fused.  The
    constructor, initialisation and
    state_dict keys are nn.Conv2d's (padding_mode 'zeros'; padding may be an
    int, a pair, 'valid', or 'same' for odd effective kernels)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=None, activation=None):
        if padding_mode != "zeros":
            raise ValueError("FusedConv2d supports padding_mode='zeros' only, got %r" % (padding_mode,))
        # nn.Conv2d takes these and fails at the first call (stride=0: "non-positive stride")
        _pair(stride, "FusedConv2d: stride", 1)
        _pair(dilation, "FusedConv2d: dilation", 1)
        if not isinstance(padding, str):
            _pair(padding, "FusedConv2d: padding", 0)
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                         dilation=dilation, groups=groups, bias=bias, padding_mode=padding_mode, device=device,
                         dtype=dtype)
        self.activation = _activation(activation)
        # (stride, padding, dilation) as the C op takes them, normalized once
        self._geometry = (tuple(self.stride), self._explicit_padding(), tuple(self.dilation))

    def _explicit_padding(self):
        if self.padding == "valid":
            return (0, 0)
        if self.padding == "same":
            pads = []
            for k, d in zip(self.kernel_size, self.dilation):
                span = d * (k - 1)
                if span % 2:
                    raise ValueError("FusedConv2d: padding='same' needs an odd dilated kernel (got kernel %s, "
                                     "dilation %s); give the padding explicitly" % (self.kernel_size, self.dilation))
                pads.append(span // 2)
            return tuple(pads)
        return tuple(self.padding)

    def forward(self, x):
        params = self._parameters  # as FusedLinear.forward
        try:
            weight, bias = params["weight"], params["bias"]
        except KeyError:
            weight, bias = self.weight, self.bias
        stride, padding, dilation = self._geometry
        return _conv2d_checked(x, weight, bias, stride, padding, dilation, self.groups, self.activation)

    __prepare_scriptable__ = _refuse_script("gpuaccel.torch.FusedConv2d")

    def extra_repr(self):
        return super().extra_repr() + ", activation=%s" % self.activation


fused_linear.__prepare_scriptable__ = _refuse_script("gpuaccel.torch.fused_linear")
fused_conv2d.__prepare_scriptable__ = _refuse_script("gpuaccel.torch.fused_conv2d")

# fuse(model) and the module it writes for Conv2d -> BatchNorm2d, which
# build on the layers above
from ._fuse import FusedConv2dBN, FuseReport, fuse  # noqa: E402
