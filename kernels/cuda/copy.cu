/*
 * copy.cu — strided copy with dtype conversion, and fill, on the GPU.
 *
 * Twin of kernels/cpu/copy.c: every conversion gives the bits of
 * kernels/convert.h, so the two agree bit for bit.  Four ways, the first
 * that applies:
 *   - same dtype, dense rows: the copy engine (cudaMemcpy*Async);
 *   - same dtype, any strides: copy_same_kernel, moving whole elements of
 *     their size, no conversion;
 *   - float dtypes, both dense in one order (an astype): convert_dense_kernel,
 *     compiled per pair of dtypes, 16 bytes of source per access, the
 *     hardware conversions (elem.cuh, convert.h's bits);
 *   - anything else (integers, bools, mixed strides): copy_kernel, through
 *     convert.h at run time.
 * Index arithmetic divides in 32 bits wherever the sizes allow.
 */
#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "../convert.h"
#include "../check.h"
#include "../walk.h"
#include "common.cuh"
#include "elem.cuh"

namespace
{

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535LL * 8;

/* Loads and stores go through a register when the address is aligned (one
 * wide access) and byte by byte otherwise (a view may start anywhere). */
__device__ __forceinline__ ga_value load_element(ga_dtype dtype, const char *p, bool aligned)
{
    if (!aligned)
        return ga_load(dtype, p);
    uint64_t bits = 0;
    switch (ga_dtype_itemsize(dtype)) {
    case 1: bits = *(const uint8_t *)p; break;
    case 2: bits = *(const uint16_t *)p; break;
    case 4: bits = *(const uint32_t *)p; break;
    default: bits = *(const uint64_t *)p; break;
    }
    return ga_load(dtype, &bits);
}

__device__ __forceinline__ void store_bytes(char *p, uint64_t bits, size_t itemsize, bool aligned)
{
    if (!aligned) {
        memcpy(p, &bits, itemsize);
        return;
    }
    switch (itemsize) {
    case 1: *(uint8_t *)p = (uint8_t)bits; break;
    case 2: *(uint16_t *)p = (uint16_t)bits; break;
    case 4: *(uint32_t *)p = (uint32_t)bits; break;
    default: *(uint64_t *)p = bits; break;
    }
}

__device__ __forceinline__ void element_offsets(const ga_pair_layout &L, int64_t idx, int64_t *doff,
                                                int64_t *soff)
{
    if (L.ndim == 1) {
        *doff = idx * L.dst_strides[0];
        *soff = idx * L.src_strides[0];
        return;
    }
    int64_t d = 0, s = 0;
    for (int k = L.ndim - 1; k >= 0; k--) {
        int64_t extent = L.shape[k], i, q;
        if (k == 0) {
            i = idx;
            q = 0;
        } else {
            i = ga_split_index(idx, extent, &q);
        }
        idx = q;
        d += i * L.dst_strides[k];
        s += i * L.src_strides[k];
    }
    *doff = d;
    *soff = s;
}

__global__ void copy_kernel(char *dst, ga_dtype dst_dtype, const char *src, ga_dtype src_dtype,
                            int64_t numel, ga_pair_layout L, bool aligned)
{
    size_t dst_size = ga_dtype_itemsize(dst_dtype);
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < numel;
         idx += (int64_t)gridDim.x * blockDim.x) {
        GA_TRIP();
        int64_t doff, soff;
        element_offsets(L, idx, &doff, &soff);
        ga_value v = load_element(src_dtype, src + soff, aligned);
        uint64_t bits = 0;
        ga_store(dst_dtype, &bits, v);
        store_bytes(dst + doff, bits, dst_size, aligned);
    }
}

/* Same dtype, any strides: whole elements of W (an unsigned type of the
 * element's size) moved without a conversion. */
