"""Inputs past every blocking and chunking boundary of the CPU kernels,
whole outputs compared with float64 references (NumPy/torch).

The boundaries (kernels/cpu): matmul.c blocks a GEMM in MC = 144 rows,
KC = 256 of the reduced dimension and NC = 512 columns, and sums rows in
blocks of ROW_SUM_BLOCK = 256; epilogue.c reduces a bias gradient in at
most 64 chunks of about 65536 / C rows each and in channel blocks of
SEG = 256 (channels innermost) or 1 + 65536 / chunk rows; conv.c splits the
im2col buffer into units of 8 MiB (filter gradient: partial sums of at most
16 MiB).  A case below sits one past a boundary, or a few blocks past it,
so that a wrong offset in any block but the first, or a dropped last
(partial) block, changes the result.  Sizes were picked from the constants
above; if the constants change, re-derive the sizes."""

import numpy as np
import pytest

import gpuaccel as ga

from helpers import assert_within, torch_activation

torch = pytest.importorskip("torch")

MC, KC, NC = 144, 256, 512
ROW_SUM_BLOCK = 256
CHUNK_ELEMS, SEG = 65536, 256

# sums of `reduction` products of values in [-1, 1]: the rounding error
# grows like sqrt(reduction) (helpers.assert_within), about 30 units of
# roundoff per sqrt(term) here at worst; a wrong or dropped block is off by
# whole terms (~0.1 and more), orders of magnitude past these bounds
ATOL = {"float32": 4e-6, "float64": 1e-14}
RTOL = {"float32": 4e-6, "float64": 1e-13}


def values(rng, shape, dtype):
    return rng.uniform(-1, 1, size=shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m, k, n", [
    (MC + 1, KC + 1, NC + 1),      # one past each block
    (2 * MC + 7, 2 * KC + 3, 19),  # several row and K blocks, a partial last one
    (5, KC - 1, 2 * NC + 3),       # several column blocks
])
def test_matmul_past_every_gemm_block(rng, dtype, m, k, n):
    a, b, bias = values(rng, (m, k), dtype), values(rng, (k, n), dtype), values(rng, (n,), dtype)
    got = ga.matmul(a, b, bias=bias, activation="relu").numpy()
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0)
    assert_within(got, ref, ATOL[dtype], RTOL[dtype], reduction=k)


def test_batched_matmul_past_the_row_blocks(rng):
    a, b = values(rng, (3, MC + 5, KC + 2), "float32"), values(rng, (KC + 2, 40), "float32")
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert_within(ga.matmul(a, b).numpy(), ref, ATOL["float32"], RTOL["float32"], reduction=KC + 2)


@pytest.mark.parametrize("activation", [None, "gelu", "silu"])
def test_linear_forward_and_backward_past_the_blocks(rng, activation):
    m, k, n = 2 * MC + 5, KC + 9, ROW_SUM_BLOCK + 3   # the bias gradient sums m > 256 rows
    x, w, bias = values(rng, (m, k), "float64"), values(rng, (n, k), "float64"), values(rng, (n,), "float64")
    gy = values(rng, (m, n), "float64")
    y, z = ga.linear(x, w, bias, activation=activation, save_preactivation=True)
    gx, gw, gb = ga.linear_backward(gy, x, w, activation=activation, preactivation=z)
    xt, wt, bt = (torch.tensor(v, requires_grad=True) for v in (x, w, bias))
    yt = torch.nn.functional.linear(xt, wt, bt)
    yt = torch_activation(yt, activation)
    yt.backward(torch.tensor(gy))
    for got, want, reduction in ((y, yt, k), (gx, xt.grad, n), (gw, wt.grad, m), (gb, bt.grad, m)):
        assert_within(np.asarray(got.numpy()), want.detach().numpy(), ATOL["float64"], RTOL["float64"], reduction)


