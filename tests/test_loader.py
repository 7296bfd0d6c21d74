"""PinnedLoader on the CPU device (the CUDA path: test_cuda_loader.py)."""

import gc
import os
import signal
import textwrap
import time

import numpy as np
import pytest

import gpuaccel as ga

from helpers import assert_close, native_threads, numpy_dtype, open_fds, run_python, sanitized, settle
from ops import normalize_ref


def dataset(rng, n, image=(5, 4, 3)):
    """uint8 images whose first byte encodes the label, and the labels."""
    x = rng.integers(0, 256, size=(n,) + image, dtype=np.uint8)
    y = rng.permutation(n).astype(np.int64)
    x[:, 0, 0, 0] = y % 256
    return x, y


def run(loader):
    return [tuple(np.array(t.numpy()) for t in batch) for batch in loader]


@pytest.mark.parametrize("n,batch,drop_last", [(1000, 64, False), (1000, 64, True), (37, 10, False),
                                               (37, 10, True), (5, 8, False), (64, 64, True)])
def test_every_sample_once_and_rows_aligned(rng, n, batch, drop_last):
    x, y = dataset(rng, n)
    loader = ga.PinnedLoader([x, y], batch, shuffle=True, seed=7, drop_last=drop_last, output="gpuaccel")
    batches = run(loader)
    assert len(batches) == len(loader) == (n // batch if drop_last else -(-n // batch))
    labels = np.concatenate([b[1] for b in batches]) if batches else np.zeros(0, np.int64)
    expected = n - n % batch if drop_last else n
    assert len(labels) == expected and len(set(labels.tolist())) == expected
    assert set(labels.tolist()) <= set(y.tolist())
    for xb, yb in batches:
        assert xb.shape[1:] == x.shape[1:] and xb.dtype == np.uint8
        position = {label: i for i, label in enumerate(y)}
        np.testing.assert_array_equal(xb, x[[position[label] for label in yb]])  # rows stay aligned


def test_no_shuffle_keeps_order_and_memory_views(rng):
    x, y = dataset(rng, 50)
    batches = run(ga.PinnedLoader([x[::2], y[::2]], 7, output="gpuaccel"))  # strided rows
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), y[::2])
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), x[::2])


def test_deterministic_whatever_the_thread_count(rng):
    x, y = dataset(rng, 777)
    runs = [run(ga.PinnedLoader([x, y], 32, shuffle=True, seed=11, num_threads=t, prefetch=p, output="gpuaccel"))
            for t, p in [(1, 0), (2, 2), (4, 5), (7, 1)]]
    for other in runs[1:]:
        assert len(other) == len(runs[0])
        for a, b in zip(runs[0], other):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])


def test_epochs_differ_and_set_epoch_repeats(rng):
    x, y = dataset(rng, 300)
    loader = ga.PinnedLoader([x, y], 50, shuffle=True, seed=1, output="gpuaccel")
    first = np.concatenate([b[1] for b in run(loader)])
    second = np.concatenate([b[1] for b in run(loader)])
    assert not np.array_equal(first, second) and sorted(first) == sorted(second)
    loader.set_epoch(0)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in run(loader)]), first)
    other_seed = ga.PinnedLoader([x, y], 50, shuffle=True, seed=2, output="gpuaccel")
    assert not np.array_equal(np.concatenate([b[1] for b in run(other_seed)]), first)


