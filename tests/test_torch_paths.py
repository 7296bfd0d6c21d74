"""gpuaccel.torch's paths: the lean eager Function, the no-grad direct call,
the torch.library custom ops (compile, export, fake and meta tensors), and
the CPU dispatch to torch's kernels above CPU_TORCH_THRESHOLD — each
against the others and against torch's own layers, on the CPU."""

import pytest

from ops import ACTIVATION_NAMES, torch_act

torch = pytest.importorskip("torch")
gt = pytest.importorskip("gpuaccel.torch")
F = torch.nn.functional


@pytest.fixture
def no_torch_dispatch(monkeypatch):
    """gpuaccel's own kernels at every size (the dispatch threshold out of reach)."""
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "linear", 1 << 62)
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "conv2d", 1 << 62)


def leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


def grads(out, inputs, seed=0):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad(out, [t for t in inputs if t is not None], g)


def linear_inputs(rng_seed, m=13, k=11, n=7, bias=True):
    gen = torch.Generator().manual_seed(rng_seed)
    x = torch.randn(m, k, generator=gen)
    w = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    return x, w, b


@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
@pytest.mark.parametrize("bias", [True, False])
def test_eager_and_custom_op_paths_give_identical_linear_results(activation, bias, no_torch_dispatch):
    x, w, b = linear_inputs(1, bias=bias)
    xe, we, be = leaves(x, w, b)
    xc, wc, bc = leaves(x, w, b)
    eager = gt.fused_linear(xe, we, be, activation)
    act = gt._activation(activation)
    custom = gt._linear(xc, wc, bc, act)[0]  # the path torch.compile takes
    assert torch.equal(eager, custom)
    for got, want in zip(grads(eager, (xe, we, be)), grads(custom, (xc, wc, bc))):
        assert torch.equal(got, want)
    with torch.no_grad():  # the direct call, no autograd node
        assert torch.equal(gt.fused_linear(x, w, b, activation), eager)


@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_eager_and_custom_op_paths_give_identical_conv_results(activation, no_torch_dispatch):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 9, 7, generator=gen)
    w = torch.randn(6, 2, 3, 3, generator=gen)
    b = torch.randn(6, generator=gen)
    geometry = ((2, 1), (1, 0), (1, 2), 2)
    xe, we, be = leaves(x, w, b)
    xc, wc, bc = leaves(x, w, b)
    eager = gt.fused_conv2d(xe, we, be, *geometry, activation=activation)
    custom = gt._conv2d(xc, wc, bc, *[list(g) for g in geometry[:3]], geometry[3], gt._activation(activation))[0]
    assert torch.equal(eager, custom)
    for got, want in zip(grads(eager, (xe, we, be)), grads(custom, (xc, wc, bc))):
        assert torch.equal(got, want)
    with torch.no_grad():
        assert torch.equal(gt.fused_conv2d(x, w, b, *geometry, activation=activation), eager)


@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
@pytest.mark.parametrize("size", ["small", "large"])
def test_both_sides_of_the_cpu_dispatch_match_torch(activation, size, monkeypatch):
    # the same shape on each side of the threshold: gpuaccel's kernels, then torch's
    threshold = 0 if size == "large" else 1 << 62
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "linear", threshold)
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "conv2d", threshold)
    x, w, b = (t.double() for t in linear_inputs(3, m=37, k=19, n=23))
    xf, wf, bf = leaves(x, w, b)
    xr, wr, br = leaves(x, w, b)
    y = gt.fused_linear(xf, wf, bf, activation)
    ref = torch_act(F.linear(xr, wr, br), activation)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads(y, (xf, wf, bf)), grads(ref, (xr, wr, br))):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-11)

    gen = torch.Generator().manual_seed(4)
    xc = torch.randn(3, 5, 11, 10, generator=gen, dtype=torch.float64)
    wc = torch.randn(4, 5, 3, 3, generator=gen, dtype=torch.float64)
    bc = torch.randn(4, generator=gen, dtype=torch.float64)
    xf, wf, bf = leaves(xc, wc, bc)
    xr, wr, br = leaves(xc, wc, bc)
    y = gt.fused_conv2d(xf, wf, bf, stride=2, padding=1, activation=activation)
    ref = torch_act(F.conv2d(xr, wr, br, stride=2, padding=1), activation)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads(y, (xf, wf, bf)), grads(ref, (xr, wr, br))):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-11)


