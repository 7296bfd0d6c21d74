"""torch's current stream, as the ops and the LossLogger follow it for CUDA
torch tensors: the stream torch names, its 0 as the legacy default stream,
and a failure to name one raised, never dropped.

Each scenario runs in a child process that replaces torch's stream lookup
(torch._C._cuda_getCurrentRawStream, which gpuaccel asks when torch's DLPack
C exchange table is switched off: GPUACCEL_NO_DLPACK_EXCHANGE=1) before
gpuaccel first looks torch up and keeps it, so that the scenario decides what torch answers.  Its CUDA
torch tensors are torch.Tensor subclasses that report cuda:0 and lie over
a gpuaccel array's device memory; on the simulator (GPUACCEL_SIM=1) an
access on a stream not ordered after the one that wrote that memory is an
ordering violation, which fails the child.
"""

import textwrap

import pytest

from helpers import run_python

pytestmark = pytest.mark.cuda
pytest.importorskip("torch")

PRELUDE = """
import os

import numpy as np
import torch

# torch's stream lookup through torch._C, which the scenario replaces, not
# through torch's DLPack C exchange table (whose answer it cannot change)
os.environ["GPUACCEL_NO_DLPACK_EXCHANGE"] = "1"

ANSWER = None   # what torch's stream lookup answers: a handle, or an exception to raise

def torch_current_raw_stream(device):
    if isinstance(ANSWER, BaseException):
        raise ANSWER
    return ANSWER

torch._C._cuda_getCurrentRawStream = torch_current_raw_stream

import gpuaccel as ga

class CudaTensor(torch.Tensor):
    # a torch tensor on cuda:0 whose memory is a gpuaccel array's
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def over(array):
        t = torch.empty(array.shape, dtype=getattr(torch, array.dtype)).as_subclass(CudaTensor)
        t.array = array
        return t

    @property
    def is_cuda(self):
        return True

    def get_device(self):
        return self.array.device.index

    def data_ptr(self):
        return self.array.data_ptr

def on_device(values, stream):
    # values written to device memory on `stream`, and a CUDA torch tensor over it
    with stream:
        array = ga.asarray(values, device="cuda:0")
    return CudaTensor.over(array)
"""


def run_child(code):
    proc = run_python("-c", PRELUDE + textwrap.dedent(code), timeout=300)
    assert proc.returncode == 0 and "ordering violation" not in proc.stderr, proc.stderr[-3000:]
    return proc.stdout.split()


def test_ops_and_logger_read_torch_tensors_on_torchs_current_stream(rng):
    seed = int(rng.integers(2**31))
    out = run_child("""
        rng = np.random.default_rng(%d)
        torch_stream = ga.Stream(device="cuda:0")
        ANSWER = torch_stream.handle
        a = rng.standard_normal((37, 19)).astype(np.float32)
        b = rng.standard_normal((19, 23)).astype(np.float32)
        losses = rng.standard_normal(11).astype(np.float32)
        # written on torch's stream; gpuaccel has no stream of its own set
        y = ga.matmul(on_device(a, torch_stream), on_device(b, torch_stream))
        np.testing.assert_allclose(y.numpy(), a @ b, rtol=1e-5, atol=1e-5)
        log = ga.LossLogger(every=4)
        for loss in losses:
            log.log(loss=on_device(loss, torch_stream))
        log.flush()
        np.testing.assert_array_equal(log.history("loss"), losses.astype(np.float64))
        print("ok")
    """ % seed)
    assert out == ["ok"]


def test_torchs_stream_0_is_the_legacy_default_stream(rng):
    # torch names the legacy default stream 0; the logger follows torch's
    # stream before gpuaccel's current one, so reading on `other` here
    # (0 taken for "no answer") would race with the writes on the legacy stream
    seed = int(rng.integers(2**31))
    out = run_child("""
        rng = np.random.default_rng(%d)
        legacy = ga.Stream.from_handle(1, device="cuda:0")
        ANSWER = 0
        a = rng.standard_normal((5, 7)).astype(np.float32)
        y = ga.linear(on_device(a, legacy), on_device(a, legacy))
        np.testing.assert_allclose(y.numpy(), a @ a.T, rtol=1e-5, atol=1e-5)
        other = ga.Stream(device="cuda:0")
        with other:
            mine = ga.asarray(np.float32(2.5), device="cuda:0")   # a gpuaccel value made on `other`
        log = ga.LossLogger(every=2)
        for k in range(5):
            loss = on_device(np.float32(k), legacy)
            with other:
                log.log(loss=loss, mine=mine)
        log.flush()
        np.testing.assert_array_equal(log.history("loss"), np.arange(5.0))
        np.testing.assert_array_equal(log.history("mine"), np.full(5, 2.5))
        print("ok")
    """ % seed)
    assert out == ["ok"]


