"""Stream ordering of the CUDA paths, checked on a simulated GPU.

Runs only against a simulator build (GPUACCEL_SIM=1, kernels/sim.c): two
simulated devices whose runtime records, with vector clocks, what every
queued operation is guaranteed to follow under CUDA's rules, and fails the
call that makes an access that is not ordered (use before allocation,
unordered read/write, free before a use finished), printing the violation on
stderr too.  Each scenario runs in a child process whose stderr is checked,
so that a violation whose error was dropped (a free in a dealloc reports an
unraisable warning) still fails the test.
`.ci/run` builds the simulator in a copy of the tree and runs this file.
"""

import os
import subprocess
import sys
import textwrap

import pytest

import gpuaccel as ga


def _simulated():
    try:
        return ga.cuda_available() and ga.device_properties(0)["name"].startswith("gpuaccel simulated")
    except Exception:
        return False


pytestmark = pytest.mark.skipif(not _simulated(), reason="needs a simulator build (GPUACCEL_SIM=1)")

PRELUDE = """
import threading
import numpy as np
import gpuaccel as ga
"""


def run_sim(code, devices=2):
    env = dict(os.environ, GPUACCEL_SIM_DEVICES=str(devices))
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300)
    return proc


def assert_ordered(code, devices=2):
    proc = run_sim(code, devices)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ordering violation" not in proc.stderr
    return proc.stdout


def test_the_checker_catches_a_race():
    # the user's side of the contract: work on two streams that touch the
    # same memory must be ordered by the user (as in torch and CuPy)
    proc = run_sim("""
        a = ga.zeros((1000,), device="cuda:0")
        s1, s2 = ga.Stream(), ga.Stream()
        with s1:
            a[...] = 1.0
        with s2:
            a[...] = 2.0   # not ordered after s1's write
    """)
    assert proc.returncode != 0
    assert "ordering violation: write not ordered after the last write" in proc.stderr


def test_the_same_with_the_users_wait_is_ordered():
    out = assert_ordered("""
        a = ga.zeros((1000,), device="cuda:0")
        s1, s2 = ga.Stream(), ga.Stream()
        with s1:
            a[...] = 1.0
        s2.wait_stream(s1)
        with s2:
            a[...] = 2.0
        s2.synchronize()
        print(a.numpy().sum())
    """)
    assert out.split() == ["2000.0"]


def test_first_use_on_another_stream_follows_the_allocation_stream():
    out = assert_ordered("""
        x = np.arange(1000, dtype=np.float32)
        a = ga.asarray(x, device="cuda:0")          # legacy stream
        with ga.Stream():
            b = a.astype("float64")                  # gpuaccel orders this first use
            c = b.copy()
        print(float(c.numpy().sum()) == float(x.sum()))
    """)
    assert out.split() == ["True"]


def test_freeing_follows_uses_on_other_streams_and_devices():
    assert_ordered("""
        for _ in range(3):
            a = ga.full((4096,), 3.0, device="cuda:0")
            side = ga.Stream()
            with side:
                b = a.astype("float64")              # read on a side stream
            c = a.to("cuda:1")                       # read by a copy on cuda:1
            del a                                    # freed after both reads
            assert b.numpy().min() == 3.0 and c.numpy().min() == 3.0
    """)


def test_peer_copy_between_legacy_streams():
    # cuda:0's and cuda:1's legacy streams are two streams: the copy on
    # cuda:1 must follow the fill on cuda:0 and the free must follow the copy
    out = assert_ordered("""
        a = ga.full((1000,), 1.0, device="cuda:0")
        b = a.to("cuda:1")
        del a
        with ga.Stream(device="cuda:0"):
            c = ga.full((1000,), 7.0, device="cuda:0")
        print(b.numpy().min(), b.numpy().max())
    """)
    assert out.split() == ["1.0", "1.0"]


def test_per_thread_stream_arrays_dropped_by_another_thread():
    out = assert_ordered("""
        made = {}
        def producer():
            with ga.Stream.from_handle(2):
                a = ga.full((1000,), 1.0, device="cuda:0")
                out = ga.empty(a.shape, device="cuda:0")
                out[...] = a
            made["a"], made["out"] = a, out
        t = threading.Thread(target=producer)
        t.start(); t.join()
        del made["a"]                      # freed by this thread, not its maker
        with ga.Stream():
            b = ga.full((1000,), 5.0, device="cuda:0")
        ga.synchronize("cuda:0")
        print(made["out"].numpy().max())
        del made["out"]                    # the same, after the host saw it done
    """)
    assert out.split() == ["1.0"]