def test_the_dispatch_threshold_counts_multiply_adds(monkeypatch):
    calls = []
    real_apply = gt._LinearFunction.apply
    monkeypatch.setattr(gt._LinearFunction, "apply", lambda *a: calls.append(a[0].shape) or real_apply(*a))
    x, w, b = linear_inputs(5, m=8, k=16, n=4)  # 512 multiply-adds
    x.requires_grad_()
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "linear", 512)
    gt.fused_linear(x, w, b)
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "linear", 511)
    gt.fused_linear(x, w, b)
    assert len(calls) == 1  # 512 is not above 512: gpuaccel's kernels; above 511: torch's


def test_eager_calls_never_go_through_the_custom_ops(monkeypatch, no_torch_dispatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the custom op was called in eager mode")

    monkeypatch.setattr(gt, "_linear", refuse)
    monkeypatch.setattr(gt, "_conv2d", refuse)
    layer = gt.FusedLinear(6, 5, activation="gelu")
    conv = gt.FusedConv2d(3, 4, 3, padding=1, activation="relu")
    layer(torch.randn(2, 6)).sum().backward()
    conv(torch.randn(1, 3, 5, 5)).sum().backward()
    with torch.no_grad():
        layer(torch.randn(2, 6))
        conv(torch.randn(1, 3, 5, 5))
    assert layer.weight.grad is not None and conv.weight.grad is not None


def test_fake_and_meta_tensors_take_the_custom_ops():
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = gt.FusedLinear(6, 5, activation="gelu")
    conv = gt.FusedConv2d(3, 4, 3, stride=2, padding=1, activation="relu")
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        y = gt.fused_linear(mode.from_tensor(torch.randn(2, 3, 6)), mode.from_tensor(layer.weight.detach()))
        assert y.shape == (2, 3, 5)
        yc = conv(mode.from_tensor(torch.randn(2, 3, 9, 8)))
        assert yc.shape == (2, 4, 5, 4)
    meta = gt.fused_linear(torch.randn(4, 6, device="meta"), torch.randn(5, 6, device="meta"), activation="relu")
    assert meta.shape == (4, 5) and meta.is_meta


def test_unbatched_conv_and_1d_linear_inputs_are_accepted_as_torch_accepts_them():
    torch.manual_seed(6)
    conv = gt.FusedConv2d(3, 4, 3, padding=1, activation="relu")
    plain = torch.nn.Conv2d(3, 4, 3, padding=1)
    plain.load_state_dict(conv.state_dict())
    x = torch.randn(3, 8, 8, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    y = conv(x)
    ref = F.relu(plain(xr))
    assert y.shape == ref.shape == (4, 8, 8)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    y.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(conv.weight.grad, plain.weight.grad, rtol=1e-4, atol=1e-5)

    layer = gt.FusedLinear(7, 3, activation="gelu")
    v = torch.randn(7, requires_grad=True)
    out = layer(v)
    assert out.shape == (3,)
    torch.testing.assert_close(out, torch_act(F.linear(v, layer.weight, layer.bias), "gelu"),
                               rtol=1e-5, atol=1e-6)
    out.sum().backward()
    assert v.grad.shape == (7,)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\) or unbatched \(C, H, W\), got shape \(8, 8\)"):
        conv(torch.randn(8, 8))


def test_only_the_gradients_asked_for_are_computed(no_torch_dispatch):
    x, w, b = linear_inputs(7)
    w.requires_grad_()
    y = gt.fused_linear(x, w, b, "gelu")  # neither x nor b requires grad
    (gw,) = torch.autograd.grad(y.sum(), [w])
    wr = w.detach().clone().requires_grad_()
    (ref,) = torch.autograd.grad(torch_act(F.linear(x, wr, b), "gelu").sum(), [wr])
    torch.testing.assert_close(gw, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", [a for a in ACTIVATION_NAMES if a is not None])
@pytest.mark.parametrize("size", ["small", "large"])
def test_double_backward_is_torchs(activation, size, monkeypatch):
    # gradients of gradients (create_graph=True), on both sides of the CPU
    # dispatch: gradgradcheck, and the second derivatives of torch's layers
    threshold = 0 if size == "large" else 1 << 62
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "linear", threshold)
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "conv2d", threshold)
    x, w, b = (t.double() for t in linear_inputs(8, m=6, k=5, n=4))
    if activation == "relu":  # gradgradcheck's finite differences need the pre-activations away from the kink
        w = w * 3
    inputs = leaves(x, w, b)
    assert torch.autograd.gradgradcheck(lambda x, w, b: gt.fused_linear(x, w, b, activation), inputs)
    gen = torch.Generator().manual_seed(9)
    xc = torch.randn(2, 4, 6, 5, generator=gen, dtype=torch.float64)
    wc = torch.randn(6, 2, 3, 3, generator=gen, dtype=torch.float64) * (3 if activation == "relu" else 1)
    bc = torch.randn(6, generator=gen, dtype=torch.float64)

    def conv(x, w, b):
        return gt.fused_conv2d(x, w, b, stride=(2, 1), padding=1, groups=2, activation=activation)

    assert torch.autograd.gradgradcheck(conv, leaves(xc, wc, bc))
    for fused, plain, tensors in (
            (lambda x, w, b: gt.fused_linear(x, w, b, activation),
             lambda x, w, b: torch_act(F.linear(x, w, b), activation), (x, w, b)),
            (conv, lambda x, w, b: torch_act(F.conv2d(x, w, b, (2, 1), 1, 1, 2), activation), (xc, wc, bc))):
        second = []
        for fn in (fused, plain):
            ins = leaves(*tensors)
            first = torch.autograd.grad(fn(*ins).square().sum(), ins, create_graph=True)
            second.append(torch.autograd.grad(sum(g.sin().sum() for g in first), ins))
        for got, want in zip(*second):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------- torch.func

