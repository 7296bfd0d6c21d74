/*
 * conv_direct.cu — the direct-convolution kernels of conv_direct.cuh.
 *
 * One thread per output element for forward and backward data, one block
 * per filter element for backward filter; sums in a fixed order
 * (deterministic), in float (double for float64), over byte strides of any
 * sign.  conv.cu runs them when cuDNN cannot (and for float64, where cuDNN
 * has no graph engine for double).
 */
#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "../activation.h"
#include "common.cuh"
#include "conv_direct.cuh"

namespace
{

constexpr int kThreads = 256; /* a power of two */
constexpr int64_t kMaxBlocks = 65535LL * 8;

/* Each float dtype's element type, and the type its sums are computed in. */
template <typename T> struct Elem;
template <> struct Elem<__half> {
    using Acc = float;
    static __host__ __device__ __forceinline__ float widen(__half v)
    {
        return __half2float(v);
    }
    static __host__ __device__ __forceinline__ __half narrow(float a)
    {
        return __float2half_rn(a);
    }
};
template <> struct Elem<__nv_bfloat16> {
    using Acc = float;
    static __host__ __device__ __forceinline__ float widen(__nv_bfloat16 v)
    {
        return __bfloat162float(v);
    }
    static __host__ __device__ __forceinline__ __nv_bfloat16 narrow(float a)
    {
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
__host__ __device__ __forceinline__ typename Elem<T>::Acc load(const char *p)
{
    T v;
    if constexpr (Aligned)
        v = *reinterpret_cast<const T *>(p);
    else
        memcpy(&v, p, sizeof(T));
    return Elem<T>::widen(v);
}

template <typename T, bool Aligned>
__host__ __device__ __forceinline__ void store(char *p, typename Elem<T>::Acc a)
{
    T v = Elem<T>::narrow(a);
    if constexpr (Aligned)
        *reinterpret_cast<T *>(p) = v;
    else
        memcpy(p, &v, sizeof(T));
}

__host__ __device__ __forceinline__ float activate(ga_activation act, float z)
{
    return ga_activate_f(act, z);
}
__host__ __device__ __forceinline__ double activate(ga_activation act, double z)
{
    return ga_activate_d(act, z);
}

/* The per-element bodies are host-callable too, so that they can be
 * checked against a reference on a machine without a GPU. */

/* y[n, k, p, q] = act(sum over c in k's group, r, s of x[n, c, h, w] *
 * w[k, c - c0, r, s] + bias[k]) with h = p*stride - pad + r*dil, likewise w. */
template <typename T, bool A>
__host__ __device__ __forceinline__ void fwd_element(const GaConvDirectArgs &a, int64_t i)
{
    using Acc = typename Elem<T>::Acc;
    int64_t q = i % a.Q, t = i / a.Q;
    int64_t p = t % a.P;
    t /= a.P;
    int64_t k = t % a.K, n = t / a.K;
    int64_t c0 = k / a.Kg * a.Cg; /* first input channel of k's group */
    Acc acc = 0;
    for (int64_t c = 0; c < a.Cg; c++) {
        const char *xc = a.x + n * a.xs[0] + (c0 + c) * a.xs[1];
        const char *wc = a.w + k * a.ws[0] + c * a.ws[1];
        for (int64_t r = 0; r < a.R; r++) {
            int64_t h = p * a.stride_h - a.pad_h + r * a.dil_h;
            if (h < 0 || h >= a.H)
                continue;
            for (int64_t s = 0; s < a.S; s++) {
                int64_t w = q * a.stride_w - a.pad_w + s * a.dil_w;
                if (w < 0 || w >= a.W)
                    continue;
                acc += load<T, A>(xc + h * a.xs[2] + w * a.xs[3]) *
                       load<T, A>(wc + r * a.ws[2] + s * a.ws[3]);
            }
        }
    }
    if (a.bias)
        acc += load<T, A>(a.bias + k * (int64_t)sizeof(T));
    if (a.preact)
        store<T, A>(a.preact + n * a.ps[0] + k * a.ps[1] + p * a.ps[2] + q * a.ps[3], acc);
    store<T, A>(a.y + n * a.ys[0] + k * a.ys[1] + p * a.ys[2] + q * a.ys[3], activate(a.act, acc));
}

/* dx[n, c, h, w] = sum over k in c's group, r, s with h = p*stride - pad +
 * r*dil (and likewise w) of dy[n, k, p, q] * w[k, c - c0, r, s]. */
template <typename T, bool A>
__host__ __device__ __forceinline__ void bwd_data_element(const GaConvDirectArgs &a, int64_t i)
{
    using Acc = typename Elem<T>::Acc;
    int64_t w = i % a.W, t = i / a.W;
    int64_t h = t % a.H;
    t /= a.H;
    int64_t c = t % a.C, n = t / a.C;
    int64_t k0 = c / a.Cg * a.Kg, cl = c % a.Cg;
    Acc acc = 0;
    for (int64_t r = 0; r < a.R; r++) {
        int64_t hp = h + a.pad_h - r * a.dil_h;
        if (hp < 0 || hp % a.stride_h)
            continue;
        int64_t p = hp / a.stride_h;
        if (p >= a.P)
            continue;
        for (int64_t s = 0; s < a.S; s++) {
            int64_t wq = w + a.pad_w - s * a.dil_w;
            if (wq < 0 || wq % a.stride_w)
                continue;
            int64_t q = wq / a.stride_w;
            if (q >= a.Q)
                continue;
            for (int64_t k = k0; k < k0 + a.Kg; k++)
                acc += load<T, A>(a.y + n * a.ys[0] + k * a.ys[1] + p * a.ys[2] + q * a.ys[3]) *
                       load<T, A>(a.w + k * a.ws[0] + cl * a.ws[1] + r * a.ws[2] + s * a.ws[3]);
        }
    }
    store<T, A>(a.x + n * a.xs[0] + c * a.xs[1] + h * a.xs[2] + w * a.xs[3], acc);
}

/* dw[k, c, r, s] = sum over n, p, q of dy[n, k, p, q] * x[n, c0 + c, h, w].
 * One slice of that sum: the terms j = first, first + step, ... of the
 * N*P*Q in n, p, q order. */
template <typename T, bool A>
__host__ __device__ __forceinline__ typename Elem<T>::Acc
bwd_filter_slice(const GaConvDirectArgs &a, int64_t e, int64_t first, int64_t step)
{
    using Acc = typename Elem<T>::Acc;
    int64_t s = e % a.S, t = e / a.S;
    int64_t r = t % a.R;
    t /= a.R;
    int64_t c = t % a.Cg, k = t / a.Cg;
    int64_t cx = k / a.Kg * a.Cg + c;
    int64_t npq = a.N * a.P * a.Q;
    Acc acc = 0;
    for (int64_t j = first; j < npq; j += step) {
        int64_t q = j % a.Q, u = j / a.Q;
        int64_t p = u % a.P, n = u / a.P;
        int64_t h = p * a.stride_h - a.pad_h + r * a.dil_h;
        int64_t w = q * a.stride_w - a.pad_w + s * a.dil_w;
        if (h < 0 || h >= a.H || w < 0 || w >= a.W)
            continue;
        acc += load<T, A>(a.y + n * a.ys[0] + k * a.ys[1] + p * a.ys[2] + q * a.ys[3]) *
               load<T, A>(a.x + n * a.xs[0] + cx * a.xs[1] + h * a.xs[2] + w * a.xs[3]);
    }
    return acc;
}

template <typename T, bool A>
__host__ __device__ __forceinline__ void bwd_filter_store(const GaConvDirectArgs &a, int64_t e,
                                                          typename Elem<T>::Acc v)
{
    int64_t s = e % a.S, t = e / a.S;
    int64_t r = t % a.R;
    t /= a.R;
    int64_t c = t % a.Cg, k = t / a.Cg;
    store<T, A>(a.w + k * a.ws[0] + c * a.ws[1] + r * a.ws[2] + s * a.ws[3], v);
}

template <typename T, bool A> __global__ void conv_fwd_direct(GaConvDirectArgs a)
{
    int64_t total = a.N * a.K * a.P * a.Q;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x)
        fwd_element<T, A>(a, i);
}

template <typename T, bool A> __global__ void conv_bwd_data_direct(GaConvDirectArgs a)
{
    int64_t total = a.N * a.C * a.H * a.W;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x)
        bwd_data_element<T, A>(a, i);
}

/* A long reduction per filter element: a block per element, each thread
 * summing a fixed slice and the block adding the slices in a fixed tree, so
 * the result does not depend on scheduling. */
template <typename T, bool A> __global__ void conv_bwd_filter_direct(GaConvDirectArgs a)
{
    using Acc = typename Elem<T>::Acc;
    __shared__ Acc partial[kThreads];
    int64_t total = a.K * a.Cg * a.R * a.S;
    for (int64_t e = blockIdx.x; e < total; e += gridDim.x) {
        partial[threadIdx.x] = bwd_filter_slice<T, A>(a, e, threadIdx.x, kThreads);
        __syncthreads();
        for (int half = kThreads / 2; half > 0; half /= 2) {
            if ((int)threadIdx.x < half)
                partial[threadIdx.x] += partial[threadIdx.x + half];
            __syncthreads();
        }
        if (threadIdx.x == 0)
            bwd_filter_store<T, A>(a, e, partial[0]);
        __syncthreads(); /* partial[] is reused for the next element */
    }
}

unsigned grid_for(int64_t n)
{
    int64_t blocks = (n + kThreads - 1) / kThreads;
    return (unsigned)std::max<int64_t>(1, std::min(blocks, kMaxBlocks));
}

template <typename T, bool A>
ga_status launch_direct(GaConvOp op, const GaConvDirectArgs &a, cudaStream_t s)
{
    switch (op) {
    case GA_CONV_FWD:
        conv_fwd_direct<T, A><<<grid_for(a.N * a.K * a.P * a.Q), kThreads, 0, s>>>(a);
        GA_CUDA_LAUNCH_CHECK("conv_fwd_direct");
        break;
    case GA_CONV_BWD_DATA:
        conv_bwd_data_direct<T, A><<<grid_for(a.N * a.C * a.H * a.W), kThreads, 0, s>>>(a);
        GA_CUDA_LAUNCH_CHECK("conv_bwd_data_direct");
        break;
    case GA_CONV_BWD_FILTER: {
        int64_t elements = a.K * a.Cg * a.R * a.S;
        unsigned blocks = (unsigned)std::max<int64_t>(1, std::min<int64_t>(elements, 1 << 20));
        conv_bwd_filter_direct<T, A><<<blocks, kThreads, 0, s>>>(a);
        GA_CUDA_LAUNCH_CHECK("conv_bwd_filter_direct");
        break;
    }
    }
    return ga_ok();
}

} // namespace

ga_status ga_conv_direct(GaConvOp op, ga_dtype dtype, bool aligned, const GaConvDirectArgs &a,
                         cudaStream_t s)
{
    switch (dtype) {
    case GA_FLOAT16:
        return aligned ? launch_direct<__half, true>(op, a, s)
                       : launch_direct<__half, false>(op, a, s);
    case GA_BFLOAT16:
        return aligned ? launch_direct<__nv_bfloat16, true>(op, a, s)
                       : launch_direct<__nv_bfloat16, false>(op, a, s);
    case GA_FLOAT32:
        return aligned ? launch_direct<float, true>(op, a, s)
                       : launch_direct<float, false>(op, a, s);
    default:
        return aligned ? launch_direct<double, true>(op, a, s)
                       : launch_direct<double, false>(op, a, s);
    }
}
