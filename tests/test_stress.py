"""Stress on the CPU backend: every public entry point called thousands of
times must leave nothing behind (references, gc objects, pool bytes, C heap,
RSS: helpers.assert_no_leak), error paths included; 8 Python threads mixing
arrays, DLPack exchanges, ops, loaders and loggers must get exactly the
single-threaded results without deadlocking; long ops release the GIL."""

import math
import os
import sys
import threading
import time
import traceback

import numpy as np
import pytest

import gpuaccel as ga

from helpers import assert_no_leak, native_threads, settle
from ops import SMOOTH_ACTIVATIONS, invalid_activations, logger_windows_ref, op_calls

torch = pytest.importorskip("torch")
pytest.importorskip("psutil")

# ------------------------------------------------------------ leak checks
#
# Each case is a factory: it makes the inputs once and returns the function
# called in the loop (and the objects whose reference counts must not move).


def _raises(fn, exc):
    def call():
        try:
            fn()
        except exc:
            return
        raise AssertionError("%r did not raise %s" % (fn, exc.__name__))

    return call


def _creation_cases():
    nd = np.arange(256, dtype=np.float32).reshape(16, 16)
    nd_strided = np.arange(1024, dtype=np.int16).reshape(32, 32)[::2, 1::3]
    tt = torch.arange(256, dtype=torch.float64).reshape(16, 16)
    nested = [[float(i * 8 + j) for j in range(8)] for i in range(8)]
    bools = [[True, False, True]] * 4
    return {
        "empty": lambda: ((lambda: ga.empty((64, 64), dtype="float32")), ()),
        "empty_bf16": lambda: ((lambda: ga.empty((3, 5, 7), dtype="bfloat16")), ()),
        "zeros": lambda: ((lambda: ga.zeros((32, 32), dtype="int64")), ()),
        "ones": lambda: ((lambda: ga.ones(1000, dtype="float16")), ()),
        "full": lambda: ((lambda: ga.full((8, 9), 2.5, dtype="float64")), ()),
        "zero_size": lambda: ((lambda: ga.zeros((0, 5))), ()),
        "asarray_list": lambda: ((lambda: ga.asarray(nested)), (nested,)),
        "asarray_bool_list": lambda: ((lambda: ga.asarray(bools, dtype="bool")), (bools,)),
        "asarray_numpy": lambda: ((lambda: ga.asarray(nd)), (nd,)),
        "asarray_numpy_copy": lambda: ((lambda: ga.asarray(nd, copy=True)), (nd,)),
        "asarray_numpy_strided": lambda: ((lambda: ga.asarray(nd_strided)), (nd_strided,)),
        "asarray_numpy_astype": lambda: ((lambda: ga.asarray(nd, dtype="bfloat16")), (nd,)),
        "asarray_torch": lambda: ((lambda: ga.asarray(tt)), (tt,)),
        "asarray_array": lambda: ((lambda a=ga.ones(5): ga.asarray(a, copy=True)), ()),
    }


def _array_cases():
    a = ga.asarray(np.arange(240, dtype=np.float32).reshape(12, 20))
    one = ga.full((1, 1), 3.0)
    small = ga.asarray(np.arange(6, dtype=np.int32).reshape(2, 3))

    def setitem():
        a[1:3, ::4] = 7.0

    def churn():
        v = a[2:10:3, ::-2].T
        w = v.reshape(-1)  # copies (not contiguous)
        return w.astype("float16").copy()

    return {
        "to_cpu": lambda: ((lambda: a.to("cpu")), (a,)),
        "astype": lambda: ((lambda: a.astype("float64")), (a,)),
        "astype_bf16": lambda: ((lambda: a.astype("bfloat16")), (a,)),
        "reshape": lambda: ((lambda: a.reshape(20, 12)), (a,)),
        "slicing": lambda: ((lambda: a[3:9, ::3][1]), (a,)),
        "setitem": lambda: (setitem, (a,)),
        "T_and_copy": lambda: (churn, (a,)),
        "numpy": lambda: ((lambda: a.numpy()), (a,)),
        "numpy_bf16": lambda: ((lambda b=a.astype("bfloat16"): b.numpy()), ()),
        "tolist": lambda: ((lambda: small.tolist()), (small,)),
        "item": lambda: ((lambda: one.item()), (one,)),
        "repr": lambda: ((lambda: repr(small)), (small,)),
        "properties": lambda: ((lambda: (a.shape, a.strides, a.dtype, a.device, a.nbytes, a.data_ptr,
                                         a.is_contiguous, a.pinned, a.readonly)), (a,)),
    }


