/*
 * transfer.h — moving values between arrays (csrc/transfer.c): copies
 * between any pair of devices and dtypes, fills, and conversions.
 */
#ifndef GPUACCEL_TRANSFER_H
#define GPUACCEL_TRANSFER_H

#include "array.h"

/* dst[...] = src[...] converted to dst's dtype; shapes equal (src may be
 * broadcast with zero strides); any pair of devices.  Copies that involve a
 * GPU are queued on `stream_obj` (NULL/None: the current stream of the
 * GPU's device), and the host never waits except when the destination is
 * host memory. */
int ga_copy_into(ga_state *st, ArrayObject *dst, ArrayObject *src, PyObject *stream_obj);
/* A new array on `device` (C-contiguous, dtype `dtype`) holding src's values. */
ArrayObject *ga_array_copy_to(ga_state *st, ArrayObject *src, ga_device device, ga_dtype dtype,
                              int pinned, PyObject *stream_obj);
/* arr (a new reference, consumed) as the dtype/device asked for (NULL:
 * keep), copied when they differ or when copy is 1 and arr is not `fresh`
 * (already a private copy).  copy: -1 None, 0 False (a needed copy is a
 * ValueError), 1 True. */
ArrayObject *ga_array_convert(ga_state *st, ArrayObject *arr, int fresh, const ga_dtype *dtype,
                              const ga_device *device, int copy, PyObject *stream_obj);
/* Fill every element with a Python scalar. */
int ga_array_fill(ga_state *st, ArrayObject *dst, PyObject *value);
/* A Python number as a ga_scalar; -1 with TypeError (naming argname) else. */
int ga_scalar_from_object(PyObject *obj, ga_scalar *out, const char *argname);

#endif
