"""gpuaccel.torch.fuse on torchvision's models (weights=None, small images):
what is fused against the goals, the fused model's outputs and every
gradient against the original in float64 (1e-9 relative) and float32, with
the CPU dispatch as it is and with gpuaccel's own kernels at every size
(what a GPU user runs), and 20 training steps side by side.

The goals' counts are checked on the models as torchvision builds them (on
the meta device: fusing reads no weights).  The numerical checks run
ResNet-18 and MobileNetV3-small whole, and VGG-11, ConvNeXt-tiny and
ViT-B/16 with their own layers and widths but fewer of them (VGG-11's conv
features with a 256-wide classifier, ConvNeXt-tiny with one block per
stage, ViT-B/16 with 2 of its 12 encoder layers): the same chains and the
same fusions, at a tenth of the float64 work, so the file fits CI's two
cores."""

import copy

import pytest

torch = pytest.importorskip("torch")
tvm = pytest.importorskip("torchvision.models")
import gpuaccel.torch as gt  # noqa: E402 - after torch's importorskip

nn = torch.nn
SIZE = 32  # image side: every model's strides leave at least 1x1
BATCH = 2  # a training-mode BatchNorm needs more than one value per channel
# the models without BatchNorm check one image: their float64 work is the largest
CHECK_BATCH = {"convnext_tiny": 1, "vit_b_16": 1}


def _vgg11():
    model = tvm.vgg11(num_classes=10)
    model.classifier[0] = nn.Linear(512 * 7 * 7, 256)
    model.classifier[3] = nn.Linear(256, 256)
    model.classifier[6] = nn.Linear(256, 10)
    return model


def _resnet18():
    return tvm.resnet18(num_classes=10)


def _mobilenet_v3_small():
    return tvm.mobilenet_v3_small(num_classes=10)


def _convnext_tiny():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    stages = [CNBlockConfig(96, 192, 1), CNBlockConfig(192, 384, 1), CNBlockConfig(384, 768, 1),
              CNBlockConfig(768, None, 1)]
    return ConvNeXt(stages, stochastic_depth_prob=0.1, num_classes=10)  # convnext_tiny's, with (3, 3, 9, 3) blocks


def _vit_b_16():
    from torchvision.models.vision_transformer import VisionTransformer

    # vit_b_16's patch, widths and heads
    return VisionTransformer(image_size=SIZE, patch_size=16, num_layers=2, num_heads=12, hidden_dim=768,
                             mlp_dim=3072, num_classes=10)


def full(name):
    """The model as torchvision builds it, on the meta device."""
    with torch.device("meta"):
        if name == "vit_b_16":
            return tvm.vit_b_16(image_size=SIZE, num_classes=10).eval()
        return getattr(tvm, name)(num_classes=10).eval()


BUILDERS = {"vgg11": _vgg11, "resnet18": _resnet18, "mobilenet_v3_small": _mobilenet_v3_small,
            "convnext_tiny": _convnext_tiny, "vit_b_16": _vit_b_16}
_STATES = {}


def _randomized(model, seed):
    """Parameters that make every layer count: BatchNorm statistics and
    affine parameters away from their defaults, ConvNeXt's layer scales
    away from 1e-6, ViT's zero-initialised head random."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.2)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.2)
        for name, p in model.named_parameters():
            if name.endswith("layer_scale"):
                p.copy_(torch.rand(p.shape, generator=gen) * 0.5 + 0.5)
            elif name.startswith("heads.head"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return model


def build(name, dtype=torch.float64, mode="eval"):
    """A fresh copy of the model, the same weights every time (made once per
    session: initialising VGG-11's 133 M parameters takes seconds)."""
    if name not in _STATES:
        torch.manual_seed(1234)
        _STATES[name] = _randomized(BUILDERS[name](), seed=99).state_dict()
    with torch.device("meta"):
        model = BUILDERS[name]()
    state = {k: v.to(dtype, copy=True) if v.is_floating_point() else v.clone() for k, v in _STATES[name].items()}
    model.load_state_dict(state, assign=True)
    return model.train(mode == "train")


def batch(seed, dtype=torch.float64, n=BATCH, size=SIZE):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=gen).to(dtype), torch.randint(0, 10, (n,), generator=gen)


# ------------------------------------------------------------------ goals

def _fused_by_layer(report):
    return {entry["names"][0]: entry for entry in report.fused}


def test_vgg11_training_fuses_all_ten_conv_and_linear_relu_pairs():
    fused, report = gt.fuse(full("vgg11").train(), inplace=True, report=True)
    assert len(report.fused) == 10
    assert all(e["activation"] == "relu" and len(e["names"]) == 2 for e in report.fused)
    assert set(report.unfused) == {"classifier.6"}  # the last Linear: nothing follows it
    assert sum(isinstance(m, gt.FusedConv2d) for m in fused.modules()) == 8
    assert sum(isinstance(m, gt.FusedLinear) for m in fused.modules()) == 2


