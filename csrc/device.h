/*
 * device.h — devices, streams, events and the current stream.
 */
#ifndef GPUACCEL_DEVICE_H
#define GPUACCEL_DEVICE_H

#include "module.h"

/* The device types use DLPack's codes so they convert without a table. */
typedef enum { GA_DEVICE_CPU = 1, GA_DEVICE_CUDA = 2 } ga_device_type;

typedef struct {
    ga_device_type type;
    int index; /* CUDA ordinal; 0 for the CPU */
} ga_device;

static inline int ga_device_equal(ga_device a, ga_device b)
{
    return a.type == b.type && (a.type == GA_DEVICE_CPU || a.index == b.index);
}

typedef struct {
    PyObject_HEAD
    ga_device device;
} DeviceObject;

typedef struct {
    PyObject_HEAD
    ga_stream handle; /* as given; 0 and 1 both mean the legacy default stream */
    int device;
    int owned;        /* ours: back to the stream pool with the object */
    int priority;     /* as asked for, when owned */
    PyObject *tokens; /* contextvar tokens of nested `with` blocks */
} StreamObject;

typedef struct {
    PyObject_HEAD
    ga_event handle; /* created at the first record() */
    int device;
    int timing;
    int recorded;
} EventObject;

extern PyType_Spec ga_device_spec, ga_stream_spec, ga_event_spec;

/* Parses what users pass as a device: None (default device), a Device,
 * "cpu", "cuda", "cuda:N", an int N (cuda:N), or a torch.device.  On error
 * raises a TypeError/ValueError naming `argname`. */
int ga_device_from_object(ga_state *st, PyObject *obj, ga_device *out, const char *argname);
PyObject *ga_device_new(ga_state *st, ga_device device);
/* "cpu" or "cuda:N" */
const char *ga_device_str(ga_device device, char *buf, size_t size);

/* Raises unless `index` names a usable CUDA device: says whether the build
 * lacks CUDA, the machine lacks a driver or device, the ordinal is out of
 * range, or this is a forked child of a process that had used CUDA. */
int ga_ensure_cuda_device(ga_state *st, int index);
/* 1 if CUDA is usable here (no exception either way). */
int ga_cuda_usable(void);

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

/* Module-level functions (method table in module.c). */
PyObject *ga_py_cuda_available(PyObject *module, PyObject *unused);
PyObject *ga_py_built_with_cuda(PyObject *module, PyObject *unused);
PyObject *ga_py_device_count(PyObject *module, PyObject *unused);
PyObject *ga_py_default_device(PyObject *module, PyObject *unused);
PyObject *ga_py_set_default_device(PyObject *module, PyObject *device);
PyObject *ga_py_current_stream(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *ga_py_synchronize(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *ga_py_device_properties(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *ga_py_build_info(PyObject *module, PyObject *unused);

/* Called from the module's exec slot. */
int ga_device_module_init(PyObject *module, ga_state *st);

#endif
