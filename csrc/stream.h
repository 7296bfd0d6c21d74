/*
 * stream.h — gpuaccel.Stream, the current stream and `stream=` arguments
 * (stream.c).
 */
#ifndef GPUACCEL_STREAM_H
#define GPUACCEL_STREAM_H

#include "device.h"

typedef struct {
    PyObject_HEAD
    ga_stream handle; /* as given; 0 and 1 both mean the legacy default stream */
    int device;
    int owned;        /* ours: back to the stream pool with the object */
    int priority;     /* as asked for, when owned */
    PyObject *tokens; /* contextvar tokens of nested `with` blocks */
} StreamObject;

extern PyType_Spec ga_stream_spec;

/* The stream gpuaccel work on `device` is queued on: the Stream made
 * current with `with`, when it belongs to that device, else the legacy
 * default stream. */
int ga_current_stream(ga_state *st, int device, ga_stream *out);
/* The same, telling whether a Stream is made current for `device`: 1 when
 * one is (*out its handle), 0 when none is (*out the legacy default
 * stream), -1 on error. */
int ga_stream_made_current(ga_state *st, int device, ga_stream *out);

/* Parses a `stream=` argument: None (current stream of `device`), a Stream,
 * an object with `cuda_stream` (torch.cuda.Stream) or an int handle. */
int ga_stream_from_object(ga_state *st, PyObject *obj, int device, ga_stream *out,
                          const char *argname);

/* Stream handle as an int for DLPack / __cuda_array_interface__: the legacy
 * default stream is 1, never 0. */
static inline Py_ssize_t ga_stream_protocol_value(ga_stream s)
{
    return (uintptr_t)s == 0 ? 1 : (Py_ssize_t)(uintptr_t)s;
}

/* current_stream(device=None) */
PyObject *ga_py_current_stream(PyObject *module, PyObject *args, PyObject *kwargs);

#endif
