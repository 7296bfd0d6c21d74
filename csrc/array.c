/*
 * array.c — the core of gpuaccel.Array: making root arrays (allocated,
 * wrapped, from a block or a DLPack tensor) and views, their geometry, and
 * the stream bookkeeping of their memory.  Nothing here moves values
 * (transfer.c) or implements the Python type's methods (array_type.c).
 */
#include "array.h"

#include <string.h>

/* ------------------------------------------------------------ helpers */

int ga_check_shape(ga_dtype dtype, int ndim, const int64_t *shape, int64_t *numel)
{
    if (ndim < 0 || ndim > GA_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "arrays have at most %d dimensions, got %d", GA_MAX_NDIM,
                     ndim);
        return -1;
    }
    int64_t n = 1;
    int zero = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) {
            PyErr_Format(PyExc_ValueError, "negative dimensions are not allowed: shape[%d] = %lld",
                         d, (long long)shape[d]);
            return -1;
        }
        if (shape[d] == 0)
            zero = 1;
    }
    int64_t bytes = (int64_t)ga_dtype_itemsize(dtype);
    for (int d = 0; d < ndim && !zero; d++) {
        if (__builtin_mul_overflow(n, shape[d], &n) || __builtin_mul_overflow(n, bytes, &bytes) ||
            bytes > PY_SSIZE_T_MAX) {
            PyErr_SetString(PyExc_ValueError, "array is too big: its size in bytes overflows");
            return -1;
        }
        bytes = (int64_t)ga_dtype_itemsize(dtype);
    }
    *numel = zero ? 0 : n;
    return 0;
}

int ga_shape_from_object(PyObject *obj, int64_t *shape, int *ndim, const char *argname)
{
    if (PyIndex_Check(obj) && !PyBool_Check(obj)) {
        Py_ssize_t v = PyNumber_AsSsize_t(obj, PyExc_OverflowError);
        if (v == -1 && PyErr_Occurred())
            return -1;
        shape[0] = v;
        *ndim = 1;
        return 0;
    }
    PyObject *seq = PySequence_Check(obj) && !PyUnicode_Check(obj) && !PyBytes_Check(obj)
                        ? PySequence_Fast(obj, "")
                        : NULL;
    if (!seq) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be an int or a sequence of ints, got %.200s",
                     argname, ga_type_name(obj));
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > GA_MAX_NDIM) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s has %zd dimensions; arrays have at most %d", argname, n,
                     GA_MAX_NDIM);
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k);
        if (!PyIndex_Check(item) || PyBool_Check(item)) {
            PyErr_Format(PyExc_TypeError, "%s must contain only ints, got %.200s at position %zd",
                         argname, ga_type_name(item), k);
            Py_DECREF(seq);
            return -1;
        }
        Py_ssize_t v = PyNumber_AsSsize_t(item, PyExc_OverflowError);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        shape[k] = v;
    }
    *ndim = (int)n;
    Py_DECREF(seq);
    return 0;
}

void ga_contiguous_strides(int ndim, const int64_t *shape, int64_t itemsize, int64_t *strides)
{
    int64_t stride = itemsize;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = stride;
        stride *= shape[d] > 0 ? shape[d] : 1;
    }
}

int64_t ga_array_size(const ArrayObject *a)
{
    int64_t n = 1;
    for (int d = 0; d < a->ndim; d++)
        n *= a->shape[d];
    return n;
}

int ga_array_is_contiguous(const ArrayObject *a)
{
    /* NumPy's rule: size-1 dims may have any stride; empty arrays are */
    int64_t expected = (int64_t)ga_dtype_itemsize(a->dtype);
    for (int d = a->ndim - 1; d >= 0; d--) {
        if (a->shape[d] == 0)
            return 1;
        if (a->shape[d] != 1) {
            if (a->strides[d] != expected)
                return 0;
            expected *= a->shape[d];
        }
    }
    return 1;
}

ga_tensor ga_array_tensor(const ArrayObject *a)
{
    ga_tensor t;
    t.data = a->data;
    t.dtype = a->dtype;
    t.ndim = a->ndim;
    memcpy(t.shape, a->shape, (size_t)a->ndim * sizeof(int64_t));
    memcpy(t.strides, a->strides, (size_t)a->ndim * sizeof(int64_t));
    return t;
}

