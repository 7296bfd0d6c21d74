/*
 * npy.h — the NumPy C API, shared by every csrc/ file that needs it.
 * module.c defines GA_NUMPY_IMPORT and imports the API in its exec slot.
 */
#ifndef GPUACCEL_NPY_H
#define GPUACCEL_NPY_H

#define PY_ARRAY_UNIQUE_SYMBOL gpuaccel_ARRAY_API
#ifndef GA_NUMPY_IMPORT
#define NO_IMPORT_ARRAY
#endif
#define NPY_NO_DEPRECATED_API NPY_1_23_API_VERSION
#include <numpy/arrayobject.h>

#endif
