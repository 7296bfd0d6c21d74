/*
 * dlpack.c — DLPack (producer and consumer) and __cuda_array_interface__ v3.
 *
 * Producer: __dlpack__ hands out a "dltensor_versioned" capsule when the
 * consumer passes max_version >= (1, 0), a legacy "dltensor" one otherwise.
 * The tensor keeps the exported Array alive; its deleter takes the GIL and
 * does nothing once the interpreter is shutting down.  For CUDA arrays the
 * consumer's stream is made to wait (on the GPU) for the work pending on the
 * memory; the host never blocks.
 *
 * Consumer: a capsule is renamed "used_dltensor[_versioned]" once its
 * contents belong to a gpuaccel Array, which calls the deleter when the
 * last view of the memory goes.
 */
#include "npy.h"

#include <stdlib.h>
#include <string.h>

#include "dlpack.h"
#include "dlpack_abi.h"
#include "transfer.h"

static const char *const CAPSULE_VERSIONED = "dltensor_versioned";
static const char *const CAPSULE_LEGACY = "dltensor";
static const char *const CAPSULE_USED_VERSIONED = "used_dltensor_versioned";
static const char *const CAPSULE_USED_LEGACY = "used_dltensor";

/* ------------------------------------------------------------ dtypes */

static DLDataType dl_dtype(ga_dtype dtype)
{
    DLDataType t;
    t.lanes = 1;
    t.bits = (uint8_t)(8 * ga_dtype_itemsize(dtype));
    switch (dtype) {
    case GA_BOOL: t.code = kDLBool; break;
    case GA_UINT8: t.code = kDLUInt; break;
    case GA_INT8:
    case GA_INT16:
    case GA_INT32:
    case GA_INT64: t.code = kDLInt; break;
    case GA_BFLOAT16: t.code = kDLBfloat; break;
    default: t.code = kDLFloat; break;
    }
    return t;
}

static int ga_dtype_from_dl(DLDataType t, ga_dtype *out)
{
    if (t.lanes != 1)
        return -1;
    switch (t.code) {
    case kDLBool:
        if (t.bits == 8) {
            *out = GA_BOOL;
            return 0;
        }
        return -1;
    case kDLUInt:
        if (t.bits == 8) {
            *out = GA_UINT8;
            return 0;
        }
        return -1;
    case kDLInt:
        switch (t.bits) {
        case 8: *out = GA_INT8; return 0;
        case 16: *out = GA_INT16; return 0;
        case 32: *out = GA_INT32; return 0;
        case 64: *out = GA_INT64; return 0;
        }
        return -1;
    case kDLFloat:
        switch (t.bits) {
        case 16: *out = GA_FLOAT16; return 0;
        case 32: *out = GA_FLOAT32; return 0;
        case 64: *out = GA_FLOAT64; return 0;
        }
        return -1;
    case kDLBfloat:
        if (t.bits == 16) {
            *out = GA_BFLOAT16;
            return 0;
        }
        return -1;
    }
    return -1;
}

/* ---------------------------------------------------------- producer */

/* One allocation per export: the managed tensor, its shape and strides, and
 * what the deleter needs. */
typedef struct {
    union {
        DLManagedTensor legacy;
        DLManagedTensorVersioned versioned;
    } managed;
    PyObject *array; /* the exported Array: keeps the memory alive */
    ga_block *block; /* its allocation (borrowed from the array), or NULL */
    int device;      /* CUDA ordinal, or -1 for host memory */
    int has_consumer_stream;
    ga_stream consumer_stream;
    int64_t dims[]; /* shape[ndim], then strides[ndim] */
} export_ctx;

static void export_release(export_ctx *ctx)
{
    /* Runs in whichever thread the consumer drops the tensor in, maybe
     * during interpreter shutdown, when touching Python would crash. */
    if (!Py_IsInitialized() || ga_is_finalizing()) {
        /* the Array is left to the dying interpreter; our own context
         * needs no Python and is freed */
        free(ctx);
        return;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    if (ctx->has_consumer_stream && ctx->block)
        (void)ga_block_record_use_status(ctx->block, ctx->device, ctx->consumer_stream);
    Py_DECREF(ctx->array);
    PyGILState_Release(gil);
    free(ctx);
}

static void delete_versioned(DLManagedTensorVersioned *m)
{
    export_release((export_ctx *)m->manager_ctx);
}

static void delete_legacy(DLManagedTensor *m)
{
    export_release((export_ctx *)m->manager_ctx);
}

/* A capsule nobody consumed owns its tensor.  The destructor often runs
 * while the consumer that refused the capsule is raising (NumPy has no
 * bfloat16): that exception is kept, and nothing of ours replaces it. */
static void capsule_destructor_versioned(PyObject *capsule)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (PyCapsule_IsValid(capsule, CAPSULE_VERSIONED)) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, CAPSULE_VERSIONED);
        if (m && m->deleter)
            m->deleter(m);
    }
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
}

static void capsule_destructor_legacy(PyObject *capsule)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (PyCapsule_IsValid(capsule, CAPSULE_LEGACY)) {
        DLManagedTensor *m = PyCapsule_GetPointer(capsule, CAPSULE_LEGACY);
        if (m && m->deleter)
            m->deleter(m);
    }
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
}

/* Parses DLPack's `stream` for a CUDA export: *none=1 for -1 (no sync). */
static int parse_consumer_stream(PyObject *obj, ga_stream *out, int *no_sync)
{
    *no_sync = 0;
    if (obj == Py_None) {
        *out = GA_STREAM_LEGACY;
        return 0;
    }
    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError,
                     "__dlpack__: stream must be None or an int (1: legacy default stream, 2: "
                     "per-thread default stream, -1: no synchronization, else a cudaStream_t), "
                     "got %.200s",
                     ga_type_name(obj));
        return -1;
    }
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        v = -2; /* beyond long long: treat as a handle below */
        unsigned long long u = PyLong_AsUnsignedLongLong(obj);
        if (u == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        *out = (ga_stream)(uintptr_t)u;
        return 0;
    }
    if (v == -1) {
        *no_sync = 1;
        return 0;
    }
    if (v == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "__dlpack__: stream=0 is ambiguous and not allowed for CUDA; use 1 for "
                        "the legacy default stream or 2 for the per-thread default stream");
        return -1;
    }
    if (v < 0) {
        PyErr_Format(PyExc_ValueError, "__dlpack__: invalid stream %lld", v);
        return -1;
    }
    *out = (ga_stream)(uintptr_t)v;
    return 0;
}

