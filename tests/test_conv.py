"""conv2d and conv2d_backward on the CPU backend against torch's float64
convolution; and the persisted tuning file."""

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

import gpuaccel as ga

from helpers import FLOAT_DTYPES, assert_sum_close
from ops import ACTIVATION_NAMES, ACTIVATIONS, CONV_TOLERANCE, SMOOTH_ACTIVATIONS, invalid_activations

torch = pytest.importorskip("torch")
F = torch.nn.functional

# |got - ref| <= atol * sqrt(reduction) + rtol * |ref|, by output dtype (ops.CONV_TOLERANCE)
TOL = CONV_TOLERANCE

GEOMETRIES = [
    # (N, C, H, W, K, R, S, stride, padding, dilation, groups)
    (2, 3, 7, 9, 4, 3, 3, 1, 1, 1, 1),
    (1, 4, 13, 5, 6, 3, 5, (2, 1), (0, 2), 1, 2),
    (3, 6, 9, 9, 6, 3, 3, 2, 1, 2, 6),        # depthwise, dilated, strided
    (2, 8, 6, 7, 8, 1, 1, 1, 0, 1, 1),        # 1x1
    (1, 2, 11, 10, 3, 5, 3, 3, (2, 1), (1, 2), 1),
    (5, 12, 1, 1, 7, 1, 1, 1, 0, 1, 1),       # 1x1 on one pixel (squeeze-excitation): one GEMM for the batch
    (3, 6, 1, 1, 9, 1, 1, 1, 0, 1, 3),        # the same, grouped
]


def check(got, ref, dtype, reduction, flip=0.0):
    assert_sum_close(got, ref, dtype, reduction, TOL, flip)


def rounded(rng, shape, dtype):
    t = torch.from_numpy(rng.standard_normal(shape)).to(getattr(torch, dtype))
    return t, t.double()


