"""The activations of the fused ops (relu, gelu = nn.GELU()'s exact erf
form, gelu_tanh, silu, hardswish, sigmoid) against torch's own functions
and autograd, on the CPU: values and derivatives at the points where they
are delicate (breakpoints, saturation, zeros of the derivative), every op ×
activation × dtype forward and backward from the same rounded inputs, the
modules against nn.Linear / nn.Conv2d followed by the activation module a
model uses, the ONNX/export decompositions, and the one-time warning that
"gelu" changed meaning."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gpuaccel as ga

from helpers import (
    ACTIVATIONS,
    FLOAT_DTYPES,
    UNIT_ROUNDOFF,
    assert_sum_close,
    sum_tolerance,
    torch_activation,
    torch_activation_module,
)

torch = pytest.importorskip("torch")
gt = pytest.importorskip("gpuaccel.torch")
F = torch.nn.functional

# the derivative reads the pre-activation (relu's reads y)
SAVES_Z = [a for a in ACTIVATIONS if a != "relu"]
TOL = {"float64": (1e-13, 1e-12), "float32": (3e-6, 3e-6), "float16": sum_tolerance("float16"),
       "bfloat16": sum_tolerance("bfloat16")}


def tdtype(name):
    return getattr(torch, name)


def as64(a):
    return torch.from_numpy(np.asarray(a.astype("float64").numpy()))


INT_OF = {"float64": torch.int64, "float32": torch.int32, "float16": torch.int16, "bfloat16": torch.int16}


def neighbours(values):
    """The next representable values of `values` (of their dtype) away
    from zero and towards it (for 0: the smallest subnormals of each sign)."""
    bits = values.view(INT_OF[str(values.dtype).split(".")[1]])
    sign = bits.new_tensor(1) << (bits.element_size() * 8 - 1)
    away, towards = (bits + 1).view(values.dtype), (bits - 1).view(values.dtype)
    zero = values == 0
    negative_tiny = (bits.new_zeros(()) | sign | 1).view(values.dtype)
    towards = torch.where(zero, negative_tiny, towards)
    return torch.cat([away, towards])


def special_points(dtype):
    """Where activations are delicate: the breakpoints of relu (0) and
    hardswish (-3, 3) and their neighbours in `dtype`, the zeros of the
    GELUs' and silu's derivatives, saturation, and ordinary values."""
    t = tdtype(dtype)
    kinks = torch.tensor([0.0, -3.0, 3.0], dtype=t)
    up, down = neighbours(kinks).split(3)
    big = 60.0 if dtype == "float16" else 1000.0
    others = torch.tensor([-0.0, -0.7517916, -2.399357, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5, 5.0, -5.0, 10.0, -10.0,
                           30.0, -30.0, big, -big, 1e-3, -1e-3], dtype=torch.float64).to(t)
    rng = torch.Generator().manual_seed(31)
    normal = (torch.randn(37, generator=rng, dtype=torch.float64) * 4).to(t)
    return torch.cat([kinks, up, down, others, normal])


def bound(dtype, ref, terms):
    """How far gpuaccel's activation (or derivative) may be from torch's.
    Both evaluate the same formula in the compute type (float64 for
    float64, else float32) and round once to the dtype, but with other
    erf/exp/tanh implementations (torch's vectorised ones, the C
    library's): a few roundings of the compute type relative to the
    formula's terms (`terms`: where 1 + erf(z) or 1 - tanh^2 cancel, the
    result is much smaller than its terms), and for 16-bit dtypes one ulp
    of the result (the two may round a value near a midpoint apart)."""
    compute = "float64" if dtype == "float64" else "float32"
    floor = {"float64": 5e-324, "float32": 1.5e-45, "float16": 6e-8, "bfloat16": 1e-40}[dtype]
    result = 2.01 * UNIT_ROUNDOFF[dtype] * np.maximum(np.abs(ref), floor) if compute != dtype else 0.0
    return result + 16 * UNIT_ROUNDOFF[compute] * (np.abs(ref) + terms)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_values_and_derivatives_match_torch_at_delicate_points(activation, dtype):
    """z goes through linear exactly (x = [[1]], w = z, no bias: y = act(z),
    and with grad_y = 1 the weight and bias gradients are act'(z) itself),
    so the kernels' activation is compared with torch's function and
    autograd at exactly those points — the breakpoints included, where only
    the same convention gives the same value (relu'(0) = 0, hardswish'(-3)
    = 0, hardswish'(3) = 1)."""
    z = special_points(dtype)
    n = z.numel()
    x = torch.ones(1, 1, dtype=z.dtype)
    w = z.reshape(n, 1).clone()
    y, aux = ga.linear(x, w, None, activation, save_preactivation=True)
    zr = z.clone().requires_grad_(True)
    yr = torch_activation(zr, activation)
    (dr,) = torch.autograd.grad(yr, zr, torch.ones_like(yr))
    got_y = as64(y).reshape(n).numpy()
    want_y = yr.detach().double().numpy()
    z64 = np.abs(z.double().numpy())
    bad = ~(np.abs(got_y - want_y) <= bound(dtype, want_y, z64))
    assert not bad.any(), (activation, dtype, z.double()[bad], got_y[bad], want_y[bad])
    _, gw, gb = ga.linear_backward(torch.ones(1, n, dtype=z.dtype), x, w, activation=activation,
                                   preactivation=aux)
    want_d = dr.double().numpy()
    allowed = bound(dtype, want_d, 1 + z64)
    if activation == "sigmoid" and dtype in ("float16", "bfloat16"):
        # torch's autograd takes sigmoid' as (1 - y) y from the output y
        # rounded to the dtype; gpuaccel from z (in float32): apart by
        # |d((1 - y) y)/dy| times y's rounding
        s = 0.5 * (1 + np.tanh(0.5 * z.double().numpy()))
        allowed = allowed + 1.01 * UNIT_ROUNDOFF[dtype] * s * np.abs(1 - 2 * s)
    for got in (gw.astype("float64").numpy().reshape(n), gb.astype("float64").numpy()):
        bad = ~(np.abs(got - want_d) <= allowed)
        assert not bad.any(), (activation, dtype, z.double()[bad], got[bad], want_d[bad])
    # the conventions at the breakpoints, exactly
    kinks = {0: z[0].item(), -3: z[1].item(), 3: z[2].item()}
    d = dict(zip(z.tolist(), gb.astype("float64").numpy().tolist()))
    if activation == "relu":
        assert d[kinks[0]] == 0.0
    if activation == "hardswish":
        assert d[kinks[-3]] == 0.0 and d[kinks[3]] == 1.0
    assert np.isfinite(got_y).all() and np.isfinite(gb.astype("float64").numpy()).all()


def rounded(shape, dtype, seed, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(tdtype(dtype))
    return t, t.double()


def check(got, ref, dtype, reduction, flip=0.0):
    assert_sum_close(np.asarray(got.astype("float64").numpy()), ref.detach().numpy(), dtype, reduction, TOL, flip)


def torch_backward(z, activation, gy, dtype):
    """dz as the kernels compute it: torch's autograd of the activation at
    the saved pre-activation (z rounded to the dtype), times grad_y,
    rounded to the dtype before the weight and bias sums."""
    zs = z.detach().to(tdtype(dtype)).double().requires_grad_(True)
    (dz,) = torch.autograd.grad(torch_activation(zs, activation), zs, gy)
    return dz.to(tdtype(dtype)).double()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_linear_and_matmul_forward_and_backward_match_torch(activation, dtype):
    x, xr = rounded((3, 17, 29), dtype, 1)
    w, wr = rounded((23, 29), dtype, 2, scale=0.3)
    b, br = rounded((23,), dtype, 3)
    z = F.linear(xr, wr, br)
    y, aux = ga.linear(x, w, b, activation, save_preactivation=True)
    check(y, torch_activation(z, activation), dtype, 29)
    check(ga.matmul(x, w.T, bias=b, activation=activation), torch_activation(z, activation), dtype, 29)
    if activation in SAVES_Z:
        check(aux, z, dtype, 29)
    else:
        assert aux is y
    gy, gyr = rounded(tuple(z.shape), dtype, 4)
    dz = torch_backward(z, activation, gyr, dtype) if activation in SAVES_Z else gyr * (z > 0)
    gx, gw, gb = ga.linear_backward(gy, x, w, activation=activation, preactivation=aux)
    flip = float(dz.abs().max()) if activation in SAVES_Z else 0.0
    check(gx, dz @ wr, dtype, 23, flip * float(wr.abs().max()))
    check(gw, dz.reshape(-1, 23).T @ xr.reshape(-1, 29), dtype, 51, flip * float(xr.abs().max()))
    check(gb, dz.reshape(-1, 23).sum(0), dtype, 51, flip)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("layout", ["NCHW", "channels_last"])
def test_conv2d_forward_and_backward_match_torch(activation, dtype, layout):
    x, xr = rounded((2, 6, 9, 8), dtype, 5)
    w, wr = rounded((8, 3, 3, 3), dtype, 6, scale=0.3)
    b, br = rounded((8,), dtype, 7)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    geo = dict(stride=(2, 1), padding=1, groups=2)
    z = F.conv2d(xr, wr, br, **geo)
    y, aux = ga.conv2d(x, w, b, activation=activation, save_preactivation=True, **geo)
    check(y, torch_activation(z, activation), dtype, 27)
    gy, gyr = rounded(tuple(z.shape), dtype, 8)
    if activation in SAVES_Z:
        check(aux, z, dtype, 27)
        dz = torch_backward(z, activation, gyr, dtype)
        kw = dict(preactivation=aux)
    else:
        dz = gyr * (z > 0)
        kw = dict(y=y)
    gx, gw, gb = ga.conv2d_backward(gy, x, w, activation=activation, **geo, **kw)
    dz = dz.requires_grad_(False)
    xr.requires_grad_(True)
    wr.requires_grad_(True)
    gx_ref, gw_ref = torch.autograd.grad(F.conv2d(xr, wr, None, **geo), (xr, wr), dz)
    flip = float(dz.abs().max()) if activation in SAVES_Z else 0.0
    check(gx, gx_ref, dtype, 8 * 9, flip * float(wr.detach().abs().max()))
    check(gw, gw_ref, dtype, 2 * 5 * 8, flip * float(xr.detach().abs().max()))
    check(gb, dz.sum((0, 2, 3)), dtype, 2 * 5 * 8, flip)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dispatch", ["gpuaccel", "torch"])
def test_modules_match_the_layer_and_activation_module_a_model_uses(activation, dispatch, monkeypatch):
    """FusedLinear / FusedConv2d(activation=a) against nn.Linear / nn.Conv2d
    followed by the activation's nn module, float64, outputs and every
    gradient: with gpuaccel's kernels at every size (what a GPU user gets)
    and with the CPU dispatch to torch's kernels."""
    limit = 1 << 62 if dispatch == "gpuaccel" else 0
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "linear", limit)
    monkeypatch.setitem(gt.CPU_TORCH_THRESHOLD, "conv2d", limit)
    torch.manual_seed(11)
    fused = torch.nn.Sequential(gt.FusedConv2d(3, 5, 3, padding=1, activation=activation), torch.nn.Flatten(),
                                gt.FusedLinear(5 * 7 * 6, 9, activation=activation)).double()
    plain = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3, padding=1), torch_activation_module(activation),
                                torch.nn.Flatten(), torch.nn.Linear(5 * 7 * 6, 9),
                                torch_activation_module(activation)).double()
    plain.load_state_dict({k.replace("2.", "3."): v for k, v in fused.state_dict().items()})
    x = torch.randn(4, 3, 7, 6, dtype=torch.float64) * 2
    xf, xp = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    yf, yp = fused(xf), plain(xp)
    torch.testing.assert_close(yf, yp, rtol=1e-12, atol=1e-13)
    g = torch.randn_like(yf)
    yf.backward(g)
    yp.backward(g)
    torch.testing.assert_close(xf.grad, xp.grad, rtol=1e-11, atol=1e-12)
    for (name, p), q in zip(fused.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-11, atol=1e-12, msg=name)