@pytest.mark.parametrize("n,world,drop_last", [(103, 4, False), (103, 4, True), (12, 3, False), (5, 8, False)])
def test_shards_are_disjoint_equal_and_match_distributed_sampler(rng, n, world, drop_last):
    pytest.importorskip("torch")
    from torch.utils.data.distributed import DistributedSampler

    x, y = dataset(rng, n)
    shards = []
    for rank in range(world):
        loader = ga.PinnedLoader([x, np.arange(n)], 4, rank=rank, world_size=world, drop_last=False,
                                 output="gpuaccel") if not drop_last else \
            ga.PinnedLoader([x, np.arange(n)], 4, rank=rank, world_size=world, drop_last=True, output="gpuaccel")
        got = np.concatenate([b[1] for b in run(loader)])
        reference = list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False,
                                            drop_last=drop_last))
        if drop_last:
            reference = reference[: len(reference) // 4 * 4]
        np.testing.assert_array_equal(got, reference)
        shards.append(got)
    assert len({len(s) for s in shards}) == 1
    if not drop_last and n % world == 0:
        assert len(set(np.concatenate(shards).tolist())) == n
    # shuffled shards: disjoint (before padding), equal, and they change with the epoch
    orders = []
    for epoch in range(2):
        combined = []
        for rank in range(world):
            loader = ga.PinnedLoader([x, np.arange(n)], 4, shuffle=True, seed=5, rank=rank, world_size=world,
                                     output="gpuaccel")
            loader.set_epoch(epoch)
            combined.append(np.concatenate([b[1] for b in run(loader)]))
        assert len({len(c) for c in combined}) == 1
        everything = np.concatenate(combined)
        assert set(everything.tolist()) == set(range(n)) or drop_last
        assert len(everything) == -(-n // world) * world
        orders.append(combined[0])
    assert not np.array_equal(orders[0], orders[1]) or n <= world


@pytest.mark.parametrize("n, world", [(1, 1), (7, 3), (10, 4), (29, 5), (64, 8), (3, 7), (100, 6)])
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_shard_geometries(n, world, batch, drop_last, shuffle):
    """Every rank's samples, for counts and batch sizes that don't divide:
    equal sizes; drop_last=False: every sample at least once, the shards
    padded (with samples from the start of the epoch's order, as
    DistributedSampler does) to ceil(n / world) each; drop_last=True: the
    tail past world * (n // world) dropped, shards disjoint, then each cut to
    whole batches."""
    shards = []
    for rank in range(world):
        loader = ga.PinnedLoader([np.arange(n)], batch, rank=rank, world_size=world, drop_last=drop_last,
                                 shuffle=shuffle, seed=3, output="gpuaccel")
        batches = [b[0].numpy().tolist() for b in loader]
        assert len(batches) == len(loader)
        assert all(len(b) == batch for b in (batches if drop_last else batches[:-1]))
        shards.append([i for b in batches for i in b])
    per_rank = n // world if drop_last else -(-n // world)
    expected = per_rank // batch * batch if drop_last else per_rank
    assert [len(s) for s in shards] == [expected] * world
    everything = [i for s in shards for i in s]
    assert set(everything) <= set(range(n))
    if drop_last:
        assert len(set(everything)) == len(everything)  # disjoint: nothing padded
    else:
        assert set(everything) == set(range(n))  # nothing left out
        assert len(everything) - n == world * per_rank - n  # repeats: the padding only
    if not shuffle:  # the order of torch's sampler, rank r taking r, r + world, ...
        from torch.utils.data.distributed import DistributedSampler

        for rank, shard in enumerate(shards):
            reference = list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False,
                                                drop_last=drop_last))
            assert shard == reference[:expected]


def test_resume_mid_epoch_gives_exactly_the_rest(rng):
    x, y = dataset(rng, 500)
    make = lambda: ga.PinnedLoader([x, y], 32, shuffle=True, seed=9, output="gpuaccel")  # noqa: E731
    full = run(make())
    loader = make()
    it = iter(loader)
    head = [tuple(t.numpy().copy() for t in next(it)) for _ in range(5)]
    state = loader.state_dict()
    assert state["batch"] == 5 and state["epoch"] == 0
    del it
    resumed = make()
    resumed.load_state_dict(state)
    tail = run(resumed)
    assert len(head) + len(tail) == len(full)
    for got, want in zip(head + tail, full):
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])
    assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["batch"] == 0
    with pytest.raises(ValueError, match="batch_size=32"):
        ga.PinnedLoader([x, y], 16).load_state_dict(state)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_normalize_matches_float64_reference(rng, dtype, layout):
    x, y = dataset(rng, 70, image=(9, 7, 3))
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    t = ga.ImageNormalize(mean, std, dtype=dtype, layout=layout)
    batches = list(ga.PinnedLoader([x, y], 16, transform=t, output="gpuaccel"))
    got = np.concatenate([b[0].astype("float64").numpy() for b in batches])
    ref = normalize_ref(x, mean, std)
    assert batches[0][0].dtype == dtype and got.shape == ref.shape  # (N, C, H, W) in both layouts
    assert_close(got, ref, dtype, scale=4.0 if dtype == "float32" else 1.0)
    n, itemsize = batches[0][0].shape[0], batches[0][0].itemsize
    c, h, w = 3, 9, 7
    expected = (c * h * w, h * w, w, 1) if layout == "NCHW" else (h * w * c, 1, w * c, c)
    assert batches[0][0].strides == tuple(itemsize * s for s in expected) and n == 16