def as_float64(a):
    return a.astype("float64").numpy()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_forward_and_gradients_match_torch(rng, dtype, geometry, activation):
    act = ACTIVATIONS[activation]
    n, c, h, w, k, r, s, stride, padding, dilation, groups = geometry
    x, xr = rounded(rng, (n, c, h, w), dtype)
    wt, wr = rounded(rng, (k, c // groups, r, s), dtype)
    b, br = rounded(rng, (k,), dtype)
    geo = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    xr.requires_grad_(True)
    wr.requires_grad_(True)
    br.requires_grad_(True)
    z = F.conv2d(xr, wr, br, **geo)
    yr = act.torch(z)
    y, aux = ga.conv2d(x, wt, b, activation=activation, save_preactivation=True, **geo)
    reduction = (c // groups) * r * s
    check(as_float64(y), yr.detach().numpy(), dtype, reduction)
    gy, gyr = rounded(rng, tuple(yr.shape), dtype)
    if act.saves == "preactivation":
        # differentiate through the saved, rounded pre-activation, as the kernels do; they store
        # the activation's gradient in the input dtype before the reductions: so does the reference
        zs = torch.from_numpy(as_float64(aux))
        dz = gyr * torch.autograd.functional.vjp(act.torch, zs, torch.ones_like(zs))[1]
        dz = dz.to(getattr(torch, dtype)).double()
        gx_ref, gw_ref, gb_ref = torch.autograd.grad(z, (xr, wr, br), dz)
    else:
        gx_ref, gw_ref, gb_ref = torch.autograd.grad(yr, (xr, wr, br), gyr)
    gx, gw, gb = ga.conv2d_backward(gy, x, wt, activation=activation, **act.backward_kwargs(y, aux, prefer_y=True),
                                    **geo)
    flips = not act.exact_gradient  # dz rounded: see check()
    dz_max = float(dz.abs().max()) if flips else 0.0
    w_max, x_max = float(wr.detach().abs().max()), float(xr.detach().abs().max())
    check(as_float64(gx), gx_ref.numpy(), dtype, k * r * s, flip=dz_max * w_max)
    check(as_float64(gw), gw_ref.numpy(), dtype, n * y.shape[2] * y.shape[3], flip=dz_max * x_max)
    check(as_float64(gb), gb_ref.numpy(), dtype, n * y.shape[2] * y.shape[3])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nhwc_layout_and_channels_last_tensors(rng, dtype):
    x, xr = rounded(rng, (2, 5, 8, 6), dtype)
    wt, wr = rounded(rng, (7, 5, 3, 3), dtype)
    b, br = rounded(rng, (7,), dtype)
    ref = F.conv2d(xr, wr, br, padding=1, stride=(1, 2)).relu()
    # NHWC arrays with KRSC weights
    x_nhwc = ga.asarray(x.permute(0, 2, 3, 1).contiguous())
    w_krsc = ga.asarray(wt.permute(0, 2, 3, 1).contiguous())
    y = ga.conv2d(x_nhwc, w_krsc, b, padding=1, stride=(1, 2), activation="relu", layout="NHWC")
    assert y.shape == (2, 8, 3, 7)
    check(as_float64(y), ref.permute(0, 2, 3, 1).detach().numpy(), dtype, 45)
    # a torch tensor in channels_last memory is used as it is, and the result follows it
    x_cl = x.to(memory_format=torch.channels_last)
    y2 = ga.conv2d(x_cl, wt, b, padding=1, stride=(1, 2), activation="relu")
    assert y2.shape == (2, 7, 8, 3) and y2.strides[1] == y2.itemsize
    check(as_float64(y2), ref.detach().numpy(), dtype, 45)
    gx, gw, gb = ga.conv2d_backward(ga.ones(y2.shape, dtype=dtype), x_cl, wt, padding=1, stride=(1, 2),
                                    activation="relu", y=y2)
    assert gx.strides[1] == gx.itemsize  # gradients keep x's memory format
    xr.requires_grad_(True)
    gx_ref = torch.autograd.grad(F.conv2d(xr, wr, br, padding=1, stride=(1, 2)).relu().sum(), xr)[0]
    check(as_float64(gx), gx_ref.numpy(), dtype, 63)


def _strided(t, how):
    """t's values in another memory layout: NCHW, channels_last, every
    other image of a batch twice as long, or a transpose of a contiguous
    tensor (for a weight)."""
    if how == "channels_last":
        return t.contiguous(memory_format=torch.channels_last)
    if how == "every_other":
        double = torch.empty((2 * t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype)
        double[::2] = t
        return double[::2]
    if how == "transposed":
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    return t


@pytest.mark.parametrize("case", [
    # (x shape, x layout, weight shape, weight layout, groups)
    ((5, 12, 1, 1), "nchw", (7, 12, 1, 1), "nchw", 1),                  # one GEMM for the whole batch
    ((6, 12, 1, 1), "every_other", (7, 12, 1, 1), "transposed", 1),     # merged at the sliced batch's stride
    ((3, 6, 5, 4), "channels_last", (9, 6, 1, 1), "nchw", 1),           # dense channels-last images: merged
    ((3, 6, 5, 4), "every_other", (8, 3, 1, 1), "channels_last", 2),    # not dense: one GEMM per image
    ((2, 5, 6, 7), "channels_last", (4, 5, 3, 3), "channels_last", 1),  # KRSC weights for NHWC unfolding
    ((2, 5, 6, 7), "nchw", (4, 5, 3, 3), "channels_last", 1),           # packed for NCHW unfolding
    ((2, 6, 6, 7), "nchw", (4, 3, 3, 3), "transposed", 2),
], ids=["one_pixel", "one_pixel_sliced", "pointwise_channels_last", "pointwise_sliced", "krsc_weight",
        "packed_weight", "transposed_weight"])
def test_memory_layouts_of_x_and_the_weight_match_torch(rng, case):
    """The kernel reads a weight in place when its memory already is the
    GEMM's layout and packs it otherwise; a pointwise conv whose images lie
    at one stride runs one GEMM for the batch: whichever, forward and every
    gradient against torch's float64 conv of the same values."""
    x_shape, x_layout, w_shape, w_layout, groups = case
    x, xr = rounded(rng, x_shape, "float32")
    wt, wr = rounded(rng, w_shape, "float32")
    b, br = rounded(rng, (w_shape[0],), "float32")
    x, wt = _strided(x, x_layout), _strided(wt, w_layout)
    pad = w_shape[2] // 2
    for t in (xr, wr, br):
        t.requires_grad_(True)
    z = F.conv2d(xr, wr, br, padding=pad, groups=groups)
    y, aux = ga.conv2d(x, wt, b, padding=pad, groups=groups, activation="relu", save_preactivation=True)
    reduction = w_shape[1] * w_shape[2] * w_shape[3]
    check(as_float64(y), z.relu().detach().numpy(), "float32", reduction)
    gy, gyr = rounded(rng, tuple(z.shape), "float32")
    gx, gw, gb = ga.conv2d_backward(_strided(gy, x_layout), x, wt, padding=pad, groups=groups, activation="relu",
                                    preactivation=aux)
    gx_ref, gw_ref, gb_ref = torch.autograd.grad(z.relu(), (xr, wr, br), gyr)
    pixels = x_shape[0] * z.shape[2] * z.shape[3]
    check(as_float64(gx), gx_ref.numpy(), "float32", w_shape[0] * w_shape[2] * w_shape[3])
    check(as_float64(gw), gw_ref.numpy(), "float32", pixels)
    check(as_float64(gb), gb_ref.numpy(), "float32", pixels)


def test_out_and_needs_flags(rng):
    x, _ = rounded(rng, (1, 2, 5, 5), "float32")
    wt, _ = rounded(rng, (3, 2, 3, 3), "float32")
    out = torch.empty(1, 3, 3, 3)
    got = ga.conv2d(x, wt, out=out)
    np.testing.assert_allclose(out.numpy(), F.conv2d(x, wt).numpy(), rtol=1e-5, atol=1e-6)
    assert got.data_ptr == out.data_ptr()
    gx, gw, gb = ga.conv2d_backward(torch.ones(1, 3, 3, 3), x, wt, needs_input_grad=False, needs_bias_grad=False)
    assert gx is None and gb is None and gw.shape == (3, 2, 3, 3)


@pytest.mark.parametrize(
    "kwargs,exc,words",
    [
        (dict(groups=2), ValueError, "groups=2 must divide the input channels \\(3\\)"),
        (dict(stride=0), ValueError, "stride must be an int >= 1"),
        (dict(padding=-1), ValueError, "padding must be an int >= 0"),
        (dict(dilation=(1, 2, 3)), ValueError, "dilation"),
        (dict(activation=invalid_activations()[3]), ValueError, "activation"),
        (dict(layout="NDHWC"), ValueError, "layout"),
        (dict(dilation=4), ValueError, "output height would be empty"),
        (dict(groups=0), ValueError, "groups must be an int from 1"),
    ],
)
def test_geometry_errors(kwargs, exc, words):
    x, w = ga.zeros((1, 3, 6, 6)), ga.zeros((6, 3, 3, 3))
    with pytest.raises(exc, match=words):
        ga.conv2d(x, w, **kwargs)


def test_shape_errors():
    with pytest.raises(ValueError, match="x must have 6 channels"):
        ga.conv2d(ga.zeros((1, 4, 6, 6)), ga.zeros((6, 3, 3, 3)), groups=2)
    with pytest.raises(ValueError, match="4-D"):
        ga.conv2d(ga.zeros((4, 6, 6)), ga.zeros((6, 4, 3, 3)))
    with pytest.raises(ValueError, match="bias must have shape \\(6,\\) \\(the output channels\\), "
                                         "got shape \\(5,\\)"):
        ga.conv2d(ga.zeros((1, 4, 6, 6)), ga.zeros((6, 4, 3, 3)), ga.zeros(5))
    for name in SMOOTH_ACTIVATIONS:  # those whose backward needs the pre-activation: y is not enough
        with pytest.raises(ValueError, match="activation='%s' needs preactivation" % name):
            ga.conv2d_backward(ga.zeros((1, 6, 4, 4)), ga.zeros((1, 4, 6, 6)), ga.zeros((6, 4, 3, 3)),
                               activation=name, y=ga.zeros((1, 6, 4, 4)))
    for act in ACTIVATIONS.values():
        if act.saves == "output":  # relu: y or the pre-activation
            with pytest.raises(ValueError, match="activation='%s' needs y .*or preactivation" % act.name):
                ga.conv2d_backward(ga.zeros((1, 6, 4, 4)), ga.zeros((1, 4, 6, 6)), ga.zeros((6, 4, 3, 3)),
                                   activation=act.name)
    with pytest.raises(ValueError, match="grad_y .* must be the forward output's shape"):
        ga.conv2d_backward(ga.zeros((1, 6, 5, 4)), ga.zeros((1, 4, 6, 6)), ga.zeros((6, 4, 3, 3)))
    with pytest.raises(TypeError, match="share one dtype"):
        ga.conv2d(ga.zeros((1, 4, 6, 6)), ga.zeros((6, 4, 3, 3), dtype="float64"))


def test_stats_count_cpu_calls():
    before = ga.conv_stats()["cpu_calls"]
    ga.conv2d(ga.zeros((1, 1, 3, 3)), ga.zeros((1, 1, 3, 3)))
    assert ga.conv_stats()["cpu_calls"] == before + 1


# ----------------------------------------------------------- tuning file

@pytest.fixture
def tuning(tmp_path, monkeypatch):
    from gpuaccel import _tuning

    monkeypatch.setenv("GPUACCEL_CACHE_DIR", str(tmp_path))
    _tuning.forget()
    _tuning._prefixes[0] = "Test GPU|cudnn91900"
    yield _tuning
    _tuning.forget()


def test_tuning_choices_are_written_and_read_back(tuning, tmp_path):
    assert tuning.lookup(0, "conv2d|shape-a") is None
    tuning.store(0, "conv2d|shape-a", "eng7:k2=1")
    tuning.store(0, "conv2d|shape-b", "eng3:")
    data = json.loads((tmp_path / "conv_tuning.json").read_text())
    assert data == {"Test GPU|cudnn91900|conv2d|shape-a": "eng7:k2=1", "Test GPU|cudnn91900|conv2d|shape-b": "eng3:"}
    tuning.forget()
    tuning._prefixes[0] = "Test GPU|cudnn91900"
    assert tuning.lookup(0, "conv2d|shape-a") == "eng7:k2=1"  # a new process reads the file
    tuning._prefixes[1] = "Other GPU|cudnn91900"
    assert tuning.lookup(1, "conv2d|shape-a") is None  # keyed by GPU (and cuDNN version)


def test_tuning_store_merges_what_other_processes_wrote(tuning, tmp_path):
    file = tmp_path / "conv_tuning.json"
    assert tuning.lookup(0, "mine") is None  # this process has read the (absent) file
    # another rank tunes other shapes meanwhile, in another process
    other = {"Test GPU|cudnn91900|theirs-%d" % i: "eng%d:" % i for i in range(3)}
    script = "import json, sys; json.dump(json.loads(sys.argv[2]), open(sys.argv[1], 'w'))"
    subprocess.run([sys.executable, "-c", script, str(file), json.dumps(other)], check=True)
    tuning.store(0, "mine", "eng9:")
    data = json.loads(file.read_text())
    assert data == dict(other, **{"Test GPU|cudnn91900|mine": "eng9:"})
    # a rank re-tunes an entry this process only read: its newer choice stays
    other["Test GPU|cudnn91900|theirs-0"] = "eng5:"
    subprocess.run([sys.executable, "-c", script, str(file), json.dumps(dict(data, **other))], check=True)
    tuning.store(0, "mine-2", "eng8:")
    data = json.loads(file.read_text())
    assert data["Test GPU|cudnn91900|theirs-0"] == "eng5:"
    assert data["Test GPU|cudnn91900|mine"] == "eng9:" and data["Test GPU|cudnn91900|mine-2"] == "eng8:"
    assert tuning.lookup(0, "theirs-1") == "eng1:"  # and this process now knows them
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv_tuning.json", "conv_tuning.json.lock"]


def test_failed_tuning_write_warns_and_leaves_no_temporary_file(tuning, tmp_path, monkeypatch):
    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tuning.os, "replace", broken_replace)
    with pytest.warns(RuntimeWarning, match="could not write the conv tuning cache.*No space left"):
        tuning.store(0, "k", "eng1:")
    assert [p.name for p in tmp_path.iterdir()] == ["conv_tuning.json.lock"]
    assert tuning.lookup(0, "k") == "eng1:"  # still used in this process


def test_corrupt_tuning_file_warns_once_even_as_an_error(tuning, tmp_path):
    (tmp_path / "conv_tuning.json").write_text("{not json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="ignoring the conv tuning cache"):
            tuning.lookup(0, "k")
        assert tuning.lookup(0, "k") is None  # not raised again on every conv call


def test_corrupt_tuning_file_is_ignored_with_a_warning(tuning, tmp_path):
    (tmp_path / "conv_tuning.json").write_text("{not json")
    with pytest.warns(RuntimeWarning, match="ignoring the conv tuning cache"):
        assert tuning.lookup(0, "k") is None
    tuning.store(0, "k", "eng1:")  # and it is rewritten
    assert json.loads((tmp_path / "conv_tuning.json").read_text()) == {"Test GPU|cudnn91900|k": "eng1:"}
    tuning.forget()
    (tmp_path / "conv_tuning.json").write_text('["a list"]')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuning._prefixes[0] = "Test GPU|cudnn91900"
        assert tuning.lookup(0, "k") is None
    assert any("not a mapping" in str(w.message) for w in caught)
