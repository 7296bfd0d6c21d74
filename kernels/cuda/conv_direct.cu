/*
 * conv_direct.cu — the direct-convolution kernels of conv_direct.cuh.
 *
 * One thread per output element for forward and backward data, one block
 * per filter element for backward filter; sums in a fixed order
 * (deterministic), in float (double for float64), over byte strides of any
 * sign.  conv.cu runs them when cuDNN cannot (and for float64, where cuDNN
 * has no graph engine for double); fallback.h's entry points run them on
 * their own, with conv.cu's checks (the simulator build has no cuDNN).
 */
#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "../activation.h"
#include "../check.h"
#include "common.cuh"
#include "conv_direct.cuh"
#include "elem.cuh"
#include "fallback.h"

namespace
{

/* One problem: x (N, C, H, W), w (K, Cg, R, S), y (N, K, P, Q) in logical
 * NCHW order, any byte strides. */
struct DirectArgs {
    char *x, *w, *y;  /* conv roles; which ones are written depends on the op */
    const char *bias; /* forward: K contiguous values, or null */
    char *preact;     /* forward: written when set */
    int64_t N, C, H, W, K, R, S, P, Q, Cg, Kg;
    int64_t xs[4], ws[4], ys[4], ps[4]; /* byte strides */
    int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
    ga_activation act;
};

constexpr int kThreads = 256; /* a power of two */
constexpr int64_t kMaxBlocks = 65535LL * 8;

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
__host__ __device__ __forceinline__ void fwd_element(const DirectArgs &a, int64_t i)
{
    using Acc = typename Elem<T>::Acc;
    int64_t q = i % a.Q, t = i / a.Q;
    int64_t p = t % a.P;
    t /= a.P;
    int64_t k = t % a.K, n = t / a.K;
    int64_t c0 = k / a.Kg * a.Cg; /* first input channel of k's group */
    Acc acc = 0;
    for (int64_t c = 0; c < a.Cg; c++) {
        GA_TRIP();
        const char *xc = a.x + n * a.xs[0] + (c0 + c) * a.xs[1];
        const char *wc = a.w + k * a.ws[0] + c * a.ws[1];
        for (int64_t r = 0; r < a.R; r++) {
            GA_TRIP();
            int64_t h = p * a.stride_h - a.pad_h + r * a.dil_h;
            if (h < 0 || h >= a.H)
                continue;
            for (int64_t s = 0; s < a.S; s++) {
                GA_TRIP();
                int64_t w = q * a.stride_w - a.pad_w + s * a.dil_w;
                if (w < 0 || w >= a.W)
                    continue;
                acc += load_elem<T, A>(xc + h * a.xs[2] + w * a.xs[3]) *
                       load_elem<T, A>(wc + r * a.ws[2] + s * a.ws[3]);
            }
        }
    }
    if (a.bias)
        acc += load_elem<T, A>(a.bias + k * (int64_t)sizeof(T));
    if (a.preact)
        store_elem<T, A>(a.preact + n * a.ps[0] + k * a.ps[1] + p * a.ps[2] + q * a.ps[3], acc);
    store_elem<T, A>(a.y + n * a.ys[0] + k * a.ys[1] + p * a.ys[2] + q * a.ys[3],
                     activate(a.act, acc));
}

/* dx[n, c, h, w] = sum over k in c's group, r, s with h = p*stride - pad +
 * r*dil (and likewise w) of dy[n, k, p, q] * w[k, c - c0, r, s]. */
template <typename T, bool A>
__host__ __device__ __forceinline__ void bwd_data_element(const DirectArgs &a, int64_t i)
{
    using Acc = typename Elem<T>::Acc;
    int64_t w = i % a.W, t = i / a.W;
    int64_t h = t % a.H;
    t /= a.H;
    int64_t c = t % a.C, n = t / a.C;
    int64_t k0 = c / a.Cg * a.Kg, cl = c % a.Cg;
    Acc acc = 0;
    for (int64_t r = 0; r < a.R; r++) {
        GA_TRIP();
        int64_t hp = h + a.pad_h - r * a.dil_h;
        if (hp < 0 || hp % a.stride_h)
            continue;
        int64_t p = hp / a.stride_h;
        if (p >= a.P)
            continue;
        for (int64_t s = 0; s < a.S; s++) {
            GA_TRIP();
            int64_t wq = w + a.pad_w - s * a.dil_w;
            if (wq < 0 || wq % a.stride_w)
                continue;
            int64_t q = wq / a.stride_w;
            if (q >= a.Q)
                continue;
            for (int64_t k = k0; k < k0 + a.Kg; k++) {
                GA_TRIP();
                acc +=
                    load_elem<T, A>(a.y + n * a.ys[0] + k * a.ys[1] + p * a.ys[2] + q * a.ys[3]) *
                    load_elem<T, A>(a.w + k * a.ws[0] + cl * a.ws[1] + r * a.ws[2] + s * a.ws[3]);
            }
        }
    }
    store_elem<T, A>(a.x + n * a.xs[0] + c * a.xs[1] + h * a.xs[2] + w * a.xs[3], acc);
}

/* dw[k, c, r, s] = sum over n, p, q of dy[n, k, p, q] * x[n, c0 + c, h, w].
 * One slice of that sum: the terms j = first, first + step, ... of the
 * N*P*Q in n, p, q order. */
template <typename T, bool A>
__host__ __device__ __forceinline__ typename Elem<T>::Acc
bwd_filter_slice(const DirectArgs &a, int64_t e, int64_t first, int64_t step)
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
        GA_TRIP();
        int64_t q = j % a.Q, u = j / a.Q;
        int64_t p = u % a.P, n = u / a.P;
        int64_t h = p * a.stride_h - a.pad_h + r * a.dil_h;
        int64_t w = q * a.stride_w - a.pad_w + s * a.dil_w;
        if (h < 0 || h >= a.H || w < 0 || w >= a.W)
            continue;
        acc += load_elem<T, A>(a.y + n * a.ys[0] + k * a.ys[1] + p * a.ys[2] + q * a.ys[3]) *
               load_elem<T, A>(a.x + n * a.xs[0] + cx * a.xs[1] + h * a.xs[2] + w * a.xs[3]);
    }
    return acc;
}

