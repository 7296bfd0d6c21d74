/*
 * array.h — gpuaccel.Array and the functions that make, view and move them.
 */
#ifndef GPUACCEL_ARRAY_H
#define GPUACCEL_ARRAY_H

#include "alloc.h"
#include "device.h"
#include "module.h"

enum {
    GA_ARRAY_PINNED = 1 << 0,   /* host memory that is page-locked */
    GA_ARRAY_READONLY = 1 << 1, /* writing through this array is refused */
};

typedef struct {
    PyObject_HEAD
    char *data; /* element [0, ..., 0] */
    ga_dtype dtype;
    int ndim;
    int flags;
    ga_device device;
    int64_t shape[GA_MAX_NDIM];
    int64_t strides[GA_MAX_NDIM]; /* bytes */
    /* Who keeps the memory alive: exactly one of
     *   block with owns_block: memory this array allocated (it is the root);
     *   dlpack: a consumed DLPack tensor (this array is the root);
     *   base:  the root Array of a view, or a foreign owner (a NumPy array,
     *          an object exposing __cuda_array_interface__).
     * An imported CUDA root also owns a borrowed block (ga_block_borrow):
     * stream bookkeeping only, released before the producer's memory.
     * Views carry the root's block, borrowed, so that work on other streams
     * can be recorded on it. */
    ga_block *block;  /* the allocation behind the memory (borrowed in views) */
    int owns_block;   /* 1 in the root array, which frees it */
    void *dlpack;     /* a consumed DLPack tensor whose deleter this root calls */
    int dlpack_versioned;
    PyObject *base;
    PyObject *weakreflist;
} ArrayObject;

extern PyType_Spec ga_array_spec;
extern PyType_Spec ga_loader_iter_spec;
extern PyType_Spec ga_logger_spec;

static inline int ga_is_array(ga_state *st, PyObject *obj)
{
    return PyObject_TypeCheck(obj, st->ArrayType);
}

/* ---- dtype.c */
/* 1 when NumPy can hold bfloat16 here (ml_dtypes is installed). */
int ga_numpy_has_bfloat16(ga_state *st);
const char *ga_dtype_name(ga_dtype dtype);
/* str, NumPy dtype or type, torch.dtype, ml_dtypes.bfloat16 */
int ga_dtype_from_object(ga_state *st, PyObject *obj, ga_dtype *out, const char *argname);
/* NumPy dtype for a gpuaccel dtype (bfloat16 needs ml_dtypes); new ref. */
PyObject *ga_dtype_to_numpy(ga_state *st, ga_dtype dtype);
/* -1 (no exception) when the NumPy dtype has no gpuaccel equivalent. */
int ga_dtype_from_numpy_descr(ga_state *st, PyObject *descr, ga_dtype *out);
/* PEP 3118 format string; NULL for bfloat16. */
const char *ga_dtype_buffer_format(ga_dtype dtype);

/* ---- array.c */
/* A new C-contiguous array with memory from the allocator of its kind;
 * device memory is allocated on *stream (NULL: the current stream). */
ArrayObject *ga_array_empty(ga_state *st, ga_dtype dtype, int ndim, const int64_t *shape,
                            ga_device device, int pinned, const ga_stream *stream);
/* An array over memory someone else owns (`owner` is kept alive). */
ArrayObject *ga_array_wrap(ga_state *st, void *data, ga_dtype dtype, int ndim,
                           const int64_t *shape, const int64_t *strides, ga_device device,
                           int flags, PyObject *owner);
/* A C-contiguous root array over a block from ga_block_alloc_status (it
 * takes the block over: it frees it on dealloc; on failure too). */
ArrayObject *ga_array_from_block(ga_state *st, ga_block *block, ga_dtype dtype, int ndim,
                                 const int64_t *shape, ga_device device, int flags);
/* An array over the memory of a consumed DLPack tensor, whose deleter it
 * calls when the last view of it goes. */
ArrayObject *ga_array_from_dlpack_tensor(ga_state *st, void *managed, int versioned, void *data,
                                         ga_dtype dtype, int ndim, const int64_t *shape,
                                         const int64_t *strides, ga_device device, int flags);
/* A view of `src`'s memory with another geometry. */
ArrayObject *ga_array_view(ga_state *st, ArrayObject *src, char *data, int ndim,
                           const int64_t *shape, const int64_t *strides);
int64_t ga_array_size(const ArrayObject *a);
int ga_array_is_contiguous(const ArrayObject *a);
ga_tensor ga_array_tensor(const ArrayObject *a);
/* The allocation behind a, if gpuaccel made it. */
ga_block *ga_array_block(const ArrayObject *a);
/* Around work queued on `stream` that uses a's memory: before it (see
 * ga_block_prepare_use) and after it (see ga_block_record_use). */
