"""gpuaccel for torch: fused linear and conv2d layers as torch custom ops.

    import gpuaccel.torch as gt
    layer = gt.FusedLinear(1024, 4096, activation="gelu")   # nn.Linear + GELU(tanh)
    conv = gt.FusedConv2d(64, 128, 3, padding=1, activation="relu")

The ops are registered with torch.library, so autograd, torch.compile
(fullgraph, no graph break) and CUDA graphs work; they run on torch's current
stream and write into tensors torch allocated.  Under torch.autocast they
compute in the autocast dtype, as nn.Linear and nn.Conv2d do.  The modules
take nn.Linear's / nn.Conv2d's arguments, initialisation and state_dict keys,
so a checkpoint of the plain layers loads into them.
"""

import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _C

__all__ = ["FusedConv2d", "FusedLinear", "fused_conv2d", "fused_linear"]

_ACTIVATIONS = ("none", "relu", "gelu")


def _activation(name):
    name = "none" if name is None else name
    if name not in _ACTIVATIONS:
        raise ValueError("activation must be None, 'relu' or 'gelu' (tanh approximation), got %r" % (name,))
    return name


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None


def _none_if_empty(t):
    return None if t.numel() == 0 and t.dim() == 1 and t.shape[0] == 0 else t


def _empty(like):
    return like.new_empty((0,))


def _autocast(*tensors):
    """The inputs in the autocast dtype when autocast is on for their device."""
    device = next(t for t in tensors if t is not None).device.type
    if not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t if t is None or not t.is_floating_point() else t.to(dtype) for t in tensors)


# ------------------------------------------------------------------ linear

@torch.library.custom_op("gpuaccel::linear", mutates_args=())
def _linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], activation: str) -> Tuple[Tensor, Tensor]:
    y = x.new_empty(x.shape[:-1] + (weight.shape[0],))
    pre = x.new_empty(y.shape) if activation == "gelu" else _empty(x)
    _C.linear(x, weight, bias, None if activation == "none" else activation, out=y,
              save_preactivation=activation == "gelu", preactivation_out=pre if activation == "gelu" else None,
              stream=_stream(x))
    return y, pre


@_linear.register_fake
def _(x, weight, bias, activation):
    y = x.new_empty(x.shape[:-1] + (weight.shape[0],))
    return y, (x.new_empty(y.shape) if activation == "gelu" else x.new_empty((0,)))


@torch.library.custom_op("gpuaccel::linear_backward", mutates_args=())
def _linear_backward(grad_y: Tensor, x: Tensor, weight: Tensor, aux: Optional[Tensor], activation: str,
                     needs: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    gx = torch.empty_like(x, memory_format=torch.contiguous_format) if needs[0] else _empty(x)
    gw = torch.empty_like(weight, memory_format=torch.contiguous_format) if needs[1] else _empty(weight)
    gb = weight.new_empty((weight.shape[0],)) if needs[2] else _empty(weight)
    _C.linear_backward(grad_y, x, weight, activation=None if activation == "none" else activation,
                       preactivation=aux, needs_input_grad=needs[0], needs_weight_grad=needs[1],
                       needs_bias_grad=needs[2], stream=_stream(x),
                       out=(gx if needs[0] else None, gw if needs[1] else None, gb if needs[2] else None))
    return gx, gw, gb


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
    aux = pre if activation == "gelu" else (y if activation == "relu" else None)
    ctx.save_for_backward(x, weight, aux)


def _linear_grad(ctx, grad_y, grad_pre):
    x, weight, aux = ctx.saved_tensors
    needs = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
    gx, gw, gb = _linear_backward(grad_y, x, weight, aux, ctx.activation, needs)
    return (gx if needs[0] else None, gw if needs[1] else None, gb if needs[2] else None, None)


_linear.register_autograd(_linear_grad, setup_context=_linear_setup)


def fused_linear(x, weight, bias=None, activation=None):
    """act(x @ weight.T + bias) in one fused kernel (forward and backward)."""
    x, weight, bias = _autocast(x, weight, bias)
    return _linear(x, weight, bias, _activation(activation))[0]


class FusedLinear(torch.nn.Module):
    """nn.Linear followed by an activation (None, 'relu' or 'gelu' with the
    tanh approximation), fused: same arguments, initialisation and
    state_dict keys (weight, bias) as nn.Linear."""

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
        return fused_linear(x, self.weight, self.bias, self.activation)

    def extra_repr(self):
        return "in_features=%d, out_features=%d, bias=%s, activation=%s" % (
            self.in_features, self.out_features, self.bias is not None, self.activation)


# ------------------------------------------------------------------ conv2d

def _channels_last(t):
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def _conv_out_shape(x, weight, stride, padding, dilation):
    n, _, h, w = x.shape
    sizes = []
    for size, k, s, p, d in zip((h, w), weight.shape[2:], stride, padding, dilation):
        sizes.append((size + 2 * p - d * (k - 1) - 1) // s + 1)
    return (n, weight.shape[0], sizes[0], sizes[1])


def _conv_empty(x, shape):
    fmt = torch.channels_last if _channels_last(x) else torch.contiguous_format
    return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=fmt)


@torch.library.custom_op("gpuaccel::conv2d", mutates_args=())
def _conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: List[int], padding: List[int],
            dilation: List[int], groups: int, activation: str) -> Tuple[Tensor, Tensor]:
    shape = _conv_out_shape(x, weight, stride, padding, dilation)
    y = _conv_empty(x, shape)
    pre = _conv_empty(x, shape) if activation == "gelu" else _empty(x)
    _C.conv2d(x, weight, bias, stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation),
              groups=groups, activation=None if activation == "none" else activation, out=y,
              save_preactivation=activation == "gelu", preactivation_out=pre if activation == "gelu" else None,
              stream=_stream(x))
    return y, pre