template <typename T, bool A>
__host__ __device__ __forceinline__ void bwd_filter_store(const DirectArgs &a, int64_t e,
                                                          typename Elem<T>::Acc v)
{
    int64_t s = e % a.S, t = e / a.S;
    int64_t r = t % a.R;
    t /= a.R;
    int64_t c = t % a.Cg, k = t / a.Cg;
    store_elem<T, A>(a.w + k * a.ws[0] + c * a.ws[1] + r * a.ws[2] + s * a.ws[3], v);
}

template <typename T, bool A> __global__ void conv_fwd_direct(DirectArgs a)
{
    int64_t total = a.N * a.K * a.P * a.Q;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        GA_TRIP();
        fwd_element<T, A>(a, i);
    }
}

template <typename T, bool A> __global__ void conv_bwd_data_direct(DirectArgs a)
{
    int64_t total = a.N * a.C * a.H * a.W;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        GA_TRIP();
        bwd_data_element<T, A>(a, i);
    }
}

/* A long reduction per filter element: a block per element, each thread
 * summing a fixed slice and the block adding the slices in a fixed tree, so
 * the result does not depend on scheduling. */
template <typename T, bool A> __global__ void conv_bwd_filter_direct(DirectArgs a)
{
    using Acc = typename Elem<T>::Acc;
    __shared__ Acc partial[kThreads];
    int64_t total = a.K * a.Cg * a.R * a.S;
    for (int64_t e = blockIdx.x; e < total; e += gridDim.x) {
        GA_TRIP();
        partial[threadIdx.x] = bwd_filter_slice<T, A>(a, e, threadIdx.x, kThreads);
        __syncthreads();
        for (int half = kThreads / 2; half > 0; half /= 2) {
            if ((int)threadIdx.x < half)
                partial[threadIdx.x] += partial[threadIdx.x + half];
            __syncthreads();
        }
        /* after the tree's last barrier, thread 0 alone reads partial[0],
         * which it wrote; the next element's sums go each thread to its own
         * partial[], so they need no barrier first */
        if (threadIdx.x == 0)
            bwd_filter_store<T, A>(a, e, partial[0]);
    }
}

