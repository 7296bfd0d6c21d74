/*
 * device.h — devices (gpuaccel.Device), CUDA availability, and the
 * module's device-level functions (device.c).
 */
#ifndef GPUACCEL_DEVICE_H
#define GPUACCEL_DEVICE_H

#include "args.h"
#include "errors.h"

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

extern PyType_Spec ga_device_spec;

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

/* The CUDA device a `device=None` argument of a Stream, an Event or a
 * module function means (the default device when it is a CUDA one, else
 * the calling thread's current CUDA device), checked usable; `what`
 * names the caller in the error a CPU device gets. */
int ga_default_cuda_device(ga_state *st, PyObject *device_obj, int *index, const char *what);

/* Module-level functions (method table in module.c). */
PyObject *ga_py_cuda_available(PyObject *module, PyObject *unused);
PyObject *ga_py_built_with_cuda(PyObject *module, PyObject *unused);
PyObject *ga_py_device_count(PyObject *module, PyObject *unused);
PyObject *ga_py_default_device(PyObject *module, PyObject *unused);
PyObject *ga_py_set_default_device(PyObject *module, PyObject *device);
PyObject *ga_py_synchronize(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *ga_py_device_properties(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *ga_py_build_info(PyObject *module, PyObject *unused);

/* Called from the module's exec slot. */
int ga_device_module_init(PyObject *module, ga_state *st);

#endif