def _dlpack_cases():
    a = ga.asarray(np.arange(64, dtype=np.float32))
    bf = ga.asarray(np.arange(12, dtype=np.float32)).astype("bfloat16")
    empty = ga.zeros((0, 3), dtype="float32")
    t = torch.arange(64, dtype=torch.float32)
    tb = torch.arange(12, dtype=torch.bfloat16)
    te = torch.zeros(3, 0, 2)
    n = np.arange(64.0)
    ne = np.zeros((0,), dtype=np.int8)

    def capsule_dropped():
        a.__dlpack__(max_version=(1, 0))  # never consumed: the capsule's destructor frees it
        a.__dlpack__()

    def raw_capsule():
        return ga.from_dlpack(t.__dlpack__())

    def view_of_import():
        return ga.from_dlpack(t)[3:9].reshape(2, 3)

    return {
        "ga_to_torch": lambda: ((lambda: torch.from_dlpack(a)), (a,)),
        "torch_to_ga": lambda: ((lambda: ga.from_dlpack(t)), (t,)),
        "ga_to_numpy": lambda: ((lambda: np.from_dlpack(a)), (a,)),
        "numpy_to_ga": lambda: ((lambda: ga.from_dlpack(n)), (n,)),
        "round_trip": lambda: ((lambda: ga.from_dlpack(torch.from_dlpack(a))), (a,)),
        "zero_size_ga_to_torch": lambda: ((lambda: torch.from_dlpack(empty)), (empty,)),
        "zero_size_torch_to_ga": lambda: ((lambda: ga.from_dlpack(te)), (te,)),
        "zero_size_numpy_both": lambda: ((lambda: np.from_dlpack(ga.from_dlpack(ne))), (ne,)),
        "bf16_ga_to_torch": lambda: ((lambda: torch.from_dlpack(bf)), (bf,)),
        "bf16_torch_to_ga": lambda: ((lambda: ga.from_dlpack(tb)), (tb,)),
        "capsule_dropped": lambda: (capsule_dropped, (a,)),
        "raw_capsule": lambda: (raw_capsule, (t,)),
        "view_of_import": lambda: (view_of_import, (t,)),
        "asarray_copy_false_torch": lambda: ((lambda: ga.asarray(t, copy=False)), (t,)),
    }


def _op_cases():
    """Every sample of every op in the registry (tests/ops.py), and the
    stats functions."""
    cases = {name: (lambda op=op, s=sample: ((lambda: op.run(s)), tuple(s.inputs())))
             for name, op, sample in op_calls(np.random.default_rng(1))}
    cases["stats"] = lambda: ((lambda: (ga.matmul_stats(), ga.conv_stats(), ga.memory_stats("cpu"))), ())
    return cases


