/*
 * workspace.h — device scratch memory for the libraries' calls (workspace.c).
 */
#ifndef GPUACCEL_WORKSPACE_H
#define GPUACCEL_WORKSPACE_H

#include "alloc.h"

/* ---- workspaces */
/* The scratch memory of one library call (cuBLASLt, cuDNN) on `stream`. */
typedef struct {
    void *ptr; /* NULL when size is 0 */
    size_t size;
    int device;
    ga_stream stream;
    ga_block *graph_block; /* inside a capture: the graph's own, freed by ga_workspace_put */
} ga_workspace;

/* At least `size` bytes for a library call about to be queued on `stream`
 * of `device`: the device's workspace, ordered after its last use on any
 * stream; or, while `stream` is captured into a CUDA graph, memory the
 * graph allocates and frees around the call (so that no replay shares it
 * with eager calls or other graphs).  -1 with an exception
 * (OutOfMemoryError when short of memory); ws->ptr is then NULL. */
int ga_workspace_get(ga_state *st, int device, ga_stream stream, size_t size, ga_workspace *ws);

/* After the call was queued (or failed to be): -1 with an exception when
 * the graph's workspace could not be freed. */
int ga_workspace_put(ga_state *st, ga_workspace *ws);

#endif
