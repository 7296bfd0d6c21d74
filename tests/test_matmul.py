"""matmul, linear and linear_backward against float64 references (NumPy /
torch CPU), on the CPU backend; test_cuda_ops.py compares the CUDA backend
with this one."""

import numpy as np
import pytest

import gpuaccel as ga

from helpers import (
    ACTIVATIONS,
    FLOAT_DTYPES,
    activation_grad_ref,
    activation_ref,
    assert_sum_close,
    numpy_dtype,
    run_python,
    sum_tolerance,
)

torch = pytest.importorskip("torch")

# |got - ref| <= atol * sqrt(K) + rtol * |ref|, by output dtype
# 16-bit results: float32 accumulation, one rounding to the output dtype, against float64 from
# the same rounded inputs (helpers.sum_tolerance: a few ulps, not a percent)
TOL = {"float64": (1e-13, 1e-12), "float32": (3e-6, 3e-6), "float16": sum_tolerance("float16"),
       "bfloat16": sum_tolerance("bfloat16")}


def check(got, ref, dtype, k, flip=0.0):
    assert_sum_close(got, ref, dtype, k, TOL, flip)


def values(rng, shape, dtype):
    """Random values already rounded to dtype, and their float64 copy."""
    x = rng.standard_normal(shape)
    a = ga.asarray(x).astype(dtype)
    return a, a.astype("float64").numpy()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 3), (129, 33, 65), (64, 1000, 17), (3, 0, 4), (0, 5, 6)])
def test_matmul_2d(rng, dtype, m, k, n):
    a, ar = values(rng, (m, k), dtype)
    b, br = values(rng, (k, n), dtype)
    d = ga.matmul(a, b)
    assert d.dtype == dtype and d.shape == (m, n)
    check(d.numpy().astype(np.float64) if dtype != "bfloat16" else d.astype("float64").numpy(), ar @ br, dtype, k)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("activation", [None] + ACTIVATIONS)
def test_matmul_bias_activation_and_out_dtype(rng, dtype, activation):
    a, ar = values(rng, (37, 29), dtype)
    b, br = values(rng, (29, 23), dtype)
    bias, biasr = values(rng, (23,), dtype)
    ref = activation_ref(ar @ br + biasr, activation)
    d = ga.matmul(a, b, bias=bias, activation=activation)
    check(d.astype("float64").numpy(), ref, dtype, 29)
    if dtype in ("float16", "bfloat16"):
        d32 = ga.matmul(a, b, bias=bias, activation=activation, out_dtype="float32")
        assert d32.dtype == "float32"
        check(d32.numpy(), ref, "float32", 29)
        # a float32 bias is accepted with a float32 output
        d32b = ga.matmul(a, b, bias=bias.astype("float32"), activation=activation, out_dtype="float32")
        check(d32b.numpy(), ref, "float32", 29)


@pytest.mark.parametrize("a_shape,b_shape", [
    ((4, 7, 5), (5, 3)), ((4, 7, 5), (4, 5, 3)), ((2, 1, 7, 5), (3, 5, 6)), ((1, 7, 5), (6, 5, 2)),
    ((5,), (5, 3)), ((7, 5), (5,)), ((5,), (5,)), ((2, 3, 4, 5), (5, 6)), ((3, 1, 2, 5), (1, 4, 5, 2)),
])
def test_matmul_batched_broadcast_and_vectors_match_numpy(rng, a_shape, b_shape):
    a, ar = values(rng, a_shape, "float64")
    b, br = values(rng, b_shape, "float64")
    ref = np.matmul(ar, br)
    got = ga.matmul(a, b)
    assert got.shape == ref.shape
    check(got.numpy(), ref, "float64", a_shape[-1])


def test_matmul_strided_offset_inputs_and_out(rng):
    base, baser = values(rng, (40, 60), "float32")
    a, ar = base[3:30:2, 5:50:3], baser[3:30:2, 5:50:3]  # (14, 15): offset and strided
    b2, b2r = values(rng, (15, 17), "float32")
    check(ga.matmul(a, b2).numpy(), ar @ b2r, "float32", 15)
    b, br = values(rng, (20, 15), "float32")
    bias, biasr = values(rng, (20,), "float32")
    out = ga.zeros((20, 30), dtype="float32")
    view = out[:, 5:25]  # a strided destination
    got = ga.matmul(b, b.T, out=view, bias=bias, activation="relu")  # b.T: a transposed operand
    assert got.data_ptr == view.data_ptr
    check(view.numpy(), np.maximum(br @ br.T + biasr, 0), "float32", 15)
    assert (out.numpy()[:, :5] == 0).all() and (out.numpy()[:, 25:] == 0).all()


