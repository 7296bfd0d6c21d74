/*
 * workspace.h — device scratch memory for the libraries' calls (workspace.c).
 */
#ifndef GPUACCEL_WORKSPACE_H
#define GPUACCEL_WORKSPACE_H

#include "alloc.h"

/* ---- workspaces */
/* Device scratch memory of at least `size` bytes for work queued on
 * `stream`: one block per (device, stream), reused in that stream's order.
 * NULL with an exception (OutOfMemoryError when short of memory). */
void *ga_workspace(ga_state *st, int device, ga_stream stream, size_t size);

#endif
