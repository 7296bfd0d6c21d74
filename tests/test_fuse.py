"""gpuaccel.torch.fuse on small models written for the purpose: which
chains are fused (module, functional and method spellings of the
activations), BatchNorm folding in eval mode and the unchanged BatchNorm in
training mode, the fold following parameter and statistic changes, names
and state_dicts, the report's reasons, models that cannot be traced, and
the fused model under deepcopy, pickle, torch.compile and torch.func.
Every fused model is checked against the model it came from, in float64."""

import copy
import pickle

import pytest

torch = pytest.importorskip("torch")
import gpuaccel.torch as gt  # noqa: E402 - after torch's importorskip

nn = torch.nn
F = nn.functional


def check_same(model, fused, x, *, rtol=1e-12, seed=0):
    """The fused model's output and every gradient (input, parameters by
    name) are the model's."""
    xs = [x.detach().clone().requires_grad_() for _ in range(2)]
    outs = []
    for m, xi in zip((model, fused), xs):
        torch.manual_seed(seed)
        outs.append(m(xi))
    torch.testing.assert_close(outs[1], outs[0], rtol=rtol, atol=rtol * float(outs[0].detach().abs().max()))
    g = torch.randn(outs[0].shape, generator=torch.Generator().manual_seed(seed + 1), dtype=outs[0].dtype)
    params = [dict(model.named_parameters()), dict(fused.named_parameters())]
    assert params[0].keys() == params[1].keys()
    names = list(params[0])
    grads = [torch.autograd.grad(o, [xi] + [p[n] for n in names], g, allow_unused=True)
             for o, xi, p in zip(outs, xs, params)]
    # a conv's bias before a training-mode BatchNorm has a zero gradient, rounding noise on both sides:
    # the absolute tolerance is relative to the largest gradient
    scale = max(float(t.abs().max()) for t in grads[0] if t is not None)
    for name, want, got in zip(["input"] + names, *grads):
        assert (got is None) == (want is None), name  # a layer forward does not call has none
        if want is not None:
            torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * scale, msg=name)


