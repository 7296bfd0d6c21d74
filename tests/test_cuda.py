"""The CUDA path: every kernel against its CPU twin, transfers, DLPack and
CUDA Array Interface with torch/CuPy, streams, events, the device pool — and
that nothing here blocks the host on the GPU."""

import sys
import time

import numpy as np
import pytest

import gpuaccel as ga

from helpers import ALL_DTYPES, INT_DTYPES, LONG_SLEEP_CYCLES, SyntheticTensor, random_strided_view, random_values

pytestmark = pytest.mark.cuda
torch = pytest.importorskip("torch")


def gpu_busy():
    torch.cuda._sleep(LONG_SLEEP_CYCLES)


@pytest.fixture(autouse=True)
def drain():
    yield
    ga.synchronize()
    if torch.cuda.is_available():  # not on the simulator (GPUACCEL_SIM=1)
        torch.cuda.synchronize()


# ---------------------------------------------------------- kernels vs CPU

@pytest.mark.parametrize("src", ALL_DTYPES)
@pytest.mark.parametrize("dst", ALL_DTYPES)
def test_cast_matches_cpu_bit_for_bit(rng, src, dst):
    x = random_strided_view(rng, (37, 29), src)  # sizes not multiples of the block
    if src not in INT_DTYPES + ["bool"]:
        x = (x * 300).astype(x.dtype)  # exercise saturation as well
    host = ga.asarray(x)
    want = host.astype(dst).numpy()
    dev = host.to("cuda")
    got = dev.astype(dst).numpy()
    assert got.tobytes() == want.tobytes()
    # strided device source and destination
    dev_view = ga.asarray(np.ascontiguousarray(x)).to("cuda")[::2, 1::3]
    assert dev_view.astype(dst).numpy().tobytes() == host[::2, 1::3].astype(dst).numpy().tobytes()


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_fill_matches_cpu(dtype):
    for value in [0, 1, -3, 2.75, 1e30, True]:
        if dtype in INT_DTYPES and isinstance(value, float) and abs(value) > 1e10:
            continue
        cpu = ga.full((1000, 3), value, dtype=dtype)
        gpu = ga.full((1000, 3), value, dtype=dtype, device="cuda")
        assert gpu.numpy().tobytes() == cpu.numpy().tobytes(), (dtype, value)
        strided = ga.zeros((50, 40), dtype=dtype, device="cuda")
        strided[::3, 1::2] = value
        ref = ga.zeros((50, 40), dtype=dtype)
        ref[::3, 1::2] = value
        assert strided.numpy().tobytes() == ref.numpy().tobytes()


@pytest.mark.gpu
def test_misaligned_device_views_use_the_byte_path(rng):
    raw = torch.empty(4 * 1000 + 1, dtype=torch.uint8, device="cuda")
    values = rng.standard_normal(1000).astype(np.float32)
    raw[1:].copy_(torch.from_numpy(values.view(np.uint8)).cuda())
    s = SyntheticTensor(bytearray(1), 2, 32, (1000,), device=(2, 0), data=raw.data_ptr(), byte_offset=1)
    a = ga.from_dlpack(s.capsule())
    assert a.data_ptr % 4 == 1
    np.testing.assert_array_equal(a.astype("float64").numpy(), values.astype(np.float64))
    a[...] = 2.5
    np.testing.assert_array_equal(a.numpy(), np.full(1000, 2.5, np.float32))


# ---------------------------------------------------------------- transfers

