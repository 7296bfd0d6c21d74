"""gpuaccel.Array on the host: construction, attributes, views, indexing,
casts, NumPy and buffer protocols — checked against NumPy."""

import pickle

import numpy as np
import pytest

import gpuaccel as ga

from helpers import ALL_DTYPES, INT_DTYPES, numpy_dtype, random_strided_view, random_values

# ----------------------------------------------------------- construction


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 0, 2), (2, 3, 5), (1,) * 32])
def test_constructors_match_numpy(dtype, shape):
    z = ga.zeros(shape, dtype=dtype)
    o = ga.ones(shape, dtype=dtype)
    assert z.shape == shape and z.dtype == dtype and z.ndim == len(shape)
    assert z.size == int(np.prod(shape)) and z.itemsize == numpy_dtype(dtype).itemsize
    assert z.nbytes == z.size * z.itemsize and z.is_contiguous
    if z.size:  # NumPy's strides of empty arrays are arbitrary
        assert z.strides == np.zeros(shape, dtype=numpy_dtype(dtype)).strides
    np.testing.assert_array_equal(z.numpy(), np.zeros(shape, dtype=numpy_dtype(dtype)))
    np.testing.assert_array_equal(o.numpy(), np.ones(shape, dtype=numpy_dtype(dtype)))
    e = ga.empty(shape, dtype=dtype)
    assert e.shape == shape and e.device == "cpu" and not e.pinned and not e.readonly


def test_default_dtype_and_shape_forms():
    assert ga.empty(3).dtype == "float32"
    assert ga.zeros([2, 3]).shape == (2, 3)
    assert ga.zeros(np.int64(4)).shape == (4,)
    assert ga.zeros(()).shape == ()


@pytest.mark.parametrize(
    "value,dtype",
    [(True, "bool"), (3, "int64"), (2.5, "float32"), (np.float16(1.5), "float16"), (np.int8(-3), "int8")],
)
def test_full_infers_dtype(value, dtype):
    a = ga.full((2, 3), value)
    assert a.dtype == dtype
    np.testing.assert_array_equal(a.numpy(), np.full((2, 3), value, dtype=numpy_dtype(dtype)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "int64", "int8", "uint8"])
def test_full_converts_like_a_cast(dtype):
    # fill writes exactly what astype would for the same value
    for value in [0.1, -2.75, 1e30, -1e30, 300, -129, float("inf")]:
        if dtype in INT_DTYPES and np.isinf(value):
            continue
        a = ga.full((3,), value, dtype=dtype)
        source = np.int64 if isinstance(value, int) else np.float64
        b = ga.asarray(np.array([value] * 3, dtype=source)).astype(dtype)
        assert a.numpy().tobytes() == b.numpy().tobytes(), (value, dtype)


