"""DLPack and __cuda_array_interface__ on the host: round trips with torch
and NumPy, and the protocol details of the spec, with synthetic capsules for
what real producers rarely send."""

import ctypes
import gc
import sys

import numpy as np
import pytest

import gpuaccel as ga

from helpers import ALL_DTYPES, SyntheticTensor, capsule_name, random_values

torch = pytest.importorskip("torch")

SHAPES = [(), (0,), (1,), (7,), (3, 0, 5), (4, 5), (2, 3, 4), (2,) * 10, (1,) * 32]


def torch_tensor(rng, shape, dtype):
    values = random_values(rng, shape, dtype if dtype != "bfloat16" else "float32")
    t = torch.from_numpy(np.ascontiguousarray(values))
    return t.to(getattr(torch, dtype)) if dtype == "bfloat16" else t


# --------------------------------------------------------- torch exchange

@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_torch_round_trip_is_zero_copy(rng, dtype, shape):
    t = torch_tensor(rng, shape, dtype)
    a = ga.from_dlpack(t)
    assert a.shape == tuple(t.shape) and a.dtype == dtype and a.device == "cpu"
    if t.numel():
        assert a.data_ptr == t.data_ptr()
    back = torch.from_dlpack(a)
    assert back.dtype == t.dtype and tuple(back.shape) == tuple(t.shape)
    assert torch.equal(back, t)
    if t.numel():
        assert back.data_ptr() == t.data_ptr()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "bool"])
def test_torch_non_contiguous_and_offset_views(rng, dtype):
    t = torch_tensor(rng, (6, 8, 5), dtype)
    for view in [t[1:, ::2], t.transpose(0, 2), t[2, :, 1:4], t[..., 3], t.permute(1, 2, 0)[::3]]:
        a = ga.from_dlpack(view)
        assert a.shape == tuple(view.shape)
        assert a.strides == tuple(s * view.element_size() for s in view.stride())
        assert a.data_ptr == view.data_ptr()
        assert torch.equal(torch.from_dlpack(a), view)
        assert torch.equal(torch.from_dlpack(a.copy()), view.contiguous())


def test_torch_sees_writes_and_keeps_owner_alive():
    t = torch.zeros(4, 3)
    a = ga.from_dlpack(t)
    a[1] = 5.0
    assert t[1].tolist() == [5.0, 5.0, 5.0]
    back = torch.from_dlpack(ga.asarray(np.arange(6.0)))
    gc.collect()
    assert back.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    del t
    gc.collect()
    a[0] = 1.0  # a still owns the torch storage
    assert a[0].tolist() == [1.0, 1.0, 1.0]


def test_asarray_accepts_torch_and_converts(rng):
    t = torch.randn(5, 3)
    a = ga.asarray(t)
    assert a.data_ptr == t.data_ptr()
    h = ga.asarray(t, dtype="float16")
    np.testing.assert_array_equal(h.numpy(), t.numpy().astype(np.float16))
    with pytest.raises(ValueError, match="copy=False"):
        ga.asarray(t, dtype="float16", copy=False)


# --------------------------------------------------------- NumPy exchange

