"""The DLPack C exchange API (DLPack 1.3, __dlpack_c_exchange_api__): gpuaccel
as a consumer of torch's table (from_dlpack, asarray and the ops read torch
tensors through it), and gpuaccel.Array's own table, each of its five
functions called through ctypes and checked against NumPy/torch."""

import ctypes

import numpy as np
import pytest

import gpuaccel as ga

from helpers import DELETER, DLDataType, DLDevice, DLManagedTensorVersioned, DLPackVersion, DLTensor

torch = pytest.importorskip("torch")

_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_GetPointer.restype = ctypes.c_void_p
_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

SET_ERROR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
MANAGED_P = ctypes.POINTER(DLManagedTensorVersioned)


class Header(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("prev_api", ctypes.c_void_p)]


class ExchangeAPI(ctypes.Structure):
    _fields_ = [("header", Header), ("managed_tensor_allocator", ctypes.c_void_p),
                ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
                ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
                ("dltensor_from_py_object_no_sync", ctypes.c_void_p), ("current_work_stream", ctypes.c_void_p)]


class Table:
    """A type's exchange table with its functions callable from Python; the
    PYFUNCTYPE ones raise the Python exception a failing call sets."""

    def __init__(self, cls):
        self.api = ExchangeAPI.from_address(_GetPointer(cls.__dlpack_c_exchange_api__, b"dlpack_exchange_api"))
        a = self.api
        self.allocator = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.POINTER(DLTensor), ctypes.POINTER(MANAGED_P),
                                           ctypes.c_void_p, SET_ERROR)(a.managed_tensor_allocator)
        self.from_py = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(MANAGED_P))(
            a.managed_tensor_from_py_object_no_sync)
        self.to_py = ctypes.PYFUNCTYPE(ctypes.c_int, MANAGED_P, ctypes.POINTER(ctypes.py_object))(
            a.managed_tensor_to_py_object_no_sync)
        self.dltensor = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))(
            a.dltensor_from_py_object_no_sync)
        self.stream = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int32,
                                        ctypes.POINTER(ctypes.c_void_p))(a.current_work_stream)

    def managed(self, obj):
        out = MANAGED_P()
        assert self.from_py(obj, ctypes.byref(out)) == 0
        return out

    def view(self, obj):
        out = DLTensor()
        assert self.dltensor(obj, ctypes.byref(out)) == 0
        return out


DTYPES = [(np.bool_, 6, 8), (np.uint8, 1, 8), (np.int8, 0, 8), (np.int16, 0, 16), (np.int32, 0, 32),
          (np.int64, 0, 64), (np.float16, 2, 16), (np.float32, 2, 32), (np.float64, 2, 64)]


def shape_of(t):
    return tuple(t.shape[k] for k in range(t.ndim))


def strides_of(t):
    return tuple(t.strides[k] for k in range(t.ndim))


# ---------------------------------------------------------------- the table

def test_array_publishes_a_version_1_3_table():
    table = Table(ga.Array)
    assert (table.api.header.version.major, table.api.header.version.minor) == (1, 3)
    assert not table.api.header.prev_api
    assert all(getattr(table.api, name) for name, _ in ExchangeAPI._fields_[1:])


