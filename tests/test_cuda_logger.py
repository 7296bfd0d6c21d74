"""LossLogger with CUDA values: never blocks, values arrive exactly, and
log() can be captured in a CUDA graph and replayed."""

import math
import time

import numpy as np
import pytest

import gpuaccel as ga

from helpers import LONG_SLEEP_CYCLES

pytestmark = [pytest.mark.cuda, pytest.mark.gpu]  # every test here needs torch's CUDA
torch = pytest.importorskip("torch")


def test_log_returns_while_the_gpu_is_busy_and_values_arrive_later():
    seen = []
    log = ga.LossLogger(4, on_log=lambda s, v: seen.append((s, v)))
    values = torch.arange(8, dtype=torch.float32, device="cuda")
    torch.cuda._sleep(LONG_SLEEP_CYCLES)  # ~0.5 s on the current stream
    start = time.perf_counter()
    for i in range(8):
        log.log(loss=values[i] * 2)
    elapsed = time.perf_counter() - start
    # no host sync: the stream is still busy with the sleep queued before the values (a wait would have
    # drained it); the sleep (~0.5 s) is far longer than eight log() calls, so no bound on `elapsed` is needed
    assert not torch.cuda.current_stream().query(), "log() waited for the GPU (%.3f s)" % elapsed
    assert seen == []  # lagged: the GPU has not reached the values yet
    log.flush()
    assert [s for s, _ in seen] == [4, 8]
    assert seen[0][1]["loss"] == pytest.approx(2 * (0 + 1 + 2 + 3) / 4)
    np.testing.assert_array_equal(log.history("loss"), np.arange(8) * 2.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64])
def test_values_of_every_dtype_arrive_exactly(rng, dtype):
    raw = rng.standard_normal(37) * 10
    tensors = torch.tensor(raw).to(device="cuda", dtype=dtype)
    log = ga.LossLogger(5)
    for i in range(37):
        log.log(loss=tensors[i], host=float(raw[i]))
    summary = log.flush()
    want = tensors.double().cpu().numpy().astype(np.float32).astype(np.float64)
    np.testing.assert_array_equal(log.history("loss"), want)
    assert summary["loss"]["mean"] == pytest.approx(tensors.double().mean().item(), rel=1e-6)
    assert summary["host"]["count"] == 37


def test_nonfinite_detected_on_the_device():
    log = ga.LossLogger(3, raise_on_nonfinite=True)
    x = torch.ones(10, device="cuda")
    x[6] = float("nan")
    for i in range(9):
        log.log(loss=x[i])
    log.poll()
    with pytest.raises(ga.NonFiniteError, match="step 7"):
        log.flush()  # the last window's NaN is not lost at the end
    assert log.nonfinite_step == 7
    log.log(loss=x[9])  # raised once
    assert math.isnan(log.flush()["loss"]["mean"])


def test_side_stream_values_are_read_on_their_stream():
    log = ga.LossLogger(2)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for i in range(6):
            torch.cuda._sleep(10_000_000)
            t = torch.full((), float(i), device="cuda")
            log.log(loss=t)
    np.testing.assert_array_equal(log.flush() and log.history("loss"), np.arange(6.0))


def test_cuda_graph_capture_and_replay():
    log = ga.LossLogger(4, capacity=64)
    static = torch.zeros((), device="cuda")
    loss = torch.zeros((), device="cuda")
    s = torch.cuda.Stream()
    static.fill_(-1.0)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        loss.copy_(static * 3)  # warm-up outside the graph, logging included
        log.log(loss=loss)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss.copy_(static * 3)
        log.log(loss=loss)
    for i in range(10):
        static.fill_(float(i))
        graph.replay()
    log.flush()
    np.testing.assert_array_equal(log.history("loss"), np.concatenate([[-3.0], np.arange(10) * 3.0]))
    assert log.step == 11


def test_first_cuda_log_inside_capture_is_refused_clearly():
    log = ga.LossLogger(4, capacity=64)
    loss = torch.ones((), device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="before CUDA graph capture"):
        with torch.cuda.graph(graph):
            loss.mul_(2)
            log.log(loss=loss)
    log.log(loss=loss)  # outside capture it works, and the value is exact
    log.flush()
    np.testing.assert_array_equal(log.history("loss"), [loss.item()])
