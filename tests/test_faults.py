"""Injected faults on the CPU backend: out-of-memory at every allocation of
an op (memory limit), files truncated, deleted or replaced under a running
PinnedLoader, failing user callbacks, Ctrl-C, fork().  Whatever could crash
runs in a subprocess, so that a crash fails the test instead of killing
pytest.  (test_memory.py covers the limit API; test_loader.py the basic
truncation and Ctrl-C cases.)"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import numpy as np
import pytest

import gpuaccel as ga

from helpers import cpu_allocated, native_threads, open_fds, python_env, run_python, settle

torch = pytest.importorskip("torch")

FATAL = ("Segmentation fault", "Fatal Python error", "Bus error", "core dumped", "Aborted",
         "AddressSanitizer", "double free", "corrupted")


# -------------------------------------------------------- subprocesses

def run_script(script, *args, timeout=60):
    """Runs `script` in a fresh interpreter outside the checkout and asserts
    that it ended cleanly (assert_clean); a hang past `timeout` is a failure
    (the process is killed)."""
    result = run_python("-c", textwrap.dedent(script), *args, timeout=timeout)
    assert_clean(result)
    return result


def assert_clean(result, expect_rc=0):
    text = result.stderr
    for word in FATAL:
        assert word not in text, "the subprocess crashed (%s):\n%s" % (word, text[-3000:])
    assert result.returncode >= 0 or result.returncode == -signal.SIGINT, (
        "the subprocess died of signal %d:\n%s" % (-result.returncode, text[-3000:]))
    if expect_rc is not None:
        assert result.returncode == expect_rc, "exit status %d:\n%s\n%s" % (
            result.returncode, result.stdout[-2000:], text[-3000:])


# ================================================= (a) out of memory

def _sweep_oom(make, check=None, max_steps=24):
    """Calls make() under memory limits from 1 byte above what is allocated
    now up to what it needs, so that an allocation fails at each point of
    the op in turn.  Every failure must be an OutOfMemoryError that leaves
    the pool exactly as it was; the first success must be right.  Returns
    the number of faults injected."""
    ga.set_memory_limit(None, device="cpu")
    base = cpu_allocated()
    # what it needs: the peak of one unlimited call
    reference = make()
    extra = cpu_allocated() - base
    del reference
    assert cpu_allocated() == base
    need = 1
    while True:  # the smallest power of two it fits in
        ga.set_memory_limit(base + need, device="cpu")
        try:
            result = make()
            del result
            break
        except ga.OutOfMemoryError:
            need *= 2
        finally:
            ga.set_memory_limit(None, device="cpu")
        assert cpu_allocated() == base
        assert need < (1 << 40), "never fits"
    need = max(need, extra, 1)
    limits = sorted({max(1, need * k // max_steps) for k in range(1, max_steps + 1)} | {1, need // 2 + 1})
    faults = 0
    for limit in limits:
        ga.set_memory_limit(base + limit, device="cpu")
        try:
            result = make()
        except ga.OutOfMemoryError as e:
            text = str(e)
            assert "out of memory on cpu" in text and "set_memory_limit" in text, text
            assert isinstance(e, MemoryError)
            faults += 1
            result = None
        finally:
            ga.set_memory_limit(None, device="cpu")
        if result is not None and check is not None:
            check(result)
        del result
        assert cpu_allocated() == base, "after an injected fault at limit %d: %d bytes more are allocated" % (
            limit, cpu_allocated() - base)
    # and it works again without a limit
    result = make()
    if check is not None:
        check(result)
    return faults


def _op_cases():
    rng = np.random.default_rng(11)
    f = lambda *s: rng.standard_normal(s)  # noqa: E731
    a64, b64 = f(40, 30), f(30, 20)
    x32, w32, bias32, gy32 = (f(16, 24).astype(np.float32), f(12, 24).astype(np.float32),
                              f(12).astype(np.float32), f(16, 12).astype(np.float32))
    cx, cw, cb = f(2, 3, 9, 9).astype(np.float32), f(4, 3, 3, 3).astype(np.float32), f(4).astype(np.float32)
    A, B = ga.asarray(a64), ga.asarray(b64)
    X, W, Bias, GY = ga.asarray(x32), ga.asarray(w32), ga.asarray(bias32), ga.asarray(gy32)
    Xh, Wh = X.astype("float16"), W.astype("float16")
    CX, CW, CB = ga.asarray(cx), ga.asarray(cw), ga.asarray(cb)
    # "gelu_erf": the exact GELU by its name that never warns (this runs at collection)
    y_gelu, z_gelu = ga.linear(X, W, Bias, activation="gelu_erf", save_preactivation=True)
    conv_y, conv_z = ga.conv2d(CX, CW, CB, padding=1, activation="gelu_erf", save_preactivation=True)
    CGY = ga.asarray(f(*conv_y.shape).astype(np.float32))
    strided = ga.asarray(np.arange(600.0).reshape(20, 30))[::2, ::3]
    ref_mm = ga.matmul(A, B).numpy().copy()
    ref_lin = [t.numpy().copy() for t in ga.linear(X, W, Bias, activation="gelu_erf", save_preactivation=True)]
    ref_lb = [t.numpy().copy() for t in ga.linear_backward(GY, X, W, activation="gelu_erf", preactivation=z_gelu)]
    ref_conv = [t.numpy().copy() for t in ga.conv2d(CX, CW, CB, padding=1, activation="gelu_erf",
                                                     save_preactivation=True)]
    ref_cb = [t.numpy().copy() for t in ga.conv2d_backward(CGY, CX, CW, padding=1, activation="gelu_erf",
                                                           preactivation=conv_z)]
    ref_h = ga.matmul(Xh, Wh.T, out_dtype="float32").numpy().copy()

    def same(ref):
        def check(result):
            results = result if isinstance(result, (tuple, list)) else (result,)
            refs = ref if isinstance(ref, list) else [ref]
            assert len(results) == len(refs)
            for r, want in zip(results, refs):
                np.testing.assert_array_equal(r.numpy(), want)
        return check

    return {
        "matmul": (lambda: ga.matmul(A, B), same(ref_mm)),
        "matmul_torch_inputs": (lambda: ga.matmul(torch.from_numpy(a64), torch.from_numpy(b64)), same(ref_mm)),
        "matmul_f16_to_f32": (lambda: ga.matmul(Xh, Wh.T, out_dtype="float32"), same(ref_h)),
        "matmul_strided_input": (lambda: ga.matmul(strided, ga.ones((10, 4), dtype="float64")), None),
        "linear_save_preactivation": (lambda: ga.linear(X, W, Bias, activation="gelu", save_preactivation=True),
                                      same(ref_lin)),
        "linear_backward": (lambda: ga.linear_backward(GY, X, W, activation="gelu", preactivation=z_gelu),
                            same(ref_lb)),
        "conv2d_save_preactivation": (lambda: ga.conv2d(CX, CW, CB, padding=1, activation="gelu",
                                                        save_preactivation=True), same(ref_conv)),
        "conv2d_backward": (lambda: ga.conv2d_backward(CGY, CX, CW, padding=1, activation="gelu",
                                                       preactivation=conv_z), same(ref_cb)),
        "asarray_numpy_copy": (lambda: ga.asarray(a64, copy=True), same(a64)),
        "asarray_numpy_convert": (lambda: ga.asarray(a64, dtype="float32"), same(a64.astype(np.float32))),
        "asarray_torch_copy": (lambda: ga.asarray(torch.from_numpy(x32), copy=True), same(x32)),
        "from_dlpack_copy": (lambda: ga.from_dlpack(torch.from_numpy(x32), copy=True), same(x32)),
        "astype": (lambda: A.astype("bfloat16"), None),
        "reshape_copy": (lambda: strided.reshape(-1), same(np.arange(600.0).reshape(20, 30)[::2, ::3].ravel())),
        "copy": (lambda: strided.copy(), None),
        "full": (lambda: ga.full((50, 7), 1.5, dtype="float64"), same(np.full((50, 7), 1.5))),
        "empty_bf16_3d": (lambda: ga.empty((4, 5, 6), dtype="bfloat16"), None),
    }


OOM_CASES = list(_op_cases())
FAULTS = {}


@pytest.mark.parametrize("name", OOM_CASES)
def test_out_of_memory_at_every_allocation_of(name, no_limit):
    make, check = _op_cases()[name]
    faults = _sweep_oom(make, check)
    assert faults >= 1, "no allocation failed: the limit did not apply"
    FAULTS[name] = faults


def test_asarray_of_a_list_under_a_limit(no_limit):
    """A list becomes memory NumPy owns (the limit does not apply to it) or
    pool memory (then the limit does): either way nothing is left behind."""
    base = cpu_allocated()
    ga.set_memory_limit(base + 1, device="cpu")
    try:
        a = ga.asarray([[1.0, 2.0], [3.0, 4.0]])
        assert a.tolist() == [[1.0, 2.0], [3.0, 4.0]]
        del a
    except ga.OutOfMemoryError:
        pass
    ga.set_memory_limit(None, device="cpu")
    assert cpu_allocated() == base


def test_limit_below_what_is_allocated_then_lifted(no_limit):
    keep = ga.ones(1 << 16, dtype="uint8")
    base = cpu_allocated()
    ga.set_memory_limit(1, device="cpu")  # below what is already allocated
    with pytest.raises(ga.OutOfMemoryError):
        ga.matmul(ga.asarray(np.ones((4, 4))), ga.asarray(np.ones((4, 4))))
    with pytest.raises(ga.OutOfMemoryError):
        keep.astype("float32")
    assert keep.numpy().sum() == 1 << 16  # what was there is untouched
    ga.set_memory_limit(None, device="cpu")
    assert cpu_allocated() == base
    assert ga.matmul(ga.asarray(np.ones((4, 4))), ga.asarray(np.ones((4, 4)))).numpy().sum() == 64


def test_threads_racing_for_memory_under_a_limit(no_limit):
    """8 threads allocate and compute under a limit that fits only some of
    them: each gets a right result or an OutOfMemoryError; the accounting
    comes back to exactly where it was."""
    rng = np.random.default_rng(2)
    A = ga.asarray(rng.standard_normal((64, 48)))
    B = ga.asarray(rng.standard_normal((48, 40)))
    ref = ga.matmul(A, B).numpy().copy()
    base = cpu_allocated()
    ooms_before = ga.memory_stats("cpu")["num_ooms"]
    ga.set_memory_limit(base + 3 * 64 * 40 * 8, device="cpu")
    counts = {"ok": 0, "oom": 0}
    lock = threading.Lock()
    errors = []

    def work(k):
        try:
            for i in range(200):
                try:
                    if (i + k) % 2:
                        got = ga.matmul(A, B).numpy()
                        assert np.array_equal(got, ref)
                    else:
                        x = ga.full((64, 40), float(k), dtype="float64")
                        time.sleep(0)
                        assert x.numpy().min() == x.numpy().max() == float(k)
                    with lock:
                        counts["ok"] += 1
                except ga.OutOfMemoryError:
                    with lock:
                        counts["oom"] += 1
        except BaseException as e:  # noqa: BLE001
            errors.append("thread %d: %r" % (k, e))

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ga.set_memory_limit(None, device="cpu")
    assert not [t for t in threads if t.is_alive()], "deadlock"
    assert not errors, errors
    assert counts["ok"] + counts["oom"] == 1600 and counts["ok"] > 0
    assert ga.memory_stats("cpu")["num_ooms"] - ooms_before == counts["oom"]
    assert cpu_allocated() == base
    FAULTS["threads_racing"] = counts["oom"]


@pytest.mark.parametrize("at_batch", [0, 3])
def test_out_of_memory_in_a_loader_worker(no_limit, at_batch):
    """The loader's native workers allocate each batch from the pool: an
    OutOfMemoryError there reaches next(), stops the workers, frees the
    ring, and the loader works again once memory is back."""
    x = np.arange(2000 * 96, dtype=np.uint8).reshape(2000, 96)
    y = np.arange(2000, dtype=np.int64)
    loader = ga.PinnedLoader([x, y], 50, shuffle=True, num_threads=3, prefetch=2, output="gpuaccel")
    threads, fds = len(native_threads()), open_fds()
    base = cpu_allocated()
    batch_bytes = 50 * (96 + 8)
    order = loader.epoch_indices(0)
    it = iter(loader)
    got = []
    for _ in range(at_batch):
        xb, yb = next(it)
        got.append(yb.numpy().copy())
        del xb, yb
    ga.set_memory_limit(cpu_allocated() + batch_bytes // 2, device="cpu")
    with pytest.raises(ga.OutOfMemoryError, match="set_memory_limit"):
        for xb, yb in it:  # the batches already gathered may still come out
            np.testing.assert_array_equal(xb.numpy(), x[yb.numpy()])
            del xb, yb
    ga.set_memory_limit(None, device="cpu")
    assert list(it) == []  # closed
    assert settle(lambda: len(native_threads()) <= threads), "loader workers left running"
    assert open_fds() == fds
    assert cpu_allocated() == base
    for k, labels in enumerate(got):
        np.testing.assert_array_equal(labels, order[k * 50:(k + 1) * 50])
    batches = [(xb.numpy().copy(), yb.numpy().copy()) for xb, yb in loader]  # the next epoch, in full
    assert len(batches) == 40
    for xb, yb in batches:
        np.testing.assert_array_equal(xb, x[yb])
    FAULTS["loader_worker_oom_%d" % at_batch] = 1


# ==================================== (b) files truncated while loading

TRUNCATE_SCRIPT = """
import json, os, sys
import numpy as np, gpuaccel as ga

