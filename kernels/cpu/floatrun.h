/*
 * floatrun.h — runs of float elements of any float dtype to and from the CPU
 * kernels' compute type (float, or double for float64 work), with the dtype
 * switch outside the loop: an exact widening on the way in, one
 * round-to-nearest-even narrowing (convert.h, as the GPU) on the way out.
 * Shared by matmul.c, conv.c and activation.c.
 */
#ifndef GPUACCEL_CPU_FLOATRUN_H
#define GPUACCEL_CPU_FLOATRUN_H

#include <string.h>

#include "../convert.h"

/* Element runs converted to the compute type: dtype switch outside the loop
 * (convert.h's exact conversions; a float16 or bfloat16 widens exactly). */
static inline void ga_gather_f(ga_dtype dtype, const char *src, int64_t stride, int64_t n,
                               void *out_, int64_t out_stride)
{
    float *out = (float *)out_;
    switch (dtype) {
    case GA_FLOAT16:
        for (int64_t k = 0; k < n; k++)
            out[k * out_stride] = (float)ga_f16_to_f64(ga_ld16(src + k * stride));
        break;
    case GA_BFLOAT16:
        for (int64_t k = 0; k < n; k++)
            out[k * out_stride] = (float)ga_bf16_to_f64(ga_ld16(src + k * stride));
        break;
    case GA_FLOAT32:
        if (stride == 4 && out_stride == 1) {
            memcpy(out, src, (size_t)n * 4);
            break;
        }
        for (int64_t k = 0; k < n; k++)
            out[k * out_stride] = ga_ld_f32(src + k * stride);
        break;
    default:
        for (int64_t k = 0; k < n; k++)
            out[k * out_stride] = (float)ga_ld_f64(src + k * stride);
        break;
    }
}

static inline void ga_gather_d(ga_dtype dtype, const char *src, int64_t stride, int64_t n,
                               void *out_, int64_t out_stride)
{
    double *out = (double *)out_;
    switch (dtype) {
    case GA_FLOAT16:
        for (int64_t k = 0; k < n; k++)
            out[k * out_stride] = ga_f16_to_f64(ga_ld16(src + k * stride));
        break;
    case GA_BFLOAT16:
        for (int64_t k = 0; k < n; k++)
            out[k * out_stride] = ga_bf16_to_f64(ga_ld16(src + k * stride));
        break;
    case GA_FLOAT32:
        for (int64_t k = 0; k < n; k++)
            out[k * out_stride] = ga_ld_f32(src + k * stride);
        break;
    default:
        if (stride == 8 && out_stride == 1) {
            memcpy(out, src, (size_t)n * 8);
            break;
        }
        for (int64_t k = 0; k < n; k++)
            out[k * out_stride] = ga_ld_f64(src + k * stride);
        break;
    }
}

/* v[0, n) rounded once to `dtype` (round to nearest even, as the GPU). */
static inline void ga_scatter_f(ga_dtype dtype, char *dst, int64_t stride, int64_t n,
                                const float *v)
{
    switch (dtype) {
    case GA_FLOAT16:
        for (int64_t k = 0; k < n; k++)
            GA_STORE_AS(uint16_t, dst + k * stride, ga_f64_to_f16(v[k]));
        break;
    case GA_BFLOAT16:
        for (int64_t k = 0; k < n; k++)
            GA_STORE_AS(uint16_t, dst + k * stride, ga_f64_to_bf16(v[k]));
        break;
    case GA_FLOAT32:
        if (stride == 4) {
            memcpy(dst, v, (size_t)n * 4);
            break;
        }
        for (int64_t k = 0; k < n; k++)
            GA_STORE_AS(float, dst + k * stride, v[k]);
        break;
    default:
        for (int64_t k = 0; k < n; k++)
            GA_STORE_AS(double, dst + k * stride, v[k]);
        break;
    }
}

static inline void ga_scatter_d(ga_dtype dtype, char *dst, int64_t stride, int64_t n,
                                const double *v)
{
    switch (dtype) {
    case GA_FLOAT16:
        for (int64_t k = 0; k < n; k++)
            GA_STORE_AS(uint16_t, dst + k * stride, ga_f64_to_f16(v[k]));
        break;
    case GA_BFLOAT16:
        for (int64_t k = 0; k < n; k++)
            GA_STORE_AS(uint16_t, dst + k * stride, ga_f64_to_bf16(v[k]));
        break;
    case GA_FLOAT32:
        for (int64_t k = 0; k < n; k++)
            GA_STORE_AS(float, dst + k * stride, v[k]);
        break;
    default:
        if (stride == 8) {
            memcpy(dst, v, (size_t)n * 8);
            break;
        }
        for (int64_t k = 0; k < n; k++)
            GA_STORE_AS(double, dst + k * stride, v[k]);
        break;
    }
}

#endif
