/*
 * conv_key.h — the one key of a convolution problem (conv_key.c): the CUDA
 * backend's plan cache looks plans up by it, csrc/conv.c reads and writes
 * the tuning file under it (it reaches csrc through ga_conv_tuning.key), and
 * the simulator (kernels/sim) keys its stand-in cache the same way.
 */
#ifndef GPUACCEL_KERNELS_CONV_KEY_H
#define GPUACCEL_KERNELS_CONV_KEY_H

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which convolution of a layer. */
typedef enum {
    GA_CONV_KEY_FWD = 0,
    GA_CONV_KEY_BWD_DATA = 1,
    GA_CONV_KEY_BWD_FILTER = 2
} ga_conv_key_op;

/* Writes the key of a convolution in conv roles (x, w, y: forward reads x
 * and w and writes y; backward data writes x from y and w; backward filter
 * writes w from x and y; bias, act and preact only forward, bias and preact
 * may be NULL) into buf, NUL-terminated, and returns its length; 0 when
 * buf is too small (GA_CONV_KEY_MAX always suffices).  Printable text,
 * with no device in it: the tuning file names the GPU model itself, and
 * the plan cache adds the device ordinal.  It holds everything a plan
 * choice depends on: the op, the dtype, the geometry and the TF32 and
 * determinism flags, each tensor's shape, byte strides (those of size-1
 * dims written as 0: they never address anything) and pointer alignment
 * (up to 16 bytes), the epilogue, and the workspace bytes the search may
 * use. */
size_t ga_conv_key(char *buf, size_t size, ga_conv_key_op op, const ga_conv_geometry *geom,
                   const ga_tensor *x, const ga_tensor *w, const ga_tensor *y, const void *bias,
                   ga_activation act, const ga_tensor *preact, size_t workspace_size);

#ifdef __cplusplus
}
#endif

#endif
