/*
 * convert.h — element conversions shared by the CPU and CUDA backends.
 *
 * The same source is compiled by the C compiler (kernels/cpu) and by nvcc
 * (kernels/cuda), so a cast gives bit-identical results on both devices and
 * the CPU path can serve as the oracle for the CUDA one.
 *
 * Rules (NumPy's where NumPy defines them):
 *   - float -> float16/bfloat16/float32: round to nearest even, from the
 *     exact source value (one rounding; NaN stays NaN, overflow gives inf);
 *   - float -> integer: truncate toward zero, saturating at the target's
 *     range, NaN -> 0 (NumPy leaves out-of-range casts undefined; this is
 *     what CUDA's cvt instructions do, so both devices agree);
 *   - integer -> narrower integer: wrap around (two's complement);
 *   - anything -> bool: value != 0 (NaN -> true).
 */
#ifndef GPUACCEL_CONVERT_H
#define GPUACCEL_CONVERT_H

#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* (kernels/cudacpu, which runs kernels/cuda on the CPU, compiles this
 * without __CUDA_ARCH__: there the host branch runs.) */
GA_HD int ga_clz64(uint64_t x)
{
#ifdef __CUDA_ARCH__
    return __clzll((long long)x);
#else
    return __builtin_clzll(x);
#endif
}

/* Round sign * m * 2^exp2 to a binary16-like format with `frac_bits`
 * fraction bits and exponent bias `bias` (float16: 10, 15; bfloat16: 7, 127),
 * nearest even. */
GA_HD uint16_t ga_round_to_small_float(uint32_t sign, uint64_t m, int exp2, int frac_bits, int bias)
{
    const uint32_t inf = (uint32_t)(2 * bias + 1) << frac_bits;
    const int min_exp = 1 - bias;
    if (m == 0)
        return (uint16_t)sign;
    int top = 63 - ga_clz64(m);
    int e = top + exp2;
    if (e > bias)
        return (uint16_t)(sign | inf);
    int shift = e >= min_exp ? top - frac_bits : (min_exp - frac_bits) - exp2;
    uint64_t q;
    if (shift <= 0) {
        q = m << -shift;
    } else if (shift > 63) {
        return (uint16_t)sign; /* below half of the smallest subnormal */
    } else {
        uint64_t rem = m & ((1ull << shift) - 1);
        uint64_t halfway = 1ull << (shift - 1);
        q = m >> shift;
        if (rem > halfway || (rem == halfway && (q & 1)))
            q++;
    }
    /* Normal numbers: the implicit leading bit of q carries into the
     * exponent field, so a rounding overflow lands on the next binade. */
    uint32_t h = e >= min_exp ? ((uint32_t)(e + bias - 1) << frac_bits) + (uint32_t)q : (uint32_t)q;
    if (h > inf)
        h = inf;
    return (uint16_t)(sign | h);
}

GA_HD uint16_t ga_f64_to_small_float(double d, int frac_bits, int bias)
{
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    uint32_t sign = (uint32_t)(bits >> 63) << 15;
    int exp = (int)((bits >> 52) & 0x7ff);
    uint64_t mant = bits & ((1ull << 52) - 1);
    if (exp == 0x7ff) {
        uint32_t inf = (uint32_t)(2 * bias + 1) << frac_bits;
        if (mant == 0)
            return (uint16_t)(sign | inf);
        /* quiet NaN, keeping the top payload bits */
        uint32_t payload = (uint32_t)(mant >> (52 - frac_bits)) | (1u << (frac_bits - 1));
        return (uint16_t)(sign | inf | payload);
    }
    if (exp == 0)
        return ga_round_to_small_float(sign, mant, -1074, frac_bits, bias);
    return ga_round_to_small_float(sign, mant | (1ull << 52), exp - 1075, frac_bits, bias);
}

GA_HD uint16_t ga_i64_to_small_float(int64_t i, int frac_bits, int bias)
{
    uint32_t sign = i < 0 ? 0x8000u : 0;
    uint64_t m = i < 0 ? (uint64_t)0 - (uint64_t)i : (uint64_t)i;
    return ga_round_to_small_float(sign, m, 0, frac_bits, bias);
}

GA_HD double ga_f16_to_f64(uint16_t h)
{
    int sign = h >> 15;
    int exp = (h >> 10) & 0x1f;
    int mant = h & 0x3ff;
    double v;
    if (exp == 0) {
        v = (double)mant * 5.9604644775390625e-08; /* 2^-24, exact */
    } else if (exp == 31) {
        uint64_t bits =
            mant ? 0x7ff8000000000000ull | ((uint64_t)mant << 42) : 0x7ff0000000000000ull;
        memcpy(&v, &bits, sizeof v);
    } else {
        uint64_t bits = ((uint64_t)(exp - 15 + 1023) << 52) | ((uint64_t)mant << 42);
        memcpy(&v, &bits, sizeof v);
    }
    return sign ? -v : v;
}

GA_HD double ga_bf16_to_f64(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return (double)f;
}

GA_HD uint16_t ga_f64_to_f16(double d)
{
    return ga_f64_to_small_float(d, 10, 15);
}
GA_HD uint16_t ga_f64_to_bf16(double d)
{
    return ga_f64_to_small_float(d, 7, 127);
}

