"""Ownership and lifetime across exchanges: no reference, object or memory
growth, deleters safe in any thread and at interpreter exit."""

import gc
import sys
import textwrap
import threading

import numpy as np
import pytest

import gpuaccel as ga

from helpers import rss_bytes, run_python

torch = pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")


def test_no_growth_over_100k_exchanges():
    a = ga.asarray(np.arange(64, dtype=np.float32))
    t0 = torch.arange(64, dtype=torch.float32)
    x = np.arange(8.0)

    def round_trips(n):
        for _ in range(n):
            t = torch.from_dlpack(a)             # gpuaccel -> torch
            b = ga.from_dlpack(t)                # torch -> gpuaccel
            c = ga.from_dlpack(t0)               # torch -> gpuaccel
            d = torch.from_dlpack(c)
            e = np.from_dlpack(ga.from_dlpack(x))  # numpy -> gpuaccel -> numpy
            del t, b, c, d, e

    round_trips(2000)  # warm up allocator caches
    gc.collect()
    refs, objs, mem = sys.getrefcount(a), len(gc.get_objects()), ga.memory_stats("cpu")["allocated_bytes"]
    before = rss_bytes()
    round_trips(100_000)
    gc.collect()
    assert sys.getrefcount(a) == refs
    assert len(gc.get_objects()) <= objs + 50
    assert ga.memory_stats("cpu")["allocated_bytes"] == mem
    after = rss_bytes()  # None under a sanitizer build: there leaks are LeakSanitizer's job
    assert before is None or after - before < 8 << 20, "RSS grew by %d bytes" % (after - before)


def test_no_growth_over_array_churn():
    def churn(n):
        for _ in range(n):
            a = ga.zeros((3, 5), dtype="float16")
            b = a[1:, ::2].T.reshape(-1).astype("float32")
            a[0] = b[:5]
            b.numpy()
            repr(a)
            del a, b

    churn(2000)
    gc.collect()
    objs, mem = len(gc.get_objects()), ga.memory_stats("cpu")["allocated_bytes"]
    before = rss_bytes()
    churn(50_000)
    gc.collect()
    assert len(gc.get_objects()) <= objs + 50
    assert ga.memory_stats("cpu")["allocated_bytes"] == mem
    after = rss_bytes()
    assert before is None or after - before < 8 << 20, "RSS grew by %d bytes" % (after - before)


def test_deleter_runs_in_another_thread():
    a = ga.zeros(1000)
    refs = sys.getrefcount(a)
    tensors = [torch.from_dlpack(a) for _ in range(50)]
    assert sys.getrefcount(a) == refs + 50

    def drop(ts):
        ts.clear()

    worker = threading.Thread(target=drop, args=(tensors,))
    worker.start()
    worker.join()
    gc.collect()
    assert sys.getrefcount(a) == refs


def test_owner_lives_exactly_as_long_as_its_views():
    import weakref

    a = ga.zeros(10)
    ref = weakref.ref(a)
    t = torch.from_dlpack(a)
    v = ga.from_dlpack(t)[2:4]
    del a
    gc.collect()
    assert ref() is not None  # torch's tensor and our view still use it
    del t
    gc.collect()
    assert ref() is not None  # the view goes through torch's tensor, still alive in v
    del v
    gc.collect()
    assert ref() is None


def test_exit_with_live_exports_is_clean():
    script = textwrap.dedent(
        """
        import numpy as np, torch, gpuaccel as ga
        keep_tensor = torch.from_dlpack(ga.zeros(100))
        keep_capsule = ga.zeros(5).__dlpack__(max_version=(1, 0))
        keep_legacy = ga.zeros(5).__dlpack__()
        keep_import = ga.from_dlpack(torch.ones(7))
        keep_view = keep_import[1:3]
        keep_cycle = [ga.zeros(3)]
        keep_cycle.append(keep_cycle)
        print("ok")
        """
    )
    result = run_python("-c", script)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