def test_per_thread_streams_of_two_threads_using_one_array():
    # handle 2 names a different stream in each thread: a use from a second
    # thread's per-thread stream is recorded as its own
    assert_ordered("""
        a = ga.full((1000,), 2.0, device="cuda:0")
        results = []
        def user():
            with ga.Stream.from_handle(2):
                results.append(a.astype("float64"))
        threads = [threading.Thread(target=user) for _ in range(3)]
        for t in threads:
            t.start(); t.join()
        del a
        ga.synchronize("cuda:0")
        assert all(r.numpy().min() == 2.0 for r in results)
    """)


def test_dlpack_export_to_a_consumer_stream():
    assert_ordered("""
        a = ga.full((1000,), 4.0, device="cuda:0")
        consumer = ga.Stream()
        with ga.Stream():
            a[...] = 5.0       # written on a producer side stream...
            capsule = a.__dlpack__(stream=consumer.handle)  # ...which the consumer waits for
        del capsule
        with consumer:
            c = a.astype("float64")
        del a
        consumer.synchronize()
        assert c.numpy().min() == 5.0
    """)


def test_loader_batches_used_on_other_streams():
    assert_ordered("""
        x = np.random.default_rng(0).standard_normal((1000, 7)).astype(np.float32)
        y = np.arange(1000, dtype=np.int64)
        loader = ga.PinnedLoader([x, y], 64, shuffle=True, seed=3, device="cuda:0", output="gpuaccel")
        side = ga.Stream()
        for epoch in range(2):
            loader.set_epoch(epoch)
            seen = []
            for bx, by in loader:
                with side:
                    s = bx.astype("float64")
                idx = by.numpy()
                np.testing.assert_array_equal(s.numpy(), x[idx].astype(np.float64))
                seen.append(idx)
                del bx, by, s
            np.testing.assert_array_equal(np.sort(np.concatenate(seen)), y)  # each sample once
    """)


def test_random_programs_over_streams_threads_and_devices():
    # arrays are made, copied, written and dropped on random streams of two
    # devices and in worker threads; the user orders data dependencies with
    # wait_stream (their part of the contract), gpuaccel orders allocation,
    # first use and freeing (its part); every value is checked against NumPy
    assert_ordered("""
        rng = np.random.default_rng(12345)
        devs = [0, 1]
        streams = {d: [ga.Stream.from_handle(1, device=d), ga.Stream(device=d), ga.Stream(device=d)]
                   for d in devs}
        live = {}      # name -> (array, expected numpy, device, stream index that last touched it)
        counter = [0]

        def on(d, k):
            return streams[d][k]

        def sync_for(entry, d, k):
            _, _, ed, ek = entry
            if (ed, ek) != (d, k):
                on(d, k).wait_stream(on(ed, ek))

        def step():
            op = rng.integers(0, 6)
            d = int(rng.integers(0, 2)); k = int(rng.integers(0, 3))
            names = list(live)
            if op == 0 or not names:
                n = int(rng.integers(1, 3000)); v = float(rng.integers(-9, 9))
                with on(d, k):
                    arr = ga.full((n,), v, device="cuda:%d" % d)
                counter[0] += 1
                live["a%d" % counter[0]] = (arr, np.full(n, v, np.float32), d, k)
            elif op == 1:
                name = names[rng.integers(len(names))]
                arr, ref, ed, ek = live[name]
                sync_for(live[name], ed, k)
                with on(ed, k):
                    out = arr.astype("float64")
                counter[0] += 1
                live["a%d" % counter[0]] = (out, ref.astype(np.float64), ed, k)
                live[name] = (arr, ref, ed, k)
            elif op == 2:
                name = names[rng.integers(len(names))]
                arr, ref, ed, ek = live[name]
                sync_for(live[name], d, k)   # the copy runs on the destination's stream
                with on(d, k):
                    out = arr.to("cuda:%d" % d) if d != ed else arr.copy()
                counter[0] += 1
                live["a%d" % counter[0]] = (out, ref.copy(), d, k)
                live[name] = (arr, ref, ed, ek)
                if ed != d:    # and the source was read by cuda:d's stream
                    on(ed, ek).wait_stream(on(d, k))
            elif op == 3:
                name = names[rng.integers(len(names))]
                arr, ref, ed, ek = live[name]
                v = float(rng.integers(-9, 9))
                sync_for(live[name], ed, k)
                with on(ed, k):
                    arr[1::2] = v
                ref = ref.copy(); ref[1::2] = v
                live[name] = (arr, ref, ed, k)
            elif op == 4:
                name = names[rng.integers(len(names))]
                arr, ref, ed, ek = live.pop(name)
                del arr        # no user sync: freeing is gpuaccel's part
            else:
                name = names[rng.integers(len(names))]
                arr, ref, ed, ek = live[name]
                on(ed, ek).synchronize()
                np.testing.assert_array_equal(arr.numpy(), ref)

        for _ in range(400):
            step()
        for name in list(live):
            arr, ref, ed, ek = live.pop(name)
            on(ed, ek).synchronize()
            np.testing.assert_array_equal(arr.numpy(), ref)
            del arr
        print("ok")
    """)
