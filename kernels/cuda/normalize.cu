/*
 * normalize.cu — the loader's image transform on the GPU, run on the copy
 * stream right after the host-to-device copy of a batch.
 *
 * Twin of kernels/cpu/normalize.c: every output is ga_normalize_value (the
 * one formula both use) rounded to the output dtype once, by the hardware
 * conversion (elem.cuh, the bits convert.h gives).  The kernel is compiled
 * per output dtype; a thread writes 16 bytes of output at a time (8
 * bfloat16 values, say), stepping the channel and pixel from one element to
 * the next instead of dividing them out of each index.
 */
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../convert.h"
#include "common.cuh"
#include "elem.cuh"

namespace
{

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535LL * 8;

/* Where output element i of the batch reads its input, and its channel:
 * set once for a thread's first element, then stepped. */
struct Pixel {
    int64_t image, ch, pixel;

    __device__ __forceinline__ Pixel(const ga_normalize_desc &d, int64_t i)
    {
        int64_t hw = d.h * d.w;
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
    }
    __device__ __forceinline__ int64_t source(const ga_normalize_desc &d) const
    {
        int64_t hw = d.h * d.w;
        return d.src_chw ? (image * d.c + ch) * hw + pixel : (image * hw + pixel) * d.c + ch;
    }
    /* the next element in the output's order */
    __device__ __forceinline__ void step(const ga_normalize_desc &d)
    {
        if (d.nchw) {
            if (++pixel == d.h * d.w) {
                pixel = 0;
                if (++ch == d.c) {
                    ch = 0;
                    image++;
                }
            }
        } else if (++ch == d.c) {
            ch = 0;
            /* a channels-first source's next image is not its last pixel's
             * neighbour: the image is stepped too */
            if (++pixel == d.h * d.w) {
                pixel = 0;
                image++;
            }
        }
    }
};

template <typename T>
__device__ __forceinline__ T normalized(const ga_normalize_desc &d, const Pixel &p)
{
    using Acc = typename Elem<T>::Acc;
    return Elem<T>::narrow((Acc)ga_normalize_value(&d, d.src[p.source(d)], p.ch));
}

/* A thread writes Vec<T>::N outputs (16 bytes) at a time when dst is
 * 16-byte aligned (`vector`); the outputs past the last whole vector, or
 * all of them otherwise, one at a time. */
template <typename T>
__global__ void normalize_kernel(ga_normalize_desc d, int64_t total, bool vector)
{
    constexpr int N = Vec<T>::N;
    char *dst = (char *)d.dst;
    int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
            step = (int64_t)gridDim.x * blockDim.x;
    int64_t vectors = vector ? total / N : 0;
    for (int64_t v = first; v < vectors; v += step) {
        GA_TRIP();
        Pixel p(d, v * N);
        Vec<T> out = {};
#pragma unroll
        for (int j = 0; j < N; j++) {
            out.v[j] = normalized<T>(d, p);
            p.step(d);
        }
        store_vec<T>(dst + v * N * (int64_t)sizeof(T), out);
    }
    for (int64_t i = vectors * N + first; i < total; i += step) {
        GA_TRIP();
        *(T *)(dst + i * (int64_t)sizeof(T)) = normalized<T>(d, Pixel(d, i));
    }
}

template <typename T> ga_status launch(const ga_normalize_desc &d, int64_t total, cudaStream_t s)
{
    bool vector = (uintptr_t)d.dst % 16 == 0;
    int64_t per_thread = vector ? Vec<T>::N : 1;
    int64_t blocks = (total + kThreads * per_thread - 1) / (kThreads * per_thread);
    unsigned grid = (unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks);
    GA_LAUNCH(grid, kThreads, 0, s, normalize_kernel<T>)(d, total, vector);
    GA_CUDA_LAUNCH_CHECK("normalize_kernel");
    return ga_ok();
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
    cudaStream_t s = ga_cu_stream(stream);
    switch (desc->dtype) {
    case GA_FLOAT16: return launch<__half>(*desc, total, s);
    case GA_BFLOAT16: return launch<__nv_bfloat16>(*desc, total, s);
    case GA_FLOAT32: return launch<float>(*desc, total, s);
    default: return launch<double>(*desc, total, s);
    }
}