def _func_inputs(seed):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)
    return rand


@pytest.mark.parametrize("activation", [a for a in ACTIVATION_NAMES if a is not None])
@pytest.mark.parametrize("size", ["small", "large"])
def test_torch_func_transforms_give_torchs_results(activation, size, monkeypatch):
    """vmap (a batch of inputs; a batch of layers), grad, per-sample
    gradients (vmap of grad), jacrev, jacfwd, hessian and functional_call
    over an ensemble, on both sides of the CPU dispatch, against torch's
    layers under the same transforms."""
    from torch.func import functional_call, grad, hessian, jacfwd, jacrev, vmap

    threshold = 0 if size == "large" else 1 << 62
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "linear", threshold)
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "conv2d", threshold)
    rand = _func_inputs(10)
    close = {"rtol": 1e-10, "atol": 1e-10}

    def fl(x, w, b):
        return gt.fused_linear(x, w, b, activation)

    def tl(x, w, b):
        return torch_act(F.linear(x, w, b), activation)

    x, w, b, xs, ws, bs = rand(5, 7), rand(4, 7), rand(4), rand(3, 5, 7), rand(3, 4, 7), rand(3, 4)
    torch.testing.assert_close(vmap(fl, (1, None, None))(xs.transpose(0, 1), w, b), tl(xs, w, b), **close)
    torch.testing.assert_close(vmap(fl, (None, 0, 0))(x, ws, bs), vmap(tl, (None, 0, 0))(x, ws, bs), **close)
    for got, want in zip(grad(lambda *a: fl(*a).square().sum(), argnums=(0, 1, 2))(x, w, b),
                         grad(lambda *a: tl(*a).square().sum(), argnums=(0, 1, 2))(x, w, b)):
        torch.testing.assert_close(got, want, **close)
    per_sample = [vmap(grad(lambda w, x, fn=fn: fn(x, w, b).square().sum()), (None, 0))(w, xs) for fn in (fl, tl)]
    torch.testing.assert_close(*per_sample, **close)
    torch.testing.assert_close(jacrev(fl, argnums=1)(x, w, b), jacrev(tl, argnums=1)(x, w, b), **close)
    torch.testing.assert_close(jacfwd(fl)(x, w, b), jacfwd(tl)(x, w, b), **close)
    torch.testing.assert_close(hessian(lambda x: fl(x, w, b).sum())(x[:2]),
                               hessian(lambda x: tl(x, w, b).sum())(x[:2]), **close)

    def fc(x, w, b):
        return gt.fused_conv2d(x, w, b, stride=(2, 1), padding=1, groups=2, activation=activation)

    def tc(x, w, b):
        return torch_act(F.conv2d(x, w, b, (2, 1), 1, 1, 2), activation)

    xc, wc, bc, xcs, wcs = rand(2, 4, 7, 6), rand(6, 2, 3, 3), rand(6), rand(3, 2, 4, 7, 6), rand(2, 6, 2, 3, 3)
    torch.testing.assert_close(vmap(fc, (0, None, None))(xcs, wc, bc), vmap(tc, (0, None, None))(xcs, wc, bc),
                               **close)
    torch.testing.assert_close(vmap(fc, (None, 0, None))(xc, wcs, bc), vmap(tc, (None, 0, None))(xc, wcs, bc),
                               **close)
    per_sample = [vmap(grad(lambda w, x, fn=fn: fn(x, w, bc).square().sum()), (None, 0))(wc, xc)
                  for fn in (fc, tc)]
    torch.testing.assert_close(*per_sample, **close)  # each sample an unbatched (C, H, W) input
    torch.testing.assert_close(jacrev(fc)(xc, wc, bc), jacrev(tc)(xc, wc, bc), **close)
    torch.testing.assert_close(jacfwd(fc, argnums=1)(xc, wc, bc), jacfwd(tc, argnums=1)(xc, wc, bc), **close)

    layer = gt.FusedLinear(7, 4, activation=activation).double()  # an ensemble of two: stacked parameters
    params = {k: torch.stack([v.detach(), v.detach() * 0.5]) for k, v in layer.named_parameters()}
    out = vmap(lambda p, x: functional_call(layer, p, (x,)), (0, None))(params, x)
    torch.testing.assert_close(out[1], tl(x, layer.weight * 0.5, layer.bias * 0.5), **close)


