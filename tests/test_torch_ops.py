"""gpuaccel.torch: the fused ops as torch custom ops (autograd, gradcheck,
autocast, torch.compile), and the modules' compatibility with nn.Linear /
nn.Conv2d, on the CPU."""

import re

import pytest

from ops import ACTIVATION_NAMES, ACTIVATIONS, invalid_activations, torch_act

torch = pytest.importorskip("torch")
gt = pytest.importorskip("gpuaccel.torch")
F = torch.nn.functional


def reference_linear(x, w, b, activation):
    return torch_act(F.linear(x, w, b), activation)


@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
@pytest.mark.parametrize("bias", [True, False])
def test_fused_linear_gradcheck(activation, bias):
    torch.manual_seed(0)
    x = torch.randn(5, 3, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True) if bias else None
    if ACTIVATIONS[activation].math.kinks:  # keep pre-activations away from the kinks (relu's, hardswish's)
        with torch.no_grad():
            w.mul_(3)
    inputs = (x, w, b) if bias else (x, w)
    if bias:
        fn = lambda x, w, b: gt.fused_linear(x, w, b, activation)  # noqa: E731
    else:
        fn = lambda x, w: gt.fused_linear(x, w, None, activation)  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_fused_linear_matches_torch_in_float32(activation):
    torch.manual_seed(1)
    x = torch.randn(33, 65, requires_grad=True)
    w = torch.randn(17, 65, requires_grad=True)
    b = torch.randn(17, requires_grad=True)
    y = gt.fused_linear(x, w, b, activation)
    ref = reference_linear(x.double(), w.double(), b.double(), activation)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w, b), g)
    refs = torch.autograd.grad(ref, (x, w, b), g.double())
    for got, want in zip(grads, refs):
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=1e-4)


def test_fused_linear_is_nn_linear_compatible():
    torch.manual_seed(7)
    plain = torch.nn.Linear(20, 30)
    torch.manual_seed(7)
    fused = gt.FusedLinear(20, 30, activation="gelu")
    assert torch.equal(plain.weight, fused.weight) and torch.equal(plain.bias, fused.bias)  # same init
    assert set(fused.state_dict()) == {"weight", "bias"}
    other = gt.FusedLinear(20, 30, activation="gelu")
    other.load_state_dict(plain.state_dict())
    x = torch.randn(4, 20)
    torch.testing.assert_close(other(x), torch_act(plain(x), "gelu"), rtol=1e-5, atol=1e-6)
    no_bias = gt.FusedLinear(20, 30, bias=False)
    assert no_bias.bias is None and set(no_bias.state_dict()) == {"weight"}
    assert "activation=gelu" in repr(fused)
    bad = invalid_activations()[2]
    with pytest.raises(ValueError, match="activation must be None, 'relu', 'gelu'.*got %s" % re.escape(repr(bad))):
        gt.FusedLinear(2, 3, activation=bad)


def test_autocast_computes_in_the_autocast_dtype():
    layer = gt.FusedLinear(16, 8, activation="relu")
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32  # the master weights stay float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.relu(torch.nn.functional.linear(x, layer.weight, layer.bias))
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_fused_conv2d_gradcheck(activation):
    torch.manual_seed(2)
    x = torch.randn(2, 4, 7, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    fn = lambda x, w, b: gt.fused_conv2d(x, w, b, stride=(2, 1), padding=1, dilation=1, groups=2,  # noqa: E731
                                         activation=activation)
    assert torch.autograd.gradcheck(fn, (x, w, b), eps=1e-6, atol=1e-5)


def test_fused_conv2d_is_nn_conv2d_compatible_and_keeps_channels_last():
    torch.manual_seed(3)
    plain = torch.nn.Conv2d(8, 16, 3, padding=1, stride=2)
    torch.manual_seed(3)
    fused = gt.FusedConv2d(8, 16, 3, padding=1, stride=2, activation="relu")
    assert torch.equal(plain.weight, fused.weight) and set(fused.state_dict()) == {"weight", "bias"}
    x = torch.randn(2, 8, 11, 9).to(memory_format=torch.channels_last)
    y = fused(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, F.relu(plain(x)), rtol=1e-4, atol=1e-5)
    same = gt.FusedConv2d(8, 8, 3, padding="same")
    assert same(torch.randn(1, 8, 5, 5)).shape == (1, 8, 5, 5)
    with pytest.raises(ValueError, match="padding_mode"):
        gt.FusedConv2d(1, 1, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="odd"):
        gt.FusedConv2d(1, 1, 2, padding="same")


@pytest.mark.slow
def test_torch_compile_fullgraph_has_no_graph_break():
    torch.manual_seed(4)
    model = torch.nn.Sequential(gt.FusedConv2d(3, 8, 3, padding=1, activation="relu"), torch.nn.Flatten(),
                                gt.FusedLinear(8 * 6 * 6, 10, activation="gelu"))
    x = torch.randn(2, 3, 6, 6)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    torch.testing.assert_close(out, eager)
    out.sum().backward()
    assert model[0].weight.grad is not None and model[2].weight.grad is not None


# ----------------------------------------------------- what the layers refuse

def _one_line(info, *words):
    message = str(info.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize("batch", [1, 64], ids=["gpuaccel-kernels", "torch-kernels"])  # both sides of the threshold
@pytest.mark.parametrize("grad", [False, True])
def test_an_input_smaller_than_the_kernel_is_a_value_error(batch, grad):
    conv = gt.FusedConv2d(3, 32, 5, dilation=(1, 2))
    for shape, side in (((batch, 3, 3, 40), "height"), ((batch, 3, 40, 8), "width"), ((batch, 3, 4, 40), "height")):
        x = torch.randn(*shape, requires_grad=grad)
        with pytest.raises(ValueError) as info:
            conv(x)
        _one_line(info, "conv2d", side, "kernel", "input %d" % shape[2 if side == "height" else 3])
    assert conv(torch.randn(batch, 3, 5, 9)).shape == (batch, 32, 1, 1)  # exactly the kernel's size works


@pytest.mark.parametrize("name, value, least", [("stride", 0, 1), ("stride", (1, -1), 1), ("dilation", 0, 1),
                                                ("padding", -1, 0), ("padding", (0, -2), 0), ("stride", 1.5, 1)])
def test_bad_geometry_is_refused_when_the_layer_is_made(name, value, least):
    with pytest.raises(ValueError) as info:
        gt.FusedConv2d(3, 4, 3, **{name: value})
    _one_line(info, "FusedConv2d", name, ">= %d" % least)
    with pytest.raises(ValueError) as info:
        gt.fused_conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), **{name: value})
    _one_line(info, "fused_conv2d", name)