def test_normalize_scalar_mean_and_other_scale(rng):
    x, y = dataset(rng, 10, image=(2, 2, 1))
    t = ga.ImageNormalize(0.5, 2.0, dtype="float32", layout="NHWC", scale=1.0)
    got = next(iter(ga.PinnedLoader([x, y], 10, transform=t, output="gpuaccel")))[0].numpy()
    np.testing.assert_allclose(got, normalize_ref(x, 0.5, 2.0, scale=1.0), rtol=1e-6)


def test_npy_paths_and_memmap(rng, tmp_path):
    x, y = dataset(rng, 123)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    mm = np.load(tmp_path / "y.npy", mmap_mode="r")
    batches = run(ga.PinnedLoader([str(tmp_path / "x.npy"), mm], 25, output="gpuaccel"))
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), x)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), y)
    shuffled = run(ga.PinnedLoader([tmp_path / "x.npy", tmp_path / "y.npy"], 25, shuffle=True, output="gpuaccel"))
    for xb, yb in shuffled:
        assert np.array_equal(xb[:, 0, 0, 0], yb % 256)


@pytest.mark.parametrize("mode", ["r", "r+", "c"])
def test_memmap_views_read_the_right_bytes(rng, tmp_path, mode):
    """Shared-mode memmaps are read from the file (at the view's own offset,
    whatever the mapping's alignment); copy-on-write ones from memory, where
    their private changes live."""
    path = tmp_path / "raw.bin"
    header = 1234  # not a multiple of the mapping granularity
    data = rng.integers(-2**40, 2**40, size=(301, 5), dtype=np.int64)
    path.write_bytes(b"\xab" * header + data.tobytes())
    mm = np.memmap(path, dtype=np.int64, mode=mode, offset=header, shape=data.shape)
    if mode != "r":
        mm[3] = -7  # r+: in the file's shared page cache; c: only in this mapping
        data[3] = -7
    for view, ref in ((mm, data), (mm[17:250], data[17:250]), (mm[::3], data[::3]), (mm[:, 1:4], data[:, 1:4])):
        got = run(ga.PinnedLoader([view], 23, shuffle=True, seed=5, output="gpuaccel"))
        loader = ga.PinnedLoader([view], 23, shuffle=True, seed=5)
        order = loader.epoch_indices(0)
        from_file = mode != "c" and view.flags.c_contiguous
        assert loader._sources[0][0] == ("file" if from_file else "memory"), (mode, view.shape)
        np.testing.assert_array_equal(np.concatenate([b[0] for b in got]), ref[order])


def test_torch_output(rng):
    torch = pytest.importorskip("torch")
    x, y = dataset(rng, 40)
    xb, yb = next(iter(ga.PinnedLoader([x, y], 16, transform=ga.ImageNormalize([0.0] * 3, [1.0] * 3))))
    assert isinstance(xb, torch.Tensor) and xb.dtype == torch.bfloat16 and xb.shape == (16, 3, 5, 4)
    assert isinstance(yb, torch.Tensor) and yb.dtype == torch.int64 and yb.tolist() == y[:16].tolist()
    assert xb.device.type == "cpu" and (not ga.cuda_available() or xb.is_pinned())