@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "bool", "float16"])
def test_host_device_round_trips(rng, pinned, dtype):
    x = random_values(rng, (123, 77), dtype)
    host = ga.empty(x.shape, dtype=dtype, pinned=pinned)
    host[...] = ga.asarray(x)
    assert host.pinned == pinned
    dev = host.to("cuda")
    assert dev.device == "cuda:0" and dev.is_contiguous
    assert dev.numpy().tobytes() == host.numpy().tobytes()
    assert dev.to("cpu").numpy().tobytes() == host.numpy().tobytes()
    # strided host -> strided device, with conversion
    target = ga.zeros((123, 200), dtype="float64", device="cuda")
    target[:, ::2][:, :77] = host
    np.testing.assert_array_equal(target[:, ::2][:, :77].numpy(), host.astype("float64").numpy())
    # strided device -> strided host
    out = ga.zeros((77, 123), dtype=dtype)
    out[...] = dev.T
    assert out.numpy().tobytes() == host.T.copy().numpy().tobytes()


def test_asarray_to_and_copy_on_device(rng):
    x = rng.standard_normal((64, 33))
    d = ga.asarray(x, device="cuda", dtype="float32")
    assert d.device == "cuda:0" and d.dtype == "float32"
    np.testing.assert_array_equal(d.numpy(), x.astype(np.float32))
    assert d.to("cuda") is d and d.to("cuda", copy=True).data_ptr != d.data_ptr
    np.testing.assert_array_equal(d.copy().numpy(), d.numpy())
    np.testing.assert_array_equal(d.reshape(33, 64).numpy(), x.astype(np.float32).reshape(33, 64))
    np.testing.assert_array_equal(d.T.reshape(-1).numpy(), x.astype(np.float32).T.reshape(-1))
    with pytest.raises(TypeError, match="implicitly"):
        np.asarray(d)
    assert "device='cuda:0'" in repr(d)


@pytest.mark.skipif(not ga.cuda_available() or ga.device_count() < 2, reason="needs two GPUs")
def test_peer_copies(rng):
    x = rng.standard_normal((100, 10)).astype(np.float32)
    a = ga.asarray(x, device="cuda:0")
    b = a.to("cuda:1")
    assert b.device == "cuda:1"
    np.testing.assert_array_equal(b.numpy(), x)
    np.testing.assert_array_equal(a.T.to("cuda:1").astype("float64").numpy(), x.T.astype(np.float64))


@pytest.mark.gpu
@pytest.mark.skipif(not ga.cuda_available() or ga.device_count() < 2, reason="needs two GPUs")
def test_peer_copy_from_legacy_streams_waits_for_the_source():
    # both sides on their device's legacy default stream: two different
    # streams, so the copy on cuda:1 must wait for the fill queued on cuda:0
    with torch.cuda.device(0):
        gpu_busy()  # torch's default stream of cuda:0 is the legacy one
    a = ga.full((1 << 22,), 1.0, device="cuda:0")  # queued behind the sleep
    b = a.to("cuda:1")
    del a  # the copy on cuda:1 still reads it: freeing must wait for that
    with ga.Stream(device="cuda:0"):
        c = ga.full((1 << 22,), 7.0, device="cuda:0")  # may reuse a's memory
    assert b.numpy().min() == 1.0 and b.numpy().max() == 1.0
    del c


@pytest.mark.gpu
def test_per_thread_stream_arrays_dropped_in_another_thread():
    # each thread's handle 2 is its own stream: an array made on thread A's
    # per-thread stream and dropped by thread B must be freed after A's work
    import threading

    made = {}

    def producer():
        with ga.Stream.from_handle(2):
            a = ga.full((1 << 22,), 1.0, device="cuda")
            with torch.cuda.stream(torch.cuda.ExternalStream(2)):
                gpu_busy()  # on this thread's per-thread stream
            out = ga.empty(a.shape, device="cuda")
            out[...] = a  # reads a after the sleep
        made["a"], made["out"] = a, out

    t = threading.Thread(target=producer)
    t.start()
    t.join()
    a = made.pop("a")
    del a  # freed here, by another thread than the one that made it
    with ga.Stream():
        b = ga.full((1 << 22,), 5.0, device="cuda")  # may reuse a's memory
    ga.synchronize()
    out = made.pop("out")
    assert out.numpy().min() == 1.0 and out.numpy().max() == 1.0
    del b, out