static int parse_max_version(PyObject *obj, int *versioned)
{
    *versioned = 0;
    if (obj == Py_None)
        return 0;
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 2 ||
        !PyLong_Check(PyTuple_GET_ITEM(obj, 0)) || !PyLong_Check(PyTuple_GET_ITEM(obj, 1))) {
        PyErr_Format(PyExc_TypeError,
                     "__dlpack__: max_version must be None or a (major, minor) tuple of ints, "
                     "got %R",
                     obj);
        return -1;
    }
    long major = PyLong_AsLong(PyTuple_GET_ITEM(obj, 0));
    if (major == -1 && PyErr_Occurred())
        return -1;
    *versioned = major >= 1;
    return 0;
}

/* dl_device: None, or a (device_type, device_id) pair. */
static int parse_dl_device(ga_state *st, PyObject *obj, const ArrayObject *self, ga_device *out)
{
    *out = self->device;
    if (obj == Py_None)
        return 0;
    int type, id;
    if (!PyTuple_Check(obj) || !PyArg_ParseTuple(obj, "ii", &type, &id)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "__dlpack__: dl_device must be None or a (device_type, device_id) tuple, "
                     "got %R",
                     obj);
        return -1;
    }
    if (type == kDLCPU || type == kDLCUDAHost) {
        out->type = GA_DEVICE_CPU;
        out->index = 0;
        return 0;
    }
    if (type == kDLCUDA || type == kDLCUDAManaged) {
        out->type = GA_DEVICE_CUDA;
        out->index = id; /* checked by the copy, if one is needed */
        return 0;
    }
    PyErr_Format(PyExc_BufferError,
                 "__dlpack__: cannot export to DLPack device type %d; gpuaccel supports CPU "
                 "(1) and CUDA (2)",
                 type);
    return -1;
}

/* The context of an export of x: shape and element strides, the device;
 * NULL with BufferError naming `who` when DLPack cannot describe x.  A
 * writable export of pinned memory first waits for async copies still
 * reading it. */
static export_ctx *export_begin(ga_state *st, ArrayObject *x, const char *who)
{
    int ndim = x->ndim;
    size_t itemsize = ga_dtype_itemsize(x->dtype);
    if (!(x->flags & GA_ARRAY_READONLY) && ga_array_before_host_write(st, x) < 0)
        return NULL;
    for (int d = 0; d < ndim; d++) {
        if (x->strides[d] % (int64_t)itemsize) {
            PyErr_Format(PyExc_BufferError,
                         "%s: stride %lld bytes of dimension %d is not a multiple of the itemsize "
                         "%zu, which DLPack cannot express",
                         who, (long long)x->strides[d], d, itemsize);
            return NULL;
        }
    }
    export_ctx *ctx = calloc(1, sizeof *ctx + 2 * (size_t)(ndim > 0 ? ndim : 1) * sizeof(int64_t));
    if (!ctx) {
        PyErr_NoMemory();
        return NULL;
    }
    for (int d = 0; d < ndim; d++) {
        ctx->dims[d] = x->shape[d];
        ctx->dims[ndim + d] = x->strides[d] / (int64_t)itemsize;
    }
    ctx->device = x->device.type == GA_DEVICE_CUDA ? x->device.index : -1;
    ctx->block = x->block;
    return ctx;
}

/* Fills the DLTensor (and the versioned header) of an export; ctx takes
 * over the reference to x. */
static void fill_dltensor(DLTensor *t, const ArrayObject *x, int64_t *shape, int64_t *strides)
{
    t->data = x->data;
    /* pinned host memory is reported as CPU: consumers (torch) refuse kDLCUDAHost */
    t->device.device_type = x->device.type == GA_DEVICE_CUDA ? kDLCUDA : kDLCPU;
    t->device.device_id = x->device.type == GA_DEVICE_CUDA ? x->device.index : 0;
    t->ndim = x->ndim;
    t->dtype = dl_dtype(x->dtype);
    t->shape = x->ndim ? shape : NULL;
    t->strides = x->ndim ? strides : NULL;
    t->byte_offset = 0;
}

static void export_finish(export_ctx *ctx, ArrayObject *x, int versioned, int copied)
{
    int readonly = (x->flags & GA_ARRAY_READONLY) != 0;
    int64_t *shape = ctx->dims, *strides = ctx->dims + x->ndim;
    if (versioned) {
        DLManagedTensorVersioned *m = &ctx->managed.versioned;
        fill_dltensor(&m->dl_tensor, x, shape, strides);
        m->version.major = DLPACK_MAJOR_VERSION;
        m->version.minor = DLPACK_MINOR_VERSION;
        m->manager_ctx = ctx;
        m->deleter = delete_versioned;
        m->flags = (readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0) |
                   (copied ? DLPACK_FLAG_BITMASK_IS_COPIED : 0);
    } else {
        DLManagedTensor *m = &ctx->managed.legacy;
        fill_dltensor(&m->dl_tensor, x, shape, strides);
        m->manager_ctx = ctx;
        m->deleter = delete_legacy;
    }
    ctx->array = (PyObject *)x;
}

