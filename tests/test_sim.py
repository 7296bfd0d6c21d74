"""Stream ordering of the CUDA paths, checked on a simulated GPU.

Runs only against a simulator build (GPUACCEL_SIM=1, kernels/sim/sim.c): two
simulated devices whose runtime records, with vector clocks, what every
queued operation is guaranteed to follow under CUDA's rules, and fails the
call that makes an access that is not ordered (use before allocation,
unordered read/write, free before a use finished), printing the violation on
stderr too.  Each scenario runs in a child process whose stderr is checked,
so that a violation whose error was dropped (a free in a dealloc reports an
unraisable warning) still fails the test.
`.ci/run` builds the simulator in a copy of the tree and runs this file.
"""

import textwrap

import pytest

from helpers import run_python, simulated

pytestmark = pytest.mark.skipif(not simulated(), reason="needs a simulator build (GPUACCEL_SIM=1)")

PRELUDE = """
import threading
import numpy as np
import gpuaccel as ga
"""


def run_sim(code, devices=2, prelude=""):
    return run_python("-c", PRELUDE + prelude + textwrap.dedent(code), env={"GPUACCEL_SIM_DEVICES": str(devices)},
                      timeout=300)


def assert_ordered(code, devices=2, prelude=""):
    proc = run_sim(code, devices, prelude)
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


