/*
 * array_type.h — the gpuaccel.Array Python type: its methods and slots
 * (csrc/array_type.c), over the core of array.h.
 */
#ifndef GPUACCEL_ARRAY_TYPE_H
#define GPUACCEL_ARRAY_TYPE_H

#include "args.h"
#include "errors.h"

extern PyType_Spec ga_array_spec;

#endif