def test_matmul_out_overlapping_an_input_is_right(rng):
    a, ar = values(rng, (8, 8), "float64")
    b, br = values(rng, (8, 8), "float64")
    ga.matmul(a, b, out=a)  # NumPy buffers this case; so does gpuaccel
    check(a.numpy(), ar @ br, "float64", 8)
    with pytest.raises(ValueError, match="out must be"):
        ga.matmul(a, b, out=ga.zeros((8, 9), dtype="float64"))


@pytest.mark.parametrize(
    "call,exc,words",
    [
        (lambda a, b: ga.matmul(a, b.astype("float64")), TypeError, "same dtype"),
        (lambda a, b: ga.matmul(a.astype("int32"), b.astype("int32")), TypeError, "float16, bfloat16"),
        (lambda a, b: ga.matmul(a, a), ValueError, "last dimension \\(5\\) must equal"),
        (lambda a, b: ga.matmul(a, b, activation="tanh"), ValueError, "activation must be"),
        (lambda a, b: ga.matmul(a, b, bias=ga.zeros(4)), ValueError,
         "bias must have shape \\(3,\\) .*got shape \\(4,\\)"),
        (lambda a, b: ga.matmul(a, b, bias=ga.zeros((1, 3))), ValueError, "got shape \\(1, 3\\)"),
        (lambda a, b: ga.matmul(a, b, out=ga.zeros((2, 4))), ValueError,
         "out must be a writable float32 array of shape \\(4, 3\\) on cpu; got one of shape \\(2, 4\\)"),
        (lambda a, b: ga.matmul(a, b, out_dtype="float16"), ValueError, "out_dtype"),
        (lambda a, b: ga.matmul(a, b, out=ga.zeros((4, 3), dtype="float64")), ValueError, "out must be"),
        (lambda a, b: ga.matmul(a, "x"), TypeError, "b must be"),
        (lambda a, b: ga.matmul(ga.zeros((2, 4, 5)), ga.zeros((3, 5, 3))), ValueError, "do not broadcast"),
        (lambda a, b: ga.matmul(a), TypeError, "missing required argument 'b'"),
        (lambda a, b: ga.matmul(a, b, bogus=1), TypeError, "unexpected keyword"),
    ],
)
def test_matmul_errors(call, exc, words):
    a, b = ga.zeros((4, 5)), ga.zeros((5, 3))
    with pytest.raises(exc, match=words):
        call(a, b)


# ------------------------------------------------------------------ linear

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("activation", [None] + ACTIVATIONS)
@pytest.mark.parametrize("x_shape", [(13, 31), (2, 7, 31), (31,)])
def test_linear_forward_and_backward(rng, dtype, activation, x_shape):
    n, k = 19, x_shape[-1]
    x, xr = values(rng, x_shape, dtype)
    w, wr = values(rng, (n, k), dtype)
    b, br = values(rng, (n,), dtype)
    z = xr @ wr.T + br
    y, aux = ga.linear(x, w, b, activation, save_preactivation=True)
    check(y.astype("float64").numpy(), activation_ref(z, activation), dtype, k)
    if activation == "relu":
        assert aux is y
    elif activation is None:
        assert aux is None
    else:
        check(aux.astype("float64").numpy(), z, dtype, k)
    gy, gyr = values(rng, y.shape, dtype)
    gx, gw, gb = ga.linear_backward(gy, x, w, activation=activation, preactivation=aux)
    # the reference differentiates through the saved (rounded) pre-activation, as the kernels do
    saves_z = activation not in (None, "relu")  # the derivative reads the saved z
    zsaved = aux.astype("float64").numpy() if saves_z else z
    dz = gyr * activation_grad_ref(zsaved, activation)
    # the kernels store the activation's gradient in the input dtype before the reductions (exact for
    # None and relu): so does the reference
    dz = torch.from_numpy(dz).to(getattr(torch, dtype)).double().numpy()
    m = int(np.prod(x_shape[:-1]))
    dz_max = float(np.abs(dz).max()) if saves_z and dz.size else 0.0  # dz rounded: see check()
    check(gx.astype("float64").numpy(), dz @ wr, dtype, n, flip=dz_max * float(np.abs(wr).max(initial=0)))
    check(gw.astype("float64").numpy(), dz.reshape(m, n).T @ xr.reshape(m, k), dtype, m,
          flip=dz_max * float(np.abs(xr).max(initial=0)))
    check(gb.astype("float64").numpy(), dz.reshape(m, n).sum(0), dtype, m, flip=dz_max)
    assert gx.shape == x.shape and gw.shape == w.shape and gb.shape == (n,)


