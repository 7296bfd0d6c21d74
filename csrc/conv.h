/*
 * conv.h — conv2d and conv2d_backward (csrc/conv.c).
 */
#ifndef GPUACCEL_CONV_H
#define GPUACCEL_CONV_H

#include "args.h"
#include "errors.h"

PyObject *ga_py_conv2d(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kw);
PyObject *ga_py_conv2d_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kw);
PyObject *ga_py_conv_stats(PyObject *module, PyObject *unused);

#endif