def randomize_batchnorms(model, seed=0):
    """Running statistics and affine parameters far from their defaults, so
    that a fold that ignored any of them would show."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                if m.running_mean is not None:
                    m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.5)
                    m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) * 2 + 0.2)
                if m.weight is not None:
                    m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                    m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.5)
    return model


class Spellings(nn.Module):
    """Each activation spelled another way: modules, functions, methods, in
    place and not."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, 3, padding=1)
        self.c2 = nn.Conv2d(6, 6, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(6)
        self.c3 = nn.Conv2d(6, 6, 1)
        self.act3 = nn.ReLU(inplace=True)
        self.c4 = nn.Conv2d(6, 5, 3, stride=2, padding=1, groups=1)
        self.bn4 = nn.BatchNorm2d(5, affine=False)
        self.c5 = nn.Conv2d(5, 5, 3, padding=1, groups=5)
        self.bn5 = nn.BatchNorm2d(5)
        self.act5 = nn.Hardswish()
        self.l1 = nn.Linear(5 * 4 * 4, 12)
        self.l2 = nn.Linear(12, 12)
        self.l3 = nn.Linear(12, 12)
        self.l4 = nn.Linear(12, 12)
        self.l5 = nn.Linear(12, 10)
        self.act5b = nn.GELU()
        self.l6 = nn.Linear(10, 4)

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = torch.relu(self.bn2(self.c2(x)))
        x = self.act3(self.c3(x))
        x = self.bn4(self.c4(x)).relu()
        x = self.act5(self.bn5(self.c5(x)))
        x = x.flatten(1)
        x = F.gelu(self.l1(x), approximate="tanh")
        x = F.silu(self.l2(x))
        x = torch.sigmoid(self.l3(x))
        x = F.relu(self.l4(x), inplace=True)
        x = self.act5b(self.l5(x))
        return self.l6(x)


EXPECTED_KINDS = {"c1": "relu", "c2": "relu", "c3": "relu", "c4": "relu", "c5": "hardswish", "l1": "gelu_tanh",
                  "l2": "silu", "l3": "sigmoid", "l4": "relu", "l5": "gelu"}


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_every_spelling_of_an_activation_is_fused_and_the_function_is_the_same(mode):
    torch.manual_seed(0)
    model = randomize_batchnorms(Spellings()).double().train(mode == "train")
    fused, report = gt.fuse(model, report=True)
    by_layer = {entry["names"][0]: entry for entry in report.fused}
    for layer, kind in EXPECTED_KINDS.items():
        assert by_layer[layer]["activation"] == kind, (layer, by_layer.get(layer))
    for layer in ("c2", "c4", "c5"):
        assert by_layer[layer]["into"] == "FusedConv2dBN" and by_layer[layer]["batchnorm_training"] == (mode == "train")
    assert set(report.unfused) == {"l6"}
    assert "followed by the model's output" in report.unfused["l6"]
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    check_same(model, fused, x)
    if mode == "train":  # the running statistics moved alike
        for name, buf in model.named_buffers():
            torch.testing.assert_close(dict(fused.named_buffers())[name], buf, rtol=1e-13, atol=1e-13)


def test_eval_batchnorm_folds_exactly_and_is_not_called():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(4, 7, 3, padding=1, bias=False), nn.BatchNorm2d(7, eps=1e-3), nn.ReLU(),
                          nn.Conv2d(7, 5, 1), nn.BatchNorm2d(5), nn.Conv2d(5, 3, 3, dilation=2, padding=2),
                          nn.BatchNorm2d(3, affine=False), nn.SiLU())
    model = randomize_batchnorms(model, seed=3).double().eval()
    fused = gt.fuse(model)
    assert sum(isinstance(m, gt.FusedConv2dBN) for m in fused.modules()) == 3
    calls = []
    for m in fused.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.register_forward_hook(lambda *a: calls.append(1))
    x = torch.randn(2, 4, 9, 7, dtype=torch.float64)
    check_same(model, fused, x, rtol=1e-12)
    assert not calls  # eval: no BatchNorm left in the computation
    fused.train()
    model.train()
    check_same(model, fused, x, rtol=1e-12)
    assert len(calls) == 3  # training: each BatchNorm runs itself


def test_the_fold_is_computed_in_float64_and_rounded_once():
    torch.manual_seed(2)
    conv, bn = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)
    randomize_batchnorms(nn.Sequential(bn), seed=5)
    with torch.no_grad():
        bn.running_var.mul_(1e-3)  # scales where float32 arithmetic would round differently
    model = nn.Sequential(conv, bn).eval()
    fused = gt.fuse(model)
    layer = fused.get_submodule("0")
    weight, bias = layer._folded(layer.batchnorm)
    scale = bn.weight.double() / torch.sqrt(bn.running_var.double() + bn.eps)
    exact = [conv.weight.double() * scale[:, None, None, None],
             (conv.bias.double() - bn.running_mean.double()) * scale + bn.bias.double()]
    for got, want in zip((weight, bias), exact):  # float64 arithmetic, one rounding: within half a float32 ulp
        assert got.dtype == torch.float32
        assert bool(((got.double() - want).abs() <= 2.0 ** -24 * want.abs() * (1 + 1e-9)).all())
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        want = model.double()(x.double())
        got = fused(x).double()  # fused is float32 still: it was copied before model became float64
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_the_fold_follows_changes_to_the_weights_and_statistics():
    torch.manual_seed(3)
    model = randomize_batchnorms(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())).double().eval()
    fused = gt.fuse(model, inplace=True)  # shares the parameters: an optimizer of the model's trains both
    x = torch.randn(2, 3, 7, 7, dtype=torch.float64)
    with torch.no_grad():
        first = fused(x)
        assert torch.equal(fused(x), first)  # the cached fold
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x).sum().backward()
    opt.step()  # eval mode: the conv's weight and the BatchNorm's affine parameters move
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-12, atol=1e-12)
        assert not torch.equal(fused(x), first)
    model.train()
    model(x)  # a training forward moves the running statistics
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-12, atol=1e-12)
    other = randomize_batchnorms(copy.deepcopy(model), seed=9)
    fused.load_state_dict(other.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(fused(x), other(x), rtol=1e-12, atol=1e-12)
        fused.float()
        torch.testing.assert_close(fused(x.float()), other.float()(x.float()), rtol=1e-5, atol=1e-5)


def test_inference_mode_and_then_a_gradient_through_the_cached_fold():
    model = randomize_batchnorms(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))).eval()
    fused = gt.fuse(model)
    for p in fused.parameters():
        p.requires_grad_(False)  # frozen: the cached fold serves the gradient of x
    x = torch.randn(1, 3, 5, 5)
    with torch.inference_mode():
        fused(x)  # the fold is cached in inference mode
    xr = x.clone().requires_grad_()
    fused(xr).sum().backward()  # and is then saved for a backward
    xm = x.clone().requires_grad_()
    model(xm).sum().backward()
    torch.testing.assert_close(xr.grad, xm.grad, rtol=1e-5, atol=1e-6)