def test_a_failing_torch_stream_lookup_is_raised_not_dropped():
    out = run_child("""
        ANSWER = RuntimeError("torch cannot name its stream")
        legacy = ga.Stream.from_handle(1, device="cuda:0")
        x = on_device(np.ones((3, 3), np.float32), legacy)
        # gpuaccel arrays and CPU tensors never ask torch
        log = ga.LossLogger(every=2)
        log.log(loss=ga.ones((), device="cuda:0"), cpu=torch.tensor(1.0))
        ga.matmul(ga.ones((3, 3), device="cuda:0"), ga.ones((3, 3), device="cuda:0"))
        for name, call in [("matmul", lambda: ga.matmul(x, x)),
                           ("LossLogger.log", lambda: log.log(loss=on_device(np.float32(1), legacy)))]:
            try:
                call()
            except RuntimeError as e:
                assert "torch cannot name its stream" in str(e), (name, e)
                print(name, "raised")
            else:
                print(name, "ran on another stream than torch's")
    """)
    assert " ".join(out) == "matmul raised LossLogger.log raised"


def test_an_op_on_gpuaccels_stream_is_ordered_both_ways_with_torchs(rng):
    # `with gpuaccel.Stream():` over CUDA torch tensors: the op waits for
    # torch's current stream (which wrote its inputs and may still read an
    # out= tensor), and torch's stream waits for the op afterwards, so that
    # torch reusing an input's memory (its caching allocator does so in its
    # stream's order) or reading the result comes after it
    seed = int(rng.integers(2**31))
    out = run_child("""
        rng = np.random.default_rng(%d)
        torch_stream = ga.Stream(device="cuda:0")
        ANSWER = torch_stream.handle
        a = rng.standard_normal((37, 19)).astype(np.float32)
        w = rng.standard_normal((23, 19)).astype(np.float32)
        x_t, w_t = on_device(a, torch_stream), on_device(w, torch_stream)
        out_t = on_device(np.zeros((37, 23), np.float32), torch_stream)
        with torch_stream:
            out_t.array.astype("float64")   # torch reads the out= tensor's old contents
        with ga.Stream(device="cuda:0"):
            ga.linear(x_t, w_t, activation="relu", out=out_t)
            y = ga.matmul(x_t, w_t.array.T)
        with torch_stream:
            # torch reuses the inputs' memory and reads the result
            x_t.array[...] = 0.0
            w_t.array[...] = 0.0
            got = out_t.array.astype("float64")
        torch_stream.synchronize()
        np.testing.assert_allclose(got.numpy(), np.maximum(a @ w.T, 0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(y.numpy(), a @ w.T, rtol=1e-5, atol=1e-5)
        print("ok")
    """ % seed)
    assert out == ["ok"]


def test_an_op_captured_on_gpuaccels_stream_does_not_wait_on_torchs_eager_stream(rng):
    # inside a capture of gpuaccel's stream no event from torch's (eager)
    # stream may be waited on: CUDA would refuse it and invalidate the capture
    seed = int(rng.integers(2**31))
    out = run_child("""
        rng = np.random.default_rng(%d)
        torch_stream = ga.Stream(device="cuda:0")
        ANSWER = torch_stream.handle
        a = rng.standard_normal((9, 5)).astype(np.float32)
        x_t = on_device(a, torch_stream)
        out_t = on_device(np.zeros((9, 9), np.float32), torch_stream)
        capture = ga.Stream(device="cuda:0")
        with capture:
            capture.wait_stream(torch_stream)
            ga.linear(x_t, x_t, out=out_t)   # the warm-up
        torch_stream.wait_stream(capture)
        g = ga.Graph()
        g.capture_begin(capture)
        with capture:
            ga.linear(x_t, x_t, out=out_t)
        g.capture_end()
        capture.wait_stream(torch_stream)
        g.replay(capture)
        capture.synchronize()
        np.testing.assert_allclose(out_t.array.numpy(), a @ a.T, rtol=1e-5, atol=1e-5)
        print("ok")
    """ % seed)
    assert out == ["ok"]
