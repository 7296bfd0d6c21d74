/*
 * dlpack.h — DLPack (producer and consumer) and __cuda_array_interface__
 * v3 (csrc/dlpack.c).
 */
#ifndef GPUACCEL_DLPACK_H
#define GPUACCEL_DLPACK_H

#include "array.h"

/* Calls the deleter of a consumed DLPack tensor. */
void ga_dlpack_release(void *managed, int versioned);
/* Array.__dlpack__, __dlpack_device__ and __cuda_array_interface__. */
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
