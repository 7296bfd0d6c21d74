/*
 * conv_direct.cuh — gpuaccel's own direct-convolution kernels
 * (conv_direct.cu): the route of last resort of conv.cu, taken when cuDNN
 * has no engine for a problem or cannot describe its tensors.  Slow, but
 * correct for every stride pattern, group count and float dtype.  The
 * checks of conv.cu's entry points live here too, so that the direct
 * route's own entry points (fallback.h) make the same ones.
 */
#ifndef GPUACCEL_CUDA_CONV_DIRECT_CUH
#define GPUACCEL_CUDA_CONV_DIRECT_CUH

#include <stdint.h>

#include "common.cuh"

/* The three convolutions, in conv roles: forward reads x, w and writes y;
 * backward data reads y (dy), w and writes x (dx); backward filter reads x,
 * y (dy) and writes w (dw). */
enum GaConvOp { GA_CONV_FWD = 0, GA_CONV_BWD_DATA = 1, GA_CONV_BWD_FILTER = 2 };

/* The checks of ga_cuda_conv2d_*, in conv roles: x (N, C, H, W),
 * w (K, C/groups, R, S), y (N, K, P, Q); and forward's own (activation,
 * preact). */
ga_status ga_conv_check(const ga_conv_geometry *g, const ga_tensor *x, const ga_tensor *w,
                        const ga_tensor *y);
ga_status ga_conv_check_forward(const ga_conv_desc *desc);

/* Queues `op` on s for checked tensors in conv roles (any byte strides;
 * bias, act and preact for forward only, preact written when its data is
 * set). */
ga_status ga_conv_direct(GaConvOp op, const ga_conv_geometry &g, const ga_tensor &x,
                         const ga_tensor &w, const ga_tensor &y, const void *bias,
                         ga_activation act, const ga_tensor *preact, cudaStream_t s);

#endif
