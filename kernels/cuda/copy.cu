/*
 * copy.cu — strided copy with dtype conversion, and fill, on the GPU.
 *
 * Twin of kernels/cpu/copy.c: the element conversion is the same source
 * (kernels/convert.h), so the two agree bit for bit.
 */
#include <stdint.h>
#include <string.h>

#include "../convert.h"
#include "../check.h"
#include "../walk.h"
#include "common.cuh"

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
        int64_t extent = L.shape[k];
        int64_t i = idx % extent;
        idx /= extent;
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

unsigned grid_for(int64_t numel)
{
    int64_t blocks = (numel + kThreads - 1) / kThreads;
    return (unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks);
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
    bool aligned = is_aligned(dst->data, L.dst_strides, L.ndim, dsize) &&
                   is_aligned(src->data, L.src_strides, L.ndim, ga_dtype_itemsize(src->dtype));
    unsigned grid = grid_for(numel);
    char *out = (char *)dst->data;
    const char *in = (const char *)src->data;
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