def test_linear_backward_needs_flags_and_errors(rng):
    x, _ = values(rng, (6, 4), "float32")
    w, _ = values(rng, (3, 4), "float32")
    gy, _ = values(rng, (6, 3), "float32")
    gx, gw, gb = ga.linear_backward(gy, x, w, needs_input_grad=False, needs_bias_grad=False)
    assert gx is None and gb is None and gw.shape == (3, 4)
    only_bias = ga.linear_backward(gy, x, w, needs_input_grad=False, needs_weight_grad=False)
    np.testing.assert_allclose(only_bias[2].numpy(), gy.numpy().sum(0), rtol=1e-6)
    for act in ACTIVATIONS:
        with pytest.raises(ValueError, match="activation='%s' needs preactivation" % act):
            ga.linear_backward(gy, x, w, activation=act)
    with pytest.raises(ValueError, match="linear_backward: need weight"):
        ga.linear_backward(gy, x, ga.zeros((3, 5)))
    with pytest.raises(TypeError, match="out must be a tuple"):
        ga.linear_backward(gy, x, w, out=[None, None, None])


def test_linear_non_contiguous_inputs(rng):
    base, baser = values(rng, (10, 3, 40), "float32")
    x, xr = base[:, 1, ::2], baser[:, 1, ::2]        # (10, 20), strided
    wbase, wbaser = values(rng, (20, 9), "float32")
    w, wr = wbase.T, wbaser.T                         # (9, 20), transposed
    y = ga.linear(x, w)
    check(y.numpy(), xr @ wr.T, "float32", 20)


@pytest.mark.parametrize(
    "call,exc,words",
    [
        (lambda x, w: ga.linear(x, ga.zeros((3, 5))), ValueError, "in_features"),
        (lambda x, w: ga.linear(x, w.astype("float64")), TypeError, "share one dtype"),
        (lambda x, w: ga.linear(x, ga.zeros(4)), ValueError, "weight must be 2-D"),
        (lambda x, w: ga.linear(x, w, ga.zeros(4)), ValueError,
         "bias must have shape \\(3,\\) \\(weight's out_features\\), got shape \\(4,\\)"),
        (lambda x, w: ga.linear(x, w, activation="swish"), ValueError, "activation"),
    ],
)
def test_linear_errors(call, exc, words):
    x, w = ga.zeros((2, 4)), ga.zeros((3, 4))
    with pytest.raises(exc, match=words):
        call(x, w)


# ----------------------------------------------------------------- settings

def test_settings_and_stats():
    assert ga.get_matmul_precision() == "highest"
    ga.set_matmul_precision("high")
    assert ga.get_matmul_precision() == "high"
    ga.set_matmul_precision("highest")
    with pytest.raises(ValueError, match="'highest'"):
        ga.set_matmul_precision("low")
    ga.set_matmul_precision(None)
    assert ga.get_deterministic() is False
    ga.set_deterministic(True)
    assert ga.get_deterministic() is True
    ga.set_deterministic(False)
    with pytest.raises(TypeError, match="True or False"):
        ga.set_deterministic(1)
    before = ga.matmul_stats()
    ga.matmul(ga.ones((3, 3)), ga.ones((3, 3)))
    after = ga.matmul_stats()
    assert after["calls"] == before["calls"] + 1 and after["cpu_calls"] == before["cpu_calls"] + 1


def test_cpu_results_do_not_depend_on_thread_count(rng, tmp_path):
    script = (
        "import numpy as np, gpuaccel as ga\n"
        "rng = np.random.default_rng(5)\n"
        "a = ga.asarray(rng.standard_normal((300, 257))).astype('bfloat16')\n"
        "b = ga.asarray(rng.standard_normal((257, 190))).astype('bfloat16')\n"
        "bias = ga.asarray(rng.standard_normal(190)).astype('bfloat16')\n"
        "import sys; sys.stdout.buffer.write(ga.matmul(a, b, bias=bias, activation='gelu', out_dtype='float32')"
        ".numpy().tobytes())\n"
    )
    outs = []
    for threads in ("1", "2", "3"):
        result = run_python("-c", script, env={"GPUACCEL_NUM_THREADS": threads}, text=False)
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        outs.append(result.stdout)
    assert outs[0] == outs[1] == outs[2] and len(outs[0]) == 300 * 190 * 4


def test_torch_tensors_are_accepted_without_copies(rng):
    x = torch.randn(8, 5)
    w = torch.randn(3, 5)
    y = ga.linear(x, w)
    np.testing.assert_allclose(y.numpy(), (x @ w.T).numpy(), rtol=1e-5, atol=1e-6)
    out = torch.empty(8, 3)
    ga.linear(x, w, out=out)
    np.testing.assert_allclose(out.numpy(), (x @ w.T).numpy(), rtol=1e-5, atol=1e-6)
    assert numpy_dtype("float32") == np.float32
