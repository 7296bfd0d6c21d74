/*
 * settings.h — the settings that steer the backends (settings.c): TF32 for float32
 * matmuls and convolutions, determinism.
 */
#ifndef GPUACCEL_SETTINGS_H
#define GPUACCEL_SETTINGS_H

#include "device.h"

/* ---- settings: set_matmul_precision("high"), set_conv_allow_tf32(False),
 * set_deterministic(True) */
int ga_deterministic(void);
/* Whether `which` GEMMs / convolutions on `dtype` on `device` may use TF32:
 * 0 unless float32 on CUDA; then gpuaccel's setting when its setter was
 * called, else torch's flag when torch is imported, else torch's default.
 * -1 with torch's exception. */
int ga_allow_tf32(ga_state *st, ga_device device, ga_dtype dtype, ga_tf32_op which);

PyObject *ga_py_set_matmul_precision(PyObject *module, PyObject *arg);
PyObject *ga_py_get_matmul_precision(PyObject *module, PyObject *unused);
PyObject *ga_py_set_conv_allow_tf32(PyObject *module, PyObject *arg);
PyObject *ga_py_get_conv_allow_tf32(PyObject *module, PyObject *unused);
/* _tf32_state('matmul' | 'conv') -> (allowed, source): the TF32 setting of
 * float32 CUDA ops and where it comes from: 'gpuaccel' (its setter),
 * 'torch' (torch's flag), 'default' (torch's default, torch not imported). */
PyObject *ga_py_tf32_state(PyObject *module, PyObject *arg);
PyObject *ga_py_set_deterministic(PyObject *module, PyObject *arg);
PyObject *ga_py_get_deterministic(PyObject *module, PyObject *unused);

#endif
