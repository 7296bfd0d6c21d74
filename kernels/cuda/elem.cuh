/*
 * elem.cuh — one float element of any float dtype, loaded as double and
 * stored with convert.h's single rounding, for the strided kernels of
 * epilogue.cu and matmul.cu.
 */
#ifndef GPUACCEL_CUDA_ELEM_CUH
#define GPUACCEL_CUDA_ELEM_CUH

#include <stdint.h>
#include <string.h>

#include "../convert.h"

/* A float element as double (exact for every float dtype).  Aligned
 * addresses take one wide load; a view may start anywhere, so the others
 * go byte by byte (convert.h's memcpy loads). */
static __device__ __forceinline__ double load_f(ga_dtype dtype, const char *p, bool aligned)
{
    uint64_t bits;
    switch (dtype) {
    case GA_FLOAT16:
    case GA_BFLOAT16: bits = aligned ? *(const uint16_t *)p : ga_ld16(p); break;
    case GA_FLOAT32: bits = aligned ? *(const uint32_t *)p : ga_ld32(p); break;
    default: bits = aligned ? *(const uint64_t *)p : ga_ld64(p); break;
    }
    return ga_load(dtype, &bits).f;
}

/* v rounded to `dtype` (convert.h's single rounding), as raw bits. */
static __device__ __forceinline__ uint64_t encode_f(ga_dtype dtype, double v)
{
    ga_value val;
    val.is_float = 1;
    val.i = 0;
    val.f = v;
    uint64_t bits = 0;
    ga_store(dtype, &bits, val);
    return bits;
}

static __device__ __forceinline__ double decode_f(ga_dtype dtype, uint64_t bits)
{
    return ga_load(dtype, &bits).f;
}

static __device__ __forceinline__ void store_bits(char *p, uint64_t bits, size_t itemsize,
                                                  bool aligned)
{
    if (!aligned) {
        memcpy(p, &bits, itemsize);
        return;
    }
    switch (itemsize) {
    case 2: *(uint16_t *)p = (uint16_t)bits; break;
    case 4: *(uint32_t *)p = (uint32_t)bits; break;
    default: *(uint64_t *)p = bits; break;
    }
}

#endif
