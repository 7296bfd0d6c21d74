"""A CUDA conv call and its plan: one key for the backend's plan cache and
the tuning file (kernels/conv_key.h), the file read only when the process
has no choice for a key, no Python at all on a plan-cache hit, and the
search run without the GIL.

On the simulator build the plan cache is the simulator's stand-in for
cuDNN's (keyed by the same function), and GPUACCEL_SIM_TUNE_SECONDS makes
its search take wall time; on a GPU the same tests run against cuDNN."""

import os
import sys
import threading
import time

import numpy as np
import pytest

import gpuaccel as ga

from helpers import simulated

pytestmark = pytest.mark.cuda


@pytest.fixture
def tuning_calls(tmp_path, monkeypatch):
    """A fresh tuning file, and every lookup and store csrc/conv.c makes
    through gpuaccel._tuning: [(name, key)]."""
    from gpuaccel import _tuning

    monkeypatch.setenv("GPUACCEL_CACHE_DIR", str(tmp_path))
    _tuning.forget()
    calls = []
    lookup, store = _tuning.lookup, _tuning.store

    def counted_lookup(device, key):
        calls.append(("lookup", key))
        return lookup(device, key)

    def counted_store(device, key, choice):
        calls.append(("store", key))
        return store(device, key, choice)

    monkeypatch.setattr(_tuning, "lookup", counted_lookup)
    monkeypatch.setattr(_tuning, "store", counted_store)
    yield calls
    _tuning.forget()


def new_shape(rng):
    """A layer no other test of the process has run (the plan cache lives as
    long as the process): odd sizes drawn at random."""
    n, c, k = int(rng.integers(1, 3)), int(rng.integers(2, 6)), int(rng.integers(2, 7))
    h, w = int(rng.integers(5, 40)), int(rng.integers(5, 40))
    x = ga.asarray(rng.standard_normal((n, c, h, w)).astype(np.float32), device="cuda")
    wt = ga.asarray(rng.standard_normal((k, c, 3, 3)).astype(np.float32), device="cuda")
    b = ga.asarray(rng.standard_normal(k).astype(np.float32), device="cuda")
    return x, wt, b


def train_step(x, w, b):
    """A layer's forward and backward: three convolutions (forward, input
    gradient, weight gradient)."""
    y = ga.conv2d(x, w, b, padding=1, activation="relu")
    return ga.conv2d_backward(y, x, w, padding=1, activation="relu", y=y)