unsigned grid_for(int64_t n)
{
    int64_t blocks = (n + kThreads - 1) / kThreads;
    return (unsigned)std::max<int64_t>(1, std::min(blocks, kMaxBlocks));
}

template <typename T, bool A>
ga_status launch_direct(GaConvOp op, const DirectArgs &a, cudaStream_t s)
{
    switch (op) {
    case GA_CONV_FWD:
        GA_LAUNCH(grid_for(a.N * a.K * a.P * a.Q), kThreads, 0, s, conv_fwd_direct<T, A>)(a);
        GA_CUDA_LAUNCH_CHECK("conv_fwd_direct");
        break;
    case GA_CONV_BWD_DATA:
        GA_LAUNCH(grid_for(a.N * a.C * a.H * a.W), kThreads, 0, s, conv_bwd_data_direct<T, A>)(a);
        GA_CUDA_LAUNCH_CHECK("conv_bwd_data_direct");
        break;
    case GA_CONV_BWD_FILTER: {
        int64_t elements = a.K * a.Cg * a.R * a.S;
        unsigned blocks = (unsigned)std::max<int64_t>(1, std::min<int64_t>(elements, 1 << 20));
        GA_LAUNCH(blocks, kThreads, 0, s, conv_bwd_filter_direct<T, A>)(a);
        GA_CUDA_LAUNCH_CHECK("conv_bwd_filter_direct");
        break;
    }
    }
    return ga_ok();
}

ga_status launch_dtype(GaConvOp op, ga_dtype dtype, bool aligned, const DirectArgs &a,
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

/* Every element of t sits at a multiple of itemsize. */
bool aligned_tensor(const ga_tensor &t, int64_t itemsize)
{
    if ((uintptr_t)t.data % (uintptr_t)itemsize)
        return false;
    for (int d = 0; d < 4; d++)
        if (t.shape[d] > 1 && t.strides[d] % itemsize)
            return false;
    return true;
}

int64_t out_size(int64_t in, int pad, int dil, int64_t k, int stride)
{
    int64_t span = in + 2 * (int64_t)pad - (int64_t)dil * (k - 1) - 1;
    return span < 0 ? 0 : span / stride + 1;
}

} // namespace

ga_status ga_conv_direct(GaConvOp op, const ga_conv_geometry &g, const ga_tensor &x,
                         const ga_tensor &w, const ga_tensor &y, const void *bias,
                         ga_activation act, const ga_tensor *preact, cudaStream_t s)
{
    bool fwd = op == GA_CONV_FWD;
    DirectArgs a;
    memset(&a, 0, sizeof a);
    a.x = (char *)x.data;
    a.w = (char *)w.data;
    a.y = (char *)y.data;
    a.bias = fwd ? (const char *)bias : nullptr;
    a.preact = fwd && preact && preact->data ? (char *)preact->data : nullptr;
    a.N = x.shape[0];
    a.C = x.shape[1];
    a.H = x.shape[2];
    a.W = x.shape[3];
    a.K = w.shape[0];
    a.Cg = w.shape[1];
    a.R = w.shape[2];
    a.S = w.shape[3];
    a.P = y.shape[2];
    a.Q = y.shape[3];
    a.Kg = a.K / g.groups;
    for (int d = 0; d < 4; d++) {
        a.xs[d] = x.strides[d];
        a.ws[d] = w.strides[d];
        a.ys[d] = y.strides[d];
        a.ps[d] = a.preact ? preact->strides[d] : 0;
    }
    a.stride_h = g.stride[0];
    a.stride_w = g.stride[1];
    a.pad_h = g.padding[0];
    a.pad_w = g.padding[1];
    a.dil_h = g.dilation[0];
    a.dil_w = g.dilation[1];
    a.act = fwd ? act : GA_ACT_NONE;
    int64_t is = (int64_t)ga_dtype_itemsize(x.dtype);
    bool aligned = aligned_tensor(x, is) && aligned_tensor(w, is) && aligned_tensor(y, is) &&
                   (!a.bias || (uintptr_t)a.bias % (uintptr_t)is == 0) &&
                   (!a.preact || aligned_tensor(*preact, is));
    return launch_dtype(op, x.dtype, aligned, a, s);
}

