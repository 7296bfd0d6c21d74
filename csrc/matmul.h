/*
 * matmul.h — matmul, linear and linear_backward (csrc/matmul.c).
 */
#ifndef GPUACCEL_MATMUL_H
#define GPUACCEL_MATMUL_H

#include "args.h"
#include "errors.h"

PyObject *ga_py_matmul(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kw);
PyObject *ga_py_linear(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kw);
PyObject *ga_py_linear_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kw);
PyObject *ga_py_matmul_stats(PyObject *module, PyObject *unused);

#endif
