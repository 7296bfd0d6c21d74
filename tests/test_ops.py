"""The op registry (ops.py) checked, and every op checked through it: each
sample of each op, in each dtype it takes, against its float64 reference;
each activation's reference against torch's; the registry against what
gpuaccel and kernels/kernels.h say exists; tests/README.md's map against
the source tree."""

import os
import re

import numpy as np
import pytest

import gpuaccel as ga

from ops import (
    ACTIVATION_ALIASES,
    ACTIVATION_MATH,
    ACTIVATIONS,
    OPS,
    ROOT,
    activation,
    invalid_activations,
    kernel_enums,
)

torch = pytest.importorskip("torch")

CASES = [(name, dtype) for name, op in OPS.items() for dtype in op.dtypes]


@pytest.mark.parametrize("name,dtype", CASES, ids=["%s-%s" % c for c in CASES])
def test_every_sample_matches_its_reference(rng, name, dtype):
    op = OPS[name]
    samples = op.samples(rng, dtype)
    assert samples, "%s has no samples in %s" % (name, dtype)
    for sample in samples:
        op.check(sample, op.run(sample))


@pytest.mark.parametrize("name", list(OPS))
def test_samples_cover_every_activation_and_layout(rng, name):
    """Every op that takes an activation (a layout) has a sample with each."""
    op = OPS[name]
    samples = op.samples(rng, op.dtypes[0])
    acts = {s.kwargs.get("activation", s.args[3] if name == "linear" and len(s.args) > 3 else None) for s in samples}
    assert set(op.activations) <= acts, (name, set(op.activations) - acts)
    layouts = {s.kwargs.get("layout", s.kwargs.get("layout")) for s in samples}
    assert set(op.layouts) <= layouts, (name, set(op.layouts) - layouts)