def _error_cases():
    a, b, w = ga.ones((4, 5)), ga.ones((5, 3)), ga.ones((3, 5))
    x, cw = ga.ones((1, 4, 6, 6)), ga.ones((6, 4, 3, 3))
    t = torch.ones(3, requires_grad=True)
    bad = {
        "matmul_shape": (lambda: ga.matmul(a, a), ValueError),
        "matmul_dtype": (lambda: ga.matmul(a, b.astype("float64")), TypeError),
        "matmul_activation": (lambda: ga.matmul(a, b, activation=invalid_activations()[1]), ValueError),
        "matmul_out_shape": (lambda: ga.matmul(a, b, out=ga.empty((3, 3))), ValueError),
        "matmul_int": (lambda: ga.matmul(a.astype("int32"), b.astype("int32")), TypeError),
        "matmul_list": (lambda: ga.matmul([[1.0]], b), TypeError),
        "linear_shape": (lambda: ga.linear(a, b), ValueError),
        "linear_backward_no_preact": (lambda: ga.linear_backward(ga.ones((4, 3)), a, w,
                                                                 activation=SMOOTH_ACTIVATIONS[0]), ValueError),
        "conv2d_groups": (lambda: ga.conv2d(x, cw, groups=2), ValueError),
        "conv2d_bias": (lambda: ga.conv2d(x, cw, ga.ones(5)), ValueError),
        "conv2d_backward_shape": (lambda: ga.conv2d_backward(ga.ones((1, 6, 5, 4)), x, cw), ValueError),
        "asarray_ragged": (lambda: ga.asarray([[1, 2], [3]]), ValueError),
        "asarray_object": (lambda: ga.asarray(object()), TypeError),
        "asarray_dtype": (lambda: ga.asarray([1, 2], dtype="complex64"), TypeError),
        "reshape": (lambda: a.reshape(7), ValueError),
        "index": (lambda: a[10], IndexError),
        "item": (lambda: a.item(), ValueError),
        "to_cuda": (lambda: a.to("cuda"), RuntimeError),
        "zeros_cuda": (lambda: ga.zeros(4, device="cuda"), RuntimeError),
        "from_dlpack_object": (lambda: ga.from_dlpack(object()), TypeError),
        "from_dlpack_requires_grad": (lambda: ga.from_dlpack(t), BufferError),
        "full_value": (lambda: ga.full((2,), "x"), TypeError),
        "setitem_broadcast": (lambda: a.__setitem__(0, ga.ones(7)), ValueError),
    }
    return {name: (lambda fn=fn, exc=exc: (_raises(fn, exc), (a, b, w, x, cw))) for name, (fn, exc) in bad.items()}


@pytest.fixture(scope="module")
def npy_file(tmp_path_factory):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, size=(96, 4, 4, 3), dtype=np.uint8)
    path = tmp_path_factory.mktemp("stress") / "x.npy"
    np.save(path, x)
    return str(path), x


def _loader_cases(npy_file):
    path, x = npy_file
    y = np.arange(len(x), dtype=np.int64)
    loader = ga.PinnedLoader([path, y], 16, shuffle=True, num_threads=2, output="gpuaccel")
    torch_loader = ga.PinnedLoader([path], 32, transform=ga.ImageNormalize(0.5, 0.25, dtype="float32"))

    def full_epoch():
        for _ in loader:
            pass

    def break_early():
        for i, _ in enumerate(loader):
            if i == 1:
                break

    def iterator_dropped():
        it = iter(loader)
        next(it)  # dropped with batches in flight

    def torch_epoch():
        for _ in torch_loader:
            pass

    def construct():
        return ga.PinnedLoader([path, y], 8, output="gpuaccel")

    def construct_bad():
        try:
            ga.PinnedLoader([path, y[:-1]], 8)
        except ValueError:
            return
        raise AssertionError("no error")

    return {
        "loader_full_epoch": lambda: (full_epoch, (y,)),
        "loader_break_early": lambda: (break_early, (y,)),
        "loader_iterator_dropped": lambda: (iterator_dropped, (y,)),
        "loader_torch_normalize": lambda: (torch_epoch, ()),
        "loader_construct": lambda: (construct, (y,)),
        "loader_bad_arguments": lambda: (construct_bad, (y,)),
    }


def _logger_cases():
    t = torch.tensor(1.5)
    g = ga.full((1,), 0.25)

    def cycle():
        seen = []
        log = ga.LossLogger(4, on_log=lambda step, v: seen.append(v))
        for i in range(10):
            log.log(loss=t, acc=float(i), lr=g)
        log.close()
        assert len(seen) == 3

    def bad_value():
        log = ga.LossLogger(2)
        try:
            log.log(loss="x")
        except TypeError:
            pass
        log.close()

    log = ga.LossLogger(7)

    def steady():
        log.log(loss=t, acc=0.5)

    return {
        "logger_cycle": lambda: (cycle, (t, g)),
        "logger_bad_value": lambda: (bad_value, ()),
        "logger_steady_log": lambda: (steady, (t,)),
    }


