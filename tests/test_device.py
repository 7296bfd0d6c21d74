"""Devices, streams, events and CUDA availability (CPU-only parts here; the
GPU parts are in test_cuda.py)."""

import os
import pickle
import textwrap

import pytest

import gpuaccel as ga

from helpers import run_python


@pytest.mark.parametrize(
    "spec,text",
    [("cpu", "cpu"), ("cpu:0", "cpu"), ("cuda:1", "cuda:1"), (2, "cuda:2"), (ga.Device("cuda:3"), "cuda:3")],
)
def test_device_parsing(spec, text):
    d = ga.Device(spec)
    assert str(d) == text and repr(d) == "gpuaccel.Device('%s')" % text
    assert d == text and d == ga.Device(text) and hash(d) == hash(ga.Device(text))
    assert pickle.loads(pickle.dumps(d)) == d


def test_device_attributes_and_two_argument_form():
    assert ga.Device("cpu").type == "cpu" and ga.Device("cpu").index is None
    d = ga.Device("cuda", 1)
    assert d.type == "cuda" and d.index == 1 and d != "cuda:0" and d != ga.Device("cpu")
    assert ga.Device("cuda").index >= 0  # the current device
    assert (ga.Device("cpu") == 5) is False


def test_torch_devices():
    torch = pytest.importorskip("torch")
    assert ga.Device(torch.device("cuda:1")) == "cuda:1"
    assert ga.Device(torch.device("cpu")) == "cpu"
    assert ga.Device("cuda:0") == torch.device("cuda:0")


@pytest.mark.parametrize(
    "spec,exc,words",
    [
        ("gpu", ValueError, "unsupported device type 'gpu'"),
        ("cuda:-1", ValueError, "cuda:N"),
        ("cuda:", ValueError, "cuda:N"),
        ("", ValueError, "'cpu', 'cuda' or 'cuda:N'"),
        (-1, ValueError, "must be >= 0"),
        (1.0, TypeError, "device must be a device"),
        (None, TypeError, "needs a device"),
        (True, TypeError, "device must be a device"),
    ],
)
def test_bad_devices(spec, exc, words):
    with pytest.raises(exc, match=words):
        ga.Device(spec)


def test_default_device_round_trip():
    assert ga.default_device() == "cpu"
    try:
        ga.set_default_device("cuda:0")
        assert ga.default_device() == "cuda:0"
    finally:
        ga.set_default_device(None)
    assert ga.default_device() == "cpu"
    with pytest.raises(ValueError):
        ga.set_default_device("nope")


def test_availability_is_consistent():
    info = ga.build_info()
    assert info["built_with_cuda"] == ga.built_with_cuda()
    if not ga.built_with_cuda():
        assert not ga.cuda_available() and info["cuda_archs"] == []
    else:
        assert info["cuda_runtime_built"] >= 12000 and info["cudnn_built"] >= 90000
        assert info["cuda_archs"] and all(a >= 50 for a in info["cuda_archs"])
        assert info["cublaslt_library"] and info["cudnn_library"]
    assert ga.device_count() == (ga.device_count() if ga.cuda_available() else 0)
    assert info["cpu_threads"] >= 1 and info["max_ndim"] == ga.MAX_NDIM == 32


def test_without_cuda_streams_and_events_fail_clearly():
    if ga.cuda_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        ga.Stream(device="cpu")
    with pytest.raises(RuntimeError):
        ga.Stream.from_handle(0)
    e = ga.Event(timing=True)
    assert e.query() and e.timing and "not recorded" in repr(e)
    e.synchronize()  # never recorded: nothing to wait for
    with pytest.raises(RuntimeError):
        e.record()
    with pytest.raises(ValueError, match="both events recorded"):
        e.elapsed_ms(ga.Event(timing=True))
    with pytest.raises(ValueError, match="timing=True"):
        e.elapsed_ms(ga.Event())
    with pytest.raises(TypeError, match="must be a gpuaccel.Event"):
        e.elapsed_ms(3)
    ga.synchronize()
    ga.synchronize("cpu")
    with pytest.raises(RuntimeError):
        ga.synchronize("cuda:0")
    with pytest.raises(RuntimeError):
        ga.device_properties()


def test_forked_child_can_use_the_cpu():
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    script = textwrap.dedent(
        """
        import os, sys
        import numpy as np
        import gpuaccel as ga
        # start the CPU worker pool in the parent, then fork
        x = np.random.default_rng(0).standard_normal(3_000_000)
        ga.asarray(x).astype("float16")
        pid = os.fork()
        if pid == 0:
            y = ga.asarray(x).astype("float32").numpy()  # the pool must restart in the child
            ok = np.array_equal(y, x.astype(np.float32)) and ga.zeros(3).tolist() == [0.0] * 3
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
        """
    )
    result = run_python("-c", script)
    assert result.returncode == 0, result.stderr