@pytest.mark.parametrize("math_name", list(ACTIVATION_MATH))
def test_activation_math_matches_torch(math_name):
    """The float64 functions and derivatives against torch's forms and
    autograd, on a grid that crosses every kink (but not onto one), and
    max_slope bounds the derivative."""
    act = ACTIVATION_MATH[math_name]
    z = np.linspace(-7.0, 7.0, 4001) + 1e-3  # 1e-3: no grid point on a kink
    t = torch.tensor(z, dtype=torch.float64, requires_grad=True)
    y = act.torch(t)
    (grad,) = torch.autograd.grad(y.sum(), t)
    np.testing.assert_allclose(act.forward(z), y.detach().numpy(), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(act.derivative(z), grad.numpy(), rtol=1e-12, atol=1e-14)
    assert np.abs(act.derivative(z)).max() <= act.max_slope
    for kink in act.kinks:  # a jump there, and torch's value at the point itself
        left, right = act.derivative(np.array([kink - 1e-9, kink + 1e-9]))
        assert left != right, "%s: no kink at %g" % (math_name, kink)
        t = torch.tensor([kink], dtype=torch.float64, requires_grad=True)
        (at,) = torch.autograd.grad(act.torch(t).sum(), t)
        assert act.derivative(np.array([kink]))[0] == at.item(), (math_name, kink, at.item())


@pytest.mark.parametrize("name", list(ACTIVATIONS), ids=[a.label for a in ACTIVATIONS.values()])
def test_registry_activations_are_what_gpuaccel_takes(name):
    """Each registered activation is accepted and computes its reference;
    save_preactivation hands back what the registry says it does."""
    act = activation(name)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((5, 4)), rng.standard_normal((3, 4))
    y, aux = ga.linear(x, w, None, name, save_preactivation=True)
    np.testing.assert_allclose(y.numpy(), act.ref(x @ w.T), rtol=1e-12, atol=1e-14)
    if act.saves is None:
        assert aux is None
    elif act.saves == "output":
        assert aux is y
    else:
        np.testing.assert_allclose(aux.numpy(), x @ w.T, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("bad", invalid_activations(), ids=repr)
def test_invalid_activations_are_refused(bad):
    with pytest.raises(ValueError, match="activation must be"):
        ga.linear(np.ones((2, 3)), np.ones((4, 3)), activation=bad)


def test_every_kernel_activation_is_registered():
    """kernels/kernels.h's ga_activation enumerators and the registry's
    activations are the same set (an activation added to the kernels has a
    registry entry, and the driver's codes come from kernels.h)."""
    enums = kernel_enums()
    assert {act.kernel_enum for act in ACTIVATIONS.values()} == set(enums), enums
    assert len(set(enums.values())) == len(enums)
    assert [act.code for act in ACTIVATIONS.values()] == [enums[act.kernel_enum] for act in ACTIVATIONS.values()]


def _source(path):
    """A source file without its comments."""
    with open(os.path.join(ROOT, path)) as f:
        return re.sub(r"/\*.*?\*/|//[^\n]*", "", f.read(), flags=re.S)


def _function_body(text, signature):
    """The body of the C function whose definition starts with `signature`
    (up to the brace that closes it)."""
    start = text.index("{", text.index(signature))
    depth = 0
    for k in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        if depth == 0:
            return text[start:k + 1]
    raise AssertionError("unbalanced braces after %r" % signature)


def _by_enum():
    return {act.kernel_enum: act for act in ACTIVATIONS.values()}


def test_registry_names_are_the_kernels_and_parsers_names():
    """Each activation's name is kernels.h's ga_activation_name of its
    enumerator and what the ops' parser (csrc/opcall.c, through
    _C._activation_name) calls it; the parser's other names are the
    registry's aliases, each naming the same enumerator."""
    text = _source("kernels/kernels.h")
    table = re.search(r"names\[GA_ACT_COUNT\]\s*=\s*\{([^}]*)\}", text).group(1)
    names = re.findall(r'"(\w+)"', table)
    codes = kernel_enums()
    for act in ACTIVATIONS.values():
        assert names[codes[act.kernel_enum]] == act.label, (act, names)
        assert ga._C._activation_name(act.name, "test_ops", 1) == act.label
    for alias, name in ACTIVATION_ALIASES.items():
        assert ga._C._activation_name(alias, "test_ops", 1) == activation(name).label
    parsed = dict(re.findall(r'\{"(\w+)",\s*(GA_ACT_\w+)\}', _source("csrc/opcall.c")))
    assert len(parsed) == len(ACTIVATIONS) + len(ACTIVATION_ALIASES), parsed
    for name, enum in parsed.items():
        assert activation(name).kernel_enum == enum, (name, enum)


def test_registry_cudnn_modes_are_the_ones_conv_graphs_use():
    """cudnn_mode is kernels/cuda/cudnn_graph.cu's activation_mode for the
    activation's enumerator (None: it has none, and conv.cu skips the fused
    graph)."""
    body = _function_body(_source("kernels/cuda/cudnn_graph.cu"), "bool activation_mode(")
    modes = dict(re.findall(r"case\s+(GA_ACT_\w+)\s*:\s*\*mode\s*=\s*(CUDNN_POINTWISE_\w+)", body))
    assert modes and "default: return false" in body, body
    for enum, act in _by_enum().items():
        assert act.cudnn_mode == modes.get(enum), (act, modes.get(enum))
    assert set(modes) <= set(_by_enum()), modes


def test_registry_cublaslt_epilogues_are_the_ones_matmul_asks_for():
    """cublaslt is the stem of the epilogues kernels/cuda/matmul.cu's
    fused_epilogue asks cuBLASLt for (forward: <stem>, <stem>_BIAS, ...;
    backward: D<stem>...); an activation it has no case for (None) runs
    the plain GEMM and gpuaccel's epilogue kernel."""
    body = _function_body(_source("kernels/cuda/matmul.cu"), "ga_fallback_reason fused_epilogue(")
    switch = body[body.index("switch (desc->activation)"):]
    cases = re.split(r"case\s+(GA_ACT_\w+)\s*:", switch.split("default:")[0])[1:]
    forward = {enum: set(re.findall(r"CUBLASLT_EPILOGUE_(\w+)", text)) for enum, text in zip(cases[::2], cases[1::2])}
    for enum, act in _by_enum().items():
        if act.name is None:
            assert forward[enum] == {"BIAS", "DEFAULT"}, forward[enum]
            continue
        if act.cublaslt is None:
            assert enum not in forward, (act, forward[enum])
            continue
        stem = act.cublaslt
        assert min(forward[enum], key=len) == stem and all(e.startswith(stem) for e in forward[enum]), (act, forward)
        assert stem + "_BIAS" in forward[enum]
    backward = re.findall(r"desc->dact\s*==\s*(GA_ACT_\w+)\)\s*\{(.*?)return GA_FALLBACK_NONE", body, flags=re.S)
    assert backward, "fused_epilogue asks for no backward epilogue"
    for enum, text in backward:
        act = _by_enum()[enum]
        assert act.cublaslt and {e for e in re.findall(r"CUBLASLT_EPILOGUE_(\w+)", text)} <= {
            "D" + act.cublaslt, "D" + act.cublaslt + "_BGRAD"}, (act, text)


def source_files():
    """The project's source files: csrc/, kernels/ and gpuaccel/ (not the
    build's own gpuaccel/_build_config.py)."""
    found = []
    for top, exts in (("csrc", (".c", ".h")), ("kernels", (".c", ".h", ".cu", ".cuh", ".cpp")), ("gpuaccel", (".py",))):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            found += [os.path.relpath(os.path.join(folder, f), ROOT) for f in files
                      if f.endswith(exts) and f != "_build_config.py"]
    return sorted(found)


def test_readme_maps_every_source_file_to_its_tests():
    """tests/README.md names every source file, and only files that exist,
    and every test file (and only those that exist)."""
    with open(os.path.join(ROOT, "tests", "README.md")) as f:
        text = f.read()
    named = set(re.findall(r"`((?:csrc|kernels|gpuaccel)/[\w/.]+\.(?:c|h|cu|cuh|cpp|py))`", text))
    missing = [f for f in source_files() if f not in named]
    assert not missing, "tests/README.md does not map: %s" % missing
    gone = sorted(f for f in named if not os.path.exists(os.path.join(ROOT, f)))
    assert not gone, "tests/README.md names files that do not exist: %s" % gone
    tests = set(re.findall(r"\b(test_\w+\.py)\b", text))
    absent = sorted(t for t in tests if not os.path.exists(os.path.join(ROOT, "tests", t)))
    assert not absent, "tests/README.md names test files that do not exist: %s" % absent
    unnamed = sorted(t for t in os.listdir(os.path.join(ROOT, "tests"))
                     if t.startswith("test_") and t.endswith(".py") and t not in tests)
    assert not unnamed, "tests/README.md does not say what these test: %s" % unnamed


def test_op_sources_exist():
    for op in OPS.values():
        for path in op.sources:
            assert os.path.exists(os.path.join(ROOT, path)), (op.name, path)
