/*
 * nocuda.c — the CUDA entry points of a CPU-only build.
 *
 * Linked in place of the kernels/cuda sources when the build found no nvcc
 * (or was asked for none with GPUACCEL_NO_CUDA=1): every function is
 * written from kernels/entry_points.h, whose last column sets the outputs
 * a caller may still read (no devices, a NULL handle, a finished query) and
 * reports GA_ERR_NO_CUDA_BUILD, which csrc/errors.c turns into a
 * RuntimeError that says how to get a CUDA build.  A simulator build
 * (GPUACCEL_SIM) links kernels/sim instead.
 */
#include <string.h>

#include "../entry_points.h"
#include "../kernels.h"

#define GA_NO_CUDA GA_STATUS(GA_ERR_NO_CUDA_BUILD, "gpuaccel was built without CUDA")

#define GA_NOCUDA_DEFINE(kind, ret, name, params, ...) \
    ret ga_cuda_##name params                          \
    {                                                  \
        __VA_ARGS__;                                   \
    }

GA_CUDA_ENTRY_POINTS(GA_NOCUDA_DEFINE)