int ga_array_prepare_stream(ga_state *st, ArrayObject *a, ga_stream stream);
int ga_array_record_stream(ga_state *st, ArrayObject *a, ga_stream stream);
/* Gives an imported CUDA root array (DLPack, __cuda_array_interface__) the
 * stream bookkeeping of gpuaccel's own memory, its contents valid on the
 * current stream (where the import ordered the producer's work).  -1 with
 * an exception. */
int ga_array_track_import(ga_state *st, ArrayObject *a);
/* Before the host writes a host array (or exports it writable): waits for
 * async copies still reading it when it is pinned.  -1 with an exception. */
int ga_array_before_host_write(ga_state *st, ArrayObject *a);
/* 1 when the two arrays' memory ranges intersect (same device). */
int ga_arrays_may_overlap(const ArrayObject *a, const ArrayObject *b);
/* Checks shape entries and that the byte size fits; fills *numel. */
int ga_check_shape(ga_dtype dtype, int ndim, const int64_t *shape, int64_t *numel);
/* Parses an int or a sequence of ints as a shape (names `argname`). */
int ga_shape_from_object(PyObject *obj, int64_t *shape, int *ndim, const char *argname);
/* Zero-copy NumPy view of a host array. */
PyObject *ga_array_numpy_view(ga_state *st, ArrayObject *a);

/* ---- transfer.c */
/* dst[...] = src[...] converted to dst's dtype; shapes equal (src may be
 * broadcast with zero strides); any pair of devices.  Copies that involve a
 * GPU are queued on `stream_obj` (NULL/None: the current stream of the
 * GPU's device), and the host never waits except when the destination is
 * host memory. */
int ga_copy_into(ga_state *st, ArrayObject *dst, ArrayObject *src, PyObject *stream_obj);
/* A new array on `device` (C-contiguous, dtype `dtype`) holding src's values. */
ArrayObject *ga_array_copy_to(ga_state *st, ArrayObject *src, ga_device device, ga_dtype dtype,
                              int pinned, PyObject *stream_obj);
/* Fill every element with a Python scalar. */
int ga_array_fill(ga_state *st, ArrayObject *dst, PyObject *value);
/* A Python number as a ga_scalar; -1 with TypeError (naming argname) else. */
int ga_scalar_from_object(PyObject *obj, ga_scalar *out, const char *argname);

/* ---- create.c */
/* asarray(obj, dtype, device, copy, stream) with parsed arguments; dtype
 * and device may be NULL for "keep". copy: -1 None, 0 False, 1 True. */
ArrayObject *ga_asarray(ga_state *st, PyObject *obj, const ga_dtype *dtype,
                        const ga_device *device, int copy, PyObject *stream_obj);
/* The conversion half of ga_asarray: arr (a new reference, consumed) as
 * the dtype/device asked for; `fresh` when arr is already a private copy. */
ArrayObject *ga_array_convert(ga_state *st, ArrayObject *arr, int fresh, const ga_dtype *dtype,
                              const ga_device *device, int copy, PyObject *stream_obj);
PyObject *ga_py_empty(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *ga_py_zeros(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *ga_py_ones(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *ga_py_full(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *ga_py_asarray(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames);
/* Parses copy=None/True/False into -1/1/0. */
int ga_copy_flag_from_object(PyObject *obj, int *out);

/* ---- torch tensors without DLPack (create.c) */
/* 1 when obj is a torch.Tensor (0 while torch has not been imported). */
int ga_is_torch_tensor(ga_state *st, PyObject *obj);
/* A zero-copy Array over a CPU or CUDA torch tensor (it keeps the tensor
 * alive).  torch's __dlpack__ costs microseconds of Python per call; this
 * reads the pointer, sizes, strides, dtype and device directly. */
ArrayObject *ga_from_torch(ga_state *st, PyObject *tensor);

/* ---- dlpack.c */
/* Calls the deleter of a consumed DLPack tensor. */
void ga_dlpack_release(void *managed, int versioned);
PyObject *ga_array_dlpack(ArrayObject *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames);
PyObject *ga_array_dlpack_device(ArrayObject *self, PyObject *unused);
PyObject *ga_array_cuda_array_interface(ArrayObject *self, void *closure);
/* The memory of an object with __dlpack__, or of a DLPack capsule, as an
 * Array (no conversion: ga_asarray does those); NULL + exception. */
ArrayObject *ga_from_dlpack_object(ga_state *st, PyObject *obj);
/* from an object with __cuda_array_interface__ */
ArrayObject *ga_from_cuda_array_interface(ga_state *st, PyObject *obj, PyObject *cai);
PyObject *ga_py_from_dlpack(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames);

#endif