@pytest.mark.parametrize("activation", [None] + ACTIVATIONS)
def test_export_decompositions_compute_the_fused_ops(activation):
    """The decompositions the ONNX exporter uses for an exported program's
    custom ops: torch's standard ops computing what the fused op computes,
    the pre-activation output included where the backward would read it."""
    x, w, b = torch.randn(5, 7, dtype=torch.float64), torch.randn(4, 7, dtype=torch.float64), torch.randn(4)
    b = b.double()
    act = gt._activation(activation)
    y, pre = gt._linear_decomposition(x, w, b, act)
    fused_y, fused_pre = gt._linear(x, w, b, act)
    torch.testing.assert_close(y, fused_y, rtol=1e-12, atol=1e-13)
    assert pre.shape == fused_pre.shape
    if activation in SAVES_Z:
        torch.testing.assert_close(pre, fused_pre, rtol=1e-12, atol=1e-13)
    xc, wc = torch.randn(1, 2, 5, 5, dtype=torch.float64), torch.randn(3, 2, 3, 3, dtype=torch.float64)
    yc, _ = gt._conv2d_decomposition(xc, wc, None, [1, 1], [1, 1], [1, 1], 1, act)
    torch.testing.assert_close(yc, gt._conv2d(xc, wc, None, [1, 1], [1, 1], [1, 1], 1, act)[0],
                               rtol=1e-12, atol=1e-13)