PyObject *ga_array_dlpack(ArrayObject *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames)
{
    static const char *const names[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *v[4];
    if (ga_parse_args("__dlpack__", args, nargs, kwnames, names, 0, 0, v) < 0)
        return NULL;
    PyObject *stream_obj = v[0] ? v[0] : Py_None, *max_version = v[1] ? v[1] : Py_None,
             *dl_device = v[2] ? v[2] : Py_None, *copy_obj = v[3] ? v[3] : Py_None;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    int versioned, copy;
    ga_device target;
    if (parse_max_version(max_version, &versioned) < 0 ||
        ga_copy_flag_from_object(copy_obj, &copy) < 0 ||
        parse_dl_device(st, dl_device, self, &target) < 0)
        return NULL;

    ArrayObject *x = self; /* what is exported: self or a copy */
    int copied = 0;
    if (!ga_device_equal(target, self->device) || copy == 1) {
        if (copy == 0) {
            PyErr_SetString(PyExc_BufferError,
                            "__dlpack__: the requested dl_device differs from the array's "
                            "device, which needs a copy, but copy=False");
            return NULL;
        }
        x = ga_array_copy_to(st, self, target, self->dtype, 0, NULL);
        if (!x)
            return NULL;
        copied = 1;
    } else {
        Py_INCREF(x);
    }

    int readonly = (x->flags & GA_ARRAY_READONLY) != 0;
    export_ctx *ctx = NULL;
    PyObject *capsule = NULL;
    if (readonly && !versioned) {
        PyErr_SetString(PyExc_BufferError,
                        "__dlpack__: a read-only array can only be exported as a versioned "
                        "DLPack tensor (the consumer must pass max_version >= (1, 0))");
        goto error;
    }
    if (!(ctx = export_begin(st, x, "__dlpack__")))
        goto error;
    if (x->device.type == GA_DEVICE_CUDA) {
        ga_stream consumer;
        int no_sync;
        if (parse_consumer_stream(stream_obj, &consumer, &no_sync) < 0)
            goto error;
        if (!no_sync) {
            ga_stream producer;
            if (ga_current_stream(st, ctx->device, &producer) < 0)
                goto error;
            GA_CHECK(st, ga_cuda_stream_wait_stream(ctx->device, consumer, ctx->device, producer));
            GA_CHECK(st, ga_block_wait_all(x->block, ctx->device, consumer));
            ctx->has_consumer_stream = 1;
            ctx->consumer_stream = consumer;
        }
    } else if (stream_obj != Py_None && !(PyLong_Check(stream_obj) &&
                                          PyLong_AsLong(stream_obj) == -1 && !PyErr_Occurred())) {
        PyErr_Clear(); /* an int beyond a C long is just a wrong stream */
        PyErr_Format(PyExc_ValueError,
                     "__dlpack__: stream must be None for an array in host memory, got %R",
                     stream_obj);
        goto error;
    }
    export_finish(ctx, x, versioned, copied);
    x = NULL; /* the reference taken above now belongs to ctx */
    if (versioned)
        capsule =
            PyCapsule_New(&ctx->managed.versioned, CAPSULE_VERSIONED, capsule_destructor_versioned);
    else
        capsule = PyCapsule_New(&ctx->managed.legacy, CAPSULE_LEGACY, capsule_destructor_legacy);
    if (!capsule) {
        Py_DECREF(ctx->array);
        free(ctx);
        return NULL;
    }
    return capsule;
error:
    Py_XDECREF(x);
    free(ctx);
    return NULL;
}

PyObject *ga_array_dlpack_device(ArrayObject *self, PyObject *unused)
{
    (void)unused;
    if (self->device.type == GA_DEVICE_CUDA)
        return Py_BuildValue("(ii)", (int)kDLCUDA, self->device.index);
    return Py_BuildValue("(ii)", (int)kDLCPU, 0);
}

/* ---------------------------------------------------------- consumer */

void ga_dlpack_release(void *managed, int versioned)
{
    /* a deleter may run Python (ctypes, Python producers): not with an
     * exception pending, which is kept for the caller */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (versioned) {
        DLManagedTensorVersioned *m = managed;
        if (m->deleter)
            m->deleter(m);
    } else {
        DLManagedTensor *m = managed;
        if (m->deleter)
            m->deleter(m);
    }
    PyErr_Restore(type, value, tb);
}

/* What an imported DLTensor is, checked: its dtype, device, flags, first
 * element and byte strides (NULL: C-contiguous). */
typedef struct {
    ga_dtype dtype;
    ga_device device;
    int array_flags;
    char *data;
    int64_t strides[GA_MAX_NDIM];
    const int64_t *byte_strides;
} dl_import;

/* Checks a DLTensor gpuaccel is given (from a capsule, a managed tensor or
 * a view); BufferError naming `who` when it cannot be an Array. */
static int dl_describe(ga_state *st, const DLTensor *t, uint64_t flags, const char *who,
                       dl_import *out)
{
    if (t->ndim < 0 || t->ndim > GA_MAX_NDIM) {
        PyErr_Format(PyExc_BufferError, "%s: ndim %d is outside 0..%d", who, (int)t->ndim,
                     GA_MAX_NDIM);
        return -1;
    }
    if (t->ndim > 0 && !t->shape) {
        PyErr_Format(PyExc_BufferError, "%s: the tensor has no shape", who);
        return -1;
    }
    if (ga_dtype_from_dl(t->dtype, &out->dtype) < 0) {
        PyErr_Format(PyExc_BufferError,
                     "%s: DLPack dtype (code %u, bits %u, lanes %u) is not supported; "
                     "gpuaccel supports bool, uint8, int8-int64, float16, bfloat16, float32 and "
                     "float64",
                     who, t->dtype.code, t->dtype.bits, t->dtype.lanes);
        return -1;
    }
    if (flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) {
        PyErr_Format(PyExc_BufferError, "%s: padded sub-byte types are not supported", who);
        return -1;
    }
    out->array_flags = (flags & DLPACK_FLAG_BITMASK_READ_ONLY) ? GA_ARRAY_READONLY : 0;
    switch (t->device.device_type) {
    case kDLCPU:
        out->device.type = GA_DEVICE_CPU;
        out->device.index = 0;
        break;
    case kDLCUDAHost:
        out->device.type = GA_DEVICE_CPU;
        out->device.index = 0;
        out->array_flags |= GA_ARRAY_PINNED;
        break;
    case kDLCUDA:
    case kDLCUDAManaged:
        out->device.type = GA_DEVICE_CUDA;
        out->device.index = t->device.device_id;
        if (ga_ensure_cuda_device(st, out->device.index) < 0)
            return -1;
        break;
    default:
        PyErr_Format(PyExc_BufferError,
                     "%s: DLPack device type %d is not supported; gpuaccel takes CPU "
                     "(1), CUDA (2), CUDA host (3) and CUDA managed (13) memory",
                     who, (int)t->device.device_type);
        return -1;
    }
    int64_t numel;
    if (ga_check_shape(out->dtype, t->ndim, t->shape, &numel) < 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_Format(PyExc_BufferError, "%s: invalid shape: %S", who, value);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return -1;
    }
    if (!t->data && numel > 0) {
        PyErr_Format(PyExc_BufferError, "%s: NULL data pointer for a non-empty tensor", who);
        return -1;
    }
    int64_t itemsize = (int64_t)ga_dtype_itemsize(out->dtype);
    out->byte_strides = NULL;
    if (t->strides) {
        for (int d = 0; d < t->ndim; d++) {
            if (t->strides[d] > INT64_MAX / itemsize || t->strides[d] < INT64_MIN / itemsize) {
                PyErr_Format(PyExc_BufferError, "%s: stride %lld overflows", who,
                             (long long)t->strides[d]);
                return -1;
            }
            out->strides[d] = t->strides[d] * itemsize;
        }
        out->byte_strides = out->strides;
    }
    out->data = t->data ? (char *)t->data + t->byte_offset : NULL;
    return 0;
}

/* An Array owning a managed tensor (it calls the deleter when the last view
 * of the memory goes); on failure the tensor is left to the caller. */
static ArrayObject *import_managed(ga_state *st, void *managed, int versioned, const char *who)
{
    DLTensor *t;
    uint64_t flags = 0;
    if (versioned) {
        DLManagedTensorVersioned *m = managed;
        if (m->version.major > DLPACK_MAJOR_VERSION) {
            PyErr_Format(PyExc_BufferError,
                         "%s: DLPack version %u.%u is newer than the %d.x gpuaccel supports", who,
                         m->version.major, m->version.minor, DLPACK_MAJOR_VERSION);
            return NULL;
        }
        t = &m->dl_tensor;
        flags = m->flags;
    } else {
        t = &((DLManagedTensor *)managed)->dl_tensor;
        /* a legacy tensor cannot say whether its memory may be written
         * (JAX exports only these, of immutable arrays): read-only, as
         * NumPy imports it */
        flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    }
    dl_import d;
    if (dl_describe(st, t, flags, who, &d) < 0)
        return NULL;
    return ga_array_from_dlpack_tensor(st, managed, versioned, d.data, d.dtype, t->ndim, t->shape,
                                       d.byte_strides, d.device, d.array_flags);
}

static ArrayObject *import_capsule(ga_state *st, PyObject *capsule)
{
    int versioned;
    void *managed;
    if (PyCapsule_IsValid(capsule, CAPSULE_VERSIONED)) {
        versioned = 1;
        managed = PyCapsule_GetPointer(capsule, CAPSULE_VERSIONED);
    } else if (PyCapsule_IsValid(capsule, CAPSULE_LEGACY)) {
        versioned = 0;
        managed = PyCapsule_GetPointer(capsule, CAPSULE_LEGACY);
    } else {
        const char *name = PyCapsule_GetName(capsule);
        PyErr_Clear();
        if (name && strncmp(name, "used_", 5) == 0)
            PyErr_SetString(PyExc_BufferError,
                            "from_dlpack: this DLPack capsule was already consumed");
        else
            PyErr_Format(PyExc_TypeError,
                         "from_dlpack: expected a DLPack capsule named 'dltensor' or "
                         "'dltensor_versioned', got one named %s%s%s",
                         name ? "'" : "", name ? name : "None", name ? "'" : "");
        return NULL;
    }
    if (!managed)
        return NULL;
    /* Take ownership: the Array calls the deleter; the capsule is marked used. */
    ArrayObject *arr = import_managed(st, managed, versioned, "from_dlpack");
    if (!arr)
        return NULL;
    if (PyCapsule_SetName(capsule, versioned ? CAPSULE_USED_VERSIONED : CAPSULE_USED_LEGACY) < 0) {
        arr->dlpack = NULL; /* the producer's capsule still owns it */
        Py_DECREF(arr);
        return NULL;
    }
    if (ga_array_track_import(st, arr) < 0) {
        Py_DECREF(arr); /* the Array owns the tensor now: its deleter runs */
        return NULL;
    }
    return arr;
}

/* ------------------------------------------- the C exchange API: consumer */

const DLPackExchangeAPI *ga_dlpack_exchange_api(ga_state *st, PyTypeObject *type)
{
    PyObject *capsule = NULL;
    if (ga_lookup_attr((PyObject *)type, st->str_dlpack_c_exchange_api, &capsule) <= 0) {
        PyErr_Clear(); /* a broken table is no table: __dlpack__ is still there */
        return NULL;
    }
    const DLPackExchangeAPI *api = NULL;
    if (PyCapsule_IsValid(capsule, DLPACK_EXCHANGE_API_CAPSULE))
        api = PyCapsule_GetPointer(capsule, DLPACK_EXCHANGE_API_CAPSULE);
    Py_DECREF(capsule);
    /* the producer keeps the table alive for the life of the process */
    if (!api || api->header.version.major != DLPACK_MAJOR_VERSION ||
        !api->managed_tensor_from_py_object_no_sync || !api->current_work_stream) {
        PyErr_Clear();
        return NULL;
    }
    return api;
}

ArrayObject *ga_array_from_dltensor_view(ga_state *st, const DLTensor *t, PyObject *owner,
                                         const char *who)
{
    dl_import d;
    if (dl_describe(st, t, 0, who, &d) < 0)
        return NULL;
    return ga_array_wrap(st, d.data, d.dtype, t->ndim, t->shape, d.byte_strides, d.device,
                         d.array_flags, owner);
}

/* The producer's work on a CUDA tensor, ordered before gpuaccel's current
 * stream on the GPU, as __dlpack__(stream=ours) would order it: the
 * exchange API's functions leave that to the consumer. */
static int order_after_producer(ga_state *st, const DLPackExchangeAPI *api, const ArrayObject *a)
{
    if (a->device.type != GA_DEVICE_CUDA)
        return 0;
    void *producer = NULL;
    ga_stream ours;
    if (api->current_work_stream(kDLCUDA, a->device.index, &producer) < 0)
        return -1;
    if (ga_current_stream(st, a->device.index, &ours) < 0)
        return -1;
    /* a NULL work stream is the legacy default stream */
    ga_stream theirs = producer ? (ga_stream)producer : GA_STREAM_LEGACY;
    GA_CHECK(st, ga_cuda_stream_wait_stream(a->device.index, ours, a->device.index, theirs));
    return 0;
error:
    return -1;
}

/* from_dlpack through the exchange API: an owning managed tensor, no
 * capsule and no Python call. */
static ArrayObject *import_exchange(ga_state *st, const DLPackExchangeAPI *api, PyObject *obj)
{
    DLManagedTensorVersioned *managed = NULL;
    if (api->managed_tensor_from_py_object_no_sync(obj, &managed) < 0)
        return NULL;
    if (!managed) {
        PyErr_Format(PyExc_BufferError,
                     "from_dlpack: %.200s's DLPack exchange API returned no tensor",
                     ga_type_name(obj));
        return NULL;
    }
    ArrayObject *arr = import_managed(st, managed, 1, "from_dlpack");
    if (!arr) {
        ga_dlpack_release(managed, 1);
        return NULL;
    }
    if (order_after_producer(st, api, arr) < 0 || ga_array_track_import(st, arr) < 0) {
        Py_DECREF(arr); /* the Array owns the tensor now: its deleter runs */
        return NULL;
    }
    return arr;
}

/* Calls obj.__dlpack__ asking for a versioned tensor; retries without
 * max_version for producers that predate it.  The stream argument is only
 * needed when a gpuaccel stream other than the legacy default is current:
 * stream=None already means "the legacy default stream" to a CUDA producer,
 * which spares asking for __dlpack_device__ (costly in torch). */
static PyObject *call_dlpack(ga_state *st, PyObject *obj)
{
    PyObject *current = NULL, *stream = NULL, *capsule = NULL;
    if (PyContextVar_Get(st->current_stream, NULL, &current) < 0)
        return NULL;
    if (current) {
        Py_DECREF(current);
        PyObject *method = NULL, *device = NULL;
        if (ga_lookup_attr(obj, st->str_dlpack_device, &method) < 0)
            return NULL;
        if (method) {
            device = PyObject_CallNoArgs(method);
            Py_DECREF(method);
            if (!device)
                return NULL;
        }
        int type = 0, id = 0;
        if (device && (!PyTuple_Check(device) || !PyArg_ParseTuple(device, "ii", &type, &id))) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "from_dlpack: __dlpack_device__() must return (device_type, "
                         "device_id), got %R",
                         device);
            Py_DECREF(device);
            return NULL;
        }
        Py_XDECREF(device);
        if (type == kDLCUDA || type == kDLCUDAManaged) {
            ga_stream ours;
            if (ga_ensure_cuda_device(st, id) < 0 || ga_current_stream(st, id, &ours) < 0)
                return NULL;
            stream = PyLong_FromSsize_t(ga_stream_protocol_value(ours));
            if (!stream)
                return NULL;
        }
    }
    /* vectorcall: slot 0 is free for the callee, then self, then kwargs */
    PyObject *call_args[4] = {NULL, obj, st->dlpack_max_version, stream};
    capsule =
        PyObject_VectorcallMethod(st->str_dlpack, call_args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                  stream ? st->kw_max_version_stream : st->kw_max_version);
    if (!capsule && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyObject *old_args[3] = {NULL, obj, stream};
        capsule = PyObject_VectorcallMethod(st->str_dlpack, old_args + 1,
                                            1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                            stream ? st->kw_stream : NULL);
    }
    Py_XDECREF(stream);
    return capsule;
}