@pytest.mark.parametrize(
    "call,exc,words",
    [
        (lambda: ga.empty(-1), ValueError, "negative"),
        (lambda: ga.empty((2, -3)), ValueError, "negative"),
        (lambda: ga.empty((1,) * 33), ValueError, "at most 32"),
        (lambda: ga.empty("3"), TypeError, "shape"),
        (lambda: ga.empty((2, 2.5)), TypeError, "shape must contain only ints"),
        (lambda: ga.empty(3, dtype="complex64"), TypeError, "dtype must be one of"),
        (lambda: ga.empty(3, dtype="float128"), TypeError, "dtype must be one of"),
        (lambda: ga.empty(3, dtype=object), TypeError, "dtype must be one of"),
        (lambda: ga.empty(3, device="tpu"), ValueError, "unsupported device type 'tpu'"),
        (lambda: ga.empty(3, device="cuda:x"), ValueError, "cuda:N"),
        (lambda: ga.empty(3, device=3.0), TypeError, "device must be a device"),
        (lambda: ga.empty(3, device="cuda", pinned=True), ValueError, "pinned=True is for host memory"),
        (lambda: ga.empty((2**62, 2**62)), ValueError, "too big"),
        (lambda: ga.full(3, "x"), TypeError, "fill_value must be a bool, int or float"),
        (lambda: ga.full(3, 1j), TypeError, "fill_value"),
        (lambda: ga.Array(), TypeError, "cannot create"),
    ],
)
def test_bad_construction_arguments(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


@pytest.mark.parametrize(
    "spelling,dtype",
    [
        ("float32", "float32"), ("f4", "float32"), (np.float16, "float16"), (np.dtype("int16"), "int16"),
        ("half", "float16"), ("bf16", "bfloat16"), ("double", "float64"), ("<i8", "int64"),
        (bool, "bool"), ("?", "bool"), ("u1", "uint8"),
    ],
)
def test_dtype_spellings(spelling, dtype):
    assert ga.empty(1, dtype=spelling).dtype == dtype


def test_torch_dtypes_accepted():
    torch = pytest.importorskip("torch")
    for name in ["float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]:
        assert ga.empty(2, dtype=getattr(torch, name)).dtype == name
    with pytest.raises(TypeError, match="dtype"):
        ga.empty(2, dtype=torch.complex64)


# --------------------------------------------------------------- asarray

def test_asarray_of_numpy_is_zero_copy(rng):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    a = ga.asarray(x)
    assert a.data_ptr == x.ctypes.data and a.strides == x.strides
    x[1, 2] = 42
    assert a.numpy()[1, 2] == 42
    assert np.shares_memory(a.numpy(), x)


def test_asarray_sequences_and_scalars():
    a = ga.asarray([[1, 2], [3, 4]])
    assert a.dtype == "int64" and a.tolist() == [[1, 2], [3, 4]]
    assert ga.asarray(2.5).dtype == "float64" and ga.asarray(2.5).shape == ()
    assert ga.asarray([True, False]).dtype == "bool"
    assert ga.asarray([1.5, 2], dtype="float16").tolist() == [1.5, 2.0]


def test_asarray_copy_semantics(rng):
    x = rng.standard_normal(6)
    assert ga.asarray(x, copy=True).data_ptr != x.ctypes.data
    assert ga.asarray(x, copy=False).data_ptr == x.ctypes.data
    with pytest.raises(ValueError, match="copy=False"):
        ga.asarray(x, dtype="float32", copy=False)
    with pytest.raises(ValueError, match="copy=False"):
        ga.asarray([1, 2], copy=False)
    a = ga.asarray(x)
    assert ga.asarray(a) is a
    assert ga.asarray(a, copy=True) is not a
    with pytest.raises(TypeError, match="copy must be None, True or False"):
        ga.asarray(x, copy=1)


def test_asarray_buffers_and_readonly():
    b = bytes(range(10))
    a = ga.asarray(b)
    assert a.dtype == "uint8" and a.readonly and a.tolist() == list(range(10))
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 1
    ro = np.arange(5.0)
    ro.flags.writeable = False
    assert ga.asarray(ro).readonly


def test_asarray_rejects_unsupported():
    with pytest.raises(TypeError, match="not supported"):
        ga.asarray(np.zeros(3, dtype=np.complex64))
    with pytest.raises(TypeError, match="not supported"):
        ga.asarray(np.zeros(3, dtype=np.uint32))
    with pytest.raises((TypeError, ValueError)):
        ga.asarray(["a", "b"])


def test_asarray_big_endian_is_converted():
    x = np.arange(6, dtype=">i4")
    a = ga.asarray(x)
    assert a.dtype == "int32" and a.tolist() == list(range(6))


# ------------------------------------------------------ views and indexing

@pytest.mark.parametrize("dtype", ["float32", "int16", "bool", "float64"])
def test_basic_indexing_matches_numpy(rng, dtype):
    x = random_values(rng, (5, 7, 3), dtype)
    a = ga.asarray(x)
    keys = [
        1, -1, (2, 3), (slice(1, 4), 2), (Ellipsis, 1), (None, 2), (slice(None, None, -1),),
        (slice(None, None, 2), slice(6, 0, -3)), (1, Ellipsis, None), (), slice(10, 20),
        (np.int64(3), slice(None)), (slice(None), None, slice(None), None),
    ]
    for key in keys:
        view, ref = a[key], x[key]
        assert view.shape == ref.shape and view.strides == ref.strides, key
        np.testing.assert_array_equal(view.numpy(), ref)
        assert view.numpy().size == 0 or np.shares_memory(view.numpy(), x)


def test_random_indexing_against_numpy(rng):
    x = rng.standard_normal((6, 5, 4, 3))
    a = ga.asarray(x)
    for _ in range(200):
        key = []
        for size in x.shape:
            kind = rng.integers(0, 3)
            if kind == 0:
                key.append(int(rng.integers(-size, size)))
            elif kind == 1:
                start, stop = rng.integers(-size - 2, size + 2, size=2)
                step = int(rng.choice([1, 2, 3, -1, -2]))
                key.append(slice(int(start), int(stop), step))
            else:
                key.append(slice(None))
        key = tuple(key[: rng.integers(0, 5)])
        np.testing.assert_array_equal(a[key].numpy(), x[key])


@pytest.mark.parametrize(
    "key,exc,words",
    [
        (10, IndexError, "out of bounds for axis 0 with size 5"),
        ((0, 0, 0), IndexError, "too many indices"),
        ((Ellipsis, Ellipsis), IndexError, "single ellipsis"),
        ([0, 1], IndexError, "advanced indexing"),
        (True, IndexError, "advanced indexing"),
        (1.5, IndexError, "valid indices"),
        (np.array([1]), IndexError, "advanced indexing"),
    ],
)
def test_bad_indices(key, exc, words):
    a = ga.zeros((5, 4))
    with pytest.raises(exc, match=words):
        a[key]


def test_views_keep_memory_alive():
    x = ga.asarray(np.arange(10.0))
    v = x[2:5]
    del x
    assert v.tolist() == [2.0, 3.0, 4.0]
    w = v[1:]
    del v
    assert w.tolist() == [3.0, 4.0]


def test_transpose_and_len():
    x = np.arange(24).reshape(2, 3, 4)
    a = ga.asarray(x)
    np.testing.assert_array_equal(a.T.numpy(), x.T)
    assert a.T.strides == x.T.strides and not a.T.is_contiguous
    assert len(a) == 2 and list(iter(ga.asarray([1, 2, 3])))[2].item() == 3
    with pytest.raises(TypeError, match="0-d"):
        len(ga.zeros(()))


@pytest.mark.parametrize(
    "shape,new",
    [((2, 3, 4), (6, 4)), ((2, 3, 4), (-1,)), ((2, 3, 4), (4, -1, 2)), ((6,), (1, 6, 1)), ((0, 3), (3, 0)),
     ((1, 1), ()), ((), (1, 1, 1))],
)
def test_reshape_views(shape, new):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    a = ga.asarray(x)
    r = a.reshape(new)
    np.testing.assert_array_equal(r.numpy(), x.reshape(new))
    if x.size:
        assert r.data_ptr == a.data_ptr  # a view


def test_reshape_copies_when_needed_and_matches_numpy(rng):
    x = rng.standard_normal((4, 6))
    a = ga.asarray(x)
    for view_key, new in [((slice(None), slice(None, None, 2)), (12,)), ((Ellipsis,), (3, 8))]:
        np.testing.assert_array_equal(a[view_key].reshape(new).numpy(), x[view_key].reshape(new))
    t = a.T.reshape(24)
    np.testing.assert_array_equal(t.numpy(), x.T.reshape(24))
    # reshape of a strided view that still allows a view (NumPy's rule)
    y = x[:, ::2]
    np.testing.assert_array_equal(a[:, ::2].reshape(4, 3, 1).numpy(), y.reshape(4, 3, 1))
    assert a.reshape(2, 2, 6).reshape(24).data_ptr == a.data_ptr
    assert a.reshape((3, 8)).shape == (3, 8)


@pytest.mark.parametrize(
    "new,words",
    [((5, 5), "cannot reshape array of size 24"), ((-1, -1), "one unknown"), ((-2, 12), "negative"),
     ((7, -1), "cannot reshape")],
)
def test_bad_reshape(new, words):
    with pytest.raises(ValueError, match=words):
        ga.zeros((4, 6)).reshape(new)


# ------------------------------------------------------------ assignment

def test_setitem_matches_numpy(rng):
    x = rng.standard_normal((5, 6)).astype(np.float32)
    a = ga.asarray(x.copy())
    ref = x.copy()
    for key, value in [
        ((1, 2), 7.5),
        (slice(None), 0),
        ((slice(1, 3), slice(None, None, 2)), np.float64(-1.25)),
        ((Ellipsis, 0), np.arange(5, dtype=np.int64)),
        ((slice(None), slice(None)), rng.standard_normal(6)),  # broadcast a row
        ((slice(None), 3), [True, False, True, False, True]),
        (2, ga.asarray(np.arange(6, dtype=np.int16))),
    ]:
        a[key] = value
        ref[key] = np.asarray(value.numpy() if isinstance(value, ga.Array) else value)
        np.testing.assert_array_equal(a.numpy(), ref)


def test_setitem_overlapping_reads_before_writing():
    x = np.arange(10.0)
    a = ga.asarray(x.copy())
    a[1:] = a[:-1]
    x[1:] = x[:-1].copy()
    np.testing.assert_array_equal(a.numpy(), x)
    b = ga.asarray(np.arange(12.0).reshape(3, 4))
    ref = np.arange(12.0).reshape(3, 4)
    b[...] = b.T.reshape(3, 4)
    np.testing.assert_array_equal(b.numpy(), ref.T.reshape(3, 4))


def test_setitem_errors():
    a = ga.zeros((3, 4))
    with pytest.raises(ValueError, match="could not broadcast shape \\(5,\\) into shape \\(3, 4\\)"):
        a[...] = np.zeros(5)
    with pytest.raises(TypeError, match="deletion"):
        del a[0]
    with pytest.raises((TypeError, ValueError)):
        a[0] = "abc"


# --------------------------------------------------------------- casts

@pytest.mark.parametrize("src", ALL_DTYPES)
@pytest.mark.parametrize("dst", ALL_DTYPES)
def test_astype_every_pair_matches_numpy(rng, src, dst):
    x = random_strided_view(rng, (13, 9), src)
    if src in ("float16", "bfloat16", "float32", "float64") and dst in INT_DTYPES + ["bool"]:
        # within every integer type's range, where NumPy defines the result
        x = np.clip(x.astype(np.float64) * 50, 0 if dst == "uint8" else -120, 120).astype(x.dtype)
    got = ga.asarray(x).astype(dst)
    # wide integers past float16's range become inf, in both: the overflow is the result compared
    with np.errstate(over="ignore"):
        ref = x.astype(numpy_dtype(dst))
        if dst in ("float16", "bfloat16") and src in ("int32", "int64"):
            # NumPy converts through float64 twice for these; check against the
            # exactly rounded value instead
            ref = x.astype(np.float64).astype(numpy_dtype(dst))
    assert got.dtype == dst and got.is_contiguous and got.shape == ref.shape
    np.testing.assert_array_equal(got.numpy(), ref)


def exact_bfloat16_bits(value):
    """Round-to-nearest-even of a float64 to bfloat16, in exact rational
    arithmetic (an independent reference: NumPy has no bfloat16, and
    ml_dtypes converts float64 through float32, rounding twice)."""
    import math
    from fractions import Fraction

    if math.isnan(value):
        return 0x7FC0
    sign = 0x8000 if math.copysign(1.0, value) < 0 else 0
    if math.isinf(value):
        return sign | 0x7F80
    f = abs(Fraction(value))
    if f == 0:
        return sign
    e = math.floor(math.log2(f))
    while Fraction(2) ** e > f:
        e -= 1
    while Fraction(2) ** (e + 1) <= f:
        e += 1
    e = max(e, -126)  # subnormals share the smallest exponent
    q, rem = divmod(f / Fraction(2) ** (e - 7), 1)
    q = int(q)
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and q % 2):
        q += 1
    if q == 256:  # carried into the next binade
        q, e = 128, e + 1
    if e > 127:
        return sign | 0x7F80
    biased = e + 127 if q >= 128 else 0
    return sign | (biased << 7) | (q & 0x7F if biased else q)


def test_half_rounding_is_exact(rng):
    import ml_dtypes

    # values straddling float16/bfloat16 rounding boundaries, subnormals, overflow
    x = np.concatenate([
        rng.standard_normal(5000) * 10.0 ** rng.integers(-9, 6, size=5000),
        [65504.0, 65519.99, 65520.0, 6e-8, 2.9e-8, 3e-8, -0.0, np.inf, -np.inf, 1e-45, 3.4e38, 3.5e38,
         # ties and near-ties at bfloat16 precision (the first rounds twice through float32)
         *map(float.fromhex, ["-0x1.410000cee0f88p-8", "0x1.0180000000001p0", "0x1.018p0", "0x1.008p0"])],
    ])
    with np.errstate(over="ignore"):
        for src in (np.float32, np.float64):
            v = x.astype(src)
            # NumPy's float->float16 conversions round once, exactly
            np.testing.assert_array_equal(ga.asarray(v).astype("float16").numpy(), v.astype(np.float16))
        # float32 -> bfloat16: ml_dtypes rounds once from float32
        v32 = x.astype(np.float32)
        np.testing.assert_array_equal(
            ga.asarray(v32).astype("bfloat16").numpy().view(np.uint16),
            v32.astype(ml_dtypes.bfloat16).view(np.uint16))
    # float64 -> bfloat16: against exact arithmetic
    got = ga.asarray(x).astype("bfloat16").numpy().view(np.uint16)
    want = np.array([exact_bfloat16_bits(float(value)) for value in x], dtype=np.uint16)
    np.testing.assert_array_equal(got, want)
    nan = ga.asarray(np.array([np.nan], dtype=np.float32))
    assert np.isnan(nan.astype("float16").numpy()[0]) and np.isnan(nan.astype("bfloat16").astype("float32").item())


def test_float_to_int_saturates_and_nan_is_zero():
    x = np.array([np.nan, np.inf, -np.inf, 1e20, -1e20, 300.7, -300.7, 2.0**63, -(2.0**63), -0.9])
    a = ga.asarray(x)
    assert a.astype("int8").tolist() == [0, 127, -128, 127, -128, 127, -128, 127, -128, 0]
    assert a.astype("uint8").tolist() == [0, 255, 0, 255, 0, 255, 0, 255, 0, 0]
    assert a.astype("int64").tolist() == [0, 2**63 - 1, -(2**63), 2**63 - 1, -(2**63), 300, -300,
                                          2**63 - 1, -(2**63), 0]
    assert a.astype("bool").tolist() == [True, True, True, True, True, True, True, True, True, True]


def test_integer_narrowing_wraps_like_numpy():
    x = np.array([300, -129, 2**40 + 5, -1], dtype=np.int64)
    for dst in ["int8", "uint8", "int16", "int32"]:
        np.testing.assert_array_equal(ga.asarray(x).astype(dst).numpy(), x.astype(dst))


def test_astype_copy_flag():
    a = ga.zeros(3)
    assert a.astype("float32", copy=False) is a
    assert a.astype("float32").data_ptr != a.data_ptr


def test_large_copies_use_threads_and_stay_right(rng):
    # big enough to be split across the worker pool, odd sizes, strided
    x = rng.standard_normal((1031, 517)).astype(np.float32)[:, ::3]
    np.testing.assert_array_equal(ga.asarray(x).astype("float64").numpy(), x.astype(np.float64))
    y = rng.standard_normal(3_000_017)
    np.testing.assert_array_equal(ga.asarray(y).astype("float16").numpy(), y.astype(np.float16))
    z = ga.zeros(2_000_003, dtype="int16")
    z[...] = -7
    assert (z.numpy() == -7).all()


# ------------------------------------------------- NumPy / buffer protocol

def test_numpy_is_a_zero_copy_view(rng):
    a = ga.asarray(rng.standard_normal((3, 4)))
    n = a.numpy()
    n[0, 0] = 123.0
    assert a[0, 0].item() == 123.0
    assert np.asarray(a).ctypes.data == a.data_ptr
    assert np.array(a, dtype=np.float32).dtype == np.float32
    with pytest.raises(ValueError, match="copy=False"):
        a.__array__(dtype=np.float32, copy=False)
    assert a.__array__(copy=True).ctypes.data != a.data_ptr


@pytest.mark.parametrize("dtype", [d for d in ALL_DTYPES if d != "bfloat16"])
def test_buffer_protocol(rng, dtype):
    x = random_values(rng, (3, 5), dtype)
    a = ga.asarray(x)
    m = memoryview(a)
    assert m.shape == x.shape and m.strides == x.strides and m.itemsize == x.itemsize
    assert m.format == np.asarray(m).dtype.char or np.asarray(m).dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(m), x)
    strided = memoryview(a[:, ::2])
    assert strided.strides == x[:, ::2].strides
    np.testing.assert_array_equal(np.asarray(strided), x[:, ::2])