GA_HD int64_t ga_f64_to_int_saturating(double d, int64_t lo, int64_t hi)
{
    if (d != d)
        return 0;
    if (d <= (double)lo)
        return lo;
    if (d >= (double)hi) /* (double)INT64_MAX rounds up to 2^63: still right */
        return hi;
    return (int64_t)d;
}

/* A loaded element: integers and bools as int64, floats as double (both
 * exact for every supported dtype). */
typedef struct {
    int is_float;
    int64_t i;
    double f;
} ga_value;

GA_HD uint16_t ga_ld16(const void *p)
{
    uint16_t t;
    memcpy(&t, p, 2);
    return t;
}
GA_HD uint32_t ga_ld32(const void *p)
{
    uint32_t t;
    memcpy(&t, p, 4);
    return t;
}
GA_HD uint64_t ga_ld64(const void *p)
{
    uint64_t t;
    memcpy(&t, p, 8);
    return t;
}

GA_HD float ga_ld_f32(const void *p)
{
    float t;
    memcpy(&t, p, 4);
    return t;
}
GA_HD double ga_ld_f64(const void *p)
{
    double t;
    memcpy(&t, p, 8);
    return t;
}

GA_HD ga_value ga_load(ga_dtype dtype, const void *p)
{
    ga_value v = {0, 0, 0.0};
    switch (dtype) {
    case GA_BOOL: v.i = *(const uint8_t *)p != 0; break;
    case GA_UINT8: v.i = *(const uint8_t *)p; break;
    case GA_INT8: v.i = *(const int8_t *)p; break;
    case GA_INT16: v.i = (int16_t)ga_ld16(p); break;
    case GA_INT32: v.i = (int32_t)ga_ld32(p); break;
    case GA_INT64: v.i = (int64_t)ga_ld64(p); break;
    case GA_FLOAT16:
        v.is_float = 1;
        v.f = ga_f16_to_f64(ga_ld16(p));
        break;
    case GA_BFLOAT16:
        v.is_float = 1;
        v.f = ga_bf16_to_f64(ga_ld16(p));
        break;
    case GA_FLOAT32:
        v.is_float = 1;
        v.f = ga_ld_f32(p);
        break;
    case GA_FLOAT64:
        v.is_float = 1;
        v.f = ga_ld_f64(p);
        break;
    default: break;
    }
    return v;
}

#define GA_STORE_AS(type, p, expr)             \
    do {                                       \
        type ga_tmp_ = (type)(expr);           \
        memcpy((p), &ga_tmp_, sizeof ga_tmp_); \
    } while (0)

GA_HD int64_t ga_value_to_int(ga_value v, int64_t lo, int64_t hi)
{
    return v.is_float ? ga_f64_to_int_saturating(v.f, lo, hi) : v.i;
}

GA_HD void ga_store(ga_dtype dtype, void *p, ga_value v)
{
    switch (dtype) {
    case GA_BOOL: *(uint8_t *)p = v.is_float ? v.f != 0.0 : v.i != 0; break;
    /* integer targets: floats saturate, integers wrap */
    case GA_UINT8: *(uint8_t *)p = (uint8_t)ga_value_to_int(v, 0, UINT8_MAX); break;
    case GA_INT8: *(int8_t *)p = (int8_t)(uint8_t)ga_value_to_int(v, INT8_MIN, INT8_MAX); break;
    case GA_INT16:
        GA_STORE_AS(int16_t, p, (uint16_t)ga_value_to_int(v, INT16_MIN, INT16_MAX));
        break;
    case GA_INT32:
        GA_STORE_AS(int32_t, p, (uint32_t)ga_value_to_int(v, INT32_MIN, INT32_MAX));
        break;
    case GA_INT64: GA_STORE_AS(int64_t, p, ga_value_to_int(v, INT64_MIN, INT64_MAX)); break;
    case GA_FLOAT16:
        GA_STORE_AS(uint16_t, p,
                    v.is_float ? ga_f64_to_f16(v.f) : ga_i64_to_small_float(v.i, 10, 15));
        break;
    case GA_BFLOAT16:
        GA_STORE_AS(uint16_t, p,
                    v.is_float ? ga_f64_to_bf16(v.f) : ga_i64_to_small_float(v.i, 7, 127));
        break;
    case GA_FLOAT32: GA_STORE_AS(float, p, v.is_float ? (float)v.f : (float)v.i); break;
    case GA_FLOAT64: GA_STORE_AS(double, p, v.is_float ? v.f : (double)v.i); break;
    default: break;
    }
}

GA_HD void ga_convert_element(ga_dtype dst_dtype, void *dst, ga_dtype src_dtype, const void *src)
{
    ga_store(dst_dtype, dst, ga_load(src_dtype, src));
}

/* ------------------------------------------------ runs (the CPU kernels)
 * Runs of float elements of any float dtype to and from the CPU kernels'
 * compute type (float, or double for float64 work), with the dtype switch
 * outside the loop: an exact widening on the way in, one round-to-nearest-
 * even narrowing (as the GPU) on the way out. */
#ifndef __CUDACC__

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

#endif /* !__CUDACC__ */

#endif /* GPUACCEL_CONVERT_H */
