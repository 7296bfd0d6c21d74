/*
 * transfer.c — moving values between arrays: any pair of devices, any pair
 * of dtypes, any strides.  Every copy, cast, transfer, conversion and fill
 * of the package goes through here, which picks the kernel (kernels/cpu or
 * kernels/cuda), the stream, the staging buffers and the waits.
 */
#include "npy.h"

#include <string.h>

#include "transfer.h"

/* A temporary buffer (not a Python object) described as a tensor. */
typedef struct {
    ga_block *block;
    ga_tensor t;
} temp_buffer;

static int temp_alloc(ga_state *st, temp_buffer *buf, ga_mem_kind kind, int device, ga_dtype dtype,
                      int ndim, const int64_t *shape, ga_stream stream)
{
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++)
        numel *= shape[d];
    size_t itemsize = ga_dtype_itemsize(dtype);
    buf->block = ga_block_alloc(st, kind, device, (size_t)numel * itemsize, stream);
    if (!buf->block)
        return -1;
    buf->t.data = buf->block->ptr;
    buf->t.dtype = dtype;
    buf->t.ndim = ndim;
    memcpy(buf->t.shape, shape, (size_t)ndim * sizeof(int64_t));
    ga_contiguous_strides(ndim, shape, (int64_t)itemsize, buf->t.strides);
    return 0;
}

/* Frees a temporary once the work queued on `stream` (of `device`) that
 * used it is done — without waiting for it. */
static void temp_release(ga_state *st, temp_buffer *buf, int device, ga_stream stream)
{
    if (!buf->block)
        return;
    if (device >= 0 && ga_block_record_use(st, buf->block, device, stream) < 0)
        PyErr_Clear(); /* freeing still must happen; the error already surfaced or will */
    ga_block_free(buf->block);
    buf->block = NULL;
}

static int64_t tensor_nbytes(const ga_tensor *t)
{
    int64_t n = (int64_t)ga_dtype_itemsize(t->dtype);
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

static int tensor_is_contiguous(const ga_tensor *t)
{
    int64_t expected = (int64_t)ga_dtype_itemsize(t->dtype);
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] == 0)
            return 1;
        if (t->shape[d] != 1) {
            if (t->strides[d] != expected)
                return 0;
            expected *= t->shape[d];
        }
    }
    return 1;
}

static int cpu_copy(ga_state *st, const ga_tensor *dst, const ga_tensor *src)
{
    ga_status status;
    if (tensor_nbytes(dst) >= GA_NOGIL_THRESHOLD_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        status = ga_cpu_copy(dst, src);
        Py_END_ALLOW_THREADS
    } else {
        status = ga_cpu_copy(dst, src);
    }
    return status.error ? ga_raise(st, status) : 0;
}

/* host -> device */
static int copy_host_to_device(ga_state *st, ArrayObject *dst, ArrayObject *src, ga_stream stream)
{
    int device = dst->device.index;
    ga_tensor d = ga_array_tensor(dst), s = ga_array_tensor(src);
    temp_buffer staging = {NULL, {0}}, device_tmp = {NULL, {0}};
    int rc = -1;
    if (ga_array_prepare_stream(st, dst, stream) < 0)
        return -1;
    const ga_tensor *source = &s;
    if (!((src->flags & GA_ARRAY_PINNED) && src->dtype == dst->dtype && tensor_is_contiguous(&s))) {
        /* pageable, strided or another dtype: convert on the host straight
         * into a pinned buffer, so that the copy itself can be async */
        int capturing = 0;
        GA_CHECK(st, ga_cuda_stream_capturing(stream, &capturing));
        if (capturing) {
            /* the graph would copy from the staging buffer at each replay,
             * long after the pool handed it to someone else */
            PyErr_SetString(PyExc_RuntimeError,
                            "a copy from host memory that is not a pinned, contiguous array of "
                            "the destination's dtype cannot be captured into a CUDA graph (it is "
                            "staged through a temporary pinned buffer, which a replay would read "
                            "after it was reused); copy before capturing, or from a pinned array "
                            "(gpuaccel.empty(..., pinned=True)) kept alive as the graph's input");
            goto done;
        }
        if (temp_alloc(st, &staging, GA_MEM_PINNED, -1, dst->dtype, d.ndim, d.shape, NULL) < 0 ||
            cpu_copy(st, &staging.t, &s) < 0)
            goto done;
        source = &staging.t;
    }
    const ga_tensor *target = &d;
    if (!tensor_is_contiguous(&d)) {
        if (temp_alloc(st, &device_tmp, GA_MEM_DEVICE, device, dst->dtype, d.ndim, d.shape,
                       stream) < 0)
            goto done;
        target = &device_tmp.t;
    }
    GA_CHECK(st, ga_cuda_memcpy_async(device, target->data, source->data,
                                      (size_t)tensor_nbytes(target), stream));
    if (target != &d)
        GA_CHECK(st, ga_cuda_copy(device, &d, target, stream));
    if (source == &s && ga_array_record_stream(st, src, stream) < 0)
        goto done;
    rc = ga_array_record_stream(st, dst, stream);
done:
error:
    temp_release(st, &staging, device, stream);
    temp_release(st, &device_tmp, device, stream);
    return rc;
}