ArrayObject *ga_from_dlpack_object(ga_state *st, PyObject *obj)
{
    if (PyCapsule_CheckExact(obj))
        return import_capsule(st, obj);
    return ga_from_dlpack_via(st, obj, ga_dlpack_exchange_api(st, Py_TYPE(obj)));
}

void ga_dlpack_explain_layout(PyObject *obj, PyObject *exc_type)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *layout = PyObject_GetAttrString(obj, "layout");
    PyObject *name = layout ? PyObject_Str(layout) : NULL;
    const char *text = name ? PyUnicode_AsUTF8(name) : NULL;
    if (text && strncmp(text, "torch.", 6) == 0 && strcmp(text, "torch.strided") != 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        PyErr_Format(exc_type,
                     "a torch tensor with layout %s is not accepted: gpuaccel (like DLPack) "
                     "takes strided tensors; convert it with .to_dense() first",
                     text);
    } else {
        PyErr_Clear();
        PyErr_Restore(type, value, tb);
    }
    Py_XDECREF(name);
    Py_XDECREF(layout);
}

static ArrayObject *import_via_dlpack(ga_state *st, PyObject *obj)
{
    PyObject *capsule = call_dlpack(st, obj);
    if (!capsule)
        return NULL;
    if (!PyCapsule_CheckExact(capsule)) {
        PyErr_Format(PyExc_TypeError,
                     "from_dlpack: %.200s.__dlpack__() returned a %.200s, not a "
                     "capsule",
                     ga_type_name(obj), ga_type_name(capsule));
        Py_DECREF(capsule);
        return NULL;
    }
    ArrayObject *arr = import_capsule(st, capsule);
    Py_DECREF(capsule);
    return arr;
}