@_conv2d.register_fake
def _(x, weight, bias, stride, padding, dilation, groups, activation):
    shape = _conv_out_shape(x, weight, stride, padding, dilation)
    return _conv_empty(x, shape), (_conv_empty(x, shape) if activation == "gelu" else x.new_empty((0,)))


@torch.library.custom_op("gpuaccel::conv2d_backward", mutates_args=())
def _conv2d_backward(grad_y: Tensor, x: Tensor, weight: Tensor, aux: Optional[Tensor], stride: List[int],
                     padding: List[int], dilation: List[int], groups: int, activation: str,
                     needs: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    gx = torch.empty_like(x) if needs[0] else _empty(x)
    gw = torch.empty_like(weight) if needs[1] else _empty(weight)
    gb = weight.new_empty((weight.shape[0],)) if needs[2] else _empty(weight)
    act = None if activation == "none" else activation
    _C.conv2d_backward(grad_y, x, weight, stride=tuple(stride), padding=tuple(padding),
                       dilation=tuple(dilation), groups=groups, activation=act, preactivation=aux,
                       needs_input_grad=needs[0], needs_weight_grad=needs[1], needs_bias_grad=needs[2],
                       stream=_stream(x),
                       out=(gx if needs[0] else None, gw if needs[1] else None, gb if needs[2] else None))
    return gx, gw, gb


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
    aux = pre if activation == "gelu" else (y if activation == "relu" else None)
    ctx.save_for_backward(x, weight, aux)


def _conv_grad(ctx, grad_y, grad_pre):
    x, weight, aux = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.geometry
    needs = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
    gx, gw, gb = _conv2d_backward(grad_y, x, weight, aux, stride, padding, dilation, groups, ctx.activation,
                                  needs)
    return (gx if needs[0] else None, gw if needs[1] else None, gb if needs[2] else None,
            None, None, None, None, None)


_conv2d.register_autograd(_conv_grad, setup_context=_conv_setup)


def _pair(value, name):
    if isinstance(value, int) and not isinstance(value, bool):
        return [value, value]
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return list(value)
    raise ValueError("%s must be an int or a pair of ints, got %r" % (name, value))


def fused_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None):
    """act(conv2d(x, weight) + bias) in one fused call (forward and
    backward); x in NCHW or channels-last memory, the result following it."""
    x, weight, bias = _autocast(x, weight, bias)
    return _conv2d(x, weight, bias, _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation"),
                   int(groups), _activation(activation))[0]


class FusedConv2d(torch.nn.Conv2d):
    """nn.Conv2d followed by an activation (None, 'relu' or 'gelu' with the
    tanh approximation), fused.  The constructor, initialisation and
    state_dict keys are nn.Conv2d's (padding_mode 'zeros'; padding may be an
    int, a pair, 'valid', or 'same' for odd effective kernels)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=None, activation=None):
        if padding_mode != "zeros":
            raise ValueError("FusedConv2d supports padding_mode='zeros' only, got %r" % (padding_mode,))
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                         dilation=dilation, groups=groups, bias=bias, padding_mode=padding_mode, device=device,
                         dtype=dtype)
        self.activation = _activation(activation)
        self._pads = self._explicit_padding()

    def _explicit_padding(self):
        if self.padding == "valid":
            return [0, 0]
        if self.padding == "same":
            pads = []
            for k, d in zip(self.kernel_size, self.dilation):
                span = d * (k - 1)
                if span % 2:
                    raise ValueError("FusedConv2d: padding='same' needs an odd dilated kernel (got kernel %s, "
                                     "dilation %s); give the padding explicitly" % (self.kernel_size, self.dilation))
                pads.append(span // 2)
            return pads
        return list(self.padding)

    def forward(self, x):
        return fused_conv2d(x, self.weight, self.bias, list(self.stride), self._pads, list(self.dilation),
                            self.groups, self.activation)

    def extra_repr(self):
        return super().extra_repr() + ", activation=%s" % self.activation