# (iterations, warmup) per group: enough calls that a leak of one small
# object per call exceeds the slack, cheap enough for a 2-core machine
GROUPS = {
    "create": (_creation_cases, 3000, 300),
    "array": (_array_cases, 3000, 300),
    "dlpack": (_dlpack_cases, 3000, 300),
    "op": (_op_cases, 1000, 100),
    "error": (_error_cases, 2000, 200),
    "logger": (_logger_cases, 500, 50),
}
CASES = [(group, name) for group, (make, _, _) in GROUPS.items() for name in make()]


@pytest.mark.parametrize("group,name", CASES, ids=["%s-%s" % c for c in CASES])
def test_no_leak(group, name):
    make, iterations, warmup = GROUPS[group]
    fn, watch = make()[name]()
    assert_no_leak(fn, iterations=iterations, warmup=warmup, watch=watch, label=name)


LOADER_CASES = ["loader_full_epoch", "loader_break_early", "loader_iterator_dropped", "loader_torch_normalize",
                "loader_construct", "loader_bad_arguments"]


@pytest.mark.parametrize("name", LOADER_CASES)
def test_no_leak_loader(npy_file, name):
    fn, watch = _loader_cases(npy_file)[name]()
    threads = len(os.listdir("/proc/self/task"))
    fds = len(os.listdir("/proc/self/fd"))
    assert_no_leak(fn, iterations=150, warmup=20, watch=watch, label=name)
    assert len(os.listdir("/proc/self/task")) == threads, "native threads left running"
    assert len(os.listdir("/proc/self/fd")) == fds, "file descriptors left open"


def test_leak_checker_catches_leaks():
    """The checker itself: a leak of one object per call, a native leak of
    pool memory, and a reference leak are all reported."""
    kept = []
    with pytest.raises(AssertionError, match="gc-tracked objects grew"):
        assert_no_leak(lambda: kept.append([]), iterations=500, warmup=5, pool=False)
    arrays = []
    with pytest.raises(AssertionError, match="pool holds"):
        assert_no_leak(lambda: arrays.append(ga.empty(16)), iterations=10, warmup=1, object_slack=10 ** 6)
    target = object()
    refs = []
    with pytest.raises(AssertionError, match="refcount of watched object"):
        assert_no_leak(lambda: refs.append(target), iterations=10, warmup=1, watch=(target,),
                       object_slack=10 ** 6)
    kept.clear(), arrays.clear(), refs.clear()


# ---------------------------------------------------------- threads

N_THREADS = 8
N_ITERATIONS = 150
JOIN_TIMEOUT = 120.0


def _run_threads(target, n=N_THREADS, timeout=JOIN_TIMEOUT):
    """Starts n threads at once (a barrier), joins them with a deadline;
    returns the exceptions they raised.  A thread still alive at the
    deadline is a deadlock: the test fails, naming it."""
    barrier = threading.Barrier(n)
    errors = []

    def body(k):
        try:
            barrier.wait(timeout=30)
            target(k)
        except BaseException:  # noqa: BLE001 - reported below
            errors.append("thread %d: %s" % (k, traceback.format_exc()))

    threads = [threading.Thread(target=body, args=(k,), daemon=True, name="stress-%d" % k) for k in range(n)]
    deadline = time.monotonic() + timeout
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, "deadlock: threads %s still running after %.0f s" % (alive, timeout)
    return errors