def test_names_are_parsed_once_for_every_entry():
    assert gt.FusedLinear(2, 3, activation="gelu_erf").activation == "gelu"
    assert "activation=gelu_tanh" in repr(gt.FusedConv2d(2, 3, 1, activation="gelu_tanh"))
    for bad in ("GELU", "gelu_exact", "swish", "tanh", 3, b"relu"):
        with pytest.raises(ValueError, match="activation must be None, 'relu', 'gelu'.*'sigmoid', got"):
            gt.FusedLinear(2, 3, activation=bad)
        with pytest.raises(ValueError, match="matmul: activation must be"):
            ga.matmul(ga.ones((2, 2)), ga.ones((2, 2)), activation=bad)


WARNING_SCRIPT = textwrap.dedent("""\
    import warnings
    import numpy as np
    import gpuaccel as ga
    import gpuaccel.torch as gt
    MODE = %r
    if MODE == "ignore":
        warnings.filterwarnings("ignore", category=ga.GeluChangedWarning)
    elif MODE == "error":
        warnings.simplefilter("error", ga.GeluChangedWarning)
    else:
        warnings.simplefilter("always")   # 'once' is gpuaccel's own doing, not the filter's
    x, w = np.ones((2, 3)), np.ones((4, 3))
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        ga.linear(x, w, None, "gelu_tanh")
        gt.FusedLinear(3, 4, activation="gelu_erf")
        ga.linear(x, w, None, "gelu_erf")
    assert not quiet, [str(q.message) for q in quiet]
    try:
        layer = gt.FusedLinear(3, 4, activation="gelu")   # the caller's line
    except ga.GeluChangedWarning as e:
        print("raised", e)
        try:
            ga.linear(x, w, None, "gelu")
        except ga.GeluChangedWarning:
            print("raised again")
        raise SystemExit(0)
    ga.linear(x, w, None, "gelu")
    gt.FusedConv2d(1, 1, 1, activation="gelu")
    print("ok", layer.activation)
""")


