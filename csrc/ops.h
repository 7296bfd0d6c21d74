/*
 * ops.h — the compute ops' module functions (csrc/ops.c).
 */
#ifndef GPUACCEL_OPS_H
#define GPUACCEL_OPS_H

#include "module.h"

PyObject *ga_py_matmul(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kw);
PyObject *ga_py_linear(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kw);
PyObject *ga_py_linear_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kw);
PyObject *ga_py_conv2d(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kw);
PyObject *ga_py_conv2d_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kw);
PyObject *ga_py_set_matmul_precision(PyObject *module, PyObject *arg);
PyObject *ga_py_get_matmul_precision(PyObject *module, PyObject *unused);
PyObject *ga_py_set_deterministic(PyObject *module, PyObject *arg);
PyObject *ga_py_get_deterministic(PyObject *module, PyObject *unused);
PyObject *ga_py_matmul_stats(PyObject *module, PyObject *unused);
PyObject *ga_py_conv_stats(PyObject *module, PyObject *unused);

#endif
