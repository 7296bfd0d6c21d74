"""TF32 for float32 CUDA ops: two settings with torch's defaults (matmuls off, convolutions on),
gpuaccel's setters, and torch's own flags followed while gpuaccel's setter is not called."""

import json
import re
import textwrap

import numpy as np
import pytest

import gpuaccel as ga

from helpers import run_python, simulated


def state(op):
    return ga._C._tf32_state(op)


@pytest.fixture
def following_torch():
    """Both settings follow torch, before and after; torch's flags back at its defaults after
    (through the legacy setters only: they set the new fp32_precision fields too, so torch is
    left in no mixed state that its legacy getters refuse)."""
    torch = pytest.importorskip("torch")
    ga.set_matmul_precision(None)
    ga.set_conv_allow_tf32(None)
    yield torch
    ga.set_matmul_precision(None)
    ga.set_conv_allow_tf32(None)
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = True


def test_defaults_are_torchs_without_importing_torch():
    code = """
        import sys
        import gpuaccel as ga
        print(ga.get_matmul_precision(), ga.get_conv_allow_tf32(), ga._C._tf32_state("matmul"),
              ga._C._tf32_state("conv"), "torch" in sys.modules)
    """
    r = run_python("-c", textwrap.dedent(code))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == "highest True (False, 'default') (True, 'default') False"


def test_defaults_follow_torchs_untouched_flags(following_torch):
    assert state("matmul") == (False, "torch") and ga.get_matmul_precision() == "highest"
    assert state("conv") == (True, "torch") and ga.get_conv_allow_tf32() is True


@pytest.mark.parametrize("value, exc", [("medium ", ValueError), ("HIGH", ValueError), ("high\0", ValueError),
                                        ("\ud800", ValueError), (1, TypeError), (b"high", TypeError),
                                        (True, TypeError)])
def test_set_matmul_precision_rejects(value, exc):
    before = ga._C._tf32_state("matmul")
    with pytest.raises(exc, match=r"set_matmul_precision: precision must be 'highest' .* 'high' or 'medium' "
                                  r".* or None .* got " + re.escape(repr(value))):
        ga.set_matmul_precision(value)
    assert ga._C._tf32_state("matmul") == before


@pytest.mark.parametrize("value", [1, 0, "True", None.__class__, np.bool_(True)])
def test_set_conv_allow_tf32_rejects(value):
    before = ga._C._tf32_state("conv")
    with pytest.raises(TypeError, match=r"set_conv_allow_tf32: allow must be True .* False .* or None .* got "
                                        + re.escape(repr(value))):
        ga.set_conv_allow_tf32(value)
    assert ga._C._tf32_state("conv") == before


def test_tf32_state_rejects_unknown_ops():
    with pytest.raises(ValueError, match="op must be 'matmul' or 'conv', got 'linear'"):
        ga._C._tf32_state("linear")


@pytest.mark.parametrize("precision, allowed", [("highest", False), ("high", True), ("medium", True)])
def test_matmul_setter_is_for_matmuls_only(following_torch, precision, allowed):
    ga.set_matmul_precision(precision)
    assert ga.get_matmul_precision() == precision
    assert state("matmul") == (allowed, "gpuaccel")
    assert state("conv") == (True, "torch")


def test_conv_setter_is_for_convs_only(following_torch):
    ga.set_conv_allow_tf32(False)
    assert ga.get_conv_allow_tf32() is False and state("conv") == (False, "gpuaccel")
    assert state("matmul") == (False, "torch")
    ga.set_conv_allow_tf32(True)
    assert ga.get_conv_allow_tf32() is True and state("conv") == (True, "gpuaccel")


def test_torchs_flags_are_followed_until_gpuaccels_setter_is_called(following_torch):
    torch = following_torch
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = False
    assert state("matmul") == (True, "torch") and ga.get_matmul_precision() == "high"
    assert state("conv") == (False, "torch") and ga.get_conv_allow_tf32() is False
    torch.backends.cuda.matmul.allow_tf32 = False
    assert state("matmul") == (False, "torch") and ga.get_matmul_precision() == "highest"

    ga.set_matmul_precision("high")     # gpuaccel's value wins from now on, whatever torch says
    ga.set_conv_allow_tf32(True)
    for mm, conv in ((False, False), (True, True), (False, True)):
        torch.backends.cuda.matmul.allow_tf32 = mm
        torch.backends.cudnn.allow_tf32 = conv
        assert state("matmul") == (True, "gpuaccel") and state("conv") == (True, "gpuaccel")
    ga.set_matmul_precision("highest")
    ga.set_conv_allow_tf32(False)
    torch.backends.cuda.matmul.allow_tf32 = True
    assert state("matmul") == (False, "gpuaccel") and state("conv") == (False, "gpuaccel")

    ga.set_matmul_precision(None)       # back to following torch
    ga.set_conv_allow_tf32(None)
    assert state("matmul") == (True, "torch") and ga.get_matmul_precision() == "high"
    assert state("conv") == (True, "torch") and ga.get_conv_allow_tf32() is True