@pytest.mark.parametrize(
    "make,exc,words",
    [
        (lambda x, y: ga.PinnedLoader([x, y[:-1]], 4), ValueError, "same first dimension.*\\[20, 19\\]"),
        (lambda x, y: ga.PinnedLoader(x, 4), TypeError, "sequence"),
        (lambda x, y: ga.PinnedLoader([], 4), ValueError, "empty"),
        (lambda x, y: ga.PinnedLoader([x, [1, 2]], 4), TypeError, "arrays\\[1\\]"),
        (lambda x, y: ga.PinnedLoader([x], 0), ValueError, "batch_size"),
        (lambda x, y: ga.PinnedLoader([x], 2.5), ValueError, "batch_size"),
        (lambda x, y: ga.PinnedLoader([x], 4, num_threads=0), ValueError, "num_threads"),
        (lambda x, y: ga.PinnedLoader([x], 4, prefetch=-1), ValueError, "prefetch"),
        (lambda x, y: ga.PinnedLoader([x], 4, output="jax"), ValueError, "output"),
        (lambda x, y: ga.PinnedLoader([x], 4, rank=3, world_size=2), ValueError, "rank"),
        (lambda x, y: ga.PinnedLoader([x], 4, device="tpu"), ValueError, "device"),
        (lambda x, y: ga.PinnedLoader([x], 4, transform="norm"), TypeError, "ImageNormalize"),
        (lambda x, y: ga.PinnedLoader([y, x], 4, transform=ga.ImageNormalize(0, 1)), ValueError, "uint8 images"),
        (lambda x, y: ga.PinnedLoader([x], 4, transform=ga.ImageNormalize([0, 0], [1, 1])), ValueError, "3 channels"),
        (lambda x, y: ga.PinnedLoader([np.zeros(())], 4), ValueError, "0-d"),
        (lambda x, y: ga.PinnedLoader([x.astype(np.complex64)], 4), TypeError, "not supported"),
        (lambda x, y: ga.ImageNormalize([0.5], [0.0]), ValueError, "std must not contain 0"),
        (lambda x, y: ga.ImageNormalize(["a"], [1.0]), TypeError, "mean"),
        (lambda x, y: ga.ImageNormalize(0, 1, dtype="int8"), ValueError, "dtype"),
        (lambda x, y: ga.ImageNormalize(0, 1, layout="CHW"), ValueError, "layout"),
    ],
)
def test_bad_arguments(rng, make, exc, words):
    x, y = dataset(rng, 20)
    with pytest.raises(exc, match=words):
        make(x, y)


def test_torch_datasets_are_refused_with_what_to_give_instead(rng):
    torch = pytest.importorskip("torch")
    from torch.utils import data

    x, y = dataset(rng, 20)

    class Touchy(data.Dataset):  # PinnedLoader must not index it
        def __len__(self):
            return 20

        def __getitem__(self, i):
            raise AssertionError("indexed")

    tensors = data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))

    class Stream(data.IterableDataset):
        def __iter__(self):
            raise AssertionError("iterated")

    for given in (tensors, Touchy(), Stream()):
        with pytest.raises(TypeError) as info:
            ga.PinnedLoader(given, 4)
        message = str(info.value)
        assert "data is a torch Dataset (%s)" % type(given).__name__ in message, message
        assert "PinnedLoader(DataLoader(dataset" in message and "NumPy arrays, np.memmap or .npy paths" in message
        assert ("dataset.tensors" in message) == (given is tensors)
    with pytest.raises(TypeError, match=r"arrays\[0\] .* got Tensor \(for a CPU torch tensor, pass t.numpy\(\)\)"):
        ga.PinnedLoader([torch.from_numpy(x), y], 4)
    # what the message says works: the tensors as arrays, and the Dataset's DataLoader
    xb, yb = next(iter(ga.PinnedLoader([t.numpy() for t in tensors.tensors], 4, device="cpu")))
    assert torch.equal(xb, torch.from_numpy(x[:4])) and torch.equal(yb, torch.from_numpy(y[:4]))
    xb, yb = next(iter(ga.PinnedLoader(data.DataLoader(tensors, batch_size=4), device="cpu")))
    assert torch.equal(xb, torch.from_numpy(x[:4])) and torch.equal(yb, torch.from_numpy(y[:4]))


def _threads_named(name):
    found = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % task) as f:
                if f.read().strip() == name:
                    found.append(int(task))
        except OSError:  # a thread that ended meanwhile
            pass
    return found


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH") or not os.path.isdir("/proc/self/task"),
                    reason="Linux scheduling policies")
def test_workers_yield_to_the_training_step(rng):
    # SCHED_BATCH: the workers keep their share of the CPU but do not preempt the training step's threads when
    # they wake up; the consumer's own thread keeps its policy
    x, y = dataset(rng, 64)
    mine = os.sched_getscheduler(0)
    loader = ga.PinnedLoader([x, y], 8, num_threads=3, output="gpuaccel")
    it = iter(loader)
    next(it)
    deadline = time.monotonic() + 10
    while len(_threads_named("gpuaccel-loader")) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    workers = _threads_named("gpuaccel-loader")
    assert len(workers) == 3
    assert all(os.sched_getscheduler(tid) == os.SCHED_BATCH for tid in workers)
    assert os.sched_getscheduler(0) == mine
    assert sum(b[0].shape[0] for b in it) == 64 - 8  # and they still deliver every batch
    loader.close()


