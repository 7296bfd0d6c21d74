/*
 * epilogue.cu — the elementwise epilogues of a linear layer on the GPU:
 *   forward:  y = act(x + bias[c]), preact <- x + bias
 *   backward: dz = grad_y * act'(aux), bias_grad[c] <- sum of dz over every dim but c
 * on N-dimensional strided tensors of any float dtype.
 *
 * Twin of the CPU backend's ga_cpu_bias_activation / ga_cpu_activation_backward:
 * element conversions come from kernels/convert.h and the activations from
 * kernels/activation.h, so both backends evaluate the same formulas.  matmul.cu
 * finishes its unfused paths with these two entry points as well.
 *
 * The bias-gradient reduction is deterministic without atomics and without
 * global temporaries (the ABI gives these entry points no workspace): every
 * channel is summed by exactly one thread or one block, each thread adds its
 * elements in increasing order, and a block combines its threads' partial
 * sums with a fixed-shape tree in shared memory.  The shape of that work
 * depends only on the tensors' shapes, strides and dtypes, so the same call
 * gives the same bits on every run.
 */
#include <stdint.h>
#include <string.h>

#include "../activation.h"
#include "../convert.h"
#include "../check.h"
#include "../walk.h"
#include "common.cuh"
#include "elem.cuh"

namespace
{

constexpr int kThreads = 256;    /* elementwise kernels */
constexpr int kRedThreads = 512; /* reduction blocks */

constexpr int64_t kSmallReduce = 64; /* at most this many elements: a thread per channel */
constexpr int64_t kMinTileBlocks = 128;
constexpr int64_t kMaxBlocks = 65535LL * 32;

/* The compute type: float, or double when a float64 tensor takes part. */
template <typename Acc> struct Act;
template <> struct Act<float> {
    static __device__ __forceinline__ float fwd(ga_activation a, float z)
    {
        return ga_activate_f(a, z);
    }
    static __device__ __forceinline__ float grad(ga_activation a, float z)
    {
        return ga_activation_grad_f(a, z);
    }
};
template <> struct Act<double> {
    static __device__ __forceinline__ double fwd(ga_activation a, double z)
    {
        return ga_activate_d(a, z);
    }
    static __device__ __forceinline__ double grad(ga_activation a, double z)
    {
        return ga_activation_grad_d(a, z);
    }
};

/* -------------------------------------------------------------- layouts */

/* Offsets (bytes) in the three tensors of linear element `idx` of a
 * layout's dims walked row-major, and its index along dim chan_dim (0 when
 * chan_dim is -1). */
template <typename Layout>
__device__ __forceinline__ void walk_offsets(const Layout &L, int chan_dim, int64_t idx,
                                             int64_t off[3], int64_t *chan)
{
    off[0] = off[1] = off[2] = 0;
    *chan = 0;
    for (int k = L.ndim - 1; k >= 0; k--) {
        int64_t extent = L.shape[k];
        int64_t i, q;
        if (k == 0) {
            i = idx;
            q = 0;
        } else if ((uint64_t)idx <= UINT32_MAX && (uint64_t)extent <= UINT32_MAX) {
            /* 32-bit division where it is enough: several times cheaper */
            q = (uint32_t)idx / (uint32_t)extent;
            i = (uint32_t)idx - (uint32_t)q * (uint32_t)extent;
        } else {
            q = idx / extent;
            i = idx - q * extent;
        }
        idx = q;
        off[0] += i * L.strides[0][k];
        off[1] += i * L.strides[1][k];
        off[2] += i * L.strides[2][k];
        if (k == chan_dim)
            *chan = i;
    }
}

__device__ __forceinline__ void ew_offsets(const ga_ew_layout &L, int64_t idx, int64_t off[3],
                                           int64_t *chan)
{
    walk_offsets(L, L.chan, idx, off, chan);
}

/* The reduced index r: every dim of a reduction layout is walked. */
__device__ __forceinline__ void red_offsets(const ga_red_layout &L, int64_t r, int64_t off[3])
{
    int64_t unused;
    walk_offsets(L, -1, r, off, &unused);
}

/* ------------------------------------------------------------ forward */

struct BiasActArgs {
    const char *x;
    char *y;
    char *preact; /* NULL: not written */
    const char *bias;
    ga_dtype x_dtype, y_dtype, preact_dtype, bias_dtype;
    ga_activation act;
    bool x_aligned, y_aligned, preact_aligned, bias_aligned;
};

template <typename Acc>
__global__ void bias_act_kernel(ga_ew_layout L, int64_t numel, BiasActArgs a)
{
    size_t y_size = ga_dtype_itemsize(a.y_dtype);
    size_t p_size = ga_dtype_itemsize(a.preact_dtype);
    size_t b_size = ga_dtype_itemsize(a.bias_dtype);
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < numel;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[3], c;
        ew_offsets(L, idx, off, &c);
        Acc z = (Acc)load_f(a.x_dtype, a.x + off[0], a.x_aligned);
        if (a.bias)
            z += (Acc)load_f(a.bias_dtype, a.bias + c * (int64_t)b_size, a.bias_aligned);
        if (a.preact)
            store_bits(a.preact + off[2], encode_f(a.preact_dtype, (double)z), p_size,
                       a.preact_aligned);
        Acc v = Act<Acc>::fwd(a.act, z);
        store_bits(a.y + off[1], encode_f(a.y_dtype, (double)v), y_size, a.y_aligned);
    }
}