def test_torchs_fp32_precision_api_is_followed_without_warnings():
    """torch >= 2.9's fp32_precision flags, also in the mixes of legacy and new API where torch's
    legacy getters raise: gpuaccel reads what torch's kernels consult, and never warns."""
    code = """
        import warnings
        warnings.simplefilter("error")
        import torch
        import gpuaccel as ga
        if not hasattr(torch._C, "_get_fp32_precision_getter"):
            print("SKIP")
            raise SystemExit
        S = ga._C._tf32_state
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        for legacy in (torch.get_float32_matmul_precision, torch._C._get_cudnn_allow_tf32):
            try:
                legacy()
                print("legacy getter did not raise", legacy)
            except RuntimeError:
                pass
        assert S("matmul") == (True, "torch") and S("conv") == (False, "torch"), (S("matmul"), S("conv"))
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
        assert S("matmul") == (False, "torch") and S("conv") == (True, "torch"), (S("matmul"), S("conv"))
        torch.backends.cuda.matmul.fp32_precision = "none"   # inherits: cuda 'all', then generic
        torch.backends.cudnn.conv.fp32_precision = "none"
        torch.backends.fp32_precision = "tf32"
        assert S("matmul") == (True, "torch") and S("conv") == (True, "torch"), (S("matmul"), S("conv"))
        torch.backends.fp32_precision = "ieee"
        assert S("matmul") == (False, "torch") and S("conv") == (False, "torch"), (S("matmul"), S("conv"))
        print("OK")
    """
    r = run_python("-c", textwrap.dedent(code))
    assert r.returncode == 0, r.stderr
    if r.stdout.strip() == "SKIP":
        pytest.skip("this torch has no fp32_precision API")
    assert r.stdout.strip() == "OK", r.stdout + r.stderr


def test_cpu_ops_are_not_steered_by_tf32(following_torch, rng):
    """TF32 is a CUDA matter: a CPU float32 op gives full float32 results whatever the settings."""
    a, b = rng.standard_normal((37, 53)).astype(np.float32), rng.standard_normal((53, 29)).astype(np.float32)
    ga.set_matmul_precision("high")
    got = ga.matmul(a, b).numpy()
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


# ------------------------------------------------- what reaches the kernels' descriptor

@pytest.fixture
def tuning(tmp_path, monkeypatch):
    from gpuaccel import _tuning

    monkeypatch.setenv("GPUACCEL_CACHE_DIR", str(tmp_path))
    _tuning.forget()
    yield tmp_path / "conv_tuning.json"
    _tuning.forget()


def conv_keys(file):
    """The conv tuning keys written so far: the backend builds them (kernels/conv_key.h) from the
    ga_conv_geometry the kernels are given, its allow_tf32 included (a word "tf32" or "fp32")."""
    return list(json.loads(file.read_text()))


@pytest.mark.cuda
@pytest.mark.skipif(not simulated(), reason="the tuning key of a CUDA conv is seen without a GPU in the simulator")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_conv_geometry_gets_the_effective_flag(following_torch, tuning, rng, dtype):
    torch = following_torch
    x = ga.asarray(rng.standard_normal((2, 3, 7, 9)).astype(dtype), device="cuda")
    w = ga.asarray(rng.standard_normal((4, 3, 3, 3)).astype(dtype), device="cuda")

    def tf32_of_new_keys(step):
        before = set(conv_keys(tuning)) if tuning.exists() else set()
        step()
        ga.synchronize()
        new = set(conv_keys(tuning)) - before
        assert new, "no conv was tuned"
        flags = {"tf32" in k.split("|")[-1].split() for k in new}
        assert len(flags) == 1, new
        return int(flags.pop())

    on = dtype == "float32"
    fwd = lambda pad: lambda: ga.conv2d(x, w, padding=pad)  # noqa: E731
    bwd = lambda pad: lambda: ga.conv2d_backward(ga.conv2d(x, w, padding=pad), x, w, padding=pad)  # noqa: E731
    assert tf32_of_new_keys(fwd(0)) == on                  # torch's default: on
    assert tf32_of_new_keys(bwd(0)) == on
    torch.backends.cudnn.allow_tf32 = False                # followed
    assert tf32_of_new_keys(fwd(1)) == 0
    ga.set_conv_allow_tf32(True)                           # gpuaccel's wins
    assert tf32_of_new_keys(fwd(2)) == on
    assert tf32_of_new_keys(bwd(2)) == on
    ga.set_conv_allow_tf32(False)
    torch.backends.cudnn.allow_tf32 = True
    assert tf32_of_new_keys(fwd((1, 2))) == 0
    ga.set_matmul_precision("high")                        # the matmul setting is not the conv's
    assert tf32_of_new_keys(fwd((2, 1))) == 0