@pytest.mark.parametrize("mode", ["default", "ignore", "error"])
def test_gelu_warns_once_that_it_changed_meaning(mode):
    """An old script's activation='gelu' (the tanh approximation before)
    gets one FutureWarning per process, naming the old behaviour's new
    spelling, at the caller's line; 'gelu_tanh' and 'gelu_erf' never warn;
    a filter silences it or turns it into an error."""
    script = WARNING_SCRIPT % mode
    line = script.splitlines().index(next(t for t in script.splitlines() if "the caller's line" in t)) + 1
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "GeluChangedWarning" in line]
    if mode == "default":
        assert result.stdout.strip() == "ok gelu"
        assert len(warnings) == 1, result.stderr
        assert "<string>:%d: GeluChangedWarning" % line in warnings[0], warnings
        assert "'gelu_tanh'" in warnings[0] and "exact (erf) GELU" in warnings[0], warnings
        assert issubclass(ga.GeluChangedWarning, FutureWarning)
    elif mode == "ignore":
        assert result.stdout.strip() == "ok gelu" and not warnings, result.stderr
    else:
        assert result.stdout.splitlines()[0].startswith("raised gpuaccel: activation='gelu'"), result.stdout
        assert result.stdout.splitlines()[1] == "raised again"  # an error each time: nothing was given once