def test_threads_mixed_work_is_exact(tmp_path):
    rng = np.random.default_rng(1234)
    # fixed inputs, and their single-threaded results computed first
    A = ga.asarray(rng.standard_normal((96, 80)))
    B = ga.asarray(rng.standard_normal((80, 72)))
    bias = ga.asarray(rng.standard_normal(72))
    X = ga.asarray(rng.standard_normal((40, 64)).astype(np.float32))
    W = ga.asarray(rng.standard_normal((48, 64)).astype(np.float32))
    Wb = ga.asarray(rng.standard_normal(48).astype(np.float32))
    GY = ga.asarray(rng.standard_normal((40, 48)).astype(np.float32))
    Xh = X.astype("bfloat16")
    Wh = W.astype("bfloat16")
    CX = ga.asarray(rng.standard_normal((2, 3, 10, 10)).astype(np.float32))
    CW = ga.asarray(rng.standard_normal((5, 3, 3, 3)).astype(np.float32))
    big_a = ga.asarray(rng.standard_normal((300, 200)).astype(np.float32))  # big enough for the CPU pool
    big_b = ga.asarray(rng.standard_normal((200, 260)).astype(np.float32))

    def compute():
        y, aux = ga.linear(X, W, Wb, activation="gelu", save_preactivation=True)
        gx, gw, gb = ga.linear_backward(GY, X, W, activation="gelu", preactivation=aux)
        return {
            "matmul": ga.matmul(A, B, bias=bias, activation="relu").numpy().copy(),
            "matmul_big": ga.matmul(big_a, big_b).numpy().copy(),
            "linear": y.numpy().copy(),
            "linear_bf16": ga.linear(Xh, Wh).astype("float32").numpy().copy(),
            "grad_x": gx.numpy().copy(), "grad_w": gw.numpy().copy(), "grad_b": gb.numpy().copy(),
            "conv": ga.conv2d(CX, CW, padding=1, activation="relu").numpy().copy(),
        }

    reference = compute()
    reference_again = compute()
    for k in reference:  # the CPU kernels are deterministic
        np.testing.assert_array_equal(reference[k], reference_again[k], err_msg=k)

    # loader data: a .npy file shared by all threads, and per-thread memory arrays
    images = rng.integers(0, 256, size=(203, 6, 5, 3), dtype=np.uint8)
    path = tmp_path / "images.npy"
    np.save(path, images)

    shared_log = ga.LossLogger(5)
    shared_values = {}
    lock = threading.Lock()
    counters = {"batches": 0, "ops": 0, "exchanges": 0, "logs": 0}

    def work(k):
        local_rng = np.random.default_rng(k)
        labels = np.arange(len(images), dtype=np.int64) * 10 + k
        loader = ga.PinnedLoader([str(path), labels], 17 + k, shuffle=True, seed=k, num_threads=2,
                                 prefetch=k % 3, output="gpuaccel")
        seen = []
        private = ga.LossLogger(3 + k, on_log=lambda step, v: seen.append((step, v["loss"])))
        private_values = []
        mine = []
        n_batches = n_ops = n_exchanges = 0
        for i in range(N_ITERATIONS):
            # arrays
            data = local_rng.standard_normal((7, 9)).astype(np.float32)
            a = ga.asarray(data)
            assert np.array_equal(a.numpy(), data)
            z = ga.full((4, 4), float(i), dtype="float64")
            assert z.tolist() == [[float(i)] * 4] * 4
            # exchanges, both ways
            t = torch.from_dlpack(a)
            assert t.data_ptr() == a.data_ptr and torch.equal(t, torch.from_numpy(data))
            t2 = torch.full((5,), float(k * 1000 + i))
            g = ga.from_dlpack(t2)
            assert g.data_ptr == t2.data_ptr() and g.tolist() == [float(k * 1000 + i)] * 5
            back = ga.from_dlpack(torch.from_dlpack(g.astype("bfloat16")))
            assert back.dtype == "bfloat16" and back.astype("float64").tolist() == t2.bfloat16().double().tolist()
            n_exchanges += 3
            # ops on the shared inputs: exactly the single-threaded results
            which = (i + k) % 4
            if which == 0:
                got = {"matmul": ga.matmul(A, B, bias=bias, activation="relu").numpy(),
                       "matmul_big": ga.matmul(big_a, big_b).numpy()}
            elif which == 1:
                y, aux = ga.linear(X, W, Wb, activation="gelu", save_preactivation=True)
                gx, gw, gb = ga.linear_backward(GY, X, W, activation="gelu", preactivation=aux)
                got = {"linear": y.numpy(), "grad_x": gx.numpy(), "grad_w": gw.numpy(), "grad_b": gb.numpy()}
            elif which == 2:
                got = {"linear_bf16": ga.linear(torch.from_dlpack(Xh), Wh).astype("float32").numpy(),
                       "conv": ga.conv2d(CX, CW, padding=1, activation="relu").numpy()}
            else:
                got = {"matmul_big": ga.matmul(torch.from_dlpack(big_a), big_b).numpy()}
            for key, value in got.items():
                assert np.array_equal(value, reference[key]), "thread %d iteration %d: %s differs" % (k, i, key)
                n_ops += 1
            # the thread's own loader: one epoch every 4 iterations, every batch checked
            if i % 4 == 0:
                epoch = loader.state_dict()["epoch"]
                order = loader.epoch_indices(epoch)
                pos = 0
                for xb, yb in loader:
                    rows = order[pos:pos + xb.shape[0]]
                    assert np.array_equal(xb.numpy(), images[rows]), "thread %d: batch content" % k
                    assert np.array_equal(yb.numpy(), labels[rows]), "thread %d: labels" % k
                    pos += xb.shape[0]
                    n_batches += 1
                assert pos == len(images)
            elif i % 4 == 2:
                for j, _ in enumerate(loader):  # and leaving an epoch early
                    if j == 2:
                        break
            # loggers: values exact in float32
            value = float(k * 100 + i)
            shared_log.log(loss=value)
            with lock:
                shared_values[value] = shared_values.get(value, 0) + 1
            private.log(loss=torch.tensor(value))
            private_values.append(value)
            mine.append(value)
        summary = private.flush()
        private.close()
        expected = logger_windows_ref(private_values, 3 + k)
        assert [s for s, _ in seen] == [s for s, _ in expected], (seen, expected)
        for (_, got_mean), (_, want) in zip(seen, expected):
            assert got_mean == want
        assert summary["loss"]["count"] == N_ITERATIONS and summary["loss"]["mean"] == np.mean(private_values)
        with lock:
            counters["batches"] += n_batches
            counters["ops"] += n_ops
            counters["exchanges"] += n_exchanges
            counters["logs"] += 2 * N_ITERATIONS

    threads_before = native_threads()
    errors = _run_threads(work)
    assert not errors, "\n".join(errors)
    assert settle(lambda: len(native_threads()) <= len(threads_before)), (
        "loader threads left running: %s, before %s" % (native_threads(), threads_before))

    summary = shared_log.flush()
    steps, values = shared_log.history("loss", with_steps=True)
    total = N_THREADS * N_ITERATIONS
    np.testing.assert_array_equal(steps, np.arange(1, total + 1))  # every step once
    assert sorted(values.tolist()) == sorted(v for v, c in shared_values.items() for _ in range(c))
    assert summary["loss"]["count"] == total
    assert summary["loss"]["mean"] == pytest.approx(sum(v * c for v, c in shared_values.items()) / total, rel=1e-12)
    shared_log.close()
    print("threads x iterations: %d x %d; %s" % (N_THREADS, N_ITERATIONS, counters))