path = sys.argv[1]
results = []
configs = [
    # (threads, prefetch, shuffle, batch, truncate after k batches, new size: "zero" / "header" / "half")
    (1, 0, False, 64, 1, "half"), (4, 4, True, 32, 2, "half"), (2, 1, True, 100, 0, "zero"),
    (3, 2, False, 16, 5, "header"), (8, 8, True, 7, 3, "half"), (1, 0, False, 4000, 0, "half"),
]
for threads, prefetch, shuffle, batch, after, size in configs:
    x = np.arange(4000 * 48, dtype=np.int64).reshape(4000, 48) % 251 + 1  # never 0: zeros would be a hole
    np.save(path, x)
    header = os.path.getsize(path) - x.nbytes
    loader = ga.PinnedLoader([path, np.arange(4000)], batch, shuffle=shuffle, num_threads=threads,
                             prefetch=prefetch, output="gpuaccel")
    it = iter(loader)
    delivered, outcome = 0, "finished"
    try:
        for k, (xb, ib) in enumerate(it):
            if k == after:
                new = {"zero": 0, "header": header, "half": header + x.nbytes // 2}[size]
                os.truncate(path, new)
            # every batch that comes out is whole and right
            assert np.array_equal(xb.numpy(), x[ib.numpy()]), "batch %d holds wrong rows" % k
            delivered += 1
    except OSError as e:
        outcome = "%s: %s" % (type(e).__name__, e)
    results.append({"config": [threads, prefetch, shuffle, batch, after, size], "delivered": delivered,
                    "batches": len(loader), "outcome": outcome, "still_open": it.next_batch_index < len(loader)
                    and list(it) != []})
print(json.dumps(results))
"""


def test_npy_truncated_while_loading_raises_or_finishes(tmp_path):
    result = run_script(TRUNCATE_SCRIPT, tmp_path / "data.npy", timeout=120)
    results = json.loads(result.stdout.strip().splitlines()[-1])
    for r in results:
        if r["outcome"] != "finished":
            assert r["outcome"].startswith("OSError") and "truncated" in r["outcome"] and "data.npy" in r["outcome"], r
        else:
            assert r["delivered"] == r["batches"], r
        assert not r["still_open"], r
    # most configurations do hit the truncation
    assert sum(r["outcome"] != "finished" for r in results) >= 4, results
    FAULTS["truncations"] = len(results)


MEMMAP_SCRIPT = """
import os, sys
import numpy as np, gpuaccel as ga

path = sys.argv[1]
x = np.ones((4000, 16, 16, 3), dtype=np.uint8)
np.save(path, x)
source = np.load(path, mmap_mode="r")  # loader documents np.memmap as a source
loader = ga.PinnedLoader([source], 100, num_threads=2, prefetch=0, output="gpuaccel")
it = iter(loader)
next(it)
os.truncate(path, 4096)
try:
    n = sum(1 for _ in it)
    print("finished", n)
except OSError as e:
    print("raised", e)
"""


def test_memmap_source_truncated_while_loading(tmp_path):
    """A np.memmap source is read with pread(): the truncation is an OSError
    naming the file, not a SIGBUS."""
    result = run_script(MEMMAP_SCRIPT, tmp_path / "mm.npy", timeout=60)
    out = result.stdout.strip()
    assert out.startswith("raised") and "mm.npy" in out and "truncated" in out, out
    FAULTS["memmap_truncations"] = 1


PARTIAL_PAGE_SCRIPT = """
import os, sys
import numpy as np, gpuaccel as ga

path = sys.argv[1]
x = (np.arange(6000 * 16, dtype=np.int64).reshape(6000, 16) % 250 + 1).astype(np.uint8)  # no zero byte
np.save(path, x)
header = os.path.getsize(path) - x.nbytes
assert (header + 1528 * 16) % 4096 == 0  # a page starts at row 1528
loader = ga.PinnedLoader([path, np.arange(6000)], 4, num_threads=1, prefetch=0, output="gpuaccel")
it = iter(loader)
assert it._engine.mappings[0] is not None, "the file is not read through a mapping"
next(it)
# cut inside row 1510: the rest of its page reads as zeros (no SIGBUS), the
# pages after it fault; batches 378 to 381 (rows 1512 to 1527) lie wholly in
# the zeros
os.truncate(path, header + 1510 * 16 + 5)
delivered = 1
try:
    for xb, ib in it:
        assert np.array_equal(xb.numpy(), x[ib.numpy()]), "batch %d holds wrong rows" % delivered
        delivered += 1
    print("finished", delivered)
except OSError as e:
    print("raised at batch", delivered, e)
"""


def test_file_cut_inside_a_page_raises_instead_of_reading_zeros(tmp_path):
    """Rows copied out of a mapping past a truncation inside the file's last
    page read as zeros instead of faulting: the loader notices anyway."""
    result = run_script(PARTIAL_PAGE_SCRIPT, tmp_path / "cut.npy", timeout=60)
    assert_clean(result)
    out = result.stdout.strip()
    assert out.startswith("raised at batch") and "cut.npy" in out and "truncated" in out, out
    assert int(out.split()[3]) <= 1510 // 4, out
    FAULTS["cut_inside_a_page"] = 1


# ====================================================== (c) worker errors

def _image_file(tmp_path, n=300):
    x = (np.arange(n * 60, dtype=np.int64).reshape(n, 60) % 253 + 1).astype(np.uint8)
    path = tmp_path / "x.npy"
    np.save(path, x)
    return str(path), x


def _epoch(loader):
    return [(xb.numpy().copy(), yb.numpy().copy()) for xb, yb in loader]


def _check_epoch(batches, x):
    assert batches
    for xb, yb in batches:
        np.testing.assert_array_equal(xb, x[yb])


def test_source_replaced_by_a_directory_between_epochs(tmp_path):
    """The workers' pread() fails (EISDIR): next() raises that OSError with
    the path; restoring the file makes the next epoch work."""
    path, x = _image_file(tmp_path)
    loader = ga.PinnedLoader([path, np.arange(len(x))], 32, shuffle=True, num_threads=3, output="gpuaccel")
    _check_epoch(_epoch(loader), x)
    threads, fds = len(native_threads()), open_fds()
    os.rename(path, path + ".bak")
    os.mkdir(path)
    with pytest.raises(OSError) as info:
        _epoch(loader)
    assert info.value.errno in (21, None) and "x.npy" in str(info.value), info.value
    os.rmdir(path)
    os.rename(path + ".bak", path)
    assert settle(lambda: len(native_threads()) <= threads) and open_fds() == fds
    _check_epoch(_epoch(loader), x)
    FAULTS["replaced_by_directory"] = 1


def test_source_deleted_between_epochs(tmp_path):
    path, x = _image_file(tmp_path)
    loader = ga.PinnedLoader([path, np.arange(len(x))], 32, num_threads=2, output="gpuaccel")
    _check_epoch(_epoch(loader), x)
    os.rename(path, path + ".gone")
    with pytest.raises(FileNotFoundError) as info:
        iter(loader)
    assert "x.npy" in str(info.value)
    os.rename(path + ".gone", path)
    _check_epoch(_epoch(loader), x)
    FAULTS["deleted_between_epochs"] = 1


def test_source_unlinked_mid_epoch_finishes_the_epoch(tmp_path):
    """An open file outlives its name: the running epoch finishes with the
    right rows; the next one says the file is gone."""
    path, x = _image_file(tmp_path, n=2000)
    loader = ga.PinnedLoader([path, np.arange(len(x))], 50, shuffle=True, num_threads=2, prefetch=1,
                             output="gpuaccel")
    it = iter(loader)
    first = next(it)
    os.unlink(path)
    batches = [(first[0].numpy().copy(), first[1].numpy().copy())] + [
        (xb.numpy().copy(), yb.numpy().copy()) for xb, yb in it]
    assert len(batches) == len(loader)
    _check_epoch(batches, x)
    with pytest.raises(FileNotFoundError):
        iter(loader)
    FAULTS["unlinked_mid_epoch"] = 1


def test_source_replaced_by_a_shorter_file_between_epochs(tmp_path):
    path, x = _image_file(tmp_path)
    loader = ga.PinnedLoader([path], 32, output="gpuaccel")
    assert len(list(loader)) == len(loader)
    np.save(path, x[:100])  # same header length, fewer rows
    with pytest.raises((ValueError, OSError), match="truncated"):
        for _ in loader:
            pass
    FAULTS["shorter_file"] = 1


def test_on_log_callback_raising(tmp_path):
    """LossLogger's user callable: its exception comes out of the log()
    that delivered the window; nothing logged is lost and logging goes on."""
    calls = []

    def on_log(step, values):
        calls.append(step)
        if step == 4:
            raise ZeroDivisionError("boom")

    log = ga.LossLogger(2, on_log=on_log)
    raised = []
    for i in range(10):
        try:
            log.log(loss=float(i))
        except ZeroDivisionError:
            raised.append(i)
    assert raised == [3] and calls == [2, 4, 6, 8, 10]
    summary = log.flush()
    assert summary["loss"]["count"] == 10 and summary["loss"]["mean"] == 4.5
    np.testing.assert_array_equal(log.history("loss"), np.arange(10.0))

    failing = ga.LossLogger(3, on_log=lambda s, v: 1 / 0)
    failing.log(loss=1.0)
    with pytest.raises(ZeroDivisionError):
        failing.close()  # the flush's delivery fails, and the logger is closed anyway
    with pytest.raises(RuntimeError, match="closed"):
        failing.log(loss=2.0)

    class Bar:
        def set_postfix(self, *a, **k):
            raise KeyError("bar broke")

    bar_log = ga.LossLogger(1, progress=Bar())
    with pytest.raises(KeyError):
        bar_log.log(loss=1.0)
    bar_log.progress = None
    bar_log.log(loss=2.0)
    assert bar_log.flush()["loss"]["count"] == 2
    FAULTS["callback_exceptions"] = 3


# ============================================================ (d) Ctrl-C

SIGINT_SCRIPT = """
import sys, threading, time
import numpy as np, gpuaccel as ga

mode = sys.argv[1]
said = []
def ready():                       # once the work is under way (its first round done), not after a guessed time
    if not said:
        said.append(1)
        print("ready", flush=True)

if mode == "loader_wait":          # the main thread waits in next() for slow batches
    big = np.zeros((64, 1 << 20), dtype=np.uint8)
    loader = ga.PinnedLoader([big], 16, num_threads=1, prefetch=0, output="gpuaccel")
    while True:
        for batch in loader:
            ready()
elif mode == "loader_busy":        # the main thread runs Python while the workers fill the ring
    x = np.zeros((200000, 64), dtype=np.uint8)
    loader = ga.PinnedLoader([x], 10, num_threads=2, prefetch=8, output="gpuaccel")
    while True:
        for batch in loader:
            sum(range(2000))
            ready()
elif mode == "torch_loader":       # torch output, shuffled file source
    import torch, tempfile, os
    path = os.path.join(tempfile.mkdtemp(), "x.npy")
    np.save(path, np.zeros((20000, 3 * 32 * 32), dtype=np.uint8).reshape(20000, 32, 32, 3))
    loader = ga.PinnedLoader([path], 64, shuffle=True, num_threads=2,
                             transform=ga.ImageNormalize(0.5, 0.25))
    while True:
        for (xb,) in loader:
            xb.float().mean()
            ready()
elif mode == "matmul":             # a long op with the GIL released
    a = ga.asarray(np.random.default_rng(0).standard_normal((1500, 1500)))
    while True:
        ga.matmul(a, a)
        ready()
elif mode == "threads":            # 8 daemon threads iterating loaders; main thread joins
    x = np.zeros((20000, 256), dtype=np.uint8)
    started = threading.Semaphore(0)
    def work(k):
        loader = ga.PinnedLoader([x], 8, num_threads=2, output="gpuaccel")
        first = True
        while True:
            for batch in loader:
                if first:
                    first = False
                    started.release()
    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        started.acquire()          # every thread has its first batch
    ready()
    while True:
        for t in threads:
            t.join(0.1)
"""


@pytest.mark.parametrize("mode", ["loader_wait", "loader_busy", "torch_loader", "matmul", "threads"])
def test_sigint_exits_with_keyboard_interrupt(mode):
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SIGINT_SCRIPT), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tempfile.gettempdir(), env=python_env())
    try:
        line = proc.stdout.readline().strip()  # printed once the work is under way
        assert line == "ready", proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail("%s: still running 10 s after SIGINT:\n%s" % (mode, err[-2000:]))
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    for word in FATAL:
        assert word not in err, err[-3000:]
    assert "KeyboardInterrupt" in err.strip().splitlines()[-1], err[-3000:]
    assert proc.returncode in (-signal.SIGINT, 1, 130), (proc.returncode, err[-3000:])
    assert took < 5, "took %.1f s to stop" % took
    FAULTS["sigint_%s" % mode] = 1


# ================================================================ (e) fork

FORK_SCRIPT = """
import os, sys, tempfile
import numpy as np, gpuaccel as ga

rng = np.random.default_rng(0)
a = ga.asarray(rng.standard_normal((300, 400)))
b = ga.asarray(rng.standard_normal((400, 200)))
ref = ga.matmul(a, b).numpy().copy()            # big enough to start the CPU thread pool
lin = ga.linear(a.astype("float32"), b.T.astype("float32"), activation="relu").numpy().copy()
x = np.arange(500 * 24, dtype=np.uint8).reshape(500, 24)
path = os.path.join(tempfile.mkdtemp(), "x.npy")
np.save(path, x)
loader = ga.PinnedLoader([path, np.arange(500)], 32, shuffle=True, num_threads=3, output="gpuaccel")
for xb, yb in loader:                           # a full epoch
    pass
for k, (xb, yb) in enumerate(loader):           # and one left early (closed below)
    if k == 2:
        break
del xb, yb
log = ga.LossLogger(3)
for i in range(7):
    log.log(loss=float(i))
keep = ga.zeros((100, 100))
t = __import__("torch").from_dlpack(keep)

def child():
    errors = []
    if not np.array_equal(ga.matmul(a, b).numpy(), ref):
        errors.append("matmul differs in the child")
    if not np.array_equal(ga.linear(a.astype("float32"), b.T.astype("float32"), activation="relu").numpy(), lin):
        errors.append("linear differs in the child")
    fresh = ga.PinnedLoader([path, np.arange(500)], 50, shuffle=True, seed=3, num_threads=2, output="gpuaccel")
    n = 0
    for xb, yb in fresh:
        if not np.array_equal(xb.numpy(), x[yb.numpy()]):
            errors.append("loader batch differs in the child")
        n += len(yb.numpy())
    if n != 500:
        errors.append("loader gave %d samples" % n)
    for xb, yb in loader:                       # the parent's loader, a new epoch
        if not np.array_equal(xb.numpy(), x[yb.numpy()]):
            errors.append("parent loader batch differs in the child")
    log.log(loss=100.0)
    if log.flush()["loss"]["count"] != 8:
        errors.append("logger count")
    if t.sum().item() != 0:
        errors.append("torch view of a gpuaccel array")
    try:
        ga.zeros(3, device="cuda")
        errors.append("a CUDA array was made in the child of a machine without a GPU?")
    except RuntimeError as e:
        if "CUDA" not in str(e) or len(str(e)) < 30:
            errors.append("unclear CUDA error: %r" % str(e))
    try:
        ga.PinnedLoader([x], 8, device="cuda:0")
        errors.append("a CUDA loader was made")
    except RuntimeError as e:
        if "CUDA" not in str(e):
            errors.append("unclear CUDA error from the loader: %r" % str(e))
    if ga.cuda_available() or ga.device_count() != 0:
        errors.append("the child sees CUDA")
    return errors

pids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        errors = child()
        if errors:
            print("\\n".join(errors), file=sys.stderr, flush=True)
        sys.exit(1 if errors else 0)          # a normal exit: atexit handlers, loader cleanup
    pids.append(pid)
bad = []
for pid in pids:
    _, status = os.waitpid(pid, 0)
    if status != 0:
        bad.append(status)
# the parent still works too
assert np.array_equal(ga.matmul(a, b).numpy(), ref)
assert sum(len(yb.numpy()) for _, yb in loader) == 500
print("children", bad)
sys.exit(1 if bad else 0)
"""


POOL_FORK_SCRIPT = """
import os, sys
import numpy as np, gpuaccel as ga, torch

rng = np.random.default_rng(5)
x = rng.integers(0, 256, (700, 24, 24, 3), dtype=np.uint8)
path = os.path.join(sys.argv[1], "x.npy")
np.save(path, x)
mean, std = [0.4, 0.5, 0.6], [0.2, 0.3, 0.25]
loader = ga.PinnedLoader([path, np.arange(700)], 64, shuffle=True, num_threads=2, prefetch=2,
                         transform=ga.ImageNormalize(mean, std, dtype="float32", layout="NHWC"))

def reference(idx):
    return ((x[idx] / 255.0 - np.array(mean)) / np.array(std)).transpose(0, 3, 1, 2)

def check(batches, what):
    for xb, ib in batches:
        if not np.allclose(xb.numpy(), reference(ib.numpy()), atol=1e-5):
            return ["%s: a batch differs" % what]
    return []

for _ in range(2):                         # the pool holds freed batches now
    for xb, ib in loader:
        pass
kept = [b for _, b in zip(range(3), loader)]  # batches alive across the fork
it = iter(loader)                          # and an epoch running, its ring full
next(it)
pid = os.fork()
if pid == 0:
    errors = check(kept, "inherited kept batch")
    try:
        next(it)
        errors.append("the parent's epoch ran in the child")
    except RuntimeError:
        pass
    del it
    for epoch in range(3):                 # new epochs in the child reuse the inherited pool
        batches = list(loader)
        errors += check(batches, "child epoch %d" % epoch)
        for xb, _ in batches:
            xb.fill_(-1.0)                 # the child's writes must stay in the child
    del kept
    errors += check(list(loader), "child after dropping the inherited batches")
    print("\\n".join(errors), file=sys.stderr, flush=True)
    sys.exit(1 if errors else 0)
for xb, ib in it:                          # the parent meanwhile finishes its epoch
    pass
_, status = os.waitpid(pid, 0)
errors = check(kept, "parent's kept batch after the child ran")
for epoch in range(2):
    errors += check(list(loader), "parent epoch %d" % epoch)
print("child", status, "errors", errors)
sys.exit(1 if status or errors else 0)
"""


def test_fork_with_pooled_batches_alive(tmp_path):
    """Pooled batch memory across fork(): the child gets its own copy of the
    pool and of the batches alive at the fork; neither process sees the
    other's writes, frees the other's memory twice, or hands out memory a
    batch still uses."""
    result = run_script(POOL_FORK_SCRIPT, tmp_path, timeout=120)
    assert_clean(result)
    assert "child 0 errors []" in result.stdout, result.stdout + result.stderr[-2000:]
    FAULTS["pool_fork"] = 1


def test_fork_after_use_child_works_on_the_cpu():
    result = run_script(FORK_SCRIPT, timeout=120)
    assert "children []" in result.stdout
    FAULTS["forks"] = 3


MP_SCRIPT = """
import multiprocessing as mp
import numpy as np, gpuaccel as ga

A = ga.asarray(np.random.default_rng(0).standard_normal((256, 256)))
REF = ga.matmul(A, A).numpy()

def work(k):
    x = ga.full((8,), float(k))
    return float(np.abs(ga.matmul(A, A).numpy() - REF).max()), x.numpy().sum()

if __name__ == "__main__":
    with mp.get_context("fork").Pool(3) as pool:
        out = pool.map(work, range(12))
    assert all(err == 0.0 for err, _ in out), out
    assert [s for _, s in out] == [8.0 * k for k in range(12)]
    print("ok")
"""


def test_multiprocessing_fork_pool_uses_gpuaccel(tmp_path):
    script = tmp_path / "mp_script.py"  # a file: the pool's workers need an importable __main__
    script.write_text(textwrap.dedent(MP_SCRIPT))
    result = run_python(script, timeout=120)
    assert_clean(result)
    assert result.stdout.strip() == "ok"


FORK_WHILE_MATMUL_SCRIPT = """
import os, sys, threading
import numpy as np, gpuaccel as ga

a = ga.asarray(np.random.default_rng(1).standard_normal((500, 500)))
ref = ga.matmul(a, a).numpy().copy()
stop = threading.Event()
def busy():
    while not stop.is_set():
        ga.matmul(a, a)      # the CPU pool is busy while the main thread forks
thread = threading.Thread(target=busy, daemon=True)
thread.start()
bad = 0
for _ in range(10):
    pid = os.fork()
    if pid == 0:
        ok = np.array_equal(ga.matmul(a, a).numpy(), ref)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    bad += status != 0
stop.set()
thread.join()
print("bad", bad)
"""


def test_fork_while_another_thread_runs_a_matmul():
    result = run_script(FORK_WHILE_MATMUL_SCRIPT, timeout=120)
    assert "bad 0" in result.stdout
    FAULTS["forks_during_matmul"] = 10


FORK_LIVE_ITERATOR_SCRIPT = """
import os, sys, time
import numpy as np, gpuaccel as ga

x = np.arange(200000 * 16, dtype=np.int64).reshape(200000, 16)
loader = ga.PinnedLoader([x], 64, num_threads=2, prefetch=2, output="gpuaccel")
it = iter(loader)
next(it)                         # an epoch under way when the process forks
a = ga.asarray(np.random.default_rng(0).random((100, 100)))
ref = ga.matmul(a, a).numpy().copy()
pid = os.fork()
if pid == 0:
    ok = np.array_equal(ga.matmul(a, a).numpy(), ref)
    sys.exit(0 if ok else 1)     # a normal exit runs PinnedLoader's atexit close
deadline = time.monotonic() + 10
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("the child hung on exit")
        sys.exit(3)
    time.sleep(0.01)
assert status == 0, status
assert next(it)[0].shape == (64, 16)
print("ok")
"""


def test_fork_with_an_epoch_under_way_child_exits():
    result = run_script(FORK_LIVE_ITERATOR_SCRIPT, timeout=60)
    assert result.stdout.strip() == "ok"


FORK_WHILE_LOADING_SCRIPT = """
import os, sys, time, threading
import numpy as np, gpuaccel as ga

x = np.zeros((64, 1 << 17), dtype=np.int64)   # 1 MiB rows: the workers allocate all the time
stop = threading.Event()
def consume():
    loader = ga.PinnedLoader([x], 1, num_threads=4, prefetch=8, output="gpuaccel")
    while not stop.is_set():
        for batch in loader:
            if stop.is_set():
                break
thread = threading.Thread(target=consume, daemon=True)
thread.start()
time.sleep(0.2)
hung = forks = 0
for round in range(8):
    pids = []
    for _ in range(50):
        pid = os.fork()
        if pid == 0:
            ga.zeros((10, 10))            # the child's first allocation
            os._exit(0)
        pids.append(pid)
    forks += len(pids)
    deadline = time.monotonic() + 5
    for pid in pids:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                hung += 1
                break
            time.sleep(0.002)
    if hung:
        break
stop.set()
thread.join(10)
print("hung %d of %d" % (hung, forks))
sys.exit(3 if hung else 0)
"""


def test_fork_while_loader_workers_allocate():
    run_script(FORK_WHILE_LOADING_SCRIPT, timeout=120)


# =================================================== threads misusing one loader

CLOSE_FROM_OTHER_THREAD_SCRIPT = """
import sys, threading, time
import numpy as np, gpuaccel as ga

big = np.zeros((64, 1 << 20), dtype=np.uint8)     # slow batches: next() waits
loader = ga.PinnedLoader([big], 64, num_threads=1, prefetch=0, output="gpuaccel")
it = iter(loader)
outcome = []
def consume():
    try:
        for batch in it:
            pass
        outcome.append("finished")
    except Exception as e:
        outcome.append(repr(e))
consumer = threading.Thread(target=consume, daemon=True)
consumer.start()
time.sleep(0.005)
loader.close()                                    # e.g. from a watchdog or signal handler thread
consumer.join(5)
if consumer.is_alive():
    print("next() still waiting 5 s after close()")
    sys.stdout.flush()
    import os
    os._exit(3)
print(outcome)
"""


def test_close_from_another_thread_wakes_a_waiting_next():
    result = run_script(CLOSE_FROM_OTHER_THREAD_SCRIPT, timeout=60)
    # close() ends the epoch: the waiting next() raises StopIteration, the loop ends normally
    assert result.stdout.strip() == "['finished']", result.stdout


SHARED_ITERATOR_SCRIPT = """
import os, sys, threading
import numpy as np, gpuaccel as ga

x = np.arange(20000 * 16, dtype=np.int64).reshape(20000, 16)
for trial in range(10):
    loader = ga.PinnedLoader([x], 7, num_threads=2, prefetch=1, output="gpuaccel")
    it = iter(loader)
    got, errors = [[], []], []
    def consume(k):
        try:
            for (b,) in it:
                got[k].append(int(b.numpy()[0, 0]))
        except Exception as e:           # sharing is documented: any error fails the test below
            errors.append(repr(e))
    threads = [threading.Thread(target=consume, args=(k,), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    if any(t.is_alive() for t in threads):
        print("trial %d: a consumer hung" % trial, flush=True)
        os._exit(3)
    if errors:
        print("trial %d: %s" % (trial, errors), flush=True)
        os._exit(5)
    if sorted(got[0] + got[1]) != list(range(0, 20000 * 16, 7 * 16)):
        print("trial %d: batches lost or repeated" % trial, flush=True)
        os._exit(4)
print("ok")
"""


def test_two_threads_sharing_one_epoch_iterator():
    result = run_script(SHARED_ITERATOR_SCRIPT, timeout=120)
    assert result.stdout.strip().endswith("ok")


def test_report_fault_counts():
    """Last in the file: how many faults were injected (see -s)."""
    print("faults injected: %d in %d scenarios: %s" % (sum(FAULTS.values()), len(FAULTS), FAULTS))
