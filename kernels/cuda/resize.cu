/*
 * resize.cu — the image loader's crop, antialiased resize and flip on the
 * GPU, after nvJPEG has decoded a batch into device memory.
 *
 * Twin of kernels/cpu/image.c: the same taps and weights (kernels/image.h),
 * summed in one pass per output pixel where the CPU makes two passes with a
 * uint8 rounding between them, so the two agree within a unit or two.
 */
#include <stdint.h>

#include "../image.h"
#include "common.cuh"

namespace
{

constexpr int kThreads = 256;

/* The weights of output pixel k's taps along one axis, normalized, and
 * the first tap's pixel (in the source image's coordinates). */
struct AxisTaps {
    int64_t first, count;
    double center, total;
};

__device__ AxisTaps axis_taps(const ga_resize_axis &a, int64_t k)
{
    AxisTaps t;
    ga_resize_taps(&a, k, &t.first, &t.count, &t.center);
    t.total = 0;
    for (int64_t j = 0; j < t.count; j++)
        t.total += ga_resize_weight(&a, t.first + j, t.center);
    return t;
}

/* One thread per output pixel, its three channels. */
__global__ void resize_kernel(ga_resize_job job)
{
    const ga_image_geometry &g = job.g;
    int64_t total = g.out_h * g.out_w;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t y = i / g.out_w, x = i - y * g.out_w;
        uint8_t *out = job.dst + i * 3;
        int64_t ky = y - g.y0, kx = x - g.x0;
        if (ky < 0 || ky >= g.ny || kx < 0 || kx >= g.nx) {
            out[0] = out[1] = out[2] = 0; /* the padding of a center crop */
            continue;
        }
        if (g.flip)
            kx = g.nx - 1 - kx;
        AxisTaps ty = axis_taps(g.ry, ky), tx = axis_taps(g.rx, kx);
        float acc[3] = {0.0f, 0.0f, 0.0f};
        for (int64_t j = 0; j < ty.count; j++) {
            float wy = (float)(ga_resize_weight(&g.ry, ty.first + j, ty.center) / ty.total);
            const uint8_t *row = job.src + (g.ry.lo + ty.first + j) * job.src_pitch;
            for (int64_t k = 0; k < tx.count; k++) {
                float w = wy * (float)(ga_resize_weight(&g.rx, tx.first + k, tx.center) / tx.total);
                const uint8_t *px = row + (g.rx.lo + tx.first + k) * 3;
                acc[0] += w * px[0];
                acc[1] += w * px[1];
                acc[2] += w * px[2];
            }
        }
        for (int c = 0; c < 3; c++) {
            float v = acc[c] + 0.5f;
            out[c] = (uint8_t)(v <= 0.0f ? 0 : v >= 255.0f ? 255 : (int)v);
        }
    }
}

} // namespace

extern "C" ga_status ga_cuda_resize_images(int device, const ga_resize_job *jobs, int n,
                                           ga_stream stream)
{
    GA_NVTX_RANGE("resize_images");
    GA_WITH_DEVICE(device);
    for (int k = 0; k < n; k++) {
        const ga_resize_job &job = jobs[k];
        const ga_image_geometry &g = job.g;
        if (g.out_h < 1 || g.out_w < 1 || g.ry.lo < 0 || g.rx.lo < 0 || g.ry.hi > job.src_h ||
            g.rx.hi > job.src_w || job.src_pitch < job.src_w * 3)
            return GA_STATUS(GA_ERR_INVALID_VALUE, "resize_images: the geometry reads outside "
                                                   "its source image");
        int64_t total = g.out_h * g.out_w;
        int64_t blocks = (total + kThreads - 1) / kThreads;
        unsigned grid = (unsigned)(blocks < 65535LL * 8 ? blocks : 65535LL * 8);
        /* one launch per image, its job by value: a batch's jobs would not
         * fit in a launch's parameters */
        GA_LAUNCH(grid, kThreads, 0, ga_cu_stream(stream), resize_kernel)(job);
        GA_CUDA_LAUNCH_CHECK("resize_kernel");
    }
    return ga_ok();
}
