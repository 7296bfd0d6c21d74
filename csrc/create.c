/*
 * create.c — empty / zeros / ones / full / asarray.
 */
#include "npy.h"

#include "create.h"
#include "dlpack.h"
#include "torch.h"
#include "transfer.h"

/* Arguments shared by empty/zeros/ones/full. */
typedef struct {
    int64_t shape[GA_MAX_NDIM];
    int ndim;
    ga_dtype dtype;
    ga_device device;
    int pinned;
} creation_args;

static int parse_creation(ga_state *st, PyObject *shape_obj, PyObject *dtype_obj,
                          PyObject *device_obj, int pinned, creation_args *out)
{
    if (ga_shape_from_object(shape_obj, out->shape, &out->ndim, "shape") < 0)
        return -1;
    if (dtype_obj != Py_None && ga_dtype_from_object(st, dtype_obj, &out->dtype, "dtype") < 0)
        return -1;
    if (ga_device_from_object(st, device_obj, &out->device, "device") < 0)
        return -1;
    if (pinned && out->device.type != GA_DEVICE_CPU) {
        PyErr_SetString(PyExc_ValueError,
                        "pinned=True is for host memory; it cannot be combined with a CUDA "
                        "device");
        return -1;
    }
    out->pinned = pinned;
    return 0;
}

static PyObject *create(PyObject *module, PyObject *args, PyObject *kwargs, const char *name,
                        PyObject *fill)
{
    static char *kwlist[] = {"shape", "dtype", "device", "pinned", NULL};
    PyObject *shape_obj, *dtype_obj = Py_None, *device_obj = Py_None;
    int pinned = 0;
    char format[32];
    snprintf(format, sizeof format, "O|OO$p:%s", name);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, kwlist, &shape_obj, &dtype_obj,
                                     &device_obj, &pinned))
        return NULL;
    ga_state *st = ga_state_from_module(module);
    creation_args a;
    a.dtype = GA_FLOAT32;
    if (parse_creation(st, shape_obj, dtype_obj, device_obj, pinned, &a) < 0)
        return NULL;
    ArrayObject *arr = ga_array_empty(st, a.dtype, a.ndim, a.shape, a.device, a.pinned, NULL);
    if (arr && fill && ga_array_fill(st, arr, fill) < 0)
        Py_CLEAR(arr);
    return (PyObject *)arr;
}

PyObject *ga_py_empty(PyObject *module, PyObject *args, PyObject *kwargs)
{
    return create(module, args, kwargs, "empty", NULL);
}

PyObject *ga_py_zeros(PyObject *module, PyObject *args, PyObject *kwargs)
{
    PyObject *zero = PyLong_FromLong(0);
    PyObject *r = zero ? create(module, args, kwargs, "zeros", zero) : NULL;
    Py_XDECREF(zero);
    return r;
}

PyObject *ga_py_ones(PyObject *module, PyObject *args, PyObject *kwargs)
{
    PyObject *one = PyLong_FromLong(1);
    PyObject *r = one ? create(module, args, kwargs, "ones", one) : NULL;
    Py_XDECREF(one);
    return r;
}

/* full()'s dtype when none is given: as torch.full. */
static int infer_fill_dtype(ga_state *st, PyObject *value, ga_dtype *out)
{
    if (PyBool_Check(value) || PyArray_IsScalar(value, Bool)) {
        *out = GA_BOOL;
        return 0;
    }
    if (PyArray_IsScalar(value, Generic)) {
        PyArray_Descr *descr = PyArray_DescrFromScalar(value);
        int rc = descr ? ga_dtype_from_numpy_descr(st, (PyObject *)descr, out) : -1;
        Py_XDECREF(descr);
        if (rc == 0)
            return 0;
        PyErr_Clear();
    }
    if (PyLong_Check(value) || PyArray_IsScalar(value, Integer)) {
        *out = GA_INT64;
        return 0;
    }
    if (PyFloat_Check(value) || PyArray_IsScalar(value, Floating)) {
        *out = GA_FLOAT32;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "fill_value must be a bool, int or float, got %.200s",
                 ga_type_name(value));
    return -1;
}

PyObject *ga_py_full(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"shape", "fill_value", "dtype", "device", "pinned", NULL};
    PyObject *shape_obj, *value, *dtype_obj = Py_None, *device_obj = Py_None;
    int pinned = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OO$p:full", kwlist, &shape_obj, &value,
                                     &dtype_obj, &device_obj, &pinned))
        return NULL;
    ga_state *st = ga_state_from_module(module);
    creation_args a;
    if (dtype_obj == Py_None && infer_fill_dtype(st, value, &a.dtype) < 0)
        return NULL;
    if (parse_creation(st, shape_obj, dtype_obj, device_obj, pinned, &a) < 0)
        return NULL;
    ga_scalar check;
    if (ga_scalar_from_object(value, &check, "fill_value") < 0)
        return NULL;
    ArrayObject *arr = ga_array_empty(st, a.dtype, a.ndim, a.shape, a.device, a.pinned, NULL);
    if (arr && ga_array_fill(st, arr, value) < 0)
        Py_CLEAR(arr);
    return (PyObject *)arr;
}