def test_resnet18_eval_fuses_all_twenty_convs_and_runs_no_batchnorm():
    model = build("resnet18", torch.float32, "eval")
    fused, report = gt.fuse(model, report=True)
    convs = [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 20 and sorted(_fused_by_layer(report)) == sorted(convs)
    assert all(e["into"] == "FusedConv2dBN" and e["batchnorm_training"] is False for e in report.fused)
    assert set(report.unfused) == {"fc"}
    calls = []
    for m in fused.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.register_forward_hook(lambda *a: calls.append(1))
    graph_batchnorms = [n for n in fused.graph.nodes if n.op == "call_module"
                        and isinstance(fused.get_submodule(n.target), nn.BatchNorm2d)]
    assert graph_batchnorms == []
    with torch.no_grad():
        fused(batch(0, torch.float32)[0])
    assert calls == []  # 0 BatchNorm2d left in the eval computation
    fused.train()
    fused(batch(0, torch.float32)[0])
    assert len(calls) == 20  # training mode: each BatchNorm runs, as before


def test_mobilenet_v3_and_convnext_eval_fuse_every_layer_followed_by_batchnorm_or_activation():
    mobile = full("mobilenet_v3_small")
    _, report = gt.fuse(mobile, inplace=True, report=True)
    by_layer = _fused_by_layer(report)
    convs = [n for n, m in mobile.named_modules() if isinstance(m, nn.Conv2d)]
    se_fc1 = [n for n in convs if n.endswith(".fc1")]
    se_fc2 = [n for n in convs if n.endswith(".fc2")]
    with_bn = [n for n in convs if n not in se_fc1 + se_fc2]
    assert len(with_bn) == 34 and len(se_fc1) == len(se_fc2) == 9
    for name in with_bn:  # every Conv2d -> BatchNorm2d: folded, with the activation after it (if any)
        entry = by_layer[name]
        assert entry["into"] == "FusedConv2dBN" and entry["batchnorm_training"] is False and not entry["note"], name
    # each Conv2d -> BatchNorm2d (-> activation) is a torchvision Conv2dNormActivation: the activation it holds
    expected = {}
    for name, block in mobile.named_modules():
        if type(block).__name__ == "Conv2dNormActivation":
            act = list(block.children())[2:]
            expected[name + ".0"] = {nn.Hardswish: "hardswish", nn.ReLU: "relu"}[type(act[0])] if act else "none"
    assert sorted(expected) == sorted(with_bn)
    assert {n: by_layer[n]["activation"] for n in with_bn} == expected
    assert sorted(expected.values()).count("hardswish") == 18
    for name in se_fc1:  # squeeze-excitation: Conv2d -> ReLU
        assert by_layer[name]["activation"] == "relu"
    for name in se_fc2:  # Conv2d -> Hardsigmoid: no fused form
        assert "hardsigmoid" in report.unfused[name]
    assert by_layer["classifier.0"]["activation"] == "hardswish"
    assert set(report.unfused) - set(se_fc2) == {"classifier.3"}

    convnext = full("convnext_tiny")
    _, report = gt.fuse(convnext, inplace=True, report=True)
    fc1 = [n for n, m in convnext.named_modules() if isinstance(m, nn.Linear) and n.endswith("block.3")]
    assert len(fc1) == 18
    for name in fc1:  # the blocks' pointwise MLP: Linear -> GELU (erf)
        assert _fused_by_layer(report)[name]["activation"] == "gelu"
    for name, why in report.unfused.items():  # the rest: a LayerNorm, a permute or an add follows
        assert name in fc1 or "no activation or BatchNorm" in why or "used 2 times" in why, (name, why)


def test_vit_fuses_every_mlp_fc1_with_its_erf_gelu():
    vit = full("vit_b_16")
    _, report = gt.fuse(vit, inplace=True, report=True)
    fc1 = ["encoder.layers.encoder_layer_%d.mlp.0" % i for i in range(12)]
    for name in fc1:
        assert _fused_by_layer(report)[name]["activation"] == "gelu"
    for i in range(12):
        assert "MultiheadAttention" in report.unfused["encoder.layers.encoder_layer_%d.self_attention.out_proj" % i]
    assert report.state_dict_compatible


# ------------------------------------------------- outputs and gradients

CASES = [("vgg11", "train"), ("resnet18", "train"), ("resnet18", "eval"), ("mobilenet_v3_small", "train"),
         ("mobilenet_v3_small", "eval"), ("convnext_tiny", "eval"), ("vit_b_16", "eval")]


@pytest.fixture(params=["default", "gpuaccel_kernels"])
def dispatch(request, monkeypatch):
    """As it is (torch's kernels above gt.CPU_TORCH_THRESHOLD), or
    gpuaccel's own kernels at every size: the path a GPU user's layers take."""
    if request.param == "gpuaccel_kernels":
        monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "linear", 1 << 62)
        monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "conv2d", 1 << 62)
    return request.param


def _assert_close(got, want, rtol, scale, what):
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * scale, msg=what)


