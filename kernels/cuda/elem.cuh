/*
 * elem.cuh — loading and storing float elements in the CUDA kernels, the
 * one place for it on the CUDA side (kernels/convert.h is the C side's, and
 * holds the conversions both share):
 *   - typed: Elem<T> (T = __half, __nv_bfloat16, float, double) with the
 *     type its sums are computed in, and load_elem / store_elem, with the
 *     hardware conversions (one rounding, as convert.h's);
 *   - by a dtype known only at run time: load_f / encode_f / store_bits,
 *     through double and convert.h's rounding.
 */
#ifndef GPUACCEL_CUDA_ELEM_CUH
#define GPUACCEL_CUDA_ELEM_CUH

#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../convert.h"

/* Each float dtype's element type, and the type its sums are computed in.
 * widen and narrow are the hardware's conversions (exact, and one rounding
 * to nearest even: the bits convert.h gives), except for a NaN: convert.h
 * (and so the CPU backend) keeps the top bits of a NaN's payload, quieted,
 * where the hardware may write a canonical NaN — so a NaN's bits are made
 * here with integer operations, as convert.h's through double make them. */
template <typename T> struct Elem;
template <> struct Elem<__half> {
    using Acc = float;
    static __host__ __device__ __forceinline__ float widen(__half v)
    {
        uint16_t h = __half_raw(v).x;
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) {
            uint32_t bits = ((uint32_t)(h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13);
            float f;
            memcpy(&f, &bits, sizeof f);
            return f;
        }
        return __half2float(v);
    }
    static __host__ __device__ __forceinline__ __half narrow(float a)
    {
        if (a != a) {
            uint32_t b;
            memcpy(&b, &a, sizeof b);
            __half_raw r;
            r.x = (uint16_t)(((b >> 16) & 0x8000u) | 0x7e00u | ((b >> 13) & 0x3ffu));
            return __half(r);
        }
        return __float2half_rn(a);
    }
};
template <> struct Elem<__nv_bfloat16> {
    using Acc = float;
    static __host__ __device__ __forceinline__ float widen(__nv_bfloat16 v)
    {
        return __bfloat162float(v); /* a shift: a NaN keeps its payload */
    }
    static __host__ __device__ __forceinline__ __nv_bfloat16 narrow(float a)
    {
        if (a != a) {
            uint32_t b;
            memcpy(&b, &a, sizeof b);
            __nv_bfloat16_raw r;
            r.x = (uint16_t)(((b >> 16) & 0x8000u) | 0x7fc0u | ((b >> 16) & 0x7fu));
            return __nv_bfloat16(r);
        }
        return __float2bfloat16_rn(a);
    }
};
template <> struct Elem<float> {
    using Acc = float;
    static __host__ __device__ __forceinline__ float widen(float v)
    {
        return v;
    }
    static __host__ __device__ __forceinline__ float narrow(float a)
    {
        return a;
    }
};
template <> struct Elem<double> {
    using Acc = double;
    static __host__ __device__ __forceinline__ double widen(double v)
    {
        return v;
    }
    static __host__ __device__ __forceinline__ double narrow(double a)
    {
        return a;
    }
};

/* Element loads/stores: one access when every address is element-aligned,
 * byte copies otherwise (a view may start anywhere). */
template <typename T, bool Aligned>
__host__ __device__ __forceinline__ typename Elem<T>::Acc load_elem(const char *p)
{
    T v;
    if constexpr (Aligned)
        v = *reinterpret_cast<const T *>(p);
    else
        memcpy(&v, p, sizeof(T));
    return Elem<T>::widen(v);
}

template <typename T, bool Aligned>
__host__ __device__ __forceinline__ void store_elem(char *p, typename Elem<T>::Acc a)
{
    T v = Elem<T>::narrow(a);
    if constexpr (Aligned)
        *reinterpret_cast<T *>(p) = v;
    else
        memcpy(p, &v, sizeof(T));
}

/* The dense fast paths move 16 bytes per access: Vec<T> is N elements of
 * T in one aligned 16-byte unit (the addresses are checked to be 16-byte
 * aligned before such a path is taken). */
template <typename T> struct alignas(16) Vec {
    static constexpr int N = 16 / sizeof(T);
    T v[N];
};

template <typename T> __host__ __device__ __forceinline__ Vec<T> load_vec(const char *p)
{
    Vec<T> r;
#ifdef __CUDA_ARCH__
    uint4 v = *reinterpret_cast<const uint4 *>(p); /* one 16-byte load */
    memcpy(&r, &v, sizeof r);
#else
    memcpy(&r, p, sizeof r);
#endif
    return r;
}

template <typename T> __host__ __device__ __forceinline__ void store_vec(char *p, const Vec<T> &r)
{
#ifdef __CUDA_ARCH__
    uint4 v;
    memcpy(&v, &r, sizeof v);
    *reinterpret_cast<uint4 *>(p) = v; /* one 16-byte store */
#else
    memcpy(p, &r, sizeof r);
#endif
}

/* How a kernel reads and writes one tensor's elements, in two kinds that
 * kernels are templated on: TypedIO<T>, a dtype known at compile time (one
 * aligned access, the hardware conversions above), and DynIO, a dtype
 * known only at run time (any alignment, convert.h through double: the
 * path for any mix of dtypes).  Both give the bits convert.h gives. */
template <typename T> struct TypedIO {
    using Acc = typename Elem<T>::Acc;
    __host__ __device__ __forceinline__ Acc load(const char *p) const
    {
        return Elem<T>::widen(*reinterpret_cast<const T *>(p));
    }
    template <typename A> __host__ __device__ __forceinline__ void store(char *p, A v) const
    {
        *reinterpret_cast<T *>(p) = Elem<T>::narrow((Acc)v);
    }
    /* v as a store and a load would give it back */
    template <typename A> __host__ __device__ __forceinline__ A round(A v) const
    {
        return (A)Elem<T>::widen(Elem<T>::narrow((Acc)v));
    }
};

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

struct DynIO {
    ga_dtype dtype;
    bool aligned;
    __device__ __forceinline__ double load(const char *p) const
    {
        return load_f(dtype, p, aligned);
    }
    template <typename A> __device__ __forceinline__ void store(char *p, A v) const
    {
        store_bits(p, encode_f(dtype, (double)v), ga_dtype_itemsize(dtype), aligned);
    }
    template <typename A> __device__ __forceinline__ A round(A v) const
    {
        return (A)decode_f(dtype, encode_f(dtype, (double)v));
    }
};

#endif