/* ------------------------------------------------------------- asarray */

/* Objects NumPy must build a new array for (so the result is already a
 * private copy). */
static int numpy_makes_new_array(PyObject *obj)
{
    return PyList_Check(obj) || PyTuple_Check(obj) || PyLong_Check(obj) || PyFloat_Check(obj) ||
           PyBool_Check(obj) || PyArray_IsScalar(obj, Generic);
}

/* *swapped: the data was byte-swapped into a private copy. */
static ArrayObject *from_numpy_convertible(ga_state *st, PyObject *obj, int *swapped)
{
    *swapped = 0;
    PyObject *arr;
    if (!PyArray_Check(obj) && PyObject_CheckBuffer(obj)) {
        /* through a memoryview, so that bytes-like objects keep their
         * buffer format (bytes: uint8) instead of becoming strings */
        PyObject *view = PyMemoryView_FromObject(obj);
        if (!view)
            return NULL;
        arr = PyArray_FromAny(view, NULL, 0, 0, 0, NULL);
        Py_DECREF(view);
    } else {
        arr = PyArray_FromAny(obj, NULL, 0, 0, 0, NULL);
    }
    if (!arr)
        return NULL;
    if (!PyArray_ISNOTSWAPPED((PyArrayObject *)arr)) {
        /* big-endian data: gpuaccel computes in the machine's byte order */
        PyArray_Descr *native =
            PyArray_DescrNewByteorder(PyArray_DESCR((PyArrayObject *)arr), NPY_NATIVE);
        PyObject *swapped_arr =
            native ? PyArray_FromAny(arr, native, 0, 0, NPY_ARRAY_DEFAULT, NULL) : NULL;
        Py_DECREF(arr);
        if (!swapped_arr)
            return NULL;
        arr = swapped_arr;
        *swapped = 1;
    }
    PyArrayObject *a = (PyArrayObject *)arr;
    ga_dtype dtype;
    if (ga_dtype_from_numpy_descr(st, (PyObject *)PyArray_DESCR(a), &dtype) < 0) {
        PyErr_Format(PyExc_TypeError,
                     "asarray: %.200s with NumPy dtype %R is not supported; gpuaccel supports "
                     "bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32 and "
                     "float64",
                     ga_type_name(obj), (PyObject *)PyArray_DESCR(a));
        Py_DECREF(arr);
        return NULL;
    }
    if (PyArray_NDIM(a) > GA_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "asarray: %d dimensions; arrays have at most %d",
                     PyArray_NDIM(a), GA_MAX_NDIM);
        Py_DECREF(arr);
        return NULL;
    }
    ga_device cpu = {GA_DEVICE_CPU, 0};
    int flags = PyArray_ISWRITEABLE(a) ? 0 : GA_ARRAY_READONLY;
    ArrayObject *result = ga_array_wrap(st, PyArray_DATA(a), dtype, PyArray_NDIM(a),
                                        (const int64_t *)PyArray_SHAPE(a),
                                        (const int64_t *)PyArray_STRIDES(a), cpu, flags, arr);
    Py_DECREF(arr);
    return result;
}

/* The memory of a DLPack producer as an Array.  A torch tensor with the
 * neg bit set is read through a resolved copy (torch's own export would
 * hand out the memory, whose values are the negated ones): *fresh is then
 * set. */
static ArrayObject *import_dlpack(ga_state *st, PyObject *obj, int *fresh)
{
    if (!ga_is_torch_tensor(st, obj))
        return ga_from_dlpack_object(st, obj);
    /* torch's own rule for DLPack exports, which its C exchange table
     * leaves to the consumer: memory reached around autograd would change
     * values autograd has saved */
    int requires_grad = ga_torch_requires_grad(st, obj);
    if (requires_grad < 0)
        return NULL;
    if (requires_grad) {
        PyErr_SetString(
            PyExc_BufferError,
            "a torch tensor that requires grad cannot be exported; use tensor.detach()");
        return NULL;
    }
    int copied;
    PyObject *resolved = ga_torch_resolved(st, obj, &copied);
    if (!resolved)
        return NULL;
    ArrayObject *arr = ga_from_dlpack_via(st, resolved, ga_torch_exchange_api(st, resolved));
    Py_DECREF(resolved);
    if (copied)
        *fresh = 1;
    return arr;
}