def _output_and_gradients(model, x, g, names):
    """model's output for x, and the gradients of <output, g> for x and for
    each parameter named (None for one forward does not use)."""
    params = dict(model.named_parameters())
    xi = x.clone().requires_grad_()
    torch.manual_seed(3)  # the same dropout and stochastic-depth draws
    out = model(xi)
    grads = torch.autograd.grad(out, [xi] + [params[n] for n in names], g, allow_unused=True)
    return [out.detach()] + list(grads)


def _both(name, mode, dtype, x, g):
    """(original's, fused model's) outputs and gradients; the fused model
    shares the original's parameters (one set of weights in memory)."""
    model = build(name, dtype, mode)
    fused = gt.fuse(model, inplace=True)
    names = [n for n, _ in model.named_parameters()]
    assert [n for n, _ in fused.named_parameters()] == names or set(dict(fused.named_parameters())) == set(names)
    return names, _output_and_gradients(model, x, g, names), _output_and_gradients(fused, x, g, names)


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", CASES, ids=["%s-%s" % c for c in CASES])
def test_outputs_and_every_gradient_are_the_originals(name, mode, dispatch):
    """float64: the fused model's output and every gradient (input, each
    parameter) within 1e-9 relative of the original's.  float32: as close to
    the float64 result as the original's float32 result is (different
    kernels round differently, and a training-mode BatchNorm over two
    values per channel magnifies rounding: a fixed float32 tolerance would
    measure the model's conditioning, not the fusion)."""
    n = CHECK_BATCH.get(name, BATCH)
    x, _ = batch(1, n=n)
    g = torch.randn(n, 10, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    names, ref, got = _both(name, mode, torch.float64, x, g)
    what = ["output", "input"] + names
    # a conv bias before a training-mode BatchNorm has a zero gradient (rounding noise on both sides):
    # a parameter's tolerance is relative to the largest parameter gradient
    scale = max(float(t.abs().max()) for t in ref[2:] if t is not None)
    for label, want, have in zip(what, ref, got):
        assert (want is None) == (have is None), label
        if want is not None:
            _assert_close(have, want, 1e-9, float(want.abs().max()) if label in ("output", "input") else scale,
                          label)
    del got
    _, ref32, got32 = _both(name, mode, torch.float32, x.float(), g.float())
    for label, exact, theirs, ours in zip(what, ref, ref32, got32):
        if exact is None:
            continue
        # gpuaccel's CPU kernels sum in another order than torch's; through a BatchNorm over two values the
        # difference can grow to a few 1e-4 of a gradient (the float64 check above is the tight one)
        allowed = 4 * float((theirs.double() - exact).norm()) + 5e-4 * float(exact.norm()) + 1e-6 * scale
        assert float((ours.double() - exact).norm()) <= allowed, (label, float((ours.double() - exact).norm()),
                                                                   allowed)


# ------------------------------------------------------------ training

STEPS = 20
# the models with BatchNorm train in float64 on 4 images of 48x48 (16 values per channel in their last
# blocks): a training-mode BatchNorm over the two values per channel of a 32x32 pair turns rounding
# differences of 1e-16 into 1e-7 within a step, and float32 ones into percents
TRAIN_SETUP = {"resnet18": (torch.float64, 4, 48), "mobilenet_v3_small": (torch.float64, 4, 48)}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BUILDERS))
def test_twenty_training_steps_side_by_side(name):
    """Twenty SGD steps (with weight decay) of the original and of its fused
    copy from the same weights and batches, dropout and stochastic depth
    drawing alike: the same losses, weights and BatchNorm statistics, and
    after them the same eval outputs (the BatchNorms folded with the
    statistics the training left)."""
    dtype, n, size = TRAIN_SETUP.get(name, (torch.float32, CHECK_BATCH.get(name, BATCH), SIZE))
    rtol = 1e-8 if dtype == torch.float64 else 2e-3
    model = build(name, dtype, "train")
    fused = gt.fuse(model)  # a copy: each model trains its own weights
    opts = [torch.optim.SGD(m.parameters(), lr=0.01, weight_decay=1e-4) for m in (model, fused)]
    loss_fn = nn.CrossEntropyLoss()
    for step in range(STEPS):
        x, y = batch(100 + step, dtype, n, size)
        losses = []
        for m, opt in zip((model, fused), opts):
            torch.manual_seed(step)
            loss = loss_fn(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        assert losses[1] == pytest.approx(losses[0], rel=rtol, abs=rtol), (step, losses)
    fused_state = fused.state_dict()
    for key, want in model.state_dict().items():
        got = fused_state[key]
        if want.is_floating_point():
            _assert_close(got, want, rtol, float(want.abs().max()) + 1e-6, key)
        else:
            assert torch.equal(got, want), key  # num_batches_tracked
    model.eval()
    fused.eval()
    with torch.no_grad():
        x, _ = batch(999, dtype, n, size)
        want = model(x)
        _assert_close(fused(x), want, rtol, float(want.abs().max()), "eval output after training")
    assert copy.deepcopy(fused).state_dict().keys() == model.state_dict().keys()