/* device -> host: waits for the copy, since the host reads the result */
static int copy_device_to_host(ga_state *st, ArrayObject *dst, ArrayObject *src, ga_stream stream)
{
    int device = src->device.index;
    ga_tensor d = ga_array_tensor(dst), s = ga_array_tensor(src);
    temp_buffer device_tmp = {NULL, {0}}, staging = {NULL, {0}};
    int rc = -1;
    if (ga_array_prepare_stream(st, src, stream) < 0)
        return -1;
    const ga_tensor *source = &s;
    if (!tensor_is_contiguous(&s)) {
        if (temp_alloc(st, &device_tmp, GA_MEM_DEVICE, device, src->dtype, s.ndim, s.shape,
                       stream) < 0)
            goto done;
        GA_CHECK(st, ga_cuda_copy(device, &device_tmp.t, &s, stream));
        source = &device_tmp.t;
    }
    int direct = src->dtype == dst->dtype && tensor_is_contiguous(&d);
    if (!direct &&
        temp_alloc(st, &staging, GA_MEM_PINNED, -1, src->dtype, s.ndim, s.shape, NULL) < 0)
        goto done;
    void *landing = direct ? d.data : staging.t.data;
    GA_CHECK(st, ga_cuda_memcpy_async(device, landing, source->data, (size_t)tensor_nbytes(source),
                                      stream));
    if (ga_array_record_stream(st, src, stream) < 0)
        goto done;
    GA_CHECK_NOGIL(st, ga_cuda_stream_synchronize(device, stream));
    GA_CHECK(st, ga_cuda_host_access(landing, (size_t)tensor_nbytes(source), 0));
    if (!direct && cpu_copy(st, &d, &staging.t) < 0)
        goto done;
    rc = 0;
done:
error:
    temp_release(st, &device_tmp, device, stream);
    temp_release(st, &staging, -1, stream);
    return rc;
}