def python_calls_during(fn):
    """The Python functions entered while fn runs (this file's excluded)."""
    entered = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename != __file__:
            entered.append("%s:%s" % (os.path.basename(frame.f_code.co_filename), frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return entered


def test_a_plan_cache_hit_calls_no_python(rng, tuning_calls):
    x, w, b = new_shape(rng)
    # the misses: set up, tuned, written to the file — Python that C calls is seen
    entered = python_calls_during(lambda: train_step(x, w, b))
    assert "_tuning.py:lookup" in entered and "_tuning.py:store" in entered, entered
    ga.synchronize()
    before = ga.conv_stats()
    entered = python_calls_during(lambda: train_step(x, w, b))
    assert entered == [], entered
    after = ga.conv_stats()
    assert after["plan_cache_hits"] - before["plan_cache_hits"] == 3
    assert after["plan_cache_misses"] == before["plan_cache_misses"]


def test_one_key_and_the_file_read_only_on_a_miss(rng, tuning_calls):
    x, w, b = new_shape(rng)
    before = ga.conv_stats()
    train_step(x, w, b)
    after = ga.conv_stats()
    assert after["plan_cache_misses"] - before["plan_cache_misses"] == 3
    lookups = [key for name, key in tuning_calls if name == "lookup"]
    stores = [key for name, key in tuning_calls if name == "store"]
    # one lookup per convolution, under the backend's key (which names the op, the
    # dtype and every tensor), and the choice stored under the very same key
    assert [k.split()[:3] for k in lookups] == [["conv2d.v2", op, "float32"]
                                                 for op in ("fwd", "bwd_data", "bwd_filter")], lookups
    if simulated():  # cuDNN's own search may find the file's choice there already
        assert stores == lookups, (stores, lookups)
    assert set(stores) <= set(lookups)
    del tuning_calls[:]
    for _ in range(3):
        train_step(x, w, b)
    assert tuning_calls == [], tuning_calls  # hits: the file is not read again
    # another layout of the same layer is another problem: another key
    nhwc = [ga.asarray(a.to("cpu").numpy().transpose(0, 2, 3, 1).copy(), device="cuda") for a in (x, w)]
    ga.conv2d(nhwc[0], nhwc[1], b, padding=1, layout="NHWC")
    (name, key), = [c for c in tuning_calls if c[0] == "lookup"]
    assert key not in lookups and key.split()[:2] == ["conv2d.v2", "fwd"], key


@pytest.mark.skipif(not simulated(), reason="the simulator's search is made to take a known time")
def test_the_search_runs_without_the_gil(rng, tuning_calls, monkeypatch):
    """While a new shape is tuned (GPUACCEL_SIM_TUNE_SECONDS of wall time
    per convolution), another Python thread runs."""
    x, w, b = new_shape(rng)
    counter = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counter[0] += 1

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        time.sleep(0.05)
        start_count, t0 = counter[0], time.perf_counter()
        time.sleep(0.3)  # the GIL released by a sleep: the thread's pace
        rate = (counter[0] - start_count) / (time.perf_counter() - t0)
        monkeypatch.setenv("GPUACCEL_SIM_TUNE_SECONDS", "0.3")
        start_count, t0 = counter[0], time.perf_counter()
        ga.conv2d(x, w, b, padding=1)
        took, spun = time.perf_counter() - t0, counter[0] - start_count
        monkeypatch.delenv("GPUACCEL_SIM_TUNE_SECONDS")
        # a hit takes no time: the thread hardly runs (the GIL is held throughout)
        start_count = counter[0]
        ga.conv2d(x, w, b, padding=1)
        spun_on_hit = counter[0] - start_count
    finally:
        stop.set()
        thread.join()
    assert took >= 0.3
    # with the GIL held through the search the thread would have spun for a
    # switch interval (5 ms) at most
    assert spun >= 0.5 * rate * 0.3, (spun, rate)
    assert spun_on_hit < spun / 10, (spun_on_hit, spun)


def test_a_new_thread_sets_up_its_own_plan_without_reading_the_file(rng, tuning_calls):
    """cuDNN plans are kept per thread (per handle): another thread's first
    call of a known shape builds its plan from the process's choice."""
    x, w, b = new_shape(rng)
    ga.conv2d(x, w, b, padding=1)
    del tuning_calls[:]
    errors = []

    def other():
        try:
            ga.conv2d(x, w, b, padding=1)
        except (ga.CudaError, RuntimeError, ValueError) as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert not errors, errors
    assert tuning_calls == [], tuning_calls
    ref = ga.conv2d(x.to("cpu"), w.to("cpu"), b.to("cpu"), padding=1)
    np.testing.assert_allclose(ga.conv2d(x, w, b, padding=1).to("cpu").numpy(), ref.numpy(),
                               rtol=1e-4, atol=1e-4 * np.sqrt(w.size))


def channels_last(rng, n, c, h, w, keep):
    """An (N, C, H, W) CUDA array in channels-last memory (a view through
    __cuda_array_interface__ of a dense NHWC array, appended to `keep`)."""
    values = rng.standard_normal((n, h, w, c)).astype(np.float32)
    base = ga.asarray(values, device="cuda")
    keep.append(base)

    class View:
        __cuda_array_interface__ = {"shape": (n, c, h, w), "strides": (h * w * c * 4, 4, w * c * 4, c * 4),
                                    "typestr": "<f4", "data": (base.data_ptr, False), "version": 3,
                                    "stream": None}

    x = ga.asarray(View(), device="cuda")
    assert x.strides == (h * w * c * 4, 4, w * c * 4, c * 4)
    return x, values.transpose(0, 3, 1, 2)


@pytest.mark.parametrize("stride", [1, 2])
def test_a_channels_last_input_with_an_nchw_weight(rng, stride):
    """torch's channels_last models pass such calls: on a GPU the weight (and
    the weight gradient) reach cuDNN as packed channels-last copies; every
    result matches the CPU backend."""
    keep = []
    n, c, h, w, k = 2, 8, 11, 9, 16
    x, x_ref = channels_last(rng, n, c, h, w, keep)
    wt = rng.standard_normal((k, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    geo = dict(stride=stride, padding=1)
    y = ga.conv2d(x, ga.asarray(wt, device="cuda"), ga.asarray(b, device="cuda"), activation="relu", **geo)
    y_ref = ga.conv2d(ga.asarray(x_ref), ga.asarray(wt), ga.asarray(b), activation="relu", **geo)
    tol = dict(rtol=1e-5, atol=1e-5 * np.sqrt(c * 9))
    np.testing.assert_allclose(y.to("cpu").numpy(), y_ref.numpy(), **tol)
    gy, gy_ref = channels_last(rng, n, k, *y.shape[2:], keep)
    got = ga.conv2d_backward(gy, x, ga.asarray(wt, device="cuda"), activation="relu", y=y, **geo)
    ref = ga.conv2d_backward(ga.asarray(gy_ref), ga.asarray(x_ref), ga.asarray(wt), activation="relu", y=y_ref,
                             **geo)
    for g, r, terms in zip(got, ref, (k * 9, n * y.shape[2] * y.shape[3], n * y.shape[2] * y.shape[3])):
        np.testing.assert_allclose(g.to("cpu").numpy(), r.numpy(), rtol=1e-5, atol=1e-5 * np.sqrt(terms))
    assert got[1].strides == (c * 9 * 4, 9 * 4, 3 * 4, 4)  # the weight gradient in the weight's own layout


@pytest.mark.skipif(not simulated(), reason="the simulator's search is made to take a known time")
def test_a_library_call_made_during_the_search_stays_ordered(rng, tuning_calls, monkeypatch):
    """The device's one workspace is given back before the search lets other
    threads run: a call another thread makes on its own stream meanwhile is
    then the workspace's last use, which the next call on the searching
    stream waits for (the simulator reports the unordered write otherwise)."""
    x, w, b = new_shape(rng)
    s1, s2 = ga.Stream(), ga.Stream()
    xm = ga.asarray(rng.standard_normal((37, 19)).astype(np.float32), device="cuda")
    wm = ga.asarray(rng.standard_normal((23, 19)).astype(np.float32), device="cuda")
    with s1:
        ga.conv2d(*new_shape(rng), padding=1)  # the workspace at its full size
    ga.synchronize()
    errors = []

    def other():
        try:
            time.sleep(0.1)  # inside the search below
            with s2:
                ga.linear(xm, wm)  # cuBLASLt's workspace: the device's one
        except (ga.CudaError, RuntimeError, ValueError) as e:  # reported below
            errors.append(e)

    monkeypatch.setenv("GPUACCEL_SIM_TUNE_SECONDS", "0.5")
    thread = threading.Thread(target=other)
    thread.start()
    with s1:
        ga.conv2d(x, w, b, padding=1)
    thread.join()
    monkeypatch.delenv("GPUACCEL_SIM_TUNE_SECONDS")
    assert not errors, errors
    with s1:
        y = ga.linear(xm, wm)  # writes the workspace after s2's call
    want = xm.to("cpu").numpy().astype(np.float64) @ wm.to("cpu").numpy().T.astype(np.float64)
    np.testing.assert_allclose(y.to("cpu").numpy(), want, rtol=1e-4, atol=1e-4 * np.sqrt(19))
