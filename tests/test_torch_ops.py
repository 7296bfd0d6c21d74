"""gpuaccel.torch: the fused ops as torch custom ops (autograd, gradcheck,
autocast, torch.compile), and the modules' compatibility with nn.Linear /
nn.Conv2d, on the CPU."""

import pytest

from helpers import ACTIVATIONS, torch_activation

torch = pytest.importorskip("torch")
gt = pytest.importorskip("gpuaccel.torch")
F = torch.nn.functional


def reference_linear(x, w, b, activation):
    return torch_activation(F.linear(x, w, b), activation)


@pytest.mark.parametrize("activation", [None] + ACTIVATIONS)
@pytest.mark.parametrize("bias", [True, False])
def test_fused_linear_gradcheck(activation, bias):
    torch.manual_seed(0)
    x = torch.randn(5, 3, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True) if bias else None
    if activation in ("relu", "hardswish"):  # keep pre-activations away from the kinks (0; -3 and 3)
        with torch.no_grad():
            w.mul_(3)
    inputs = (x, w, b) if bias else (x, w)
    if bias:
        fn = lambda x, w, b: gt.fused_linear(x, w, b, activation)  # noqa: E731
    else:
        fn = lambda x, w: gt.fused_linear(x, w, None, activation)  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("activation", [None] + ACTIVATIONS)
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
    torch.testing.assert_close(other(x), F.gelu(plain(x)), rtol=1e-5, atol=1e-6)
    no_bias = gt.FusedLinear(20, 30, bias=False)
    assert no_bias.bias is None and set(no_bias.state_dict()) == {"weight"}
    assert "activation=gelu" in repr(fused)
    with pytest.raises(ValueError, match="activation must be None, 'relu', 'gelu'.*got 'swish'"):
        gt.FusedLinear(2, 3, activation="swish")


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


@pytest.mark.parametrize("activation", [None] + ACTIVATIONS)
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
