"""PinnedLoader on a GPU: the same values as the CPU path, consumer-stream
ordering, outputs that stay valid, and a __next__ that never waits for the
GPU."""

import time

import numpy as np
import pytest

import gpuaccel as ga

from helpers import LONG_SLEEP_CYCLES

pytestmark = pytest.mark.cuda
torch = pytest.importorskip("torch")


def data(rng, n=600, image=(32, 32, 3)):
    x = rng.integers(0, 256, size=(n,) + image, dtype=np.uint8)
    y = np.arange(n, dtype=np.int64)
    return x, y


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_gpu_batches_equal_cpu_batches_bit_for_bit(rng, dtype, layout):
    x, y = data(rng)
    t = ga.ImageNormalize([0.4, 0.5, 0.6], [0.2, 0.3, 0.25], dtype=dtype, layout=layout)
    kwargs = dict(shuffle=True, seed=3, transform=t, output="gpuaccel")
    cpu = list(ga.PinnedLoader([x, y], 97, device="cpu", **kwargs))
    gpu = list(ga.PinnedLoader([x, y], 97, device="cuda", **kwargs))
    assert len(cpu) == len(gpu)
    for (cx, cy), (gx, gy) in zip(cpu, gpu):
        assert gx.device == "cuda:0" and gx.dtype == dtype
        assert gx.shape == cx.shape == (len(cy.numpy()), 3, 32, 32) and gx.strides == cx.strides
        if layout == "NHWC":  # channels last in memory, shown as (N, C, H, W)
            assert gx.strides[1] == gx.itemsize and gx.strides[3] == 3 * gx.itemsize
        assert gx.numpy().tobytes() == cx.numpy().tobytes()
        assert gy.numpy().tobytes() == cy.numpy().tobytes()


@pytest.mark.gpu
def test_channels_last_torch_tensors_on_the_gpu(rng):
    x, y = data(rng, 300)
    t = ga.ImageNormalize([0.4, 0.5, 0.6], [0.2, 0.3, 0.25], dtype="bfloat16", layout="NHWC")
    for xb, yb in ga.PinnedLoader([x, y], 64, shuffle=True, transform=t):
        assert xb.is_cuda and tuple(xb.shape) == (len(yb), 3, 32, 32)
        assert xb.is_contiguous(memory_format=torch.channels_last)
        want = (x[yb.cpu().numpy()] / 255.0 - np.array([0.4, 0.5, 0.6])) / np.array([0.2, 0.3, 0.25])
        got = xb.float().cpu().numpy().transpose(0, 2, 3, 1)
        np.testing.assert_allclose(got, want, atol=0.02, rtol=0.01)


@pytest.mark.gpu
def test_torch_tensors_on_the_current_stream(rng):
    x, y = data(rng)
    side = torch.cuda.Stream()
    total = torch.zeros((), device="cuda", dtype=torch.int64)
    with torch.cuda.stream(side):
        for xb, yb in ga.PinnedLoader([x, y], 64, shuffle=True, seed=1):
            assert xb.is_cuda and yb.is_cuda
            torch.cuda._sleep(1_000_000)  # consumer busy: batches must still arrive in order
            total += yb.sum()
    side.synchronize()
    assert total.item() == y.sum()


@pytest.mark.gpu
def test_next_returns_while_the_gpu_is_busy(rng):
    x, y = data(rng, 2000)
    loader = ga.PinnedLoader([x, y], 100, transform=ga.ImageNormalize(0.5, 0.5))
    it = iter(loader)
    next(it)
    torch.cuda._sleep(LONG_SLEEP_CYCLES)  # ~0.5 s on the consumer stream
    start = time.perf_counter()
    xb, yb = next(it)
    elapsed = time.perf_counter() - start
    # next() returned while the consumer stream still runs the sleep queued before it: it did not wait for
    # the GPU (a host wait would have drained the stream); no wall-clock bound needed
    assert not torch.cuda.current_stream().query(), "next() waited for the GPU (%.3f s)" % elapsed
    assert yb.tolist() == list(range(100, 200))  # the values arrive once the stream gets there


@pytest.mark.gpu
def test_held_batches_stay_valid(rng):
    x, y = data(rng, 1000, image=(8, 8, 3))
    held = list(ga.PinnedLoader([x, y], 50, prefetch=1))  # far more batches than ring slots
    for k, (xb, yb) in enumerate(held):
        assert yb.tolist() == list(range(50 * k, 50 * k + 50))
        np.testing.assert_array_equal(xb.cpu().numpy(), x[50 * k: 50 * k + 50])


@pytest.mark.gpu
def test_memory_returns_to_the_pool(rng):
    x, y = data(rng, 400)
    loader = ga.PinnedLoader([x, y], 32, output="gpuaccel")
    list(loader)
    ga.synchronize()
    base = ga.memory_stats("cuda")["allocated_bytes"]
    for _ in range(20):
        for _batch in loader:
            pass
        del _batch
    ga.synchronize()
    assert ga.memory_stats("cuda")["allocated_bytes"] == base
    s = loader.stats()
    assert s["copy_seconds"] > 0 and s["samples_per_second"] > 0