/* device -> another device: peer copy of a dense buffer */
static int copy_device_to_device(ga_state *st, ArrayObject *dst, ArrayObject *src,
                                 ga_stream dst_stream)
{
    int sdev = src->device.index, ddev = dst->device.index;
    ga_stream src_stream;
    ga_tensor d = ga_array_tensor(dst), s = ga_array_tensor(src);
    temp_buffer src_tmp = {NULL, {0}}, dst_tmp = {NULL, {0}};
    int rc = -1;
    if (ga_current_stream(st, sdev, &src_stream) < 0 ||
        ga_array_prepare_stream(st, src, src_stream) < 0 ||
        ga_array_prepare_stream(st, dst, dst_stream) < 0)
        return -1;
    const ga_tensor *source = &s;
    if (!tensor_is_contiguous(&s) || src->dtype != dst->dtype) {
        if (temp_alloc(st, &src_tmp, GA_MEM_DEVICE, sdev, dst->dtype, s.ndim, s.shape, src_stream) <
            0)
            goto done;
        GA_CHECK(st, ga_cuda_copy(sdev, &src_tmp.t, &s, src_stream));
        source = &src_tmp.t;
    }
    const ga_tensor *target = &d;
    if (!tensor_is_contiguous(&d)) {
        if (temp_alloc(st, &dst_tmp, GA_MEM_DEVICE, ddev, dst->dtype, d.ndim, d.shape, dst_stream) <
            0)
            goto done;
        target = &dst_tmp.t;
    }
    GA_CHECK(st, ga_cuda_stream_wait_stream(ddev, dst_stream, sdev, src_stream));
    GA_CHECK(st, ga_cuda_memcpy_async(ddev, target->data, source->data,
                                      (size_t)tensor_nbytes(target), dst_stream));
    if (target != &d)
        GA_CHECK(st, ga_cuda_copy(ddev, &d, target, dst_stream));
    if (source == &s) {
        if (src->block && ga_block_record_use(st, src->block, ddev, dst_stream) < 0)
            goto done;
    } else if (ga_block_record_use(st, src_tmp.block, ddev, dst_stream) < 0) {
        goto done;
    }
    rc = ga_array_record_stream(st, dst, dst_stream);
done:
error:
    temp_release(st, &src_tmp, sdev, src_stream);
    temp_release(st, &dst_tmp, ddev, dst_stream);
    return rc;
}

int ga_copy_into(ga_state *st, ArrayObject *dst, ArrayObject *src, PyObject *stream_obj)
{
    if (dst->ndim != src->ndim || memcmp(dst->shape, src->shape, (size_t)dst->ndim * 8) != 0) {
        PyErr_SetString(PyExc_SystemError, "gpuaccel: ga_copy_into with mismatched shapes");
        return -1;
    }
    if (ga_array_size(dst) == 0)
        return 0;
    int dst_cuda = dst->device.type == GA_DEVICE_CUDA;
    int src_cuda = src->device.type == GA_DEVICE_CUDA;
    if (!dst_cuda && ga_array_before_host_write(st, dst) < 0)
        return -1; /* a pinned destination: async copies may still read it */
    if (!dst_cuda && !src_cuda) {
        ga_tensor d = ga_array_tensor(dst), s = ga_array_tensor(src);
        return cpu_copy(st, &d, &s);
    }
    /* the stream belongs to the GPU side (the destination's, for two GPUs) */
    int device = dst_cuda ? dst->device.index : src->device.index;
    ga_stream stream;
    if (ga_ensure_cuda_device(st, device) < 0 ||
        (src_cuda && ga_ensure_cuda_device(st, src->device.index) < 0) ||
        ga_stream_from_object(st, stream_obj, device, &stream, "stream") < 0)
        return -1;
    if (dst_cuda && src_cuda && dst->device.index != src->device.index)
        return copy_device_to_device(st, dst, src, stream);
    if (dst_cuda && src_cuda) {
        ga_tensor d = ga_array_tensor(dst), s = ga_array_tensor(src);
        if (ga_array_prepare_stream(st, dst, stream) < 0 ||
            ga_array_prepare_stream(st, src, stream) < 0)
            return -1;
        GA_CHECK(st, ga_cuda_copy(device, &d, &s, stream));
        if (ga_array_record_stream(st, src, stream) < 0)
            return -1;
        return ga_array_record_stream(st, dst, stream);
    }
    if (dst_cuda)
        return copy_host_to_device(st, dst, src, stream);
    return copy_device_to_host(st, dst, src, stream);
error:
    return -1;
}

ArrayObject *ga_array_copy_to(ga_state *st, ArrayObject *src, ga_device device, ga_dtype dtype,
                              int pinned, PyObject *stream_obj)
{
    ga_stream stream, *stream_ptr = NULL;
    if (device.type == GA_DEVICE_CUDA) {
        /* allocate on the stream that will write it */
        if (ga_ensure_cuda_device(st, device.index) < 0 ||
            ga_stream_from_object(st, stream_obj, device.index, &stream, "stream") < 0)
            return NULL;
        stream_ptr = &stream;
    }
    ArrayObject *dst = ga_array_empty(st, dtype, src->ndim, src->shape, device, pinned, stream_ptr);
    if (!dst)
        return NULL;
    if (ga_copy_into(st, dst, src, stream_obj) < 0) {
        Py_DECREF(dst);
        return NULL;
    }
    return dst;
}