template <typename W>
__global__ void copy_same_kernel(char *dst, const char *src, int64_t numel, ga_pair_layout L)
{
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < numel;
         idx += (int64_t)gridDim.x * blockDim.x) {
        GA_TRIP();
        int64_t doff, soff;
        element_offsets(L, idx, &doff, &soff);
        *reinterpret_cast<W *>(dst + doff) = *reinterpret_cast<const W *>(src + soff);
    }
}

/* One float element of S as D: convert.h's single rounding (the hardware
 * conversion from float; convert.h's own from double to 16 bits, where a
 * detour through float would round twice), and convert.h's NaN (quieted,
 * the top of its payload kept) where float and double meet, made with
 * integer operations rather than left to the hardware's NaN rules. */
template <typename D, typename S> __device__ __forceinline__ D convert_float(S v)
{
    if constexpr (std::is_same<S, double>::value && std::is_same<D, float>::value) {
        if (v != v) {
            uint64_t b;
            memcpy(&b, &v, sizeof b);
            uint32_t f =
                (uint32_t)(b >> 32 & 0x80000000u) | 0x7fc00000u | (uint32_t)(b >> 29 & 0x7fffffu);
            float out;
            memcpy(&out, &f, sizeof out);
            return out;
        }
        return (float)v;
    } else if constexpr (std::is_same<D, double>::value && !std::is_same<S, double>::value) {
        float f = Elem<S>::widen(v);
        if (f != f) {
            uint32_t b;
            memcpy(&b, &f, sizeof b);
            uint64_t d = (uint64_t)(b & 0x80000000u) << 32 | 0x7ff8000000000000ull |
                         (uint64_t)(b & 0x7fffffu) << 29;
            double out;
            memcpy(&out, &d, sizeof out);
            return out;
        }
        return (double)f;
    } else if constexpr (std::is_same<S, double>::value && std::is_same<D, __half>::value) {
        __half_raw r;
        r.x = ga_f64_to_f16(v);
        return __half(r);
    } else if constexpr (std::is_same<S, double>::value && std::is_same<D, __nv_bfloat16>::value) {
        __nv_bfloat16_raw r;
        r.x = ga_f64_to_bf16(v);
        return __nv_bfloat16(r);
    } else {
        return Elem<D>::narrow((typename Elem<D>::Acc)Elem<S>::widen(v));
    }
}

/* Dense float arrays of one order (an astype): a thread converts the
 * Vec<S>::N elements of one 16-byte load of the source; the elements past
 * the last whole vector one at a time. */
template <typename D, typename S>
__global__ void convert_dense_kernel(char *dst, const char *src, int64_t numel)
{
    constexpr int N = Vec<S>::N;
    int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
            step = (int64_t)gridDim.x * blockDim.x;
    int64_t vectors = numel / N;
    D *out = reinterpret_cast<D *>(dst);
    for (int64_t v = first; v < vectors; v += step) {
        GA_TRIP();
        Vec<S> in = load_vec<S>(src + v * 16);
        constexpr int Q = (int)(sizeof(D) * N / 16); /* whole 16-byte stores of D */
        if constexpr (Q > 0) {
            Vec<D> converted[Q] = {};
#pragma unroll
            for (int j = 0; j < N; j++)
                converted[j / Vec<D>::N].v[j % Vec<D>::N] = convert_float<D, S>(in.v[j]);
#pragma unroll
            for (int q = 0; q < Q; q++)
                store_vec<D>(dst + v * N * (int64_t)sizeof(D) + 16 * q, converted[q]);
        } else {
#pragma unroll
            for (int j = 0; j < N; j++)
                out[v * N + j] = convert_float<D, S>(in.v[j]);
        }
    }
    for (int64_t i = vectors * N + first; i < numel; i += step) {
        GA_TRIP();
        out[i] = convert_float<D, S>(reinterpret_cast<const S *>(src)[i]);
    }
}