/* ------------------------------------------------------------ backward */

struct BwdArgs {
    const char *grad;
    const char *aux; /* read only for an activation */
    char *dz;        /* NULL: not written */
    char *bias_grad; /* reductions only */
    ga_dtype grad_dtype, aux_dtype, dz_dtype, sum_dtype, bias_grad_dtype;
    ga_activation act;
    bool grad_aligned, aux_aligned, dz_aligned, bias_grad_aligned;
};

/* dz = grad * act'(aux), written to dz when there is one; returns dz as
 * stored (rounded to its dtype), which is what the bias gradient sums. */
template <typename Acc>
__device__ __forceinline__ Acc dz_value(const BwdArgs &a, Acc g, Acc x, char *dz_at)
{
    Acc v = a.act == GA_ACT_NONE ? g : g * Act<Acc>::grad(a.act, x);
    uint64_t bits = encode_f(a.sum_dtype, (double)v);
    if (dz_at)
        store_bits(dz_at, bits, ga_dtype_itemsize(a.dz_dtype), a.dz_aligned);
    return (Acc)decode_f(a.sum_dtype, bits);
}

template <typename Acc>
__global__ void act_backward_kernel(ga_ew_layout L, int64_t numel, BwdArgs a)
{
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < numel;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[3], c;
        ew_offsets(L, idx, off, &c);
        Acc g = (Acc)load_f(a.grad_dtype, a.grad + off[0], a.grad_aligned);
        Acc x =
            a.act == GA_ACT_NONE ? (Acc)0 : (Acc)load_f(a.aux_dtype, a.aux + off[1], a.aux_aligned);
        dz_value<Acc>(a, g, x, a.dz + off[2]);
    }
}

/* Adds the elements r = first, first + step, ... < R of channel c to s in
 * increasing order.  Every element is read before it is written, so dz may
 * be grad itself.  (Not unrolled by hand: with the per-element dtype
 * switches inlined, an 8-way unroll made cicc run for over ten minutes.) */
template <typename Acc>
__device__ __forceinline__ Acc reduce_channel(const ga_red_layout &L, const BwdArgs &a, int64_t c,
                                              int64_t first, int64_t step)
{
    Acc s = 0;
    const char *grad = a.grad + c * L.cstride[0];
    const char *aux = a.aux ? a.aux + c * L.cstride[1] : NULL;
    char *dz = a.dz ? a.dz + c * L.cstride[2] : NULL;
    int64_t r = first;
    for (; r < L.R; r += step) {
        int64_t off[3];
        red_offsets(L, r, off);
        Acc g = (Acc)load_f(a.grad_dtype, grad + off[0], a.grad_aligned);
        Acc x = aux ? (Acc)load_f(a.aux_dtype, aux + off[1], a.aux_aligned) : (Acc)0;
        s += dz_value<Acc>(a, g, x, dz ? dz + off[2] : NULL);
    }
    return s;
}