# ------------------------------------------------------------ torch.compile

def _compiled_graph_targets(model, x):
    """model compiled with a backend that keeps the graphs it is given: the
    output and the graph's call targets."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(model, backend=backend, fullgraph=True)(x)
    return out, {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}


def _small_model():
    return torch.nn.Sequential(gt.FusedConv2d(3, 5, 3, padding=1, activation="relu"), torch.nn.Flatten(),
                               gt.FusedLinear(5 * 6 * 6, 7, activation="gelu"))


@pytest.mark.slow
@pytest.mark.parametrize("size", ["small", "large"])
def test_compiled_cpu_layers_are_torchs_ops_at_every_size(size, monkeypatch):
    """Under torch.compile a CPU layer is torch's ops in the graph whatever
    its size (inductor compiles them as it compiles torch's layers; a custom
    op would cost a Python dispatch per call): the results and gradients
    are eager's, exactly where eager runs torch's kernels too (above the
    threshold), within float32 rounding where eager runs gpuaccel's."""
    threshold = 0 if size == "large" else 1 << 62
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "linear", threshold)
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "conv2d", threshold)
    model = _small_model()
    x = torch.randn(2, 3, 6, 6)
    out, targets = _compiled_graph_targets(model, x)
    assert not {t for t in targets if t.startswith("gpuaccel.")}, targets
    for op in ("conv2d", "relu", "linear", "gelu"):  # torch's ops, whatever dynamo calls their targets
        assert any(op in t for t in targets), (op, targets)
    eager = model(x)
    if size == "large":
        assert torch.equal(out, eager)
    else:
        torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-6)
    got = torch.autograd.grad(out.sum(), list(model.parameters()))
    want = torch.autograd.grad(eager.sum(), list(model.parameters()))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_compiled_custom_ops_run_eagers_kernels(monkeypatch):
    """The custom ops in a compiled graph, as a CUDA layer has them (here on
    the CPU with the CPU rule switched off): the same kernels as eager, so
    the same results and gradients."""
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "linear", 1 << 62)
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "conv2d", 1 << 62)
    monkeypatch.setattr(gt, "_compiling_for_the_cpu", lambda: False)
    model = _small_model()
    x = torch.randn(2, 3, 6, 6)
    out, targets = _compiled_graph_targets(model, x)
    assert {"gpuaccel.conv2d.default", "gpuaccel.linear.default"} <= targets, targets
    eager = model(x)
    assert torch.equal(out, eager)
    got = torch.autograd.grad(out.sum(), list(model.parameters()))
    want = torch.autograd.grad(eager.sum(), list(model.parameters()))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_export_keeps_the_custom_ops_of_small_cpu_layers():
    """torch.export (unlike torch.compile) keeps gpuaccel's ops for layers
    below the CPU threshold, so that the exported program holds the fused
    kernels; it computes what the eager model does."""
    model = _small_model()
    x = torch.randn(2, 3, 6, 6)
    exported = torch.export.export(model, (x,))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert {"gpuaccel.conv2d.default", "gpuaccel.linear.default"} <= targets, targets
    assert torch.equal(exported.module()(x), model(x))


def test_ops_take_torchs_stream_by_name():
    import gpuaccel as ga

    x, w, b = linear_inputs(9)
    torch.testing.assert_close(torch.from_dlpack(ga.linear(x, w, b, "relu", stream="torch")),
                               F.relu(F.linear(x, w, b)), rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
def test_a_cuda_op_refuses_a_stream_string_other_than_torch():
    import numpy as np

    import gpuaccel as ga

    a = ga.asarray(np.ones((3, 4), dtype=np.float32), device="cuda")
    with pytest.raises(TypeError, match="stream must be None"):
        ga.linear(a, ga.asarray(np.ones((2, 4), dtype=np.float32), device="cuda"), stream="torh")