@pytest.mark.parametrize("rows, channels", [
    (3 * (CHUNK_ELEMS // 3 + 1) + 5, 3),        # three whole chunks and a partial fourth
    (64 * (CHUNK_ELEMS // 2 + 1) + 77, 2),      # past MAX_CHUNKS = 64: longer chunks
    (3 * (CHUNK_ELEMS // 300 + 1) + 5, 300),    # chunks and two channel blocks of SEG = 256
])
def test_bias_gradient_past_every_chunk_and_channel_block(rng, rows, channels):
    gy = values(rng, (rows, channels), "float32")
    gy[-1] += 100.0  # the last row of the last (partial) chunk weighs in visibly
    x, w = np.zeros((rows, 1), np.float32), np.zeros((channels, 1), np.float32)
    _, _, gb = ga.linear_backward(gy, x, w, needs_input_grad=False, needs_weight_grad=False)
    assert_within(gb.numpy(), gy.astype(np.float64).sum(0), ATOL["float32"], RTOL["float32"], reduction=rows)


def test_bias_gradient_with_channels_outside_the_rows_conv_layout(rng):
    # NCHW: the channel is not innermost, the reduction spans N*H*W = 3 chunks and a part
    n, c, h, wd = 5, 3, 126, 125
    gy = values(rng, (n, c, h, wd), "float32")
    x, w = np.zeros((n, 1, h, wd), np.float32), np.zeros((c, 1, 1, 1), np.float32)
    _, _, gb = ga.conv2d_backward(gy, x, w, needs_input_grad=False, needs_weight_grad=False)
    assert_within(gb.numpy(), gy.astype(np.float64).sum((0, 2, 3)), ATOL["float32"], RTOL["float32"],
                  reduction=n * h * wd)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_forward_and_backward_past_the_im2col_units(rng, layout):
    # im2col of 8 images of 16 channels x 3x3 over 66x66 outputs is about 20 MiB of float32: several 8 MiB units
    n, c, k, hw = 8, 16, 6, 66
    x, w, b = values(rng, (n, c, hw, hw), "float32"), values(rng, (k, c, 3, 3), "float32"), values(rng, (k,), "float32")
    gy = values(rng, (n, k, hw, hw), "float32")
    xt, wt, bt = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x, w, b))
    yt = torch.nn.functional.conv2d(xt, wt, bt, padding=1)
    yt.backward(torch.tensor(gy, dtype=torch.float64))

    def to(a):  # the layout's memory order
        return np.ascontiguousarray(a.transpose(0, 2, 3, 1)) if layout == "NHWC" else a

    def back(a):
        return np.asarray(a.numpy()).transpose(0, 3, 1, 2) if layout == "NHWC" else np.asarray(a.numpy())

    wl = to(w)
    y = ga.conv2d(to(x), wl, b, padding=1, layout=layout)
    gx, gw, gb = ga.conv2d_backward(to(gy), to(x), wl, padding=1, layout=layout)
    assert_within(back(y), yt.detach().numpy(), ATOL["float32"], RTOL["float32"], reduction=c * 9)
    assert_within(back(gx), xt.grad.numpy(), ATOL["float32"], RTOL["float32"], reduction=k * 9)
    assert_within(back(gw), wt.grad.numpy(), ATOL["float32"], RTOL["float32"], reduction=n * hw * hw)
    assert_within(gb.numpy(), bt.grad.numpy(), ATOL["float32"], RTOL["float32"], reduction=n * hw * hw)


@pytest.mark.parametrize("threads, prefetch, batch", [(1, 1, 7), (3, 2, 10), (4, 1, 1)])
def test_loader_wraps_its_ring_many_times_in_order(rng, threads, prefetch, batch):
    n = 257  # not a multiple of any batch: a partial last batch
    x = rng.integers(0, 256, (n, 5, 3), dtype=np.uint8)
    y = np.arange(n, dtype=np.int64)
    loader = ga.PinnedLoader([x, y], batch, num_threads=threads, prefetch=prefetch, output="gpuaccel")
    got_x, got_y = [], []
    for xb, yb in loader:
        got_x.append(xb.numpy().copy())
        got_y.append(yb.numpy().copy())
    assert [len(b) for b in got_y] == [batch] * (n // batch) + ([n % batch] if n % batch else [])
    np.testing.assert_array_equal(np.concatenate(got_y), y)
    np.testing.assert_array_equal(np.concatenate(got_x), x)