def test_bad_files(rng, tmp_path):
    x, _ = dataset(rng, 10)
    with pytest.raises(FileNotFoundError):
        ga.PinnedLoader([str(tmp_path / "missing.npy")], 4)
    (tmp_path / "text.npy").write_text("not numpy")
    with pytest.raises(ValueError, match="not a readable .npy"):
        ga.PinnedLoader([str(tmp_path / "text.npy")], 4)
    np.save(tmp_path / "f.npy", np.asfortranarray(x.reshape(10, -1)))
    with pytest.raises(ValueError, match="Fortran order"):
        ga.PinnedLoader([str(tmp_path / "f.npy")], 4)
    np.save(tmp_path / "short.npy", x)
    with open(tmp_path / "short.npy", "r+b") as f:
        f.truncate(os.path.getsize(tmp_path / "short.npy") - 7)
    with pytest.raises(ValueError, match="truncated"):
        ga.PinnedLoader([str(tmp_path / "short.npy")], 4)


def test_file_truncated_while_running_raises_at_next(rng, tmp_path):
    x, y = dataset(rng, 4000, image=(16, 16, 3))
    path = tmp_path / "x.npy"
    np.save(path, x)
    loader = ga.PinnedLoader([str(path), y], 100, prefetch=0, num_threads=1, output="gpuaccel")
    it = iter(loader)
    next(it)
    with open(path, "r+b") as f:
        f.truncate(4096)
    with pytest.raises(OSError, match="ended early.*truncated") as info:
        for _ in it:
            pass
    assert str(path) in str(info.value)
    # the iterator is closed: its threads are gone and it stays exhausted
    assert list(it) == []


def test_ctrl_c_while_waiting_stops_cleanly(rng):
    threads = len(native_threads())
    big = np.zeros((64, 1 << 20), dtype=np.uint8)  # 64 MiB per batch: the wait is long enough
    loader = ga.PinnedLoader([big], 64, num_threads=1, prefetch=0, output="gpuaccel")
    old = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in range(50):
                signal.setitimer(signal.ITIMER_REAL, 0.001)
                for batch in loader:
                    del batch
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    loader.close()
    assert len(native_threads()) <= threads  # a thread of an earlier test may have ended meanwhile


def test_nothing_left_behind_after_100_short_iterations(rng, tmp_path):
    x, y = dataset(rng, 300)
    np.save(tmp_path / "x.npy", x)
    loader = ga.PinnedLoader([str(tmp_path / "x.npy"), y], 16, shuffle=True, num_threads=3, output="gpuaccel")
    run(loader)  # warm the pools
    gc.collect()  # what earlier tests left to the cyclic collector goes now, not during the loop
    threads, fds, mem = len(native_threads()), open_fds(), ga.memory_stats("cpu")["allocated_bytes"]
    for i in range(100):
        for k, _batch in enumerate(loader):
            if k == i % 5:
                break  # leave mid-epoch
        del _batch
    # joined worker threads leave /proc a moment later: wait for the condition, not a fixed time
    assert settle(lambda: len(native_threads()) <= threads), (len(native_threads()), threads)
    assert settle(lambda: open_fds() == fds), (open_fds(), fds)
    gc.collect()
    assert ga.memory_stats("cpu")["allocated_bytes"] == mem
    with loader:
        next(iter(loader))
    assert settle(lambda: len(native_threads()) <= threads), (len(native_threads()), threads)


def test_len_stats_and_repr(rng):
    x, y = dataset(rng, 100)
    loader = ga.PinnedLoader([x, y], 30, output="gpuaccel")
    assert len(loader) == 4 and "100 samples" in repr(loader)
    run(loader)
    s = loader.stats()
    assert s["batches"] == 4 and s["samples"] == 100 and s["samples_per_second"] > 0
    assert s["consumer_wait_seconds"] >= 0 and s["gather_seconds"] > 0


def test_progress_bar(rng, capsys):
    pytest.importorskip("tqdm")
    x, y = dataset(rng, 50)
    assert len(run(ga.PinnedLoader([x, y], 10, progress=True, output="gpuaccel"))) == 5
    assert "5/5" in capsys.readouterr().err