def test_state_dict_names_and_inplace_sharing():
    torch.manual_seed(4)
    model = Spellings().eval()
    fused = gt.fuse(model)
    assert set(fused.state_dict()) == set(model.state_dict())
    fused.load_state_dict(model.state_dict())  # strict
    model.load_state_dict(fused.state_dict())
    assert all(p is not q for p, q in zip(model.parameters(), fused.parameters()))
    shared = gt.fuse(model, inplace=True)
    mine = dict(model.named_parameters())
    assert all(p is mine[n] for n, p in shared.named_parameters())
    assert all(b is dict(model.named_buffers())[n] for n, b in shared.named_buffers())


class Reasons(nn.Module):
    def __init__(self):
        super().__init__()
        self.twice = nn.Linear(6, 6)
        self.used_twice = nn.Linear(6, 6)
        self.pooled = nn.Conv2d(3, 6, 3, padding=1)
        self.reflect = nn.Conv2d(6, 6, 3, padding=1, padding_mode="reflect")
        self.hooked = nn.Conv2d(6, 6, 1)
        self.attention = nn.MultiheadAttention(6, 2, batch_first=True)
        self.unused = nn.Linear(3, 3)
        self.hooked.register_forward_hook(lambda m, i, o: None)

    def forward(self, x):
        y = F.max_pool2d(self.pooled(x), 2)
        y = F.relu(self.reflect(y))
        y = F.relu(self.hooked(y))
        s = y.mean((2, 3))
        s = F.relu(self.twice(F.relu(self.twice(s))))
        u = self.used_twice(s)
        s = F.relu(u) + u
        a, _ = self.attention(s[:, None], s[:, None], s[:, None])
        return a[:, 0]


def test_the_report_names_every_unfused_layer_with_its_reason():
    torch.manual_seed(5)
    model = Reasons().double()
    fused, report = gt.fuse(model, report=True)
    assert report.fused == []
    reasons = report.unfused
    assert set(reasons) == {"twice", "used_twice", "pooled", "reflect", "hooked", "attention.out_proj", "unused"}
    assert "called 2 times" in reasons["twice"]
    assert "used 2 times" in reasons["used_twice"]
    assert "max_pool2d" in reasons["pooled"]
    assert "padding_mode='reflect'" in reasons["reflect"]
    assert "hooks" in reasons["hooked"]
    assert "MultiheadAttention" in reasons["attention.out_proj"]
    assert "not called" in reasons["unused"]
    text = str(report)
    for name, why in reasons.items():
        assert name in text and why in text
    check_same(model, fused, torch.randn(2, 3, 6, 6, dtype=torch.float64))


class Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4), nn.GELU(
            approximate="tanh"))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        y = self.features(x).mean((2, 3))
        if y.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it
            return self.head(y)
        return -self.head(y)


class ModeDependent(Untraceable):
    def forward(self, x):
        y = self.features(x).mean((2, 3))
        return self.head(y * 2 if self.training else y)


