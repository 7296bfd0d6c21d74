/*
 * workspace.c — device scratch memory for the libraries' calls (cuBLASLt,
 * cuDNN), reused in stream order.
 */
#include "workspace.h"

#include <stdio.h>
#include <string.h>

#define GA_MAX_WORKSPACES 32

/* One workspace per (device, stream), grown to the largest request: work
 * queued on a stream runs in order, so consecutive ops can share it. */
typedef struct {
    int device;
    ga_stream stream;
    uint64_t thread; /* for the per-thread default stream: one per thread */
    ga_block *block;
} workspace_entry;

static workspace_entry workspaces[GA_MAX_WORKSPACES];
static int nworkspaces;

void *ga_workspace(ga_state *st, int device, ga_stream stream, size_t size)
{
    /* a workspace is reused in its stream's order only; handle 2 is a
     * different stream in each thread */
    int per_thread = stream == GA_STREAM_PER_THREAD;
    uint64_t self = ga_thread_token();
    workspace_entry *w = NULL;
    for (int k = 0; k < nworkspaces && !w; k++)
        if (workspaces[k].device == device && workspaces[k].stream == stream &&
            (!per_thread || workspaces[k].thread == self))
            w = &workspaces[k];
    if (!w) {
        if (nworkspaces == GA_MAX_WORKSPACES) {
            /* many streams: recycle the oldest entry (freed in its stream's order) */
            ga_block_free(workspaces[0].block);
            memmove(&workspaces[0], &workspaces[1], (GA_MAX_WORKSPACES - 1) * sizeof *workspaces);
            nworkspaces--;
        }
        w = &workspaces[nworkspaces++];
        w->device = device;
        w->stream = stream;
        w->thread = self;
        w->block = NULL;
    }
    if (!w->block || w->block->size < size) {
        /* the allocation would be a node of the graph being captured,
         * owned by it: not a workspace that later eager calls can use */
        int capturing = 0;
        ga_status cs = ga_cuda_stream_capturing(stream, &capturing);
        if (cs.error || capturing) {
            if (!w->block)
                *w = workspaces[--nworkspaces];
            if (cs.error)
                return ga_raise(st, cs), NULL;
            /* ga_raise copies the message into the exception at once */
            char message[320], need[32];
            snprintf(message, sizeof message,
                     "the first cuBLASLt/cuDNN call on this stream needs a %s workspace, which "
                     "cannot be allocated inside a CUDA graph capture; run one step eagerly on the "
                     "stream that will be captured (a warm-up) before capturing",
                     ga_format_bytes(size, need, sizeof need));
            cs = ga_status_make(GA_ERR_CUDA, 900 /* cudaErrorStreamCaptureUnsupported */,
                                "cudaErrorStreamCaptureUnsupported", message,
                                "workspace allocation", __FILE__, __LINE__);
            return ga_raise(st, cs), NULL;
        }
        if (w->block)
            ga_block_free(w->block);
        w->block = ga_block_alloc(st, GA_MEM_DEVICE, device, size, stream);
        if (!w->block) {
            *w = workspaces[--nworkspaces];
            return NULL;
        }
    }
    return w->block->ptr;
}