def test_threads_hammer_one_logger_with_windows():
    """Windows delivered to on_log while 8 threads log: each window's mean is
    the mean of exactly the steps it covers (from history())."""
    every = 7
    windows = []
    log = ga.LossLogger(every, on_log=lambda step, v: windows.append((step, v["loss"])))
    per_thread = 300

    def work(k):
        for i in range(per_thread):
            log.log(loss=float(k * 1000 + i))

    errors = _run_threads(work)
    assert not errors, "\n".join(errors)
    log.flush()
    steps, values = log.history("loss", with_steps=True)
    total = N_THREADS * per_thread
    np.testing.assert_array_equal(steps, np.arange(1, total + 1))
    assert sorted(values.tolist()) == sorted(float(k * 1000 + i) for k in range(N_THREADS) for i in range(per_thread))
    assert sorted(s for s, _ in windows) == list(range(every, total + 1, every)) + ([total] if total % every else [])
    for end, mean in windows:
        start = (end - 1) // every * every
        assert mean == pytest.approx(values[start:end].mean(), rel=1e-12), (end, mean)
    log.close()


def test_threads_share_arrays_and_exchange():
    """Views, exports and imports of the same arrays from 8 threads: the
    owner outlives every view and the reference counts come back."""
    base = ga.asarray(np.arange(4096, dtype=np.float32))
    t = torch.arange(4096, dtype=torch.float32)
    refs_base, refs_t = sys.getrefcount(base), sys.getrefcount(t)

    def work(k):
        keep = []
        for i in range(400):
            v = base[k * 64:(k + 1) * 64]
            tv = torch.from_dlpack(v)
            assert tv[0].item() == k * 64
            gv = ga.from_dlpack(t[i:i + 8])
            assert gv.tolist() == list(map(float, range(i, i + 8)))
            keep.append((tv, gv))
            if len(keep) > 10:
                keep.pop(0)
        keep.clear()

    errors = _run_threads(work)
    assert not errors, "\n".join(errors)
    import gc

    gc.collect()
    assert sys.getrefcount(base) == refs_base and sys.getrefcount(t) == refs_t


