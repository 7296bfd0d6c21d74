/*
 * create.h — making arrays: asarray from anything array-like, and
 * empty / zeros / ones / full (csrc/create.c).
 */
#ifndef GPUACCEL_CREATE_H
#define GPUACCEL_CREATE_H

#include "array.h"

/* asarray(obj, dtype, device, copy, stream) with parsed arguments; dtype
 * and device may be NULL for "keep". copy: -1 None, 0 False, 1 True. */
ArrayObject *ga_asarray(ga_state *st, PyObject *obj, const ga_dtype *dtype, const ga_device *device,
                        int copy, PyObject *stream_obj);
PyObject *ga_py_empty(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *ga_py_zeros(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *ga_py_ones(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *ga_py_full(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *ga_py_asarray(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames);
PyObject *ga_py_from_dlpack(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames);

#endif