int ga_array_prepare_stream(ga_state *st, ArrayObject *a, ga_stream stream)
{
    if (a->device.type != GA_DEVICE_CUDA)
        return 0;
    return ga_block_prepare_use(st, a->block, a->device.index, stream);
}

int ga_array_record_stream(ga_state *st, ArrayObject *a, ga_stream stream)
{
    if (a->device.type != GA_DEVICE_CUDA && !(a->flags & GA_ARRAY_PINNED))
        return 0;
    int device = a->device.type == GA_DEVICE_CUDA ? a->device.index : -1;
    if (device < 0 && ga_cuda_stream_device(stream, &device).error)
        return 0;
    return ga_block_record_use(st, a->block, device, stream);
}

int ga_array_track_import(ga_state *st, ArrayObject *a)
{
    if (a->device.type != GA_DEVICE_CUDA || a->block || !a->data || ga_array_size(a) == 0)
        return 0;
    ga_stream stream;
    if (ga_current_stream(st, a->device.index, &stream) < 0)
        return -1;
    size_t size = (size_t)ga_array_size(a) * ga_dtype_itemsize(a->dtype);
    GA_CHECK(st, ga_block_borrow(a->device.index, a->data, size, stream, &a->block));
    a->owns_block = 1;
    return 0;
error:
    return -1;
}

int ga_array_before_host_write(ga_state *st, ArrayObject *a)
{
    if (a->device.type != GA_DEVICE_CPU || !a->block || a->block->kind != GA_MEM_PINNED)
        return 0;
    GA_CHECK_NOGIL(st, ga_block_host_wait(a->block));
    return 0;
error:
    return -1;
}

static ArrayObject *array_alloc(ga_state *st)
{
    ArrayObject *a = (ArrayObject *)st->ArrayType->tp_alloc(st->ArrayType, 0);
    if (a) {
        a->data = NULL;
        a->ndim = 0;
        a->flags = 0;
        a->block = NULL;
        a->owns_block = 0;
        a->dlpack = NULL;
        a->dlpack_versioned = 0;
        a->base = NULL;
        a->weakreflist = NULL;
    }
    return a;
}

ArrayObject *ga_array_empty(ga_state *st, ga_dtype dtype, int ndim, const int64_t *shape,
                            ga_device device, int pinned, const ga_stream *stream_in)
{
    int64_t numel;
    if (ga_check_shape(dtype, ndim, shape, &numel) < 0)
        return NULL;
    size_t nbytes = (size_t)numel * ga_dtype_itemsize(dtype);
    ga_block *block;
    ga_stream stream = GA_STREAM_LEGACY;
    if (device.type == GA_DEVICE_CUDA) {
        if (ga_ensure_cuda_device(st, device.index) < 0)
            return NULL;
        if (stream_in)
            stream = *stream_in;
        else if (ga_current_stream(st, device.index, &stream) < 0)
            return NULL;
        block = ga_block_alloc(st, GA_MEM_DEVICE, device.index, nbytes, stream);
    } else if (pinned) {
        int current = 0;
        if (ga_cuda_get_device(&current).error)
            current = 0;
        if (ga_ensure_cuda_device(st, current) < 0) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_Format(PyExc_RuntimeError, "pinned host memory needs CUDA: %S", value);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            return NULL;
        }
        block = ga_block_alloc(st, GA_MEM_PINNED, -1, nbytes, NULL);
    } else {
        block = ga_block_alloc(st, GA_MEM_HOST, -1, nbytes, NULL);
    }
    if (!block)
        return NULL;
    ArrayObject *a = array_alloc(st);
    if (!a) {
        ga_block_free(block);
        return NULL;
    }
    a->data = block->ptr;
    a->dtype = dtype;
    a->ndim = ndim;
    a->device = device;
    a->flags = pinned && device.type == GA_DEVICE_CPU ? GA_ARRAY_PINNED : 0;
    if (ndim > 0)
        memcpy(a->shape, shape, (size_t)ndim * sizeof(int64_t));
    ga_contiguous_strides(ndim, shape, (int64_t)ga_dtype_itemsize(dtype), a->strides);
    a->block = block;
    a->owns_block = 1;
    return a;
}