# -------------------------------------------------------- GIL release

def _progress_during(run):
    """Runs run() while another Python thread spins; returns (seconds run()
    took, spins meanwhile).  Holding the GIL through run() leaves the
    spinner at (almost) nothing."""
    progress = {"n": 0}
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            progress["n"] += 1

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        time.sleep(0.05)
        n0, t0 = progress["n"], time.perf_counter()
        run()
        return time.perf_counter() - t0, progress["n"] - n0
    finally:
        stop.set()
        spinner.join(10)


def test_big_matmul_releases_the_gil():
    rng = np.random.default_rng(5)
    a = ga.asarray(rng.standard_normal((1500, 1500)))
    b = ga.asarray(rng.standard_normal((1500, 1500)))
    ga.matmul(a[:100], b)  # warm the pool
    out = []
    elapsed, during = _progress_during(lambda: out.append(ga.matmul(a, b)))
    rate_alone = _spin_rate()
    assert during > 0.1 * rate_alone * elapsed, (
        "the Python thread made %d iterations in the %.2f s of the matmul (alone: %.0f/s): the GIL was held"
        % (during, elapsed, rate_alone))
    np.testing.assert_allclose(out[0].numpy()[:3, :3], a.numpy()[:3] @ b.numpy()[:, :3], rtol=1e-10)


def _spin_rate():
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.1:
        n += 1
    return n / (time.perf_counter() - t0)


def _long_enough(make, seconds=0.25, max_scale=16):
    """make(scale) -> a callable making one C call whose work grows with
    `scale`.  Returns the callable at the scale whose call, timed alone here,
    takes `seconds` (a fast machine gets more work, not a test too short to
    tell GIL release from luck)."""
    run = make(1)
    t0 = time.perf_counter()
    run()
    took = time.perf_counter() - t0
    if took >= seconds:
        return run
    return make(min(max_scale, math.ceil(1.2 * seconds / max(took, 1e-3))))


@pytest.mark.parametrize("op", ["conv2d", "loader_wait", "linear_backward"])
def test_other_long_work_releases_the_gil(op, tmp_path):
    rng = np.random.default_rng(6)
    if op == "conv2d":
        w = ga.asarray(rng.standard_normal((64, 48, 3, 3)).astype(np.float32))

        def make(scale):
            x = ga.asarray(rng.standard_normal((24 * scale, 48, 48, 48)).astype(np.float32))
            return lambda: ga.conv2d(x, w, padding=1)

        run = _long_enough(make)
    elif op == "linear_backward":
        w = ga.asarray(rng.standard_normal((900, 1000)))

        def make(scale):
            x = ga.asarray(rng.standard_normal((1200 * scale, 1000)))
            gy = ga.asarray(rng.standard_normal((1200 * scale, 900)))
            return lambda: ga.linear_backward(gy, x, w)

        run = _long_enough(make)
    else:
        big = np.zeros((8, 32 << 20), dtype=np.uint8)  # 256 MiB in 8 batches: the consumer waits
        path = tmp_path / "big.npy"
        np.save(path, big)
        del big

        def run():
            for _ in ga.PinnedLoader([str(path)], 1, num_threads=1, prefetch=0, output="gpuaccel"):
                pass

    elapsed, during = _progress_during(run)
    assert elapsed > 0.05, "too short to tell (%.3f s)" % elapsed
    assert during > 0.1 * _spin_rate() * elapsed, "%s held the GIL: %d iterations in %.2f s" % (op, during, elapsed)