@pytest.mark.parametrize("np_dtype,code,bits", DTYPES)
def test_dltensor_view_describes_the_array(rng, np_dtype, code, bits):
    table = Table(ga.Array)
    base = ga.asarray((rng.standard_normal((5, 7)) * 10).astype(np_dtype))
    a = base[1:5:2, ::-3]  # offset, step, negative stride
    t = table.view(a)
    assert t.data == a.data_ptr and t.byte_offset == 0
    assert (t.device.device_type, t.device.device_id) == (1, 0)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (code, bits, 1)
    assert shape_of(t) == a.shape
    assert strides_of(t) == tuple(s // a.itemsize for s in a.strides)
    # the view describes the values: read them back through NumPy
    itemsize = a.itemsize
    flat = np.ctypeslib.as_array((ctypes.c_char * (base.nbytes)).from_address(base.data_ptr))
    whole = np.frombuffer(flat, dtype=np_dtype)
    start = (t.data - base.data_ptr) // itemsize
    got = np.lib.stride_tricks.as_strided(whole[start:], shape=a.shape,
                                          strides=[s * itemsize for s in strides_of(t)])
    np.testing.assert_array_equal(got, a.numpy())


def test_dltensor_view_of_a_zero_d_and_an_empty_array():
    table = Table(ga.Array)
    scalar = ga.full((), 3.5, dtype="float64")  # a view lives only as long as its array
    t = table.view(scalar)
    assert t.ndim == 0
    assert ctypes.c_double.from_address(t.data).value == 3.5
    empty = ga.zeros((0, 4), dtype="float32")
    e = table.view(empty)
    assert shape_of(e) == (0, 4)


def test_dltensor_view_refuses_what_dlpack_cannot_say():
    table = Table(ga.Array)
    with pytest.raises(TypeError, match="gpuaccel.Array, got list"):
        table.dltensor([1, 2], ctypes.byref(DLTensor()))
    # strides that are not a multiple of the itemsize come from NumPy views
    raw = np.zeros(33, dtype=np.uint8)
    misaligned = np.ndarray((4,), dtype=np.float64, buffer=raw, offset=1, strides=(7,))
    with pytest.raises(BufferError, match="not a multiple of the itemsize"):
        table.dltensor(ga.asarray(misaligned), ctypes.byref(DLTensor()))


def test_managed_export_keeps_the_array_alive_until_its_deleter(rng):
    table = Table(ga.Array)
    values = rng.standard_normal((3, 4))
    a = ga.asarray(values)
    m = table.managed(a)
    assert (m.contents.version.major, m.contents.version.minor) == (1, 1)
    assert m.contents.flags == 0
    t = m.contents.dl_tensor
    assert t.data == a.data_ptr and shape_of(t) == (3, 4) and strides_of(t) == (4, 1)
    data = a.data_ptr
    del a  # the managed tensor holds the array
    np.testing.assert_array_equal(np.ctypeslib.as_array(ctypes.cast(data, ctypes.POINTER(ctypes.c_double)),
                                                        shape=(3, 4)), values)
    m.contents.deleter(ctypes.cast(m, ctypes.c_void_p))


def test_managed_export_flags_a_read_only_array():
    table = Table(ga.Array)
    frozen = np.arange(6.0)
    frozen.flags.writeable = False
    m = table.managed(ga.asarray(frozen))
    assert m.contents.flags & 1  # DLPACK_FLAG_BITMASK_READ_ONLY
    m.contents.deleter(ctypes.cast(m, ctypes.c_void_p))


def test_to_py_takes_over_torch_and_gpuaccel_managed_tensors(rng):
    ours, theirs = Table(ga.Array), Table(type(torch.zeros(1)))
    t = torch.from_numpy(rng.standard_normal((4, 5)).astype(np.float32))
    out = ctypes.py_object()
    assert ours.to_py(theirs.managed(t), ctypes.byref(out)) == 0
    a = out.value
    assert isinstance(a, ga.Array) and a.data_ptr == t.data_ptr()
    np.testing.assert_array_equal(a.numpy(), t.numpy())
    src = ga.asarray(rng.standard_normal(7))
    out2 = ctypes.py_object()
    assert ours.to_py(ours.managed(src), ctypes.byref(out2)) == 0
    assert out2.value.data_ptr == src.data_ptr
    np.testing.assert_array_equal(out2.value.numpy(), src.numpy())


def test_to_py_consumes_a_tensor_it_cannot_hold():
    ours = Table(ga.Array)
    deleted = []
    deleter = DELETER(lambda p: deleted.append(p))
    shape = (ctypes.c_int64 * 1)(3)
    buf = (ctypes.c_char * 24)()
    complex_tensor = DLManagedTensorVersioned(
        DLPackVersion(1, 1), None, deleter, 0,
        DLTensor(ctypes.addressof(buf), DLDevice(1, 0), 1, DLDataType(5, 64, 1), shape, None, 0))
    with pytest.raises(BufferError, match="dtype"):
        ours.to_py(ctypes.pointer(complex_tensor), ctypes.byref(ctypes.py_object()))
    assert len(deleted) == 1  # ownership was handed over, also on failure


@pytest.mark.parametrize("np_dtype,code,bits", DTYPES)
def test_allocator_makes_a_writable_array(np_dtype, code, bits):
    table = Table(ga.Array)
    shape = (ctypes.c_int64 * 3)(2, 3, 5)
    proto = DLTensor(None, DLDevice(1, 0), 3, DLDataType(code, bits, 1), shape, None, 0)
    out = MANAGED_P()
    errors = []
    set_error = SET_ERROR(lambda ctx, kind, msg: errors.append((kind, msg)))
    assert table.allocator(ctypes.byref(proto), ctypes.byref(out), None, set_error) == 0 and not errors
    t = out.contents.dl_tensor
    assert shape_of(t) == (2, 3, 5) and strides_of(t) == (15, 5, 1)
    assert (t.dtype.code, t.dtype.bits) == (code, bits)
    arr = np.ctypeslib.as_array((ctypes.c_char * (30 * bits // 8)).from_address(t.data))
    arr[:] = b"\x01"  # the memory is ours to write
    out.contents.deleter(ctypes.cast(out, ctypes.c_void_p))


def test_allocator_reports_errors_through_set_error():
    table = Table(ga.Array)
    shape = (ctypes.c_int64 * 1)(4)
    errors = []
    set_error = SET_ERROR(lambda ctx, kind, msg: errors.append((kind.decode(), msg.decode())))
    complex_proto = DLTensor(None, DLDevice(1, 0), 1, DLDataType(5, 64, 1), shape, None, 0)
    assert table.allocator(ctypes.byref(complex_proto), ctypes.byref(MANAGED_P()), None, set_error) == -1
    assert errors and errors[-1][0] == "BufferError" and "dtype" in errors[-1][1]
    vulkan_proto = DLTensor(None, DLDevice(7, 0), 1, DLDataType(2, 32, 1), shape, None, 0)
    assert table.allocator(ctypes.byref(vulkan_proto), ctypes.byref(MANAGED_P()), None, set_error) == -1
    assert "device type 7" in errors[-1][1]


def test_current_work_stream_is_null_for_the_cpu_and_refuses_other_devices():
    table = Table(ga.Array)
    out = ctypes.c_void_p(123)
    assert table.stream(1, 0, ctypes.byref(out)) == 0 and out.value is None
    with pytest.raises(ValueError, match="device type 7"):
        table.stream(7, 0, ctypes.byref(out))


@pytest.mark.cuda
def test_current_work_stream_is_gpuaccels_current_stream():
    table = Table(ga.Array)
    out = ctypes.c_void_p()
    s = ga.Stream()
    with s:
        assert table.stream(2, 0, ctypes.byref(out)) == 0
    assert out.value == s.handle


# ------------------------------------------------- gpuaccel as a consumer

def test_from_dlpack_reads_torch_through_its_table_not_dunder_dlpack(monkeypatch, rng):
    assert hasattr(type(torch.zeros(1)), "__dlpack_c_exchange_api__") or pytest.skip("torch < 2.9")
    calls = []
    original = torch.Tensor.__dlpack__
    monkeypatch.setattr(torch.Tensor, "__dlpack__", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    t = torch.from_numpy(rng.standard_normal((6, 5)))[::2, 1:]
    a = ga.from_dlpack(t)
    assert not calls
    assert a.data_ptr == t.data_ptr() and a.strides == tuple(s * 8 for s in t.stride())
    np.testing.assert_array_equal(a.numpy(), t.numpy())
    t[0, 0] = 42.0  # zero-copy
    assert a.numpy()[0, 0] == 42.0
    p = torch.nn.Parameter(torch.ones(3), requires_grad=False)
    assert ga.from_dlpack(p).data_ptr == p.data_ptr()
    with pytest.raises(BufferError, match="requires grad"):  # torch's own rule for exports
        ga.from_dlpack(torch.ones(3, requires_grad=True))


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                                   torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_asarray_of_torch_tensors_of_every_dtype(dtype):
    t = (torch.arange(24).reshape(2, 3, 4) % 7).to(dtype)
    a = ga.asarray(t)
    assert a.dtype == str(dtype).removeprefix("torch.") and a.data_ptr == t.data_ptr()
    assert torch.equal(torch.from_dlpack(a), t)


def test_a_lazily_negated_torch_view_is_read_with_its_values():
    t = torch.arange(6.0).reshape(2, 3)
    negated = torch._neg_view(t)
    assert negated.is_neg()
    expected = -t.numpy()
    np.testing.assert_array_equal(ga.from_dlpack(negated).numpy(), expected)
    np.testing.assert_array_equal(ga.asarray(negated).numpy(), expected)
    np.testing.assert_allclose(ga.matmul(negated, ga.asarray(np.eye(3, dtype=np.float32))).numpy(), expected)
    with pytest.raises(BufferError, match="neg bit"):
        ga.from_dlpack(negated, copy=False)
    with pytest.raises(ValueError, match="neg bit"):
        ga.asarray(negated, copy=False)


def test_unsupported_torch_tensors_are_refused_by_name():
    with pytest.raises((TypeError, BufferError), match="complex|dtype"):
        ga.linear(torch.zeros(2, 3, dtype=torch.complex64), torch.zeros(4, 3, dtype=torch.complex64))
    with pytest.raises(TypeError, match="meta"):
        ga.linear(torch.zeros(2, 3, device="meta"), torch.zeros(4, 3, device="meta"))