@pytest.mark.parametrize("dtype", [d for d in ALL_DTYPES if d != "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES[:7])
def test_numpy_round_trip(rng, dtype, shape):
    x = random_values(rng, shape, dtype)
    a = ga.from_dlpack(x)
    assert a.shape == x.shape and a.dtype == dtype
    y = np.from_dlpack(a)
    np.testing.assert_array_equal(y, x)
    if x.size:
        assert np.shares_memory(x, y)


def test_readonly_numpy_keeps_read_only_flag():
    x = np.arange(4.0)
    x.flags.writeable = False
    a = ga.from_dlpack(x)
    assert a.readonly
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 1
    y = np.from_dlpack(a)
    assert not y.flags.writeable
    with pytest.raises(BufferError, match="read-only"):
        a.__dlpack__()  # legacy capsule cannot say read-only


# ------------------------------------------------------- producer details

def test_versioned_or_legacy_by_max_version():
    a = ga.zeros(3)
    assert capsule_name(a.__dlpack__()) == b"dltensor"
    assert capsule_name(a.__dlpack__(max_version=None)) == b"dltensor"
    assert capsule_name(a.__dlpack__(max_version=(0, 8))) == b"dltensor"
    assert capsule_name(a.__dlpack__(max_version=(1, 0))) == b"dltensor_versioned"
    assert capsule_name(a.__dlpack__(max_version=(2, 3))) == b"dltensor_versioned"
    assert a.__dlpack_device__() == (1, 0)


def _versioned_struct(capsule):
    from helpers import DLManagedTensorVersioned

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return DLManagedTensorVersioned.from_address(get(capsule, b"dltensor_versioned"))


def test_flags_and_strides_are_honest():
    x = np.arange(12.0).reshape(3, 4)[:, 1::2]
    x.flags.writeable = False
    a = ga.asarray(x)
    m = _versioned_struct(cap := a.__dlpack__(max_version=(1, 1)))
    assert (m.version.major, m.version.minor) == (1, 1)
    assert m.flags & 1 and not m.flags & 2  # READ_ONLY, not IS_COPIED
    t = m.dl_tensor
    assert [t.shape[i] for i in range(2)] == [3, 2] and [t.strides[i] for i in range(2)] == [4, 2]
    assert t.byte_offset == 0 and t.dtype.code == 2 and t.dtype.bits == 64
    del m, t, cap
    copied = _versioned_struct(c2 := a.__dlpack__(max_version=(1, 0), copy=True))
    assert copied.flags & 2 and not copied.flags & 1  # IS_COPIED; the copy is writable
    assert copied.dl_tensor.data != a.data_ptr
    del copied, c2
    for dtype, code, bits in [("bool", 6, 8), ("bfloat16", 4, 16), ("uint8", 1, 8), ("int16", 0, 16)]:
        m = _versioned_struct(c3 := ga.zeros(2, dtype=dtype).__dlpack__(max_version=(1, 0)))
        assert (m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes) == (code, bits, 1)
        del m, c3


def test_producer_argument_errors():
    a = ga.zeros(3)
    with pytest.raises(BufferError, match="copy=False"):
        a.__dlpack__(dl_device=(2, 0), copy=False)
    with pytest.raises(BufferError, match="device type 7"):
        a.__dlpack__(dl_device=(7, 0))
    with pytest.raises(ValueError, match="stream must be None"):
        a.__dlpack__(stream=5)
    with pytest.raises(TypeError, match="max_version"):
        a.__dlpack__(max_version=1)
    with pytest.raises(TypeError, match="dl_device"):
        a.__dlpack__(dl_device="cpu")
    with pytest.raises(TypeError):
        a.__dlpack__(3)  # keyword-only
    assert capsule_name(a.__dlpack__(dl_device=(1, 0), copy=False)) == b"dltensor"
    # a float32 view stepping 6 bytes: NumPy allows it, DLPack cannot say it
    odd = ga.asarray(np.lib.stride_tricks.as_strided(np.zeros(8, np.float32), (3,), (6,)))
    assert odd.strides == (6,) and odd.dtype == "float32"
    with pytest.raises(BufferError, match="not a multiple of the itemsize"):
        odd.__dlpack__()
    assert odd.copy().__dlpack__() is not None


def test_unconsumed_capsule_frees_its_tensor():
    a = ga.zeros(5)
    base_refs = ctypes.c_long.from_address(id(a)).value
    caps = [a.__dlpack__() for _ in range(10)] + [a.__dlpack__(max_version=(1, 0)) for _ in range(10)]
    assert ctypes.c_long.from_address(id(a)).value == base_refs + 20
    del caps
    gc.collect()
    assert ctypes.c_long.from_address(id(a)).value == base_refs


def test_consumed_capsule_is_renamed_and_cannot_be_reused():
    a = ga.zeros(5)
    for kwargs, used in [({}, b"used_dltensor"), ({"max_version": (1, 0)}, b"used_dltensor_versioned")]:
        cap = a.__dlpack__(**kwargs)
        b = ga.from_dlpack(cap)
        assert capsule_name(cap) == used and b.data_ptr == a.data_ptr
        with pytest.raises(BufferError, match="already consumed"):
            ga.from_dlpack(cap)
        t = torch.from_dlpack(a.__dlpack__(**kwargs))
        assert t.data_ptr() == a.data_ptr


# ------------------------------------------------------- consumer details

def test_byte_offset_and_null_strides_are_honoured():
    buf = bytearray(np.arange(20, dtype=np.float32).tobytes())
    s = SyntheticTensor(buf, 2, 32, (2, 3), strides=None, byte_offset=8)
    a = ga.from_dlpack(s.capsule())
    assert a.is_contiguous and a.strides == (12, 4)
    np.testing.assert_array_equal(a.numpy(), np.arange(2, 8, dtype=np.float32).reshape(2, 3))
    assert s.deleted == 0
    del a
    gc.collect()
    assert s.deleted == 1


@pytest.mark.parametrize("versioned", [True, False])
def test_strided_synthetic_and_deleter_after_last_view(versioned):
    buf = bytearray(np.arange(24, dtype=np.int16).tobytes())
    s = SyntheticTensor(buf, 0, 16, (3, 4), strides=(8, 2), versioned=versioned)
    a = ga.from_dlpack(s.capsule())
    np.testing.assert_array_equal(a.numpy(), np.arange(24, dtype=np.int16).reshape(3, 8)[:, ::2])
    v = a[1:, ::2]
    del a
    gc.collect()
    assert s.deleted == 0  # the view still uses the memory
    assert v.tolist() == [[8, 12], [16, 20]]
    del v
    gc.collect()
    assert s.deleted == 1


def test_zero_size_null_data_and_zero_dim():
    s = SyntheticTensor(bytearray(0), 2, 32, (0, 4), data=None)
    a = ga.from_dlpack(s.capsule())
    assert a.shape == (0, 4) and a.size == 0
    s0 = SyntheticTensor(bytearray(np.float64(2.5).tobytes()), 2, 64, ())
    assert ga.from_dlpack(s0.capsule()).item() == 2.5
    assert torch.from_dlpack(ga.zeros((0, 3))).shape == (0, 3)
    assert np.from_dlpack(ga.zeros((2, 0))).shape == (2, 0)


def test_read_only_flag_and_pinned_host_import():
    buf = bytearray(16)
    a = ga.from_dlpack(SyntheticTensor(buf, 1, 8, (16,), flags=1).capsule())
    assert a.readonly
    p = ga.from_dlpack(SyntheticTensor(buf, 1, 8, (16,), device=(3, 0)).capsule())
    assert p.pinned and p.device == "cpu"


@pytest.mark.parametrize(
    "kwargs,exc,words",
    [
        (dict(dtype_code=5, bits=64, shape=(2,)), BufferError, "dtype .code 5"),
        (dict(dtype_code=2, bits=32, shape=(2,), lanes=4), BufferError, "lanes 4"),
        (dict(dtype_code=1, bits=16, shape=(2,)), BufferError, "not supported"),
        (dict(dtype_code=2, bits=32, shape=(2,), version=(2, 0)), BufferError, "version 2.0 is newer"),
        (dict(dtype_code=2, bits=32, shape=(2,), device=(4, 0)), BufferError, "device type 4"),
        (dict(dtype_code=2, bits=32, shape=(2,), ndim=40), BufferError, "ndim 40"),
        (dict(dtype_code=2, bits=32, shape=(2, -1)), BufferError, "invalid shape"),
        (dict(dtype_code=2, bits=32, shape=(4,), flags=4), BufferError, "sub-byte"),
    ],
)
def test_malformed_capsules_raise_and_stay_unconsumed(kwargs, exc, words):
    s = SyntheticTensor(bytearray(64), **kwargs)
    cap = s.capsule()
    with pytest.raises(exc, match=words):
        ga.from_dlpack(cap)
    assert not capsule_name(cap).startswith(b"used_")
    assert s.deleted == 0


def test_null_data_for_non_empty_tensor():
    s = SyntheticTensor(bytearray(8), 2, 32, (2,), data=None)
    s.managed.dl_tensor.data = None
    with pytest.raises(BufferError, match="NULL data"):
        ga.from_dlpack(s.capsule())


def test_from_dlpack_argument_errors():
    with pytest.raises(TypeError, match="must have a __dlpack__ method"):
        ga.from_dlpack([1, 2])
    bad = ctypes.pythonapi.PyCapsule_New
    bad.restype = ctypes.py_object
    bad.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    other = bad(ctypes.addressof(ctypes.c_int(1)), b"something_else", None)
    with pytest.raises(TypeError, match="named 'something_else'"):
        ga.from_dlpack(other)

    class Liar:
        def __dlpack__(self, **kw):
            return 42

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(TypeError, match="not a capsule"):
        ga.from_dlpack(Liar())


def test_dlpack_device_is_only_asked_for_with_a_current_stream():
    # stream=None already means the legacy default stream to a CUDA producer,
    # so without a gpuaccel stream in a `with` block the device is not needed
    class Producer:
        device_calls = 0

        def __dlpack__(self, **kw):
            assert "stream" not in kw
            return np.arange(3.0).__dlpack__(**kw)

        def __dlpack_device__(self):
            Producer.device_calls += 1
            return (1, 0)

    assert ga.from_dlpack(Producer()).tolist() == [0.0, 1.0, 2.0]
    assert Producer.device_calls == 0


def test_old_producer_without_keywords_is_retried():
    calls = []

    class Old:
        def __init__(self):
            self.x = np.arange(3.0)

        def __dlpack__(self, stream=None):
            calls.append(stream)
            return self.x.__dlpack__()

        def __dlpack_device__(self):
            return (1, 0)

    a = ga.from_dlpack(Old())
    assert a.tolist() == [0.0, 1.0, 2.0] and calls == [None]


def test_from_dlpack_device_and_copy():
    t = torch.arange(4.0)
    c = ga.from_dlpack(t, copy=True)
    assert c.data_ptr != t.data_ptr() and c.tolist() == t.tolist()
    assert ga.from_dlpack(t, device="cpu", copy=False).data_ptr == t.data_ptr()


# --------------------------------------------- __cuda_array_interface__

def test_cuda_array_interface_absent_on_host_arrays():
    assert not hasattr(ga.zeros(3), "__cuda_array_interface__")


class FakeCai:
    def __init__(self, **cai):
        self.__cuda_array_interface__ = cai


@pytest.mark.parametrize(
    "cai,exc,words",
    [
        (dict(shape=(2,), typestr="<f4"), ValueError, "needs 'shape', 'typestr' and 'data'"),
        (dict(shape=(2,), typestr="<c8", data=(0, False), version=3), TypeError, "typestr"),
        (dict(shape=(2,), typestr=">f4", data=(0, False), version=3), TypeError, "typestr"),
        (dict(shape=[2], typestr="<f4", data=(0, False), version=3), TypeError, "shape must be a tuple"),
        (dict(shape=(2,), typestr="<f4", data=5, version=3), TypeError, "data must be a"),
        (dict(shape=(2,), typestr="<f4", data=(0, False), mask=1, version=3), ValueError, "masked"),
        (dict(shape=(2, 2), typestr="<f4", data=(0, False), strides=(4,), version=3), ValueError, "1 strides"),
        (dict(shape=(2,), typestr="<f4", data=(0, False), version=3), ValueError, "NULL data"),
    ],
)
def test_malformed_cuda_array_interface(cai, exc, words):
    with pytest.raises(exc, match=words):
        ga.asarray(FakeCai(**cai))


def test_cuda_array_interface_needs_cuda_here():
    if ga.cuda_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="CUDA|without CUDA"):
        ga.asarray(FakeCai(shape=(2,), typestr="<f4", data=(1 << 40, False), version=3))


# --------------------------------------------------------- device-less CUDA

def test_cuda_requests_raise_clear_errors_without_a_gpu():
    if ga.cuda_available():
        pytest.skip("this machine has CUDA")
    message = "built without CUDA" if not ga.built_with_cuda() else "CUDA is not available"
    for call in [
        lambda: ga.empty(3, device="cuda"),
        lambda: ga.zeros(3).to("cuda"),
        lambda: ga.asarray([1.0], device="cuda:0"),
        lambda: ga.zeros(3).__dlpack__(dl_device=(2, 0)),
        lambda: ga.empty(3, pinned=True),
        lambda: ga.Stream(),
        lambda: ga.current_stream(),
    ]:
        with pytest.raises(RuntimeError, match=message):
            call()


# -------------------------------------------------- consumers that refuse

class _LegacyOnly:
    """A producer that hands out gpuaccel's legacy capsule whatever the
    consumer asks (as producers before DLPack 1.0 do)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def _refused(consumer, producer, array, error):
    """The consumer's own exception comes through (the capsule's destructor
    ran while it was pending), and the export's reference to the array is
    gone with the capsule."""
    before = sys.getrefcount(array)
    with pytest.raises(error) as info:
        consumer(producer)
    assert not isinstance(info.value, SystemError)
    del info
    gc.collect()
    assert sys.getrefcount(array) == before


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_numpy_refusing_bfloat16_keeps_its_error(versioned):
    a = ga.zeros((3,), dtype="bfloat16")
    producer = a if versioned else _LegacyOnly(a)
    _refused(np.from_dlpack, producer, a, (RuntimeError, BufferError, TypeError))


def test_jax_refusing_a_strided_view_keeps_its_error(rng):
    jnp = pytest.importorskip("jax.numpy")
    base = ga.asarray(rng.random((5, 6), np.float32))
    view = base[:, ::2]
    _refused(jnp.from_dlpack, view, view, Exception)
    # and what JAX takes, it takes without copying, values intact
    np.testing.assert_array_equal(np.asarray(jnp.from_dlpack(base)), base.numpy())


# ----------------------------------------------- what import takes, and how

@pytest.mark.parametrize("make", [lambda t: t.to_sparse(), lambda t: t.to_sparse_csr(), lambda t: t.to_mkldnn()],
                         ids=["sparse_coo", "sparse_csr", "mkldnn"])
def test_tensors_without_strided_memory_are_refused_in_one_line(make):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "sparse CSR support is in beta"
        t = make(torch.eye(3))
    layout = str(t.layout)
    for call, error in ((ga.from_dlpack, BufferError), (ga.asarray, BufferError),
                        (lambda x: ga.matmul(x, torch.eye(3)), TypeError),
                        (lambda x: ga.matmul(torch.eye(3), x), TypeError)):
        with pytest.raises(error) as info:
            call(t)
        message = str(info.value)
        assert "\n" not in message and len(message) < 200, message
        assert layout in message and "to_dense()" in message


def test_a_strided_tensor_that_fails_keeps_torchs_error():
    # the layout note replaces only errors about tensors of other layouts
    t = torch.eye(3, requires_grad=True)
    with pytest.raises(BufferError, match="requires grad"):
        ga.from_dlpack(t)


def test_legacy_capsules_import_read_only(rng):
    # a legacy capsule has no flags to say its memory may be written: read-only, as NumPy imports it
    x = rng.random(5)
    a = ga.from_dlpack(_LegacyOnly(ga.asarray(x)))
    assert a.readonly
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 1.0
    writable = ga.from_dlpack(SyntheticTensor(bytearray(8), 2, 64, (1,)).capsule())  # versioned, flags 0
    assert not writable.readonly
    copied = ga.from_dlpack(_LegacyOnly(ga.asarray(x)), copy=True)
    assert not copied.readonly
    copied[0] = 7.0
    assert copied.numpy()[0] == 7.0 and x[0] != 7.0


def test_jax_arrays_import_read_only(rng):
    jnp = pytest.importorskip("jax.numpy")
    values = rng.random(7).astype(np.float32)
    j = jnp.asarray(values)
    a = ga.from_dlpack(j)
    assert a.readonly  # JAX arrays are immutable; JAX exports legacy capsules, which cannot say so
    np.testing.assert_array_equal(a.numpy(), values)
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        ga.matmul(ga.asarray(np.ones((7, 1), np.float32)), ga.asarray(np.ones((1, 7), np.float32)),
                  out=jnp.zeros((7, 7), jnp.float32))
    np.testing.assert_array_equal(np.asarray(j), values)
    c = ga.from_dlpack(j, copy=True)
    c[0] = -1.0
    np.testing.assert_array_equal(np.asarray(j), values)
