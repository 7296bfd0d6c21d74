/*
 * array.h — the gpuaccel.Array object's core (csrc/array.c): its struct,
 * constructors, views, geometry and stream bookkeeping.  What moves values
 * is in transfer.h, the Python type's methods in array_type.c.
 */
#ifndef GPUACCEL_ARRAY_H
#define GPUACCEL_ARRAY_H

#include "alloc.h"
#include "stream.h"
#include "dtype.h"
#include "args.h"
#include "errors.h"

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
    ga_block *block; /* the allocation behind the memory (borrowed in views) */
    int owns_block;  /* 1 in the root array, which frees it */
    void *dlpack;    /* a consumed DLPack tensor whose deleter this root calls */
    int dlpack_versioned;
    PyObject *base;
    PyObject *weakreflist;
    int64_t *dl_strides; /* element strides for DLTensor views (the exchange API), made on demand */
} ArrayObject;

static inline int ga_is_array(ga_state *st, PyObject *obj)
{
    return PyObject_TypeCheck(obj, st->ArrayType);
}

/* A new C-contiguous array with memory from the allocator of its kind;
 * device memory is allocated on *stream (NULL: the current stream). */
ArrayObject *ga_array_empty(ga_state *st, ga_dtype dtype, int ndim, const int64_t *shape,
                            ga_device device, int pinned, const ga_stream *stream);
/* An array over memory someone else owns (`owner` is kept alive). */
ArrayObject *ga_array_wrap(ga_state *st, void *data, ga_dtype dtype, int ndim, const int64_t *shape,
                           const int64_t *strides, ga_device device, int flags, PyObject *owner);
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
/* C-contiguous byte strides for `shape` (size-0 dims count as 1). */
void ga_contiguous_strides(int ndim, const int64_t *shape, int64_t itemsize, int64_t *strides);
ga_tensor ga_array_tensor(const ArrayObject *a);
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

#endif