ArrayObject *ga_from_dlpack_via(ga_state *st, PyObject *obj, const DLPackExchangeAPI *api)
{
    ArrayObject *arr = api ? import_exchange(st, api, obj) : import_via_dlpack(st, obj);
    if (!arr)
        ga_dlpack_explain_layout(obj, PyExc_BufferError);
    return arr;
}

/* ------------------------------------------- the C exchange API: producer
 *
 * Array.__dlpack_c_exchange_api__: the same exports as __dlpack__ for a C
 * consumer, with no capsule and no Python call.  "No sync" means no
 * handshake with a consumer stream: the consumer asks current_work_stream
 * (gpuaccel's current stream) and queues its work there, and gpuaccel makes
 * that stream wait, on the GPU, for the work it knows on the memory, as it
 * would for its own op on that stream. */

/* The module whose Array type publishes the table: the functions that get
 * no Array (allocator, to_py, work stream) need its state. */
static ga_state *exchange_state;

/* An Array the table was handed, or NULL with TypeError. */
static ArrayObject *exchange_array(void *py_object, const char *fn)
{
    PyObject *obj = py_object;
    if (!exchange_state || !obj || !ga_is_array(exchange_state, obj)) {
        PyErr_Format(PyExc_TypeError, "gpuaccel %s: expected a gpuaccel.Array, got %.200s", fn,
                     obj ? ga_type_name(obj) : "NULL");
        return NULL;
    }
    return (ArrayObject *)obj;
}

