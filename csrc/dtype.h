/*
 * dtype.h — gpuaccel's dtypes by name, and as NumPy, torch and PEP 3118
 * see them (csrc/dtype.c).
 */
#ifndef GPUACCEL_DTYPE_H
#define GPUACCEL_DTYPE_H

#include "args.h"
#include "errors.h"

/* 1 when NumPy can hold bfloat16 here (ml_dtypes is installed). */
int ga_numpy_has_bfloat16(ga_state *st);
const char *ga_dtype_name(ga_dtype dtype);
/* str, NumPy dtype or type, torch.dtype, ml_dtypes.bfloat16 */
int ga_dtype_from_object(ga_state *st, PyObject *obj, ga_dtype *out, const char *argname);
/* NumPy dtype for a gpuaccel dtype (bfloat16 needs ml_dtypes); new ref. */
PyObject *ga_dtype_to_numpy(ga_state *st, ga_dtype dtype);
/* -1 (no exception) when the NumPy dtype has no gpuaccel equivalent. */
int ga_dtype_from_numpy_descr(ga_state *st, PyObject *descr, ga_dtype *out);
/* PEP 3118 format string; NULL for bfloat16. */
const char *ga_dtype_buffer_format(ga_dtype dtype);

#endif
