/*
 * alloc.h — one allocator per memory kind.
 *
 *   host   (pageable): posix_memalign, counted against the CPU limit; blocks
 *          of 64 KiB and more are cached in size classes when freed (a
 *          bounded cache: they keep their pages, so reusing them costs no
 *          page faults);
 *   pinned (page-locked host): a caching pool of cudaHostAlloc blocks in size
 *          classes; a freed block is handed out again only after the events
 *          of the copies that used it have completed;
 *   device: gpuaccel's stream-ordered pool on each GPU (cudaMallocAsync);
 *          freeing is queued on the allocation stream after it has waited
 *          for every other stream the block was used on.
 */
#ifndef GPUACCEL_ALLOC_H
#define GPUACCEL_ALLOC_H

#include "args.h"
#include "errors.h"

typedef enum { GA_MEM_HOST = 0, GA_MEM_PINNED = 1, GA_MEM_DEVICE = 2 } ga_mem_kind;

#define GA_BLOCK_MAX_USES 4

typedef struct {
    ga_mem_kind kind;
    int device; /* CUDA ordinal for DEVICE blocks */
    void *ptr;
    size_t size;      /* bytes asked for */
    size_t capacity;  /* bytes reserved (the pinned size class) */
    ga_stream stream; /* DEVICE: the allocation stream */
    /* DEVICE on the per-thread default stream: the allocating thread (each
     * thread's handle 2 names a different stream) */
    uint64_t owner;
    /* other streams the block was used on, each with an event recorded
     * after that use (see ga_block_record_use); a stream is named by its
     * device, its handle and, for handle 2, its thread */
    int n_uses;
    ga_stream use_streams[GA_BLOCK_MAX_USES];
    ga_event use_events[GA_BLOCK_MAX_USES];
    int use_devices[GA_BLOCK_MAX_USES];
    uint64_t use_threads[GA_BLOCK_MAX_USES];
    /* DEVICE: recorded where the contents became valid, when the producer
     * knows that point better than "the allocation stream's tail" (the
     * loader's copy stream holds later batches too); NULL otherwise */
    ga_event ready;
    /* DEVICE memory another library owns (see ga_block_borrow) */
    int borrowed;
    /* DEVICE: allocated while its stream was captured into a CUDA graph:
     * the graph's allocation node, owned by the graph (see ga_block_free) */
    int graph;
} ga_block;

/* The stream bookkeeping of gpuaccel's device blocks for memory another
 * library owns (a DLPack or __cuda_array_interface__ import): `stream` is
 * where the import made the contents valid (the consumer stream the
 * producer ordered its work for), so a first use on another stream waits
 * for it and uses are recorded as for gpuaccel's own blocks; freeing frees
 * nothing and makes that stream wait for the uses before the producer's
 * memory is let go. */
ga_status ga_block_borrow(int device, void *ptr, size_t size, ga_stream stream, ga_block **out);

/* The same without Python (for threads that do not hold the GIL): returns
 * the status instead of raising. */
ga_status ga_block_alloc_status(ga_mem_kind kind, int device, size_t size, ga_stream stream,
                                ga_block **out);

/* Records, on `stream`, the point where the block's contents became valid
 * (see ga_block.ready).  No GIL needed. */
ga_status ga_block_set_ready(ga_block *block, ga_stream stream);

/* Allocates `size` bytes (NULL ptr for 0 bytes).  Raises OutOfMemoryError
 * naming the request, what is in use and the limit; returns NULL then. */
ga_block *ga_block_alloc(ga_state *st, ga_mem_kind kind, int device, size_t size, ga_stream stream);

/* Before queuing work that uses the block on `stream`: the first time a
 * stream other than the allocation stream uses it, that stream waits (on
 * the GPU) for the allocation stream, where the memory became valid.
 * Nothing while `stream` is captured into a CUDA graph: a captured wait on
 * an event recorded outside the capture is an error that invalidates it,
 * and the graph runs later anyway (its inputs must be ready and alive at
 * each replay, as in torch). */
int ga_block_prepare_use(ga_state *st, ga_block *block, int device, ga_stream stream);

/* Records that work just queued on `stream` (of CUDA device `device`) uses
 * the block, so that freeing or reusing it waits for that work.  Returns -1
 * with an exception set on a CUDA error.  Nothing while `stream` is
 * captured: an event recorded in a capture cannot be waited on or queried
 * outside it; a graph's replays read and write the memory later, when the
 * caller must keep it alive. */
int ga_block_record_use(ga_state *st, ga_block *block, int device, ga_stream stream);

/* Makes `stream` (of CUDA device `device`) wait, on the GPU, for all work
 * known to use the block: its allocation stream and every recorded use.
 * Used when memory is handed to a consumer that will read it on `stream`.
 * Nothing while `stream` is captured (see ga_block_prepare_use). */
ga_status ga_block_wait_all(ga_block *block, int device, ga_stream stream);

/* Before the host writes a pinned block (or hands it to a host consumer
 * that may): waits for the GPU copies that still read it, as a
 * synchronous copy would have.  A user's pinned block is busy only after
 * an async host-to-device copy from it (copies into one are waited for at
 * once), so nothing on the training path waits here.  No GIL needed (call
 * it without). */
ga_status ga_block_host_wait(ga_block *block);

/* Records a use like ga_block_record_use, reporting instead of raising
 * (for deleters, which run without a way to raise). */
ga_status ga_block_record_use_status(ga_block *block, int device, ga_stream stream);

/* A token for the calling thread: never 0, never reused (unlike a
 * pthread_t).  Handle 2, the per-thread default stream, names a different
 * stream in each thread: what is keyed by a stream is keyed by this too. */
uint64_t ga_thread_token(void);

/* Releases the block; never raises (a CUDA error is reported as
 * unraisable).  Needs the GIL.  A device block whose allocation stream is
 * being captured: a block the capture allocated is freed by a free node of
 * the graph; any other is freed once the capture is over (a free node may
 * only free a graph's allocation). */
void ga_block_free(ga_block *block);

/* The same without Python (for threads that do not hold the GIL): returns
 * the status of a failed CUDA call instead of reporting it. */
ga_status ga_block_free_status(ga_block *block);

/* Frees the device blocks freed while their stream was captured whose
 * capture is over (ga_block_free does at each free); the first error. */
ga_status ga_block_free_deferred(void);

/* Device memory kept as library workspaces (workspace.c), reported by
 * memory_stats(): `delta` bytes more (or fewer) on `device`. */
void ga_alloc_count_workspace(int device, int64_t delta);

/* Module-level functions. */
PyObject *ga_py_memory_stats(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *ga_py_empty_cache(PyObject *module, PyObject *unused);
PyObject *ga_py_set_memory_limit(PyObject *module, PyObject *args, PyObject *kwargs);

#endif
