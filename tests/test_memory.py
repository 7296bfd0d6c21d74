"""Allocator statistics, limits and out-of-memory errors (host side; the
device pool is covered in test_cuda.py)."""

import numpy as np
import pytest

import gpuaccel as ga


def test_stats_count_allocations():
    before = ga.memory_stats("cpu")
    a = ga.empty(1000, dtype="uint8")
    during = ga.memory_stats("cpu")
    assert during["allocated_bytes"] - before["allocated_bytes"] == 1000
    assert during["num_allocs"] == before["num_allocs"] + 1
    assert during["peak_allocated_bytes"] >= during["allocated_bytes"]
    assert during["device"] == "cpu" and during["limit_bytes"] is None
    del a
    after = ga.memory_stats("cpu")
    assert after["allocated_bytes"] == before["allocated_bytes"]
    assert after["num_frees"] == before["num_frees"] + 1
    keys = {"allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "limit_bytes", "num_allocs",
            "num_frees", "num_ooms", "pinned_allocated_bytes", "pinned_cached_bytes"}
    assert keys <= set(after)


def test_limit_raises_out_of_memory_and_recovers(no_limit):
    base = ga.memory_stats("cpu")["allocated_bytes"]
    ga.set_memory_limit(base + (1 << 20), device="cpu")
    keep = ga.empty(1 << 19, dtype="uint8")
    with pytest.raises(ga.OutOfMemoryError) as info:
        ga.empty(1 << 20, dtype="uint8")
    err = info.value
    assert isinstance(err, MemoryError) and isinstance(err, ga.CudaError) and isinstance(err, RuntimeError)
    text = str(err)
    assert "1.00 MiB" in text and "limit" in text and "set_memory_limit" in text and "cpu" in text
    assert ga.memory_stats("cpu")["num_ooms"] >= 1
    # conversions that would allocate fail the same way, and leave nothing behind
    with pytest.raises(ga.OutOfMemoryError):
        ga.asarray(np.zeros(1 << 18)).astype("float64", copy=True)
    del keep
    ok = ga.empty(1 << 19, dtype="uint8")  # fits again once memory was returned
    assert ok.nbytes == 1 << 19
    ga.set_memory_limit(None, device="cpu")
    assert ga.memory_stats("cpu")["limit_bytes"] is None
    assert ga.empty(1 << 21, dtype="uint8").nbytes == 1 << 21


def test_fractional_limit(no_limit):
    ga.set_memory_limit(0.5, device="cpu")
    limit = ga.memory_stats("cpu")["limit_bytes"]
    import os

    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE")
    assert abs(limit - total / 2) <= 1


@pytest.mark.parametrize(
    "limit,exc,words",
    [(-5, ValueError, "positive"), (0, ValueError, "positive"), (0.0, ValueError, "fraction"),
     (1.5, ValueError, "fraction"), ("1GB", TypeError, "int \\(bytes\\)"), (True, TypeError, "int")],
)
def test_bad_limits(limit, exc, words, no_limit):
    with pytest.raises(exc, match=words):
        ga.set_memory_limit(limit, device="cpu")


def test_empty_cache_and_default_device_stats():
    ga.empty_cache()
    stats = ga.memory_stats()
    assert stats["device"] == ("cpu" if not ga.cuda_available() else stats["device"])
    with pytest.raises(ValueError):
        ga.memory_stats("nowhere")
