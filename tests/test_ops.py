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

from ops import ACTIVATION_MATH, ACTIVATIONS, OPS, ROOT, activation, invalid_activations, kernel_enums

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
    and every test file it names exists."""
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


def test_op_sources_exist():
    for op in OPS.values():
        for path in op.sources:
            assert os.path.exists(os.path.join(ROOT, path)), (op.name, path)