/* The consumer's stream is gpuaccel's current one: it waits for the work
 * known on x's memory; 0 or -1 with an exception. */
static int exchange_order(ga_state *st, ArrayObject *x, ga_stream *stream)
{
    if (x->device.type != GA_DEVICE_CUDA)
        return 0;
    if (ga_current_stream(st, x->device.index, stream) < 0)
        return -1;
    if (x->block)
        GA_CHECK(st, ga_block_wait_all(x->block, x->device.index, *stream));
    return 0;
error:
    return -1;
}

static int exchange_from_py(void *py_object, DLManagedTensorVersioned **out)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = -1;
    export_ctx *ctx = NULL;
    ArrayObject *x = exchange_array(py_object, "managed_tensor_from_py_object_no_sync");
    ga_stream stream = NULL;
    if (!x || !(ctx = export_begin(exchange_state, x, "__dlpack_c_exchange_api__")) ||
        exchange_order(exchange_state, x, &stream) < 0) {
        free(ctx);
        goto done;
    }
    if (x->device.type == GA_DEVICE_CUDA) {
        ctx->has_consumer_stream = 1; /* its use is recorded when the consumer lets go */
        ctx->consumer_stream = stream;
    }
    Py_INCREF(x);
    export_finish(ctx, x, 1, 0);
    *out = &ctx->managed.versioned;
    rc = 0;
done:
    PyGILState_Release(gil);
    return rc;
}

static int exchange_dltensor(void *py_object, DLTensor *out)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = -1;
    ArrayObject *x = exchange_array(py_object, "dltensor_from_py_object_no_sync");
    if (!x)
        goto done;
    int ndim = x->ndim;
    int64_t itemsize = (int64_t)ga_dtype_itemsize(x->dtype);
    if (!x->dl_strides && ndim > 0) {
        int64_t *strides = malloc((size_t)ndim * sizeof *strides);
        if (!strides) {
            PyErr_NoMemory();
            goto done;
        }
        for (int d = 0; d < ndim; d++) {
            if (x->strides[d] % itemsize) {
                PyErr_Format(PyExc_BufferError,
                             "__dlpack_c_exchange_api__: stride %lld bytes of dimension %d is not "
                             "a multiple of the itemsize %lld, which DLPack cannot express",
                             (long long)x->strides[d], d, (long long)itemsize);
                free(strides);
                goto done;
            }
            strides[d] = x->strides[d] / itemsize;
        }
        x->dl_strides = strides; /* an Array's geometry never changes */
    }
    ga_stream stream = NULL;
    if (!(x->flags & GA_ARRAY_READONLY) && ga_array_before_host_write(exchange_state, x) < 0)
        goto done;
    if (exchange_order(exchange_state, x, &stream) < 0)
        goto done;
    /* the consumer's kernels on that stream use the memory: a free waits */
    if (x->device.type == GA_DEVICE_CUDA && x->block)
        GA_CHECK(exchange_state, ga_block_record_use_status(x->block, x->device.index, stream));
    fill_dltensor(out, x, x->shape, x->dl_strides);
    rc = 0;
error:
done:
    PyGILState_Release(gil);
    return rc;
}

static int exchange_to_py(DLManagedTensorVersioned *tensor, void **out_py_object)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = -1;
    ArrayObject *arr = NULL;
    if (!exchange_state) {
        PyErr_SetString(PyExc_RuntimeError, "gpuaccel's module is not loaded");
    } else if (!tensor) {
        PyErr_SetString(PyExc_ValueError,
                        "gpuaccel managed_tensor_to_py_object_no_sync: tensor is NULL");
    } else if ((arr = import_managed(exchange_state, tensor, 1,
                                     "managed_tensor_to_py_object_no_sync"))) {
        if (ga_array_track_import(exchange_state, arr) < 0) {
            Py_CLEAR(arr); /* the Array owned the tensor: its deleter ran */
        } else {
            *out_py_object = arr;
            rc = 0;
        }
        tensor = NULL;
    }
    if (rc < 0 && tensor)
        ga_dlpack_release(tensor, 1); /* ownership was handed over, also on failure */
    PyGILState_Release(gil);
    return rc;
}

static int exchange_work_stream(DLDeviceType device_type, int32_t device_id, void **out)
{
    *out = NULL;
    if (device_type == kDLCPU || device_type == kDLCUDAHost)
        return 0;
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = -1;
    ga_stream stream;
    if (device_type != kDLCUDA && device_type != kDLCUDAManaged)
        PyErr_Format(PyExc_ValueError,
                     "gpuaccel current_work_stream: device type %d is not CPU or CUDA",
                     (int)device_type);
    else if (!exchange_state)
        PyErr_SetString(PyExc_RuntimeError, "gpuaccel's module is not loaded");
    else if (ga_ensure_cuda_device(exchange_state, device_id) == 0 &&
             ga_current_stream(exchange_state, device_id, &stream) == 0) {
        *out = (void *)stream; /* 1 and 2 are CUDA's own legacy and per-thread handles */
        rc = 0;
    }
    PyGILState_Release(gil);
    return rc;
}