# ------------------------------------------------------------ torch / CuPy

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_torch_cuda_zero_copy(rng, dtype):
    t = torch.from_numpy(random_values(rng, (40, 30), "float32" if dtype == "bfloat16" else dtype)).to(
        device="cuda", dtype=getattr(torch, dtype))
    a = ga.from_dlpack(t)
    assert a.device == "cuda:0" and a.data_ptr == t.data_ptr() and a.dtype == dtype
    back = torch.from_dlpack(a)
    assert back.data_ptr() == t.data_ptr() and torch.equal(back, t)
    v = ga.from_dlpack(t[3:, ::2])
    assert torch.equal(torch.from_dlpack(v), t[3:, ::2])
    assert ga.asarray(t).__dlpack_device__() == (2, 0)


@pytest.mark.gpu
def test_dlpack_export_does_not_block_the_host():
    a = ga.zeros((1 << 20,), device="cuda")
    gpu_busy()  # on torch's current stream (the legacy default stream)
    start = time.perf_counter()
    t = torch.from_dlpack(a)
    b = ga.from_dlpack(t)
    c = ga.asarray(torch.ones(5, device="cuda"))
    repr(b)
    elapsed = time.perf_counter() - start
    # the stream still runs the sleep queued before: nothing above waited for the GPU
    assert not torch.cuda.current_stream().query(), "the exchange waited for the GPU (%.3f s)" % elapsed
    assert c.numpy().tolist() == [1.0] * 5


@pytest.mark.gpu
def test_consumer_stream_waits_for_producer_work():
    n = 1 << 22
    a = ga.zeros((n,), device="cuda")
    side = torch.cuda.Stream()
    for _ in range(3):
        gpu_busy()                       # legacy stream busy ...
        a[...] = 7.0                     # ... so this fill is queued behind it
        with torch.cuda.stream(side):    # a consumer on another stream
            t = torch.from_dlpack(a)     # must wait for the fill, on the GPU
            total = t.sum()
        side.synchronize()
        assert total.item() == 7.0 * n
        a[...] = 0.0


@pytest.mark.gpu
def test_producer_side_stream_is_waited_on():
    s = ga.Stream()
    x = torch.full((1 << 20,), 3.0, device="cuda")
    with s:
        a = ga.asarray(x, copy=True)  # written on s
        b = ga.empty(a.shape, device="cuda")
        b[...] = a
    t = torch.from_dlpack(b)  # current (legacy) stream must wait for s's work
    assert t.sum().item() == 3.0 * (1 << 20)


@pytest.mark.gpu
def test_stream_is_passed_to_producers_under_a_current_stream():
    seen = []
    t = torch.ones(4, device="cuda")

    class Producer:
        def __dlpack__(self, **kw):
            seen.append(kw.get("stream"))
            return t.__dlpack__(**kw)

        def __dlpack_device__(self):
            return (2, 0)

    s = ga.Stream()
    with s:
        assert ga.from_dlpack(Producer()).numpy().tolist() == [1.0] * 4
    assert seen == [s.handle]

    class BadDevice(Producer):
        def __dlpack_device__(self):
            return "cuda"

    with s:
        with pytest.raises(TypeError, match="__dlpack_device__"):
            ga.from_dlpack(BadDevice())


def test_cuda_array_interface_round_trip():
    cupy = pytest.importorskip("cupy")
    a = ga.asarray(np.arange(12, dtype=np.float32).reshape(3, 4), device="cuda")
    cai = a.__cuda_array_interface__
    assert cai["version"] == 3 and cai["typestr"] == "<f4" and cai["shape"] == (3, 4)
    assert cai["data"] == (a.data_ptr, False) and cai["strides"] is None and cai["stream"] == 1
    assert a.T.__cuda_array_interface__["strides"] == (4, 16)
    c = cupy.asarray(a)
    assert c.data.ptr == a.data_ptr and cupy.asnumpy(c).tolist() == a.numpy().tolist()
    back = ga.asarray(cupy.arange(6, dtype=cupy.int16))
    assert back.device == "cuda:0" and back.tolist() == list(range(6))
    with pytest.raises(AttributeError, match="bfloat16"):
        ga.zeros(3, dtype="bfloat16", device="cuda").__cuda_array_interface__  # noqa: B018 - the access raises