template <typename Acc>
__device__ __forceinline__ void store_bias_grad(const BwdArgs &a, int64_t c, Acc s)
{
    size_t size = ga_dtype_itemsize(a.bias_grad_dtype);
    store_bits(a.bias_grad + c * (int64_t)size, encode_f(a.bias_grad_dtype, (double)s), size,
               a.bias_grad_aligned);
}

/* Few elements per channel: one thread sums a whole channel. */
template <typename Acc> __global__ void bgrad_thread_kernel(ga_red_layout L, BwdArgs a)
{
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < L.C;
         c += (int64_t)gridDim.x * blockDim.x)
        store_bias_grad<Acc>(a, c, reduce_channel<Acc>(L, a, c, 0, 1));
}

/* Sums part[0 .. kRedThreads) viewed as [H][W] over H, in a fixed tree
 * order; part[ch] holds the result for column ch.  After its last barrier
 * the only thread that reads part[ch] is thread ch, which wrote it: a
 * caller that goes on to refill part (each thread its own element) needs
 * no barrier first. */
template <typename Acc, int W>
__device__ __forceinline__ void tree_reduce(Acc *part, int lane, int ch)
{
    constexpr int H = kRedThreads / W;
#pragma unroll
    for (int h = H / 2; h > 0; h >>= 1) {
        if (lane < h)
            part[lane * W + ch] += part[(lane + h) * W + ch];
        __syncthreads();
    }
}

/* The channel is the fastest-varying dim (e.g. the bias gradient of a
 * row-major activation): a block takes W neighbouring channels, its H = 512/W
 * thread rows walk the reduced index, so a warp reads whole row segments. */
template <typename Acc, int W>
__global__ void __launch_bounds__(kRedThreads) bgrad_tile_kernel(ga_red_layout L, BwdArgs a)
{
    constexpr int H = kRedThreads / W;
    __shared__ Acc part[kRedThreads];
    int ch = threadIdx.x % W, lane = threadIdx.x / W;
    for (int64_t tile = blockIdx.x; tile * W < L.C; tile += gridDim.x) {
        int64_t c = tile * W + ch;
        Acc s = c < L.C ? reduce_channel<Acc>(L, a, c, lane, H) : (Acc)0;
        part[threadIdx.x] = s;
        __syncthreads();
        tree_reduce<Acc, W>(part, lane, ch);
        if (lane == 0 && c < L.C)
            store_bias_grad<Acc>(a, c, part[ch]); /* thread ch's own element */
    }
}

/* The channel varies slower than the reduced dims (e.g. NCHW): a block per
 * channel, its threads walk the reduced index, neighbours reading
 * neighbouring elements. */
template <typename Acc>
__global__ void __launch_bounds__(kRedThreads) bgrad_block_kernel(ga_red_layout L, BwdArgs a)
{
    __shared__ Acc part[kRedThreads];
    for (int64_t c = blockIdx.x; c < L.C; c += gridDim.x) {
        part[threadIdx.x] = reduce_channel<Acc>(L, a, c, threadIdx.x, kRedThreads);
        __syncthreads();
        tree_reduce<Acc, 1>(part, threadIdx.x, 0);
        if (threadIdx.x == 0)
            store_bias_grad<Acc>(a, c, part[0]); /* thread 0's own element */
    }
}

/* ------------------------------------------------------------- checks */