ArrayObject *ga_array_from_block(ga_state *st, ga_block *block, ga_dtype dtype, int ndim,
                                 const int64_t *shape, ga_device device, int flags)
{
    int64_t numel;
    ArrayObject *a = ga_check_shape(dtype, ndim, shape, &numel) == 0 ? array_alloc(st) : NULL;
    if (!a) {
        ga_block_free(block);
        return NULL;
    }
    a->data = block->ptr;
    a->dtype = dtype;
    a->ndim = ndim;
    a->device = device;
    a->flags = flags;
    if (ndim > 0)
        memcpy(a->shape, shape, (size_t)ndim * sizeof(int64_t));
    ga_contiguous_strides(ndim, shape, (int64_t)ga_dtype_itemsize(dtype), a->strides);
    a->block = block;
    a->owns_block = 1;
    return a;
}

ArrayObject *ga_array_wrap(ga_state *st, void *data, ga_dtype dtype, int ndim, const int64_t *shape,
                           const int64_t *strides, ga_device device, int flags, PyObject *owner)
{
    int64_t numel;
    if (ga_check_shape(dtype, ndim, shape, &numel) < 0)
        return NULL;
    ArrayObject *a = array_alloc(st);
    if (!a)
        return NULL;
    a->data = data;
    a->dtype = dtype;
    a->ndim = ndim;
    a->device = device;
    a->flags = flags;
    if (ndim > 0) /* a 0-d array may come with NULL shape and strides */
        memcpy(a->shape, shape, (size_t)ndim * sizeof(int64_t));
    if (strides && ndim > 0)
        memcpy(a->strides, strides, (size_t)ndim * sizeof(int64_t));
    else if (!strides)
        ga_contiguous_strides(ndim, shape, (int64_t)ga_dtype_itemsize(dtype), a->strides);
    a->base = Py_XNewRef(owner);
    return a;
}

ArrayObject *ga_array_from_dlpack_tensor(ga_state *st, void *managed, int versioned, void *data,
                                         ga_dtype dtype, int ndim, const int64_t *shape,
                                         const int64_t *strides, ga_device device, int flags)
{
    ArrayObject *a = ga_array_wrap(st, data, dtype, ndim, shape, strides, device, flags, NULL);
    if (a) {
        a->dlpack = managed;
        a->dlpack_versioned = versioned;
    }
    return a;
}

ArrayObject *ga_array_view(ga_state *st, ArrayObject *src, char *data, int ndim,
                           const int64_t *shape, const int64_t *strides)
{
    ArrayObject *a = array_alloc(st);
    if (!a)
        return NULL;
    a->data = data;
    a->dtype = src->dtype;
    a->ndim = ndim;
    a->device = src->device;
    a->flags = src->flags;
    if (ndim > 0) {
        memcpy(a->shape, shape, (size_t)ndim * sizeof(int64_t));
        memcpy(a->strides, strides, (size_t)ndim * sizeof(int64_t));
    }
    /* keep the root alive, not the chain of views */
    a->base = Py_NewRef(src->owns_block || src->dlpack ? (PyObject *)src : src->base);
    a->block = src->block;
    return a;
}

/* ----------------------------------------------------------- geometry */

/* Byte range [lo, hi) that the elements of a occupy. */
static void extent(const ArrayObject *a, uintptr_t *lo, uintptr_t *hi)
{
    int64_t low = 0, high = (int64_t)ga_dtype_itemsize(a->dtype);
    for (int d = 0; d < a->ndim; d++) {
        int64_t span = (a->shape[d] - 1) * a->strides[d];
        if (span < 0)
            low += span;
        else
            high += span;
    }
    *lo = (uintptr_t)a->data + low;
    *hi = (uintptr_t)a->data + high;
}

int ga_arrays_may_overlap(const ArrayObject *a, const ArrayObject *b)
{
    if (ga_array_size(a) == 0 || ga_array_size(b) == 0 || !a->data || !b->data)
        return 0;
    if (!ga_device_equal(a->device, b->device))
        return 0;
    uintptr_t alo, ahi, blo, bhi;
    extent(a, &alo, &ahi);
    extent(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}