def test_the_simulated_kernels_are_kernels_cuda_run_by_cudacpu():
    # every launch goes through kernels/cudacpu, which refuses a thread order
    # it does not know: so a cast on the device ran copy.cu's copy_kernel
    proc = run_python("-c", PRELUDE + textwrap.dedent("""
        x = ga.asarray(np.arange(7, dtype=np.float32), device="cuda:0")
        try:
            x.astype("float16")
        except ga.CudaError as e:
            print(e)
    """), env={"GPUACCEL_CUDACPU_SCHEDULE": "sideways"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cudacpu: GPUACCEL_CUDACPU_SCHEDULE=sideways" in proc.stdout, proc.stdout


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


def test_imported_arrays_follow_their_import_stream():
    # an array imported through DLPack or __cuda_array_interface__ is valid
    # on the stream the import ordered the producer for; used on another
    # stream it waits for that one, and dropping it lets the producer's
    # memory go only after those uses
    out = assert_ordered("""
        class CAI:
            def __init__(self, a, stream):
                self.__cuda_array_interface__ = dict(a.__cuda_array_interface__, stream=stream)

        for dev in ["cuda:0", "cuda:1"]:
            s1, s2 = ga.Stream(device=dev), ga.Stream(device=dev)
            with s1:
                a = ga.full((1000,), 3.0, device=dev)
                by_dlpack = ga.from_dlpack(a)               # consumer stream: s1
                by_cai = ga.asarray(CAI(a, s1.handle))
            host = by_cai.numpy()                           # read on the legacy stream
            with s2:
                doubled = by_dlpack[::2].astype("float64")  # a view, read on s2
            del by_dlpack, by_cai, a                        # the producer frees a after both
            with s2:
                b = ga.full((1000,), 9.0, device=dev)       # may reuse a's memory
            print(host.min(), doubled.numpy().max())
    """)
    assert out.split() == ["3.0", "3.0", "3.0", "3.0"]


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


# ------------------------------------------- library kernels on the simulator
# matmul, conv, the activation epilogues, the loader's normalize and the
# logger's update run as their CPU twins over simulated device memory, so
# the CUDA paths of csrc/matmul.c, conv.c, logger.c and loader.c run end to end:
# results are checked against the CPU device, ordering by the simulator.

OPS_PRELUDE = """
# |got - want| <= atol + rtol * |want|, elementwise.  16-bit: a few ulps of
# the output dtype (UNIT: half an ulp) -- the roundings of both sides (the
# CPU once; the simulated GPU's unfused path rounds the product before the
# bias, then the result), each at most an ulp of the tensor's largest
# magnitude where a bias cancels the product -- plus float32 accumulation.
UNIT = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
TOL = {"float32": 2e-5, "float64": 1e-12}

def close(got, want, dt, what):
    g = got.astype("float64").numpy()
    w = want.astype("float64").numpy()
    top = max(1.0, float(np.abs(w).max())) if w.size else 1.0
    if dt in UNIT:
        np.testing.assert_allclose(g, w, rtol=4 * UNIT[dt], atol=4 * UNIT[dt] * top + 1e-5, err_msg=what)
    else:
        np.testing.assert_allclose(g, w, rtol=TOL[dt], atol=TOL[dt] * top, err_msg=what)
"""


def test_ops_on_streams_devices_and_threads_match_the_cpu():
    out = assert_ordered(prelude=OPS_PRELUDE, code="""
        rng = np.random.default_rng(2024)
        devices = ["cuda:0", "cuda:1"]
        dtypes = ["float32", "float64", "float16", "bfloat16"]
        acts = [None, "relu", "gelu", "gelu_tanh", "silu", "hardswish", "sigmoid"]

        def one_case(seed, streams, dev):
            r = np.random.default_rng(seed)
            dt = dtypes[r.integers(4)]
            act = acts[r.integers(len(acts))]
            s_in, s_op = streams[r.integers(len(streams))], streams[r.integers(len(streams))]
            M, K, N = (int(v) for v in r.integers(1, 40, 3))
            lead = (int(r.integers(1, 4)),)
            host = {
                "x": r.standard_normal(lead + (M, K)), "w": r.standard_normal((N, K)),
                "b": r.standard_normal(N), "gy": r.standard_normal(lead + (M, N)),
                "xc": r.standard_normal((2, 3, 9, 11)), "wc": r.standard_normal((5, 3, 3, 3)),
                "bc": r.standard_normal(5), "gyc": None,
            }
            stride, pad = int(r.integers(1, 3)), int(r.integers(0, 2))
            P, Q = (9 + 2 * pad - 3) // stride + 1, (11 + 2 * pad - 3) // stride + 1
            host["gyc"] = r.standard_normal((2, 5, P, Q))
            cpu = {k: ga.asarray(v.astype(np.float32)).astype(dt) for k, v in host.items()}
            with s_in:                       # inputs made on one stream...
                gpu = {k: v.to(dev) for k, v in cpu.items()}
            s_op.wait_stream(s_in)           # ...used on another: the user's ordering

            def run_all(t):   # every op and its backward, on one device's operands
                y, z = ga.linear(t["x"], t["w"], t["b"], activation=act, save_preactivation=True)
                grads = ga.linear_backward(t["gy"], t["x"], t["w"], activation=act, preactivation=z)
                m = ga.matmul(t["x"], t["w"].T, bias=t["b"], activation=act)
                yc, zc = ga.conv2d(t["xc"], t["wc"], t["bc"], stride=stride, padding=pad,
                                   activation=act, save_preactivation=True)
                cgrads = ga.conv2d_backward(t["gyc"], t["xc"], t["wc"], stride=stride, padding=pad,
                                            activation=act, preactivation=zc)
                return (y, z, m, yc, zc) + tuple(grads) + tuple(cgrads)

            with s_op:
                got_all = run_all(gpu)
            del gpu                          # freed while s_op may still read them
            want_all = run_all(cpu)
            what = "%s %s %s" % (dt, act, dev)
            for got, want, name in zip(got_all, want_all,
                                       ["y", "z", "matmul", "conv y", "conv z", "gx", "gw", "gb",
                                        "conv gx", "conv gw", "conv gb"]):
                assert (got is None) == (want is None), name
                if got is None:      # no separate pre-activation without an activation
                    continue
                assert got.device == dev and got.dtype == want.dtype, (name, got, want)
                close(got, want, dt, name + " " + what)   # read back on the legacy stream
            return dt

        seen = set()
        for case in range(16):
            dev = devices[case % 2]
            streams = [ga.Stream.from_handle(1, device=dev), ga.Stream(device=dev), ga.Stream(device=dev)]
            seen.add(one_case(case, streams, dev))

        errors = []
        def worker(k):
            try:
                with ga.Stream.from_handle(2):
                    for i in range(3):
                        one_case(100 + 10 * k + i, [ga.Stream.from_handle(2), ga.Stream()], "cuda:0")
            except BaseException as e:
                errors.append(e)
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not errors, errors
        stats = ga.matmul_stats()
        assert stats["cuda_calls"] > 0 and ga.conv_stats()["cuda_calls"] > 0
        print(sorted(seen))
    """)
    assert out.split() == ["['bfloat16',", "'float16',", "'float32',", "'float64']"]


def test_out_arrays_and_workspaces_across_many_streams():
    # out= made on another stream; more streams than the workspace table
    # holds (the oldest workspace is freed in its stream's order)
    assert_ordered(prelude=OPS_PRELUDE, code="""
        rng = np.random.default_rng(5)
        x = rng.standard_normal((33, 17)).astype(np.float32)
        w = rng.standard_normal((9, 17)).astype(np.float32)
        X, W = ga.asarray(x).to("cuda:0"), ga.asarray(w).to("cuda:0")
        ref = ga.linear(ga.asarray(x), ga.asarray(w), activation="relu")
        outs = []
        for k in range(40):
            maker, user = ga.Stream(), ga.Stream()
            with maker:
                out = ga.empty((33, 9), device="cuda:0")
            user.wait_stream(maker)
            with user:
                outs.append((ga.linear(X, W, activation="relu", out=out), out))
        for y, out in outs:
            assert y is out
            close(out, ref, "float32", "out=")
        # a strided view as input (copied to a describable operand on the op's stream)
        big = ga.asarray(rng.standard_normal((66, 34)).astype(np.float32)).to("cuda:0")
        with ga.Stream():
            y = ga.linear(big[::2, ::2], W)
        close(y, ga.linear(ga.asarray(big.numpy()[::2, ::2]), ga.asarray(w)), "float32", "strided")
    """)


def test_logger_with_values_from_several_streams():
    # the logger's state is updated on each value's stream in turn and read
    # back once per window; closing frees it after the last window's copy
    out = assert_ordered("""
        rng = np.random.default_rng(3)
        vals = rng.standard_normal(53).astype(np.float32)
        got = []
        log = ga.LossLogger(every=7, capacity=64, on_log=lambda step, v: got.append((step, v["loss"])))
        side = [ga.Stream(), ga.Stream.from_handle(1), ga.Stream()]
        for i, v in enumerate(vals):
            with side[i % 3]:
                a = ga.asarray(np.array(v)).to("cuda:0")
                log.log(loss=a, twice=a.astype("float64"))
            del a
        summary = log.flush()
        steps = [s for s, _ in got]
        assert steps == [7, 14, 21, 28, 35, 42, 49, 53], steps
        want = [vals[s - 7 if s % 7 == 0 else 49:s].astype(np.float64).mean() for s in steps]
        np.testing.assert_allclose([m for _, m in got], want, rtol=1e-6)
        np.testing.assert_array_equal(log.history("loss"), vals.astype(np.float64))
        assert summary["twice"]["count"] == 53
        log.close()
        del log
        print("ok")
    """)
    assert out.split() == ["ok"]


def test_loader_normalizes_on_the_device():
    assert_ordered("""
        rng = np.random.default_rng(4)
        imgs = rng.integers(0, 256, (101, 9, 11, 3), dtype=np.uint8)
        labels = np.arange(101)
        mean, std = [0.5, 0.4, 0.45], [0.2, 0.25, 0.3]
        side = ga.Stream()
        for dtype, layout, tol in [("float32", "NCHW", 1e-6), ("bfloat16", "NHWC", 1e-2)]:
            loader = ga.PinnedLoader([imgs, labels], 16, shuffle=True, seed=1, device="cuda:0",
                                     output="gpuaccel", num_threads=3,
                                     transform=ga.ImageNormalize(mean, std, dtype=dtype, layout=layout))
            seen = []
            for epoch in range(2):
                for x, y in loader:
                    idx = y.numpy()
                    want = ((imgs[idx] / 255.0 - np.array(mean)) / np.array(std)).transpose(0, 3, 1, 2)
                    if layout == "NHWC":  # (N, C, H, W) with the channels last in memory
                        assert x.strides[1] == x.itemsize and x.strides[3] == 3 * x.itemsize
                    with side:                      # consumed on another stream
                        got = x.astype("float64")
                    np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol)
                    seen.append(idx)
                    del x, y, got
            np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.repeat(labels, 2))
    """)


def test_host_writes_to_pinned_memory_follow_async_copies_from_it():
    # an async copy from a pinned array may still be reading it: every way
    # the host writes it (or hands it out writable) waits for that copy
    out = assert_ordered("""
        buf = ga.empty((1000,), dtype="float32", pinned=True)
        side = ga.Stream()
        results = []
        writes = [
            lambda k: buf.__setitem__(Ellipsis, float(k)),
            lambda k: buf.numpy().__setitem__(Ellipsis, k),
            lambda k: memoryview(buf).cast("B").__setitem__(slice(0, 4000), np.full(1000, k, np.float32).tobytes()),
            lambda k: np.from_dlpack(buf).__setitem__(Ellipsis, k),
            lambda k: buf.__setitem__(Ellipsis, ga.full((1000,), float(k), device="cuda:0")),
        ]
        for k, write in enumerate(writes * 2):
            write(k)
            with side:
                results.append((k, buf.to("cuda:0")))
        for k, d in results:
            assert d.numpy().min() == k and d.numpy().max() == k, (k, d.numpy()[:3])
        print(len(results))
    """)
    assert out.split() == ["10"]


def test_eight_threads_on_two_simulated_gpus():
    # the thread-safety scenario of test_stress on the CUDA paths: 8 threads
    # at once make arrays on their own streams of both devices, exchange
    # them through DLPack and __cuda_array_interface__, run ops, iterate a
    # loader and log; every value exact (or within dtype tolerance), no
    # deadlock, and every access ordered
    out = assert_ordered(prelude=OPS_PRELUDE, code="""
        x_all = np.random.default_rng(0).standard_normal((300, 6)).astype(np.float32)
        y_all = np.arange(300, dtype=np.int64)

        class CAI:
            def __init__(self, a, stream):
                self.__cuda_array_interface__ = dict(a.__cuda_array_interface__, stream=stream)

        errors = []
        barrier = threading.Barrier(8)

        def work(k):
            try:
                r = np.random.default_rng(k)
                dev = "cuda:%d" % (k % 2)
                mine, other = ga.Stream(device=dev), ga.Stream(device=dev)
                log = ga.LossLogger(every=4)
                loader = ga.PinnedLoader([x_all, y_all], 32 + k, shuffle=True, seed=k, device=dev,
                                         output="gpuaccel", num_threads=2)
                barrier.wait()
                logged = []
                for it in range(12):
                    a = r.standard_normal((7 + k, 5)).astype(np.float32)
                    w = r.standard_normal((3, 5)).astype(np.float32)
                    with mine:
                        A = ga.asarray(a, device=dev)
                        W = ga.asarray(w, device=dev)
                        Y = ga.linear(A, W, activation="relu")
                        other.wait_stream(mine)
                        B = ga.from_dlpack(A.__dlpack__(stream=other.handle))   # consumer: other
                        C = ga.asarray(CAI(Y, mine.handle))                      # producer: mine
                        loss = Y.astype("float64")
                        log.log(loss=ga.asarray(np.array(float(it)), device=dev))
                    logged.append(float(it))
                    with other:
                        D = B.astype("float64")
                    np.testing.assert_allclose(C.numpy(), np.maximum(a @ w.T, 0), rtol=1e-5, atol=1e-5)
                    np.testing.assert_array_equal(D.numpy(), a.astype(np.float64))
                    np.testing.assert_allclose(loss.numpy(), np.maximum(a @ w.T, 0), rtol=1e-5, atol=1e-5)
                    if it % 4 == 0:
                        E = A.to("cuda:%d" % (1 - k % 2))                        # peer copy
                        np.testing.assert_array_equal(E.numpy(), a)
                    del A, W, Y, B, C, D, loss
                seen = []
                for bx, by in loader:
                    idx = by.numpy()
                    np.testing.assert_array_equal(bx.numpy(), x_all[idx])
                    seen.append(idx)
                np.testing.assert_array_equal(np.sort(np.concatenate(seen)), y_all)
                summary = log.flush()
                assert summary["loss"]["count"] == 12 and summary["loss"]["mean"] == np.mean(logged)
                log.close()
            except BaseException as e:
                import traceback
                errors.append("thread %d: %s" % (k, traceback.format_exc()))

        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for t in threads: t.start()
        for t in threads: t.join(timeout=240)
        assert not any(t.is_alive() for t in threads), "deadlock"
        assert not errors, "\\n".join(errors)
        print("ok")
    """)
    assert out.split() == ["ok"]
