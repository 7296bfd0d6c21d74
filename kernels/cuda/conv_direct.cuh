/*
 * conv_direct.cuh — gpuaccel's own direct-convolution kernels
 * (conv_direct.cu): the route of last resort of conv.cu, taken when cuDNN
 * has no engine for a problem or cannot describe its tensors.  Slow, but
 * correct for every stride pattern, group count and float dtype.
 */
#ifndef GPUACCEL_CUDA_CONV_DIRECT_CUH
#define GPUACCEL_CUDA_CONV_DIRECT_CUH

#include <stdint.h>

#include "common.cuh"

/* The three convolutions, in conv roles: forward reads x, w and writes y;
 * backward data reads y (dy), w and writes x (dx); backward filter reads x,
 * y (dy) and writes w (dw). */
enum GaConvOp { GA_CONV_FWD = 0, GA_CONV_BWD_DATA = 1, GA_CONV_BWD_FILTER = 2 };

/* One problem: x (N, C, H, W), w (K, Cg, R, S), y (N, K, P, Q) in logical
 * NCHW order, any byte strides. */
struct GaConvDirectArgs {
    char *x, *w, *y;  /* conv roles; which ones are written depends on the op */
    const char *bias; /* forward: K contiguous values, or null */
    char *preact;     /* forward: written when set */
    int64_t N, C, H, W, K, R, S, P, Q, Cg, Kg;
    int64_t xs[4], ws[4], ys[4], ps[4]; /* byte strides */
    int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
    ga_activation act;
};

/* Queues `op` on s.  dtype: the float dtype of every tensor; aligned: every
 * element of every tensor sits at a multiple of its size (one access per
 * element instead of byte copies). */
ga_status ga_conv_direct(GaConvOp op, ga_dtype dtype, bool aligned, const GaConvDirectArgs &a,
                         cudaStream_t s);

#endif