def test_groups_must_be_a_positive_int():
    x, w = torch.randn(1, 4, 8, 8), torch.randn(4, 2, 3, 3)
    for groups in (0, -1, "2", 2.0, True):
        with pytest.raises(ValueError) as info:
            gt.fused_conv2d(x, w, groups=groups)
        _one_line(info, "groups", repr(groups))
    np = pytest.importorskip("numpy")
    torch.testing.assert_close(gt.fused_conv2d(x, w, groups=np.int64(2)), F.conv2d(x, w, groups=2))


@pytest.mark.parametrize("size", ["small", "large"])  # gpuaccel's kernels below the CPU threshold, torch's above
def test_shape_errors_are_the_same_whichever_kernels_run(size):
    n = 1 if size == "small" else 64
    with pytest.raises(ValueError) as info:
        gt.FusedLinear(300, 400)(torch.zeros(n, 500))
    _one_line(info, "linear", "(500)", "in_features (300)")
    with pytest.raises(ValueError) as info:
        gt.FusedConv2d(3, 64, 3)(torch.zeros(n, 5, 32, 32))
    _one_line(info, "conv2d", "3 channels", "has 5")
    with pytest.raises(ValueError) as info:
        gt.FusedConv2d(4, 64, 3, groups=2)(torch.zeros(n, 5, 32, 32))
    _one_line(info, "groups=2", "(5)")


@pytest.mark.parametrize("value", ["numpy", "list", "gpuaccel"])
def test_a_layer_given_something_else_than_a_tensor_says_what_takes_it(value):
    np = pytest.importorskip("numpy")
    import gpuaccel as ga

    given = {"numpy": np.zeros((2, 3, 8, 8), np.float32), "list": [[1.0, 2.0, 3.0]],
             "gpuaccel": ga.zeros((2, 3, 8, 8))}[value]
    type_name = {"numpy": "numpy.ndarray", "list": "list", "gpuaccel": "Array"}[value]
    for layer, op in ((gt.FusedConv2d(3, 4, 3), "conv2d"), (gt.FusedLinear(8, 4), "linear")):
        with pytest.raises(TypeError) as info:
            layer(given)
        _one_line(info, op, "x must be a torch.Tensor", type_name)
        if value != "list":
            _one_line(info, "torch.from_numpy", "gpuaccel.%s" % op)
    with pytest.raises(TypeError) as info:
        gt.fused_linear(torch.zeros(2, 8), np.zeros((4, 8), np.float32))
    _one_line(info, "weight must be a torch.Tensor")
    with pytest.raises(TypeError) as info:
        gt.fused_conv2d(torch.zeros(1, 3, 8, 8), torch.zeros(4, 3, 3, 3), bias=[0.0] * 4)
    _one_line(info, "bias must be a torch.Tensor", "list")


def test_jit_script_says_what_works_instead():
    import warnings

    model = torch.nn.Sequential(gt.FusedConv2d(3, 4, 3, activation="relu"), torch.nn.Flatten(),
                                gt.FusedLinear(4 * 4 * 4, 2))

    def uses_the_function(x, w):
        return gt.fused_linear(x, w)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch: "torch.jit.script/trace is deprecated"
        for target, name in ((model, "FusedConv2d"), (model[2], "FusedLinear"), (gt.fused_conv2d, "fused_conv2d"),
                             (uses_the_function, "fused_linear")):
            with pytest.raises(RuntimeError) as info:
                torch.jit.script(target)
            message = str(info.value)
            assert "gpuaccel.torch.%s cannot be compiled by torch.jit.script" % name in message
            assert all(w in message for w in ("torch.jit.trace", "torch.export", "torch.compile"))
        # what the message names works
        x = torch.randn(2, 3, 6, 6)
        traced = torch.jit.trace(model, (x,))
    torch.testing.assert_close(traced(x), model(x))
    exported = torch.export.export(model, (x,))
    torch.testing.assert_close(exported.module()(x), model(x))