/* Hands a pending Python exception to the allocator's caller. */
static void report_to(void *error_ctx, void (*set_error)(void *, const char *, const char *))
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *text = value ? PyObject_Str(value) : NULL;
    const char *message = text ? PyUnicode_AsUTF8(text) : NULL;
    PyErr_Clear();
    set_error(error_ctx, type ? ((PyTypeObject *)type)->tp_name : "RuntimeError",
              message ? message : "gpuaccel: allocation failed");
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

static int exchange_allocator(DLTensor *prototype, DLManagedTensorVersioned **out, void *error_ctx,
                              void (*set_error)(void *, const char *, const char *))
{
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = -1;
    ArrayObject *arr = NULL;
    dl_import d;
    if (!exchange_state) {
        PyErr_SetString(PyExc_RuntimeError, "gpuaccel's module is not loaded");
    } else if (!prototype) {
        PyErr_SetString(PyExc_ValueError, "gpuaccel managed_tensor_allocator: prototype is NULL");
    } else {
        /* only dtype, ndim, shape and device count: a prototype of no data */
        DLTensor shape_only = *prototype;
        shape_only.data = NULL;
        shape_only.strides = NULL;
        shape_only.byte_offset = 0;
        int64_t numel = 1;
        for (int k = 0; k < shape_only.ndim && shape_only.shape; k++)
            numel *= shape_only.shape[k];
        if (numel > 0)
            shape_only.data = (void *)1; /* dl_describe wants data for a non-empty tensor */
        if (dl_describe(exchange_state, &shape_only, 0, "managed_tensor_allocator", &d) == 0 &&
            (arr = ga_array_empty(exchange_state, d.dtype, shape_only.ndim, shape_only.shape,
                                  d.device, (d.array_flags & GA_ARRAY_PINNED) != 0, NULL))) {
            rc = exchange_from_py(arr, out);
            Py_DECREF(arr); /* the export holds it */
        }
    }
    if (rc < 0)
        report_to(error_ctx, set_error);
    PyGILState_Release(gil);
    return rc;
}

static const DLPackExchangeAPI exchange_api = {
    {{DLPACK_MAJOR_VERSION, DLPACK_EXCHANGE_API_MINOR_VERSION}, NULL},
    exchange_allocator,
    exchange_from_py,
    exchange_to_py,
    exchange_dltensor,
    exchange_work_stream,
};

int ga_dlpack_publish_exchange_api(ga_state *st)
{
    PyObject *capsule = PyCapsule_New((void *)&exchange_api, DLPACK_EXCHANGE_API_CAPSULE, NULL);
    if (!capsule)
        return -1;
    /* a class attribute of an immutable type: put in its dict while the
     * module is made, before any lookup could have cached its absence */
    int rc = PyDict_SetItem(st->ArrayType->tp_dict, st->str_dlpack_c_exchange_api, capsule);
    Py_DECREF(capsule);
    PyType_Modified(st->ArrayType);
    if (rc == 0)
        exchange_state = st;
    return rc;
}

void ga_dlpack_unpublish_exchange_api(ga_state *st)
{
    if (exchange_state == st)
        exchange_state = NULL;
}

/* -------------------------------------------------- CUDA Array Interface */

static const char *cai_typestr(ga_dtype dtype)
{
    static const char *const typestrs[GA_NUM_DTYPES] = {
        "|b1", "|u1", "|i1", "<i2", "<i4", "<i8", "<f2", NULL, "<f4", "<f8",
    };
    return (unsigned)dtype < GA_NUM_DTYPES ? typestrs[dtype] : NULL;
}

PyObject *ga_array_cuda_array_interface(ArrayObject *self, void *closure)
{
    (void)closure;
    if (self->device.type != GA_DEVICE_CUDA) {
        PyErr_SetString(PyExc_AttributeError,
                        "__cuda_array_interface__ is only defined for CUDA arrays");
        return NULL;
    }
    const char *typestr = cai_typestr(self->dtype);
    if (!typestr) {
        PyErr_SetString(PyExc_AttributeError,
                        "bfloat16 has no __cuda_array_interface__ typestr; exchange it with "
                        "DLPack");
        return NULL;
    }
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    /* `stream` promises the data is ready on our current stream: make that
     * true for work queued on other streams too */
    ga_stream stream;
    if (ga_current_stream(st, self->device.index, &stream) < 0)
        return NULL;
    GA_CHECK(st, ga_block_wait_all(self->block, self->device.index, stream));
    PyObject *shape = NULL, *strides = NULL;
    shape = PyTuple_New(self->ndim);
    if (!shape)
        return NULL;
    for (int d = 0; d < self->ndim; d++)
        PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(self->shape[d]));
    if (ga_array_is_contiguous(self)) {
        strides = Py_NewRef(Py_None);
    } else {
        strides = PyTuple_New(self->ndim);
        if (!strides) {
            Py_DECREF(shape);
            return NULL;
        }
        for (int d = 0; d < self->ndim; d++)
            PyTuple_SET_ITEM(strides, d, PyLong_FromLongLong(self->strides[d]));
    }
    return Py_BuildValue("{s:N,s:s,s:(NO),s:i,s:N,s:n,s:[(ss)]}", "shape", shape, "typestr",
                         typestr, "data", PyLong_FromVoidPtr(self->data),
                         self->flags & GA_ARRAY_READONLY ? Py_True : Py_False, "version", 3,
                         "strides", strides, "stream", ga_stream_protocol_value(stream), "descr",
                         "", typestr);
error:
    return NULL;
}

static int dtype_from_typestr(const char *s, ga_dtype *out)
{
    if (strlen(s) != 3 || !(s[0] == '<' || s[0] == '|' || s[0] == '='))
        return -1;
    static const struct {
        const char *code;
        ga_dtype dtype;
    } table[] = {
        {"b1", GA_BOOL},    {"u1", GA_UINT8},   {"i1", GA_INT8},
        {"i2", GA_INT16},   {"i4", GA_INT32},   {"i8", GA_INT64},
        {"f2", GA_FLOAT16}, {"f4", GA_FLOAT32}, {"f8", GA_FLOAT64},
    };
    for (size_t k = 0; k < sizeof table / sizeof table[0]; k++) {
        if (strcmp(s + 1, table[k].code) == 0) {
            *out = table[k].dtype;
            return 0;
        }
    }
    return -1;
}