# ------------------------------------------------------- streams and events

@pytest.mark.gpu
def test_stream_api():
    s = ga.Stream()
    assert s.device == "cuda:0" and s.handle != 0 and s == s and s != ga.current_stream()
    with s:
        assert ga.current_stream() == s
        with ga.Stream() as inner:
            assert ga.current_stream() == inner
        assert ga.current_stream() == s
    assert ga.current_stream().handle == 0
    wrapped = ga.Stream.from_handle(torch.cuda.Stream().cuda_stream)
    assert wrapped.device == "cuda:0"
    e = s.record_event()
    s.wait_event(e)
    s.wait_stream(ga.current_stream())
    s.synchronize()
    assert s.query() and e.query()


@pytest.mark.gpu
def test_events_time_gpu_work():
    start, end = ga.Event(timing=True), ga.Event(timing=True)
    start.record()
    gpu_busy()
    end.record()
    end.synchronize()
    assert start.elapsed_ms(end) > 10.0


@pytest.mark.gpu
def test_synchronize_waits_and_event_wait():
    gpu_busy()
    e = ga.Event()
    e.record()
    assert not e.query()
    ga.synchronize()
    assert e.query()


# ------------------------------------------------------------------ memory

def test_device_pool_stats_limit_and_recovery():
    ga.synchronize()
    base = ga.memory_stats("cuda")
    a = ga.empty(1 << 20, dtype="uint8", device="cuda")
    s = ga.memory_stats("cuda")
    assert s["allocated_bytes"] - base["allocated_bytes"] == 1 << 20
    assert s["reserved_bytes"] >= s["allocated_bytes"] and s["device_total_bytes"] > 0
    try:
        ga.set_memory_limit(s["allocated_bytes"] + (1 << 20), device="cuda")
        with pytest.raises(ga.OutOfMemoryError, match="limit"):
            ga.empty(2 << 20, dtype="uint8", device="cuda")
        del a
        b = ga.empty(1 << 20, dtype="uint8", device="cuda")
        assert b.nbytes == 1 << 20
    finally:
        ga.set_memory_limit(None, device="cuda")
    with pytest.raises(ga.OutOfMemoryError, match="CUDA out of memory on cuda:0"):
        ga.empty(1 << 50, dtype="uint8", device="cuda")
    ga.empty_cache()
    ga.synchronize()
    assert ga.memory_stats("cuda")["reserved_bytes"] <= s["reserved_bytes"]


def test_the_device_pool_keeps_freed_memory_up_to_its_release_threshold_only():
    # freed memory stays reserved through a synchronization, for reuse
    # without driver calls, up to the pool's release threshold (512 MiB,
    # csrc/alloc.c); above it a synchronization gives it back to the
    # device, where torch's allocator can have it
    threshold = 512 << 20
    slack = 32 << 20  # the driver reserves in chunks of a few MiB
    ga.synchronize()
    ga.empty_cache()
    a = ga.empty(64 << 20, dtype="uint8", device="cuda")
    del a
    ga.synchronize()
    s = ga.memory_stats("cuda")
    assert s["reserved_bytes"] >= s["allocated_bytes"] + (64 << 20)
    big = ga.empty(threshold + (256 << 20), dtype="uint8", device="cuda")
    assert ga.memory_stats("cuda")["reserved_bytes"] >= big.nbytes
    del big
    ga.synchronize()
    s = ga.memory_stats("cuda")
    assert s["reserved_bytes"] <= max(threshold, s["allocated_bytes"]) + slack
    assert s["peak_reserved_bytes"] >= threshold + (256 << 20)