unsigned grid_for(int64_t work, int64_t per_block)
{
    int64_t blocks = (work + per_block - 1) / per_block;
    if (blocks < 1)
        blocks = 1;
    return (unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

/* Whether every element of tensor k of the layout sits at a multiple of
 * its size (one wide access per element). */
bool ew_aligned(const void *p, size_t itemsize, const ga_ew_layout &L, int k)
{
    if ((uintptr_t)p % itemsize)
        return false;
    for (int d = 0; d < L.ndim; d++)
        if (L.strides[k][d] % (int64_t)itemsize)
            return false;
    return true;
}

bool red_aligned(const void *p, size_t itemsize, const ga_red_layout &L, int k)
{
    if ((uintptr_t)p % itemsize || L.cstride[k] % (int64_t)itemsize)
        return false;
    for (int d = 0; d < L.ndim; d++)
        if (L.strides[k][d] % (int64_t)itemsize)
            return false;
    return true;
}

int64_t abs64(int64_t v)
{
    return v < 0 ? -v : v;
}

/* The reduction's shape: a thread per channel when channels are short, W
 * channels per block when the channel is the fastest-varying dim of grad_y,
 * else a block per channel.  A function of shapes and strides only. */
template <typename Acc>
ga_status launch_bias_grad(const ga_red_layout &L, const BwdArgs &a, cudaStream_t s)
{
    if (L.R <= kSmallReduce) {
        GA_LAUNCH(grid_for(L.C, kThreads), kThreads, 0, s, bgrad_thread_kernel<Acc>)(L, a);
        GA_CUDA_LAUNCH_CHECK("bgrad_thread_kernel");
        return ga_ok();
    }
    bool channel_inner = L.C >= 64;
    for (int d = 0; d < L.ndim && channel_inner; d++)
        channel_inner = abs64(L.cstride[0]) < abs64(L.strides[0][d]);
    if (!channel_inner) {
        GA_LAUNCH(grid_for(L.C, 1), kRedThreads, 0, s, bgrad_block_kernel<Acc>)(L, a);
        GA_CUDA_LAUNCH_CHECK("bgrad_block_kernel");
    } else if (L.C >= 32 * kMinTileBlocks) {
        GA_LAUNCH(grid_for(L.C, 32), kRedThreads, 0, s, bgrad_tile_kernel<Acc, 32>)(L, a);
        GA_CUDA_LAUNCH_CHECK("bgrad_tile_kernel");
    } else if (L.C >= 16 * kMinTileBlocks) {
        GA_LAUNCH(grid_for(L.C, 16), kRedThreads, 0, s, bgrad_tile_kernel<Acc, 16>)(L, a);
        GA_CUDA_LAUNCH_CHECK("bgrad_tile_kernel");
    } else {
        /* narrow tiles: more blocks for a GPU-wide pass over few channels */
        GA_LAUNCH(grid_for(L.C, 8), kRedThreads, 0, s, bgrad_tile_kernel<Acc, 8>)(L, a);
        GA_CUDA_LAUNCH_CHECK("bgrad_tile_kernel");
    }
    return ga_ok();
}

} // namespace

extern "C" ga_status ga_cuda_bias_activation(int device, const ga_bias_act_desc *desc,
                                             ga_stream stream)
{
    GA_TRY_STATUS(ga_check_bias_act(desc, __func__));
    const ga_tensor *x = &desc->x, *y = &desc->y, *pre = &desc->preact;
    bool has_pre = pre->data != NULL, has_bias = desc->bias != NULL;
    const ga_tensor *ts[3] = {x, y, has_pre ? pre : NULL};
    ga_ew_layout L;
    int64_t numel = ga_ew_layout_make(x, ts, has_bias ? desc->channel_dim : -1, &L);
    if (numel == 0 || ga_bias_act_is_noop(desc))
        return ga_ok();

    BiasActArgs a;
    a.x = (const char *)x->data;
    a.y = (char *)y->data;
    a.preact = has_pre ? (char *)pre->data : NULL;
    a.bias = (const char *)desc->bias;
    a.x_dtype = x->dtype;
    a.y_dtype = y->dtype;
    a.preact_dtype = has_pre ? pre->dtype : y->dtype;
    a.bias_dtype = has_bias ? desc->bias_dtype : x->dtype;
    a.act = desc->activation;
    a.x_aligned = ew_aligned(x->data, ga_dtype_itemsize(x->dtype), L, 0);
    a.y_aligned = ew_aligned(y->data, ga_dtype_itemsize(y->dtype), L, 1);
    a.preact_aligned = has_pre && ew_aligned(pre->data, ga_dtype_itemsize(pre->dtype), L, 2);
    a.bias_aligned = has_bias && (uintptr_t)desc->bias % ga_dtype_itemsize(desc->bias_dtype) == 0;
    bool f64 = ga_bias_act_in_double(desc);

    GA_NVTX_RANGE("bias_activation");
    GA_WITH_DEVICE(device);
    cudaStream_t s = ga_cu_stream(stream);
    if (f64)
        GA_LAUNCH(grid_for(numel, kThreads), kThreads, 0, s, bias_act_kernel<double>)(L, numel, a);
    else
        GA_LAUNCH(grid_for(numel, kThreads), kThreads, 0, s, bias_act_kernel<float>)(L, numel, a);
    GA_CUDA_LAUNCH_CHECK("bias_act_kernel");
    return ga_ok();
}

extern "C" ga_status ga_cuda_activation_backward(int device, const ga_act_backward_desc *desc,
                                                 ga_stream stream)
{
    GA_TRY_STATUS(ga_check_act_backward(desc, __func__));
    const ga_tensor *g = &desc->grad_y, *aux = &desc->aux, *dz = &desc->dz;
    ga_activation act = desc->activation;
    bool has_dz = dz->data != NULL, has_bg = desc->bias_grad != NULL;
    if (ga_act_backward_is_noop(desc))
        return ga_ok();

    BwdArgs a;
    a.grad = (const char *)g->data;
    a.aux = act != GA_ACT_NONE ? (const char *)aux->data : NULL;
    a.dz = has_dz ? (char *)dz->data : NULL;
    a.bias_grad = (char *)desc->bias_grad;
    a.grad_dtype = g->dtype;
    a.aux_dtype = act != GA_ACT_NONE ? aux->dtype : g->dtype;
    a.dz_dtype = has_dz ? dz->dtype : g->dtype;
    a.sum_dtype = ga_act_backward_sum_dtype(desc);
    a.bias_grad_dtype = has_bg ? desc->bias_grad_dtype : g->dtype;
    a.act = act;
    bool f64 = ga_act_backward_in_double(desc);
    const ga_tensor *ts[3] = {g, act != GA_ACT_NONE ? aux : NULL, has_dz ? dz : NULL};

    GA_NVTX_RANGE("activation_backward");
    if (!has_bg) {
        ga_ew_layout L;
        int64_t numel = ga_ew_layout_make(g, ts, -1, &L);
        if (numel == 0)
            return ga_ok();
        a.grad_aligned = ew_aligned(g->data, ga_dtype_itemsize(g->dtype), L, 0);
        a.aux_aligned = a.aux && ew_aligned(a.aux, ga_dtype_itemsize(aux->dtype), L, 1);
        a.dz_aligned = ew_aligned(dz->data, ga_dtype_itemsize(dz->dtype), L, 2);
        a.bias_grad_aligned = false;
        GA_WITH_DEVICE(device);
        cudaStream_t s = ga_cu_stream(stream);
        unsigned grid = grid_for(numel, kThreads);
        if (f64)
            GA_LAUNCH(grid, kThreads, 0, s, act_backward_kernel<double>)(L, numel, a);
        else
            GA_LAUNCH(grid, kThreads, 0, s, act_backward_kernel<float>)(L, numel, a);
        GA_CUDA_LAUNCH_CHECK("act_backward_kernel");
        return ga_ok();
    }

    /* with a bias gradient: one pass writes dz and sums it */
    ga_red_layout L;
    ga_red_layout_make(g, ts, desc->channel_dim, &L);
    if (L.C == 0)
        return ga_ok();
    a.grad_aligned = L.R == 0 || red_aligned(g->data, ga_dtype_itemsize(g->dtype), L, 0);
    a.aux_aligned = a.aux && L.R > 0 && red_aligned(a.aux, ga_dtype_itemsize(aux->dtype), L, 1);
    a.dz_aligned = has_dz && L.R > 0 && red_aligned(dz->data, ga_dtype_itemsize(dz->dtype), L, 2);
    a.bias_grad_aligned = (uintptr_t)desc->bias_grad % ga_dtype_itemsize(a.bias_grad_dtype) == 0;
    GA_WITH_DEVICE(device);
    cudaStream_t s = ga_cu_stream(stream);
    if (f64)
        return launch_bias_grad<double>(L, a, s);
    return launch_bias_grad<float>(L, a, s);
}