@pytest.mark.parametrize("cls", [Untraceable, ModeDependent])
def test_a_forward_that_cannot_be_traced_is_fused_child_by_child(cls):
    torch.manual_seed(6)
    model = randomize_batchnorms(cls()).double()
    fused, report = gt.fuse(model, report=True)
    assert type(fused) is cls and report.fallbacks and report.fallbacks[0][0] == ""
    why = report.fallbacks[0][1]
    assert ("training mode" in why) if cls is ModeDependent else ("TraceError" in why or "control flow" in why), why
    assert report.traced == ["features"]
    assert [e["names"][0] for e in report.fused] == ["features.0", "features.2"]
    assert "could not be traced" in report.unfused["head"]
    x = torch.randn(2, 3, 7, 7, dtype=torch.float64)
    for mode in (True, False):
        model.train(mode)
        fused.train(mode)
        check_same(model, fused, x)


def test_copies_pickles_compile_and_torch_func_of_a_fused_model():
    from torch.func import functional_call, grad

    torch.manual_seed(7)
    model = randomize_batchnorms(Spellings()).double().eval()
    fused = gt.fuse(model)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        want = model(x)
        for clone in (copy.deepcopy(fused), pickle.loads(pickle.dumps(fused))):
            torch.testing.assert_close(clone(x), want, rtol=1e-12, atol=1e-12)
            assert clone.state_dict().keys() == model.state_dict().keys()
    compiled = torch.compile(fused, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), want, rtol=1e-12, atol=1e-12)
    # the model's own parameter names address the fused model's parameters
    params = {n: p.detach() for n, p in model.named_parameters()}
    grads = [grad(lambda p, m=m: functional_call(m, p, (x,)).square().sum())(params) for m in (model, fused)]
    for name in params:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-10, atol=1e-10, msg=name)


def test_a_compiled_graph_folds_or_applies_the_batchnorm_whichever_pass_is_smaller():
    """A compiled graph cannot keep the fold between calls: where the conv's
    output is larger than its weight the graph folds (a pass over the
    weight), where it is smaller it applies the BatchNorm to the output (a
    pass over the output), as the compiled original does; either way the
    original's function, in eval mode, with and without gradients."""
    torch.manual_seed(12)
    # conv 0: 4 x 8 x 9 x 9 output > 8 x 3 x 3 x 3 weight; conv 1: 4 x 16 x 2 x 2 output < 16 x 8 x 3 x 3 weight
    model = randomize_batchnorms(nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=4), nn.BatchNorm2d(16), nn.Hardswish())).double().eval()
    fused = gt.fuse(model)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(fused, backend=backend, fullgraph=True)
    x = torch.randn(4, 3, 9, 9, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-12, atol=1e-12)
    names = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("batch_norm" in t for t in names) == 1, names  # the second conv's only
    assert sum("rsqrt" in t for t in names) == 1, names  # the first conv's fold
    # with gradients: the fold and the BatchNorm are differentiated in the graph
    for m in (model, fused):
        m.zero_grad()
    compiled(x).square().sum().backward()
    model(x).square().sum().backward()
    fused_params = dict(fused.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(fused_params[name].grad, p.grad, rtol=1e-10, atol=1e-10, msg=name)


def test_channels_last_and_autocast():
    torch.manual_seed(8)
    model = randomize_batchnorms(nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                               nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())).eval()
    model = model.to(memory_format=torch.channels_last)
    fused = gt.fuse(model)
    x = torch.randn(2, 3, 9, 9).to(memory_format=torch.channels_last)
    with torch.no_grad():
        y = fused(x)
        assert y.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-5)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, want = fused(x), model(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.05 * float(want.abs().max()))


def test_fuse_checks_its_arguments():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got function"):
        gt.fuse(lambda x: x)
    with pytest.raises(TypeError, match="inplace and report must be bools, got inplace=1"):
        gt.fuse(nn.Linear(2, 2), inplace=1)
    fused, report = gt.fuse(nn.Linear(2, 2), report=True)
    assert "nothing follows it" in report.unfused[""]
