"""One deterministic test per bug the fuzzer (test_fuzz.py) and the fault
tests (test_faults.py) found, so that each stays fixed whatever hypothesis
happens to draw."""

import numpy as np
import pytest

import gpuaccel as ga

from helpers import assert_close
from ops import SMOOTH_ACTIVATIONS, conv_fwd64


@pytest.mark.parametrize("view", ["step", "reversed", "broadcast"])
def test_strided_bias_is_read_with_its_strides(rng, view):
    x = rng.standard_normal((7, 5))
    w = rng.standard_normal((3, 5))
    base = rng.standard_normal(6)
    bias = {"step": base[::2], "reversed": base[:3][::-1], "broadcast": np.broadcast_to(base[:1], (3,))}[view]
    want = x @ w.T + bias
    assert_close(ga.linear(x, w, bias).numpy(), want, "float64")
    assert_close(ga.matmul(x, w.T, bias=bias).numpy(), want, "float64")
    xi = rng.standard_normal((2, 5, 4, 6))
    wi = rng.standard_normal((3, 5, 1, 1))
    conv = conv_fwd64(xi, wi) + bias[:, None, None]
    assert_close(ga.conv2d(xi, wi, bias).numpy(), conv, "float64")


@pytest.mark.parametrize("groups", [2**31, 2**32, 2**32 + 1, 2**63 - 1, 2**70])
def test_huge_groups_raise(groups):
    x, w = np.ones((1, 2, 4, 4)), np.ones((2, 1, 3, 3))
    for fn in (lambda: ga.conv2d(x, w, groups=groups),
               lambda: ga.conv2d_backward(np.ones((1, 2, 2, 2)), x, w, groups=groups)):
        with pytest.raises(ValueError, match="groups must be an int from 1"):
            fn()


def test_big_endian_with_copy_false_raises_and_copies_otherwise():
    x = np.arange(6, dtype=">f4").reshape(2, 3)
    with pytest.raises(ValueError, match="copy=False.*byte order"):
        ga.asarray(x, copy=False)
    a = ga.asarray(x)
    assert a.dtype == "float32"
    np.testing.assert_array_equal(a.numpy(), x)
    x[0, 0] = 100.0  # a private copy: the original's later changes do not show
    assert a.numpy()[0, 0] == 0.0


def test_broadcast_rows_of_linear(rng):
    row = rng.standard_normal((1, 1, 5))
    x = np.broadcast_to(row, (4, 3, 5))  # leading dims merge to a row stride of 0
    w = rng.standard_normal((2, 5))
    assert_close(ga.linear(x, w).numpy(), x @ w.T, "float64")
    gy = np.broadcast_to(rng.standard_normal((1, 1, 2)), (4, 3, 2))
    gx, gw, gb = ga.linear_backward(gy, x, w, needs_bias_grad=True)
    assert_close(gx.numpy(), gy @ w, "float64")
    assert_close(gw.numpy(), gy.reshape(-1, 2).T @ x.reshape(-1, 5), "float64")
    assert_close(gb.numpy(), gy.reshape(-1, 2).sum(0), "float64")


@pytest.mark.parametrize("activation", SMOOTH_ACTIVATIONS)  # those that save a pre-activation
@pytest.mark.parametrize("shape", [(2, 0, 5), (0, 3, 5), (3, 0)])
def test_empty_leading_dims_of_linear(rng, shape, activation):
    K = shape[-1]
    x, w = np.zeros(shape), rng.standard_normal((4, K))
    y, z = ga.linear(x, w, activation=activation, save_preactivation=True)
    assert y.shape == shape[:-1] + (4,) and z.shape == y.shape
    gy = np.zeros(y.shape)
    gx, gw, gb = ga.linear_backward(gy, x, w, activation=activation, preactivation=z, needs_bias_grad=True)
    assert gx.shape == shape and gw.shape == (4, K) and gb.shape == (4,)
    np.testing.assert_array_equal(gw.numpy(), 0.0)
    np.testing.assert_array_equal(gb.numpy(), 0.0)


@pytest.mark.parametrize("call", [
    lambda: ga.linear(np.ones((2, 3)), np.ones((4, 3)), activation="gelu\0x"),
    lambda: ga.conv2d(np.ones((1, 1, 3, 3)), np.ones((1, 1, 1, 1)), layout="NHWC\0x"),
    lambda: ga.set_matmul_precision("high\0"),
])
def test_embedded_nul_is_not_a_valid_name(call):
    with pytest.raises(ValueError, match="must be"):
        call()


@pytest.mark.parametrize("dtype", ["\ud800", "float32\0", ">f8"])
def test_bad_dtype_strings_name_the_argument(dtype):
    with pytest.raises(TypeError, match="dtype"):
        ga.zeros(3, dtype=dtype)


def test_device_string_with_nul_or_surrogate():
    for device in ("cpu\0", "\udcff"):
        with pytest.raises((TypeError, ValueError), match="device"):
            ga.zeros(3, device=device)


class _RaisingInterface:
    @property
    def __cuda_array_interface__(self):
        raise KeyError("the producer's own error")


def test_interface_property_that_raises_is_reported():
    with pytest.raises(KeyError, match="the producer's own error"):
        ga.asarray(_RaisingInterface())
    with pytest.raises(KeyError, match="the producer's own error"):
        ga.matmul(_RaisingInterface(), np.ones((2, 2)))


@pytest.mark.parametrize("stream", [2**64, -(2**70), 2**63])
def test_host_dlpack_export_with_an_overflowing_stream(stream):
    a = ga.zeros(3)
    with pytest.raises(ValueError, match="stream must be None"):
        a.__dlpack__(stream=stream)