__global__ void fill_kernel(char *dst, size_t itemsize, uint64_t pattern, int64_t numel,
                            ga_pair_layout L, bool aligned)
{
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < numel;
         idx += (int64_t)gridDim.x * blockDim.x) {
        GA_TRIP();
        int64_t doff, unused;
        element_offsets(L, idx, &doff, &unused);
        store_bytes(dst + doff, pattern, itemsize, aligned);
    }
}

unsigned grid_for(int64_t numel, int64_t per_thread = 1)
{
    int64_t blocks = (numel + kThreads * per_thread - 1) / (kThreads * per_thread);
    return (unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

template <typename D, typename S>
ga_status launch_convert(char *dst, const char *src, int64_t numel, cudaStream_t s)
{
    GA_LAUNCH(grid_for(numel, Vec<S>::N), kThreads, 0, s, convert_dense_kernel<D, S>)
    (dst, src, numel);
    GA_CUDA_LAUNCH_CHECK("convert_dense_kernel");
    return ga_ok();
}

/* The source dtype's half of a dense float conversion. */
template <typename D>
ga_status convert_from(ga_dtype src_dtype, char *dst, const char *src, int64_t numel,
                       cudaStream_t s)
{
    switch (src_dtype) {
    case GA_FLOAT16: return launch_convert<D, __half>(dst, src, numel, s);
    case GA_BFLOAT16: return launch_convert<D, __nv_bfloat16>(dst, src, numel, s);
    case GA_FLOAT32: return launch_convert<D, float>(dst, src, numel, s);
    default: return launch_convert<D, double>(dst, src, numel, s);
    }
}

ga_status convert_dense(ga_dtype dst_dtype, ga_dtype src_dtype, char *dst, const char *src,
                        int64_t numel, cudaStream_t s)
{
    switch (dst_dtype) {
    case GA_FLOAT16: return convert_from<__half>(src_dtype, dst, src, numel, s);
    case GA_BFLOAT16: return convert_from<__nv_bfloat16>(src_dtype, dst, src, numel, s);
    case GA_FLOAT32: return convert_from<float>(src_dtype, dst, src, numel, s);
    default: return convert_from<double>(src_dtype, dst, src, numel, s);
    }
}

template <typename W>
ga_status launch_same(char *dst, const char *src, int64_t numel, const ga_pair_layout &L,
                      cudaStream_t s)
{
    GA_LAUNCH(grid_for(numel), kThreads, 0, s, copy_same_kernel<W>)(dst, src, numel, L);
    GA_CUDA_LAUNCH_CHECK("copy_same_kernel");
    return ga_ok();
}

bool is_aligned(const void *p, const int64_t *strides, int ndim, size_t itemsize)
{
    if ((uintptr_t)p % itemsize)
        return false;
    for (int k = 0; k < ndim; k++)
        if (strides[k] % (int64_t)itemsize)
            return false;
    return true;
}

} // namespace

extern "C" ga_status ga_cuda_copy(int device, const ga_tensor *dst, const ga_tensor *src,
                                  ga_stream stream)
{
    GA_NVTX_RANGE("copy");
    GA_TRY_STATUS(ga_check_copy(dst, src, __func__));
    ga_pair_layout L;
    int64_t numel = ga_pair_layout_make(dst, src, &L);
    if (numel == 0)
        return ga_ok();
    GA_WITH_DEVICE(device);
    cudaStream_t s = ga_cu_stream(stream);
    size_t dsize = ga_dtype_itemsize(dst->dtype);
    if (dst->dtype == src->dtype) {
        /* dense rows: the copy engine moves them without a kernel */
        int64_t inner_d = L.dst_strides[L.ndim - 1], inner_s = L.src_strides[L.ndim - 1];
        int64_t row = L.shape[L.ndim - 1];
        if (inner_d == (int64_t)dsize && inner_s == (int64_t)dsize) {
            if (L.ndim == 1) {
                GA_CUDA_TRY(cudaMemcpyAsync(dst->data, src->data, (size_t)numel * dsize,
                                            cudaMemcpyDefault, s));
                return ga_ok();
            }
            /* pitches above cudaDevAttrMaxPitch (2^31 - 1) are refused by
             * cudaMemcpy2DAsync: the kernel copies those */
            if (L.ndim == 2 && L.dst_strides[0] >= row * (int64_t)dsize &&
                L.src_strides[0] >= row * (int64_t)dsize && L.dst_strides[0] <= INT32_MAX &&
                L.src_strides[0] <= INT32_MAX) {
                GA_CUDA_TRY(cudaMemcpy2DAsync(dst->data, (size_t)L.dst_strides[0], src->data,
                                              (size_t)L.src_strides[0], (size_t)row * dsize,
                                              (size_t)L.shape[0], cudaMemcpyDefault, s));
                return ga_ok();
            }
        }
    }
    size_t ssize = ga_dtype_itemsize(src->dtype);
    bool aligned = is_aligned(dst->data, L.dst_strides, L.ndim, dsize) &&
                   is_aligned(src->data, L.src_strides, L.ndim, ssize);
    char *out = (char *)dst->data;
    const char *in = (const char *)src->data;
    if (dst->dtype == src->dtype && aligned) {
        switch (dsize) {
        case 1: return launch_same<uint8_t>(out, in, numel, L, s);
        case 2: return launch_same<uint16_t>(out, in, numel, L, s);
        case 4: return launch_same<uint32_t>(out, in, numel, L, s);
        default: return launch_same<uint64_t>(out, in, numel, L, s);
        }
    }
    if (ga_dtype_is_float(dst->dtype) && ga_dtype_is_float(src->dtype) && L.ndim == 1 &&
        L.dst_strides[0] == (int64_t)dsize && L.src_strides[0] == (int64_t)ssize &&
        (uintptr_t)out % 16 == 0 && (uintptr_t)in % 16 == 0)
        return convert_dense(dst->dtype, src->dtype, out, in, numel, s);
    unsigned grid = grid_for(numel);
    GA_LAUNCH(grid, kThreads, 0, s, copy_kernel)
    (out, dst->dtype, in, src->dtype, numel, L, aligned);
    GA_CUDA_LAUNCH_CHECK("copy_kernel");
    return ga_ok();
}

extern "C" ga_status ga_cuda_fill(int device, const ga_tensor *dst, ga_scalar value,
                                  ga_stream stream)
{
    GA_TRY_STATUS(ga_check_copy(dst, NULL, __func__));
    ga_pair_layout L;
    int64_t numel = ga_pair_layout_make(dst, NULL, &L);
    if (numel == 0)
        return ga_ok();
    unsigned char bytes[8];
    ga_scalar_to_bytes(value, dst->dtype, bytes);
    uint64_t pattern;
    memcpy(&pattern, bytes, sizeof pattern);
    size_t itemsize = ga_dtype_itemsize(dst->dtype);
    GA_WITH_DEVICE(device);
    cudaStream_t s = ga_cu_stream(stream);
    /* memset covers a dense tensor whose element is one repeated byte */
    bool repeated_byte = true;
    for (size_t k = 1; k < itemsize; k++)
        repeated_byte = repeated_byte && bytes[k] == bytes[0];
    if (L.ndim == 1 && L.dst_strides[0] == (int64_t)itemsize && repeated_byte) {
        GA_CUDA_TRY(cudaMemsetAsync(dst->data, bytes[0], (size_t)numel * itemsize, s));
        return ga_ok();
    }
    bool aligned = is_aligned(dst->data, L.dst_strides, L.ndim, itemsize);
    unsigned grid = grid_for(numel);
    char *out = (char *)dst->data;
    GA_LAUNCH(grid, kThreads, 0, s, fill_kernel)(out, itemsize, pattern, numel, L, aligned);
    GA_CUDA_LAUNCH_CHECK("fill_kernel");
    return ga_ok();
}