ArrayObject *ga_asarray(ga_state *st, PyObject *obj, const ga_dtype *dtype, const ga_device *device,
                        int copy, PyObject *stream_obj)
{
    ArrayObject *arr = NULL;
    int fresh = 0;   /* arr is already a private copy of obj's values */
    int swapped = 0; /* ... made because obj's bytes are not in native order */
    int has_dlpack = 0;
    PyObject *cai = NULL;
    if (!ga_is_array(st, obj) && !PyCapsule_CheckExact(obj)) {
        /* an attribute that raises something else than AttributeError is
         * an error to report, not a missing interface */
        if ((has_dlpack = ga_has_attr(obj, st->str_dlpack)) < 0)
            return NULL;
        if (!has_dlpack && ga_lookup_attr(obj, st->str_cuda_array_interface, &cai) < 0)
            return NULL;
    }
    if (ga_is_array(st, obj)) {
        arr = (ArrayObject *)Py_NewRef(obj);
    } else if (PyCapsule_CheckExact(obj) || has_dlpack) {
        arr = import_dlpack(st, obj, &fresh);
        if (!arr && PyErr_ExceptionMatches(PyExc_BufferError) && PyObject_CheckBuffer(obj)) {
            PyErr_Clear(); /* e.g. a big-endian or read-only NumPy array */
            arr = from_numpy_convertible(st, obj, &swapped);
        } else if (arr && fresh && copy == 0) {
            PyErr_SetString(PyExc_ValueError,
                            "asarray: copy=False, but this torch tensor is a lazily negated view "
                            "(its neg bit is set), whose values exist only in a copy");
            Py_DECREF(arr);
            return NULL;
        }
    } else if (cai) {
        arr = ga_from_cuda_array_interface(st, obj, cai);
        Py_DECREF(cai);
    } else {
        fresh = numpy_makes_new_array(obj);
        if (fresh && copy == 0) {
            PyErr_Format(PyExc_ValueError,
                         "asarray: copy=False, but a %.200s has to be copied to make an array",
                         ga_type_name(obj));
            return NULL;
        }
        arr = from_numpy_convertible(st, obj, &swapped);
    }
    if (!arr)
        return NULL;
    if (swapped && copy == 0) {
        PyErr_Format(PyExc_ValueError,
                     "asarray: copy=False, but this %.200s holds non-native byte order data, "
                     "which has to be copied into the machine's byte order",
                     ga_type_name(obj));
        Py_DECREF(arr);
        return NULL;
    }
    return ga_array_convert(st, arr, fresh || swapped, dtype, device, copy, stream_obj);
}

PyObject *ga_py_asarray(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames)
{
    static const char *const names[] = {"obj", "dtype", "device", "copy", "stream", NULL};
    PyObject *v[5];
    if (ga_parse_args("asarray", args, nargs, kwnames, names, 3, 1, v) < 0)
        return NULL;
    PyObject *obj = v[0], *dtype_obj = v[1], *device_obj = v[2], *copy_obj = v[3],
             *stream_obj = v[4];
    ga_state *st = ga_state_from_module(module);
    ga_dtype dtype;
    ga_device device;
    int copy;
    int has_dtype = dtype_obj && dtype_obj != Py_None;
    int has_device = device_obj && device_obj != Py_None;
    if (has_dtype && ga_dtype_from_object(st, dtype_obj, &dtype, "dtype") < 0)
        return NULL;
    if (has_device && ga_device_from_object(st, device_obj, &device, "device") < 0)
        return NULL;
    if (ga_copy_flag_from_object(copy_obj, &copy) < 0)
        return NULL;
    return (PyObject *)ga_asarray(st, obj, has_dtype ? &dtype : NULL, has_device ? &device : NULL,
                                  copy, stream_obj);
}

PyObject *ga_py_from_dlpack(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    static const char *const names[] = {"x", "device", "copy", NULL};
    PyObject *v[3];
    if (ga_parse_args("from_dlpack", args, nargs, kwnames, names, 1, 1, v) < 0)
        return NULL;
    PyObject *x = v[0], *device_obj = v[1], *copy_obj = v[2];
    ga_state *st = ga_state_from_module(module);
    int has_dlpack =
        PyCapsule_CheckExact(x) || ga_is_torch_tensor(st, x) ? 1 : ga_has_attr(x, st->str_dlpack);
    if (has_dlpack < 0)
        return NULL;
    if (!has_dlpack) {
        PyErr_Format(PyExc_TypeError,
                     "from_dlpack: x must have a __dlpack__ method or be a DLPack capsule, got "
                     "%.200s",
                     ga_type_name(x));
        return NULL;
    }
    ga_device device;
    int copy;
    int has_device = device_obj && device_obj != Py_None;
    if (has_device && ga_device_from_object(st, device_obj, &device, "device") < 0)
        return NULL;
    if (ga_copy_flag_from_object(copy_obj, &copy) < 0)
        return NULL;
    int fresh = 0;
    ArrayObject *arr = import_dlpack(st, x, &fresh);
    if (!arr)
        return NULL;
    if (fresh && copy == 0) {
        PyErr_SetString(PyExc_BufferError,
                        "from_dlpack: copy=False, but this torch tensor is a lazily negated view "
                        "(its neg bit is set), whose values exist only in a copy");
        Py_DECREF(arr);
        return NULL;
    }
    return (PyObject *)ga_array_convert(st, arr, fresh, NULL, has_device ? &device : NULL, copy,
                                        NULL);
}
