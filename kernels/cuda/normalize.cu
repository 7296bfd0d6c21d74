/*
 * normalize.cu — the loader's image transform on the GPU, run on the copy
 * stream right after the host-to-device copy of a batch.
 *
 * Twin of kernels/cpu/normalize.c (ga_normalize_value + kernels/convert.h).
 */
#include <stdint.h>

#include "../convert.h"
#include "common.cuh"

namespace
{

constexpr int kThreads = 256;

/* One thread per output element: writes are coalesced in either layout;
 * reads of the uint8 source are a few bytes apart and come from L2. */
__global__ void normalize_kernel(ga_normalize_desc d, int64_t total)
{
    size_t out_size = ga_dtype_itemsize(d.dtype);
    int64_t hw = d.h * d.w;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t image, pixel, ch;
        if (d.nchw) {
            image = i / (d.c * hw);
            int64_t rest = i - image * d.c * hw;
            ch = rest / hw;
            pixel = rest - ch * hw;
        } else {
            image = i / (hw * d.c);
            int64_t rest = i - image * hw * d.c;
            pixel = rest / d.c;
            ch = rest - pixel * d.c;
        }
        uint8_t x = d.src_chw ? d.src[(image * d.c + ch) * hw + pixel]
                              : d.src[(image * hw + pixel) * d.c + ch];
        ga_value v;
        v.is_float = 1;
        v.i = 0;
        v.f = ga_normalize_value(&d, x, ch);
        uint64_t bits = 0;
        ga_store(d.dtype, &bits, v);
        char *out = (char *)d.dst + (size_t)i * out_size;
        switch (out_size) {
        case 2: *(uint16_t *)out = (uint16_t)bits; break;
        case 4: *(uint32_t *)out = (uint32_t)bits; break;
        default: *(uint64_t *)out = bits; break;
        }
    }
}

} // namespace

extern "C" ga_status ga_cuda_normalize_images(int device, const ga_normalize_desc *desc,
                                              ga_stream stream)
{
    GA_NVTX_RANGE("normalize");
    if (desc->n < 0 || desc->h < 0 || desc->w < 0 || desc->c < 1 ||
        desc->c > GA_NORMALIZE_MAX_CHANNELS || !ga_dtype_is_float(desc->dtype))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "normalize: bad shape, channels or dtype");
    int64_t total = desc->n * desc->h * desc->w * desc->c;
    if (total == 0)
        return ga_ok();
    if ((uintptr_t)desc->dst % ga_dtype_itemsize(desc->dtype))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "normalize: misaligned output");
    GA_WITH_DEVICE(device);
    int64_t blocks = (total + kThreads - 1) / kThreads;
    unsigned grid = (unsigned)(blocks < 65535LL * 8 ? blocks : 65535LL * 8);
    GA_LAUNCH(grid, kThreads, 0, ga_cu_stream(stream), normalize_kernel)(*desc, total);
    GA_CUDA_LAUNCH_CHECK("normalize_kernel");
    return ga_ok();
}