ga_status ga_conv_check(const ga_conv_geometry *g, const ga_tensor *x, const ga_tensor *w,
                        const ga_tensor *y)
{
    if (!g || !x || !w || !y)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: a required argument is NULL");
    if (x->ndim != 4 || w->ndim != 4 || y->ndim != 4)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: tensors must have 4 dims (NCHW order)");
    if (!ga_dtype_is_float(x->dtype) || w->dtype != x->dtype || y->dtype != x->dtype)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: tensors must share one float dtype");
    for (int d = 0; d < 4; d++)
        if (x->shape[d] < 0 || w->shape[d] < 0 || y->shape[d] < 0)
            return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: negative dimension");
    for (int i = 0; i < 2; i++)
        if (g->stride[i] < 1 || g->dilation[i] < 1 || g->padding[i] < 0)
            return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: bad stride, padding or dilation");
    int64_t groups = g->groups;
    if (groups < 1 || x->shape[1] % groups || w->shape[0] % groups ||
        w->shape[1] * groups != x->shape[1])
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: channels do not match the groups");
    if (y->shape[0] != x->shape[0] || y->shape[1] != w->shape[0] ||
        y->shape[2] !=
            out_size(x->shape[2], g->padding[0], g->dilation[0], w->shape[2], g->stride[0]) ||
        y->shape[3] !=
            out_size(x->shape[3], g->padding[1], g->dilation[1], w->shape[3], g->stride[1]))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: output shape does not match the input");
    if ((ga_numel(x) && !x->data) || (ga_numel(w) && !w->data) || (ga_numel(y) && !y->data))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: NULL data for a non-empty tensor");
    return ga_ok();
}

ga_status ga_conv_check_forward(const ga_conv_desc *desc)
{
    if (!desc)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: desc is NULL");
    GA_TRY_STATUS(ga_conv_check(&desc->geom, &desc->x, &desc->w, &desc->y));
    if (!ga_activation_is_valid(desc->activation))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: unknown activation");
    const ga_tensor *pre = &desc->preact;
    if (pre->data) {
        if (pre->ndim != 4 || pre->dtype != desc->y.dtype)
            return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: preact must be shaped and typed as y");
        for (int d = 0; d < 4; d++)
            if (pre->shape[d] != desc->y.shape[d])
                return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: preact must have y's shape");
    }
    return ga_ok();
}

/* ======================================================== entry points */

extern "C" ga_status ga_cuda_conv2d_forward_direct(int device, const ga_conv_desc *desc,
                                                   ga_stream stream)
{
    GA_TRY_STATUS(ga_conv_check_forward(desc));
    if (ga_numel(&desc->y) == 0)
        return ga_ok();
    GA_WITH_DEVICE(device);
    return ga_conv_direct(GA_CONV_FWD, desc->geom, desc->x, desc->w, desc->y, desc->bias,
                          desc->activation, &desc->preact, ga_cu_stream(stream));
}

/* Both backward ops in conv roles: x and w (dx, or dw) written from the
 * other two. */
static ga_status backward_direct(int device, GaConvOp op, const ga_conv_geometry *geom,
                                 const ga_tensor *x, const ga_tensor *w, const ga_tensor *y,
                                 ga_stream stream)
{
    GA_TRY_STATUS(ga_conv_check(geom, x, w, y));
    if (ga_numel(op == GA_CONV_BWD_DATA ? x : w) == 0)
        return ga_ok();
    GA_WITH_DEVICE(device);
    return ga_conv_direct(op, *geom, *x, *w, *y, nullptr, GA_ACT_NONE, nullptr,
                          ga_cu_stream(stream));
}

extern "C" ga_status ga_cuda_conv2d_backward_data_direct(int device, const ga_conv_geometry *geom,
                                                         const ga_tensor *dy, const ga_tensor *w,
                                                         const ga_tensor *dx, ga_stream stream)
{
    return backward_direct(device, GA_CONV_BWD_DATA, geom, dx, w, dy, stream);
}

extern "C" ga_status ga_cuda_conv2d_backward_filter_direct(int device, const ga_conv_geometry *geom,
                                                           const ga_tensor *x, const ga_tensor *dy,
                                                           const ga_tensor *dw, ga_stream stream)
{
    return backward_direct(device, GA_CONV_BWD_FILTER, geom, x, dw, dy, stream);
}