def test_exit_while_iterating_is_clean(tmp_path):
    script = textwrap.dedent(
        """
        import numpy as np, gpuaccel as ga
        x = np.zeros((10000, 64), dtype=np.uint8)
        loader = ga.PinnedLoader([x], 10, num_threads=4, output="gpuaccel")
        it = iter(loader)
        next(it)
        keep = (loader, it)
        print("ok")
        """
    )
    result = run_python("-c", script, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_numpy_dtypes_of_bfloat16_output(rng):
    x, y = dataset(rng, 8)
    xb, _ = next(iter(ga.PinnedLoader([x, y], 8, transform=ga.ImageNormalize(0, 1), output="gpuaccel")))
    assert xb.numpy().dtype == numpy_dtype("bfloat16")


# ------------------------------------------- batch memory from the host pool

MEAN, STD = [0.3, 0.5, 0.7], [0.2, 0.25, 0.3]


def test_kept_batches_stay_valid_while_dropped_ones_are_reused(rng):
    """Batches big enough for the pageable pool (>= 64 KiB): a loop that
    keeps some batches and drops the others.  The dropped ones' memory comes
    back in later batches and epochs; a kept one's never does while it is
    held, and every kept batch still holds its values at the end."""
    x, y = dataset(rng, 333, image=(17, 15, 3))  # 255 pixels: the vector loops leave a tail
    position = {label: i for i, label in enumerate(y)}
    loader = ga.PinnedLoader([x, y], 32, shuffle=True, num_threads=3, prefetch=1, output="gpuaccel",
                             transform=ga.ImageNormalize(MEAN, STD, dtype="float32"))
    kept, kept_ptrs, ptrs = [], set(), []
    for epoch in range(4):
        for k, (xb, yb) in enumerate(loader):
            assert xb.data_ptr not in kept_ptrs, "a kept batch's memory was handed out again"
            ptrs.append(xb.data_ptr)
            if k % 4 == epoch:
                kept.append((xb, yb))
                kept_ptrs.add(xb.data_ptr)
    assert len(set(ptrs)) < len(ptrs) - len(kept), "dropped batches' memory was not reused"
    assert ga.memory_stats("cpu")["pageable_cached_bytes"] > 0
    for xb, yb in kept:
        rows = [position[label] for label in yb.numpy()]
        assert_close(xb.numpy(), normalize_ref(x[rows], MEAN, STD), "float32", scale=4.0)


def test_kept_torch_batches_stay_valid(rng):
    """The same through torch: the DLPack deleter hands the memory back when
    the tensor dies, not before."""
    torch = pytest.importorskip("torch")
    x, y = dataset(rng, 200, image=(16, 16, 3))
    position = {label: i for i, label in enumerate(y)}
    loader = ga.PinnedLoader([x, y], 24, shuffle=True, num_threads=2,
                             transform=ga.ImageNormalize(MEAN, STD, dtype="float32", layout="NHWC"))
    kept = []
    for _ in range(3):
        for k, (xb, yb) in enumerate(loader):
            assert isinstance(xb, torch.Tensor) and xb.is_contiguous(memory_format=torch.channels_last)
            if k in (1, 4):
                kept.append((xb, yb))
            xb.add_(1000.0)  # the consumer writes its batch: a kept one must not see later writes
    for xb, yb in kept:
        rows = [position[label] for label in yb.numpy()]
        assert_close(xb.numpy() - 1000.0, normalize_ref(x[rows], MEAN, STD), "float32", scale=2e4)


def test_close_with_batches_alive(rng):
    """close() mid-epoch returns the ring's memory; batches the user holds
    stay valid through the next epochs, which reuse that memory; all of it
    is accounted for once they are dropped."""
    x, y = dataset(rng, 300, image=(19, 13, 3))
    position = {label: i for i, label in enumerate(y)}
    loader = ga.PinnedLoader([x, y], 40, shuffle=True, num_threads=2, prefetch=3, output="gpuaccel",
                             transform=ga.ImageNormalize(MEAN, STD, dtype="bfloat16"))
    run(loader)  # warm the pool
    base = ga.memory_stats("cpu")["allocated_bytes"]
    it = iter(loader)
    held = [next(it), next(it)]
    loader.close()
    assert list(it) == []
    for _ in range(2):
        for xb, yb in loader:
            rows = [position[label] for label in yb.numpy()]
            assert_close(xb.astype("float64").numpy(), normalize_ref(x[rows], MEAN, STD), "bfloat16")
    for xb, yb in held:
        rows = [position[label] for label in yb.numpy()]
        assert_close(xb.astype("float64").numpy(), normalize_ref(x[rows], MEAN, STD), "bfloat16")
    del held, xb, yb
    assert ga.memory_stats("cpu")["allocated_bytes"] == base


FAULTS_SCRIPT = """
import resource, sys
import numpy as np, gpuaccel as ga

x = np.random.default_rng(0).integers(0, 256, (1280, 64, 64, 3), dtype=np.uint8)
loader = ga.PinnedLoader([x], 64, shuffle=True, num_threads=2, output="gpuaccel",
                         transform=ga.ImageNormalize(0.5, 0.25, dtype="float32"))
for _ in range(2):  # warm: the pool, the workers' buffers
    for (xb,) in loader:
        pass
del xb
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    for (xb,) in loader:  # a training loop drops each batch
        pass
del xb
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults, 3 * 20 * 64 * 64 * 64 * 3 * 4 // 4096)
"""


def run_script_words(script, env=None):
    """The words `script` prints, run in a fresh interpreter with `env`."""
    result = run_python("-c", textwrap.dedent(script), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split()


@pytest.mark.skipif(sanitized(), reason="page faults under ASan count its quarantine and shadow memory")
def test_dropped_batches_fault_in_no_new_pages():
    """Every batch of three epochs lands in memory whose pages are already
    there: far fewer minor faults than the pages the batches span (with
    freed blocks going back to the system, every page faults again)."""
    faults, pages = (int(v) for v in run_script_words(FAULTS_SCRIPT))
    assert faults < pages // 20, "%d minor faults for %d pages of batches" % (faults, pages)


BOUND_SCRIPT = """
import numpy as np, gpuaccel as ga

x = np.random.default_rng(1).integers(0, 256, (600, 32, 32, 3), dtype=np.uint8)
loader = ga.PinnedLoader([x], 40, num_threads=2, output="gpuaccel",
                         transform=ga.ImageNormalize(0.5, 0.25, dtype="float32"))
base = ga.memory_stats("cpu")["allocated_bytes"]
kept = [b for b in loader]                   # the user keeps a whole epoch: 15 batches of 480 KiB
stats = ga.memory_stats("cpu")
assert stats["allocated_bytes"] - base >= 15 * 40 * 32 * 32 * 3 * 4, stats
for k, (xb,) in enumerate(kept):
    np.testing.assert_allclose(xb.numpy()[:, 0], (x[40 * k:40 * (k + 1), :, :, 0] / 255 - 0.5) / 0.25, atol=1e-6)
del kept, xb
stats = ga.memory_stats("cpu")
assert stats["allocated_bytes"] == base, stats
print(stats["pageable_cached_bytes"], stats["pageable_cache_limit_bytes"])
ga.empty_cache()
print(ga.memory_stats("cpu")["pageable_cached_bytes"])
"""


@pytest.mark.parametrize("limit", [0, 1 << 20, None])
def test_pool_is_bounded(limit):
    """Dropping a kept epoch all at once: what the pool keeps stays under its
    bound ($GPUACCEL_HOST_CACHE_BYTES, 0: none), the rest goes back to the
    system; empty_cache() returns the rest."""
    env = {} if limit is None else {"GPUACCEL_HOST_CACHE_BYTES": str(limit)}
    cached, bound, after_empty = (int(v) for v in run_script_words(BOUND_SCRIPT, env))
    if limit is not None:
        assert bound == limit
    assert cached <= bound and after_empty == 0
    if limit is None:
        assert cached >= 5 * 40 * 32 * 32 * 3 * 4  # the default bound keeps more than a few batches


# ------------------------------------------------------- channels_last output

def test_channels_last_torch_tensors(rng):
    torch = pytest.importorskip("torch")
    x, y = dataset(rng, 50, image=(6, 9, 3))
    loader = ga.PinnedLoader([x, y], 16, transform=ga.ImageNormalize(MEAN, STD, dtype="float32", layout="NHWC"))
    for xb, yb in loader:
        assert tuple(xb.shape) == (len(yb), 3, 6, 9) and xb.is_contiguous(memory_format=torch.channels_last)
        assert not xb.is_contiguous()
        rows = [int(np.where(y == label)[0][0]) for label in yb.numpy()]
        assert_close(xb.numpy(), normalize_ref(x[rows], MEAN, STD), "float32", scale=4.0)
        conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
        assert conv(xb).is_contiguous(memory_format=torch.channels_last)  # what a channels_last model takes


# -------------------------------------------- the transform, bit for bit

def exact_table(multiplier, offset, dtype):
    """out[ch][v]: fma(v, scale, shift) rounded once to float32 (float64 for a
    float64 output), then to the dtype, nearest even — computed in rational
    arithmetic, independent of the code under test."""
    from fractions import Fraction

    ml_dtypes = pytest.importorskip("ml_dtypes")

    def nearest_f32(q):
        f = np.float32(float(q))
        candidates = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
        return min(candidates, key=lambda c: (abs(Fraction(float(c)) - q),
                                               int(np.array(c).view(np.uint32)) & 1))

    table = []
    for m, o in zip(multiplier, offset):
        if dtype == "float64":
            row = [float(Fraction(v) * Fraction(m) + Fraction(o)) for v in range(256)]
            table.append(np.array(row, dtype=np.float64))
            continue
        s, t = Fraction(float(np.float32(m))), Fraction(float(np.float32(o)))
        row = np.array([nearest_f32(Fraction(v) * s + t) for v in range(256)], dtype=np.float32)
        target = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
        table.append(row.astype(target))
    return np.stack(table)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("image", [(7, 9, 3), (16, 16, 3), (5, 13, 1), (6, 7, 4), (3, 11, 5)])
def test_normalize_bits_match_a_rational_reference(rng, dtype, layout, image):
    """Vector loops (AVX2 where the CPU has it) and table lookups for what
    they leave over, in every layout, channel count and dtype: the same bits
    as the one formula, rounded exactly."""
    x, y = dataset(rng, 37, image=image)
    c = image[2]
    mean = list(rng.uniform(0.0, 1.0, c))
    std = list(rng.uniform(0.05, 0.5, c))
    t = ga.ImageNormalize(mean, std, dtype=dtype, layout=layout)
    table = exact_table(*t._spec(c)[:2], dtype)
    batches = list(ga.PinnedLoader([x, y], 10, transform=t, output="gpuaccel", num_threads=2))
    got = np.concatenate([b[0].numpy() for b in batches])
    channels = np.arange(c).reshape(1, 1, 1, c)
    want = table[channels, x].transpose(0, 3, 1, 2)
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[want.dtype.itemsize]
    assert got.shape == want.shape and got.dtype == want.dtype
    mismatch = np.ascontiguousarray(got).view(bits) != np.ascontiguousarray(want).view(bits)
    assert not mismatch.any(), "%d of %d elements differ" % (mismatch.sum(), mismatch.size)


# --------------------------------------------- files read through a mapping

def test_file_replaced_between_epochs_is_read_anew(rng, tmp_path):
    """Each epoch maps a file only while it is the file at that path: one
    renamed over it is read from then on, and an unchanged one keeps its
    mapping (and its already mapped pages) from epoch to epoch."""
    path = tmp_path / "x.npy"
    x, y = dataset(rng, 300, image=(8, 8, 3))
    np.save(path, x)
    loader = ga.PinnedLoader([str(path), np.arange(300)], 32, shuffle=True, output="gpuaccel")
    for _ in range(2):
        for xb, ib in loader:
            np.testing.assert_array_equal(xb.numpy(), x[ib.numpy()])
    first = loader._mappings[0]
    assert first is not None and loader._mappings[1] is None  # the in-memory array needs none
    assert len(run(loader)) == len(loader)
    assert loader._mappings[0] is first
    x2 = 255 - x
    np.save(tmp_path / "new.npy", x2)
    os.replace(tmp_path / "new.npy", path)
    for _ in range(2):
        for xb, ib in loader:
            np.testing.assert_array_equal(xb.numpy(), x2[ib.numpy()])
    assert loader._mappings[0] is not first


def test_memmap_written_between_epochs(rng, tmp_path):
    """An r+ memmap shares the page cache with the loader's mapping: what
    the user writes through it is what the next epoch reads."""
    path = tmp_path / "x.npy"
    x, _ = dataset(rng, 100, image=(4, 4, 3))
    np.save(path, x)
    mm = np.load(path, mmap_mode="r+")
    loader = ga.PinnedLoader([mm, np.arange(100)], 16, output="gpuaccel")
    assert len(run(loader)) == 7
    mm[::3] = 7
    x[::3] = 7
    for xb, ib in loader:
        np.testing.assert_array_equal(xb.numpy(), x[ib.numpy()])
