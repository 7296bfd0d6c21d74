/*
 * workspace.c — device scratch memory for the libraries' calls (cuBLASLt,
 * cuDNN).
 *
 * Eagerly, one workspace per device serves every stream, grown to the
 * largest request.  An event recorded after each call that used it orders
 * the next call, when that one is queued on another stream (a GPU-side
 * wait), and the free of an outgrown one.  The event is recorded at once,
 * not when another stream comes: by then the last stream may be captured
 * into a CUDA graph, where no event recorded can order eager work.
 *
 * Inside a capture the call gets memory of its own, allocated and freed on
 * the capturing stream: the graph's allocation and free nodes, owned by the
 * graph.  The device's workspace is never captured, so growing it later,
 * or eager calls on any stream, cannot touch what a replay uses, and graphs
 * replayed at once on different streams do not share scratch memory (the
 * driver maps each graph's own).  The size is the eager one, so that the
 * plans made eagerly (keyed by it) serve the capture.
 */
#include "workspace.h"

#include <string.h>

typedef struct {
    ga_block *block;
    ga_event last_use; /* recorded after the last call that used it */
    int recorded;
    /* that call's stream, named from its thread (handle 2, the per-thread
     * default stream, is another stream in each thread) */
    ga_stream last_stream;
    uint64_t last_thread;
} device_workspace;

static device_workspace workspaces[GA_MAX_DEVICES];

static int same_stream(ga_stream a, ga_stream b)
{
    uintptr_t x = (uintptr_t)a ? (uintptr_t)a : 1, y = (uintptr_t)b ? (uintptr_t)b : 1;
    return x == y;
}

static int used_last_by(const device_workspace *w, ga_stream stream)
{
    return same_stream(w->last_stream, stream) &&
           (stream != GA_STREAM_PER_THREAD || w->last_thread == ga_thread_token());
}

/* Inside a capture: the graph's own memory. */
static int graph_workspace(ga_state *st, int device, ga_stream stream, size_t size,
                           ga_workspace *ws)
{
    ws->graph_block = ga_block_alloc(st, GA_MEM_DEVICE, device, size, stream);
    if (!ws->graph_block)
        return -1;
    ws->ptr = ws->graph_block->ptr;
    return 0;
}

/* The device's workspace grown to `size`, allocated on `stream`; the old
 * one is freed once `stream` has passed the last call that used it. */
static int grow(ga_state *st, device_workspace *w, int device, ga_stream stream, size_t size)
{
    if (w->block) {
        if (w->recorded && !used_last_by(w, stream))
            GA_CHECK(st, ga_cuda_stream_wait_event(device, stream, w->last_use));
        if (ga_block_record_use(st, w->block, device, stream) < 0)
            return -1;
        ga_alloc_count_workspace(device, -(int64_t)w->block->size);
        ga_block_free(w->block);
        w->block = NULL;
        w->recorded = 0;
    }
    w->block = ga_block_alloc(st, GA_MEM_DEVICE, device, size, stream);
    if (!w->block)
        return -1;
    ga_alloc_count_workspace(device, (int64_t)size);
    w->last_stream = stream;
    w->last_thread = ga_thread_token();
    return 0;
error:
    return -1;
}

int ga_workspace_get(ga_state *st, int device, ga_stream stream, size_t size, ga_workspace *ws)
{
    memset(ws, 0, sizeof *ws);
    ws->device = device;
    ws->stream = stream;
    ws->size = size;
    if (size == 0)
        return 0;
    if (device < 0 || device >= GA_MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "CUDA device ordinal %d out of range", device);
        return -1;
    }
    int capturing = 0;
    GA_CHECK(st, ga_cuda_stream_capturing(stream, &capturing));
    if (capturing)
        return graph_workspace(st, device, stream, size, ws);
    device_workspace *w = &workspaces[device];
    if (!w->last_use)
        GA_CHECK(st, ga_cuda_event_create(device, 0, &w->last_use));
    if (!w->block || w->block->size < size) {
        if (grow(st, w, device, stream, size) < 0)
            return -1;
    } else if (w->recorded && !used_last_by(w, stream)) {
        /* the last call, on another stream, may still be using it (the
         * first call on a stream also follows the allocation this way) */
        GA_CHECK(st, ga_cuda_stream_wait_event(device, stream, w->last_use));
    }
    ws->ptr = w->block->ptr;
    return 0;
error:
    return -1;
}

int ga_workspace_put(ga_state *st, ga_workspace *ws)
{
    if (ws->graph_block) {
        /* a free node: each replay allocates and frees it around the call */
        ga_status status = ga_block_free_status(ws->graph_block);
        ws->graph_block = NULL;
        ws->ptr = NULL;
        return status.error ? ga_raise(st, status) : 0;
    }
    if (!ws->ptr)
        return 0;
    ws->ptr = NULL;
    device_workspace *w = &workspaces[ws->device];
    w->last_stream = ws->stream;
    w->last_thread = ga_thread_token();
    w->recorded = 0;
    GA_CHECK(st, ga_cuda_event_record(ws->device, w->last_use, ws->stream));
    w->recorded = 1;
    return 0;
error:
    return -1;
}