@pytest.mark.gpu
def test_pinned_memory_is_pinned_and_reused():
    p = ga.empty(1 << 16, dtype="float32", pinned=True)
    t = torch.from_dlpack(p)
    assert p.pinned and t.is_pinned() and p.__dlpack_device__() == (1, 0)
    ptr = p.data_ptr
    del p, t
    q = ga.empty(1 << 16, dtype="float32", pinned=True)  # the cached block, its copies being done
    assert q.data_ptr == ptr


@pytest.mark.gpu
def test_freeing_waits_for_other_streams_on_the_gpu():
    # memory used on a side stream must not be handed out again before that
    # stream is done with it
    side = ga.Stream()
    for _ in range(5):
        a = ga.full((1 << 22,), 1.0, device="cuda")
        with side:
            gpu_busy_on = torch.cuda.ExternalStream(side.handle)
            with torch.cuda.stream(gpu_busy_on):
                gpu_busy()
            out = ga.empty(a.shape, device="cuda")
            out[...] = a      # reads a on the side stream, after the sleep
        del a                 # freed on the legacy stream: must wait for `side`
        b = ga.full((1 << 22,), 5.0, device="cuda")  # may reuse a's memory
        side.synchronize()
        assert out.numpy().min() == 1.0
        del b


@pytest.mark.gpu
def test_host_writes_to_a_pinned_array_wait_for_the_async_copy_from_it():
    # .to("cuda") from a pinned array is async (no host wait on the training
    # path); the host's next write to that array waits for the copy instead
    side = ga.Stream()
    writes = [lambda v: buf.__setitem__(Ellipsis, v),                      # gpuaccel's fill
              lambda v: buf.__setitem__(Ellipsis, ga.full(buf.shape, v)),   # a host copy
              lambda v: buf.numpy().__setitem__(Ellipsis, v),               # a NumPy view
              lambda v: np.asarray(memoryview(buf)).__setitem__(Ellipsis, v)]
    for write in writes:
        buf = ga.full((1 << 22,), 1.0, pinned=True)
        with torch.cuda.stream(torch.cuda.ExternalStream(side.handle)):
            gpu_busy()
        with side:
            dev = buf.to("cuda")      # queued behind the sleep: still reading buf
        write(2.0)                    # must not overwrite what the copy reads
        assert dev.numpy().max() == 1.0 and buf.numpy().min() == 2.0


@pytest.mark.gpu
def test_arrays_outlive_the_stream_they_were_made_on(rng, monkeypatch):
    # arrays made under Streams that are then dropped are freed in those
    # streams' order later: the handles must still be valid streams then
    # (a failed cudaFreeAsync is reported through sys.unraisablehook)
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    values = rng.standard_normal((513, 7)).astype(np.float32)
    before = ga.memory_stats("cuda")["allocated_bytes"]
    streams = [ga.Stream(priority=-1 if k % 2 else 0) for k in range(20)]
    kept = []
    for s in streams:
        with s:
            kept.append(ga.asarray(values, device="cuda").astype("float64"))
    del s, streams  # every stream dropped before any of its arrays
    for a in kept:
        np.testing.assert_array_equal(a.numpy(), values.astype(np.float64))
    kept.clear()  # each freed on its dropped stream
    ga.synchronize()
    assert unraisable == []
    assert ga.memory_stats("cuda")["allocated_bytes"] == before
    # released streams are handed out again, the last released first
    last = ga.Stream(priority=-1)
    handle = last.handle
    del last
    assert ga.Stream(priority=-1).handle == handle


@pytest.mark.gpu
def test_device_properties_and_build_for_this_gpu():
    p = ga.device_properties()
    assert p["multiprocessors"] > 0 and p["total_memory"] > 0
    major, minor = p["compute_capability"]
    archs = ga.build_info()["cuda_archs"]
    assert any(a // 10 <= major for a in archs), (archs, major, minor)