def test_buffer_protocol_refusals():
    with pytest.raises(BufferError, match="bfloat16"):
        memoryview(ga.zeros(3, dtype="bfloat16"))
    ro = ga.asarray(b"abc")
    m = memoryview(ro)
    assert m.readonly
    import ctypes

    with pytest.raises((BufferError, TypeError)):
        ctypes.c_char.from_buffer(ro)


def test_repr_item_tolist_scalars():
    a = ga.asarray(np.array([[1.5, 2.0]], dtype=np.float32))
    assert repr(a).startswith("gpuaccel.Array([[1.5, 2. ]]") and "dtype=float32, device='cpu'" in repr(a)
    assert ga.full((), 3, dtype="int16").item() == 3
    assert float(ga.full((1,), 2.5)) == 2.5 and int(ga.full((1, 1), 7)) == 7
    assert bool(ga.full((), True)) and not bool(ga.zeros(1))
    with pytest.raises(ValueError, match="ambiguous"):
        bool(ga.zeros(2))
    with pytest.raises(ValueError, match="exactly one element"):
        ga.zeros(2).item()
    assert ga.asarray(np.array([1.5], dtype=np.float32)).astype("bfloat16").item() == 1.5
    assert ga.zeros((2, 0)).tolist() == [[], []]


def test_weakref_and_pickle_refusal():
    import weakref

    a = ga.zeros(3)
    r = weakref.ref(a)
    assert r() is a
    del a
    assert r() is None
    with pytest.raises(TypeError):
        pickle.dumps(ga.zeros(3))