ArrayObject *ga_array_convert(ga_state *st, ArrayObject *arr, int fresh, const ga_dtype *dtype,
                              const ga_device *device, int copy, PyObject *stream_obj)
{
    ga_dtype want_dtype = dtype ? *dtype : arr->dtype;
    ga_device want_device = device ? *device : arr->device;
    int convert = want_dtype != arr->dtype || !ga_device_equal(want_device, arr->device);
    if (convert && copy == 0) {
        char have[32], want[32];
        PyErr_Format(PyExc_ValueError,
                     "asarray: copy=False, but turning %s %s into %s %s needs a copy",
                     ga_dtype_name(arr->dtype), ga_device_str(arr->device, have, sizeof have),
                     ga_dtype_name(want_dtype), ga_device_str(want_device, want, sizeof want));
        Py_DECREF(arr);
        return NULL;
    }
    if (convert || (copy == 1 && !fresh)) {
        ArrayObject *copied = ga_array_copy_to(st, arr, want_device, want_dtype, 0, stream_obj);
        Py_DECREF(arr);
        return copied;
    }
    return arr;
}

int ga_scalar_from_object(PyObject *obj, ga_scalar *out, const char *argname)
{
    out->is_integer = 0;
    out->i = 0;
    out->f = 0.0;
    if (PyBool_Check(obj) || PyArray_IsScalar(obj, Bool)) {
        int truth = PyObject_IsTrue(obj);
        if (truth < 0)
            return -1;
        out->is_integer = 1;
        out->i = truth;
        return 0;
    }
    if (PyLong_Check(obj) || PyArray_IsScalar(obj, Integer)) {
        int overflow = 0;
        PyObject *as_int = PyNumber_Long(obj);
        if (!as_int)
            return -1;
        long long v = PyLong_AsLongLongAndOverflow(as_int, &overflow);
        if (overflow) {
            /* beyond int64: only meaningful for float targets */
            out->f = PyLong_AsDouble(as_int);
            Py_DECREF(as_int);
            return out->f == -1.0 && PyErr_Occurred() ? -1 : 0;
        }
        Py_DECREF(as_int);
        if (v == -1 && PyErr_Occurred())
            return -1;
        out->is_integer = 1;
        out->i = v;
        return 0;
    }
    if (PyFloat_Check(obj) || PyArray_IsScalar(obj, Floating)) {
        out->f = PyFloat_AsDouble(obj);
        return out->f == -1.0 && PyErr_Occurred() ? -1 : 0;
    }
    PyErr_Format(PyExc_TypeError, "%s must be a bool, int or float, got %.200s", argname,
                 ga_type_name(obj));
    return -1;
}

int ga_array_fill(ga_state *st, ArrayObject *dst, PyObject *value)
{
    ga_scalar scalar;
    if (ga_scalar_from_object(value, &scalar, "value") < 0)
        return -1;
    ga_tensor t = ga_array_tensor(dst);
    if (dst->device.type == GA_DEVICE_CPU) {
        if (ga_array_before_host_write(st, dst) < 0)
            return -1;
        ga_status status;
        if (tensor_nbytes(&t) >= GA_NOGIL_THRESHOLD_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            status = ga_cpu_fill(&t, scalar);
            Py_END_ALLOW_THREADS
        } else {
            status = ga_cpu_fill(&t, scalar);
        }
        return status.error ? ga_raise(st, status) : 0;
    }
    int device = dst->device.index;
    ga_stream stream;
    if (ga_ensure_cuda_device(st, device) < 0 || ga_current_stream(st, device, &stream) < 0 ||
        ga_array_prepare_stream(st, dst, stream) < 0)
        return -1;
    GA_CHECK(st, ga_cuda_fill(device, &t, scalar, stream));
    return ga_array_record_stream(st, dst, stream);
error:
    return -1;
}