static int int64_tuple_from(PyObject *obj, int64_t *out, int *n, const char *what)
{
    if (!PyTuple_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "__cuda_array_interface__: %s must be a tuple, got %.200s",
                     what, ga_type_name(obj));
        return -1;
    }
    Py_ssize_t len = PyTuple_GET_SIZE(obj);
    if (len > GA_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "__cuda_array_interface__: %s has more than %d entries",
                     what, GA_MAX_NDIM);
        return -1;
    }
    for (Py_ssize_t k = 0; k < len; k++) {
        PyObject *item = PyTuple_GET_ITEM(obj, k);
        if (!PyLong_Check(item)) {
            PyErr_Format(PyExc_TypeError, "__cuda_array_interface__: %s must hold ints", what);
            return -1;
        }
        out[k] = PyLong_AsLongLong(item);
        if (out[k] == -1 && PyErr_Occurred())
            return -1;
    }
    *n = (int)len;
    return 0;
}

ArrayObject *ga_from_cuda_array_interface(ga_state *st, PyObject *obj, PyObject *cai)
{
    if (!PyDict_Check(cai)) {
        PyErr_Format(PyExc_TypeError, "__cuda_array_interface__ must be a dict, got %.200s",
                     ga_type_name(cai));
        return NULL;
    }
    PyObject *shape_obj = PyDict_GetItemString(cai, "shape");
    PyObject *typestr_obj = PyDict_GetItemString(cai, "typestr");
    PyObject *data_obj = PyDict_GetItemString(cai, "data");
    PyObject *strides_obj = PyDict_GetItemString(cai, "strides");
    PyObject *mask = PyDict_GetItemString(cai, "mask");
    PyObject *stream_obj = PyDict_GetItemString(cai, "stream");
    if (!shape_obj || !typestr_obj || !data_obj) {
        PyErr_SetString(PyExc_ValueError,
                        "__cuda_array_interface__ needs 'shape', 'typestr' and 'data'");
        return NULL;
    }
    if (mask && mask != Py_None) {
        PyErr_SetString(PyExc_ValueError, "__cuda_array_interface__: masked arrays are not "
                                          "supported");
        return NULL;
    }
    int64_t shape[GA_MAX_NDIM], strides[GA_MAX_NDIM];
    int ndim, nstrides = 0;
    if (int64_tuple_from(shape_obj, shape, &ndim, "shape") < 0)
        return NULL;
    if (strides_obj && strides_obj != Py_None) {
        if (int64_tuple_from(strides_obj, strides, &nstrides, "strides") < 0)
            return NULL;
        if (nstrides != ndim) {
            PyErr_Format(PyExc_ValueError, "__cuda_array_interface__: %d strides for %d dimensions",
                         nstrides, ndim);
            return NULL;
        }
    }
    ga_dtype dtype;
    const char *typestr = ga_exact_utf8(typestr_obj);
    if (!typestr || dtype_from_typestr(typestr, &dtype) < 0) {
        PyErr_Format(PyExc_TypeError,
                     "__cuda_array_interface__: typestr %R is not supported (use |b1, |u1, |i1, "
                     "<i2, <i4, <i8, <f2, <f4 or <f8)",
                     typestr_obj);
        return NULL;
    }
    PyObject *ptr_obj, *ro_obj;
    if (!PyTuple_Check(data_obj) || !PyArg_ParseTuple(data_obj, "OO", &ptr_obj, &ro_obj) ||
        !PyLong_Check(ptr_obj)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError,
                        "__cuda_array_interface__: data must be a (pointer, read_only) tuple");
        return NULL;
    }
    void *ptr = PyLong_AsVoidPtr(ptr_obj);
    if (!ptr && PyErr_Occurred())
        return NULL;
    int readonly = PyObject_IsTrue(ro_obj);
    if (readonly < 0)
        return NULL;
    int64_t numel;
    if (ga_check_shape(dtype, ndim, shape, &numel) < 0)
        return NULL;
    if (!ptr && numel > 0) {
        PyErr_SetString(PyExc_ValueError, "__cuda_array_interface__: NULL data pointer");
        return NULL;
    }
    int device = 0;
    if (ptr) {
        int kind;
        int current = 0;
        if (ga_cuda_get_device(&current).error)
            current = 0;
        if (ga_ensure_cuda_device(st, current) < 0)
            return NULL;
        ga_status status = ga_cuda_pointer_info(ptr, &kind, &device);
        if (status.error)
            return ga_raise(st, status), NULL;
        if (kind != 2 && kind != 3) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__: data does not point to CUDA device memory");
            return NULL;
        }
    } else if (ga_cuda_get_device(&device).error) {
        device = 0;
    }
    if (ga_ensure_cuda_device(st, device) < 0)
        return NULL;
    if (stream_obj && stream_obj != Py_None) {
        if (!PyLong_Check(stream_obj)) {
            PyErr_SetString(PyExc_TypeError, "__cuda_array_interface__: stream must be an int");
            return NULL;
        }
        long long s = PyLong_AsLongLong(stream_obj);
        if (s == -1 && PyErr_Occurred())
            return NULL;
        if (s == 0) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__: stream 0 is disallowed by version 3");
            return NULL;
        }
        ga_stream ours;
        if (ga_current_stream(st, device, &ours) < 0)
            return NULL;
        GA_CHECK(st, ga_cuda_stream_wait_stream(device, ours, device, (ga_stream)(uintptr_t)s));
    }
    ga_device where = {GA_DEVICE_CUDA, device};
    ArrayObject *a = ga_array_wrap(st, ptr, dtype, ndim, shape, nstrides ? strides : NULL, where,
                                   readonly ? GA_ARRAY_READONLY : 0, obj);
    if (a && ga_array_track_import(st, a) < 0)
        Py_CLEAR(a);
    return a;
error:
    return NULL;
}
