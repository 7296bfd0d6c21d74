/*
 * epilogue.cu — the elementwise epilogues of a linear layer on the GPU:
 *   forward:  y = act(x + bias[c]), preact <- x + bias
 *   backward: dz = grad_y * act'(aux), bias_grad[c] <- sum of dz over every dim but c
 * on N-dimensional strided tensors of any float dtype.
 *
 * Twin of the CPU backend's ga_cpu_bias_activation / ga_cpu_activation_backward:
 * the same roundings (kernels/convert.h's, which elem.cuh's hardware
 * conversions match bit for bit), the activations from kernels/activation.h,
 * so both backends evaluate the same formulas.  matmul.cu finishes its
 * unfused paths with these two entry points as well.
 *
 * Every kernel is written once over element-access policies (elem.cuh):
 * when the tensors share one dtype (the bias or the bias gradient may be
 * float32 beside 16-bit tensors) it is compiled for that dtype, with one
 * access and one hardware conversion per element; any other mix of dtypes
 * goes through convert.h at run time.  Dense tensors of one dtype and one
 * memory order (channels-last ones included) take a further path: 16 bytes
 * per access, and the channel index carried from element to element instead
 * of divided out.
 *
 * The bias gradient is deterministic without atomics: the reduced index is
 * cut into chunks fixed by the shape (not by the GPU), each (channel, chunk)
 * is summed by one block in a fixed order — its threads each walk their
 * stride of the chunk in increasing order, then a fixed-shape tree in
 * shared memory — into a partial sum in the caller's workspace, and a
 * second kernel adds each channel's partial sums in chunk order.  Chunks
 * split the work across the GPU whatever the channel count (64 channels of
 * 800k elements each are 64 x 25 blocks, not 8).  Without a workspace large
 * enough (ga_cuda_activation_backward_workspace) the sums take one chunk
 * per channel, in one pass.  The shape of the work depends only on the
 * tensors' shapes, strides and whether a workspace was given, so the same
 * call gives the same bits on every run and every GPU.
 */
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <type_traits>

#include "../activation.h"
#include "../check.h"
#include "../convert.h"
#include "../walk.h"
#include "common.cuh"
#include "elem.cuh"

namespace
{

constexpr int kThreads = 256;    /* elementwise kernels */
constexpr int kRedThreads = 512; /* reduction blocks */

constexpr int64_t kSmallReduce = 64; /* at most this many elements: a thread per channel */
constexpr int64_t kMaxBlocks = 65535LL * 32;

/* The reduction's chunks: each thread of a block walks about kChunkTrips
 * elements of its chunk; a channel has at most kMaxChunks chunks (so the
 * second pass, a thread per channel, adds at most that many partials) —
 * past kMaxChunks * the block's rows * kChunkTrips elements, chunks grow. */
constexpr int64_t kChunkTrips = 64;
constexpr int64_t kMaxChunks = 256;

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
        } else {
            i = ga_split_index(idx, extent, &q);
        }
        idx = q;
        off[0] += i * L.strides[0][k];
        off[1] += i * L.strides[1][k];
        off[2] += i * L.strides[2][k];
        if (k == chan_dim)
            *chan = i;
    }
}

/* The channel of the elements of a dense tensor in memory order: element i
 * has channel (i / inner) % C.  A walker divides once, then steps. */
struct ChanWalk {
    int64_t C = 1, inner = 1;

    struct At {
        int64_t c, rem; /* the channel, and i % inner */
    };
    __device__ __forceinline__ At at(int64_t i) const
    {
        int64_t q, r;
        if ((uint64_t)i <= UINT32_MAX && (uint64_t)inner <= UINT32_MAX) {
            q = (uint32_t)i / (uint32_t)inner;
            r = (uint32_t)i - (uint32_t)q * (uint32_t)inner;
        } else {
            q = i / inner;
            r = i - q * inner;
        }
        return At{C <= UINT32_MAX && (uint64_t)q <= UINT32_MAX ? (uint32_t)q % (uint32_t)C : q % C,
                  r};
    }
    __device__ __forceinline__ void step(At &a) const
    {
        if (++a.rem == inner) {
            a.rem = 0;
            if (++a.c == C)
                a.c = 0;
        }
    }
};

/* ------------------------------------------------------------ forward */

/* One bias_act call's tensors and how their elements are accessed (IO for
 * x, y and preact, BIO for the bias). */
template <typename Acc, typename IO, typename BIO> struct BiasAct {
    const char *x;
    char *y;
    char *preact; /* NULL: not written */
    const char *bias;
    int64_t bias_size;
    IO x_io, y_io, p_io;
    BIO b_io;
    ga_activation act;

    __device__ __forceinline__ Acc z_of(Acc x_value, int64_t c) const
    {
        return bias ? x_value + (Acc)b_io.load(bias + c * bias_size) : x_value;
    }
};

template <typename Acc, typename IO, typename BIO>
__global__ void bias_act_kernel(ga_ew_layout L, int64_t numel, BiasAct<Acc, IO, BIO> a)
{
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < numel;
         idx += (int64_t)gridDim.x * blockDim.x) {
        GA_TRIP();
        int64_t off[3], c;
        walk_offsets(L, L.chan, idx, off, &c);
        Acc z = a.z_of((Acc)a.x_io.load(a.x + off[0]), c);
        if (a.preact)
            a.p_io.store(a.preact + off[2], z);
        a.y_io.store(a.y + off[1], Act<Acc>::fwd(a.act, z));
    }
}

/* Dense tensors of T in one memory order: a thread takes 16 bytes of x at
 * a time (and writes 16 of y, and of preact); the elements past the last
 * whole vector go one per thread. */
template <typename T, typename BIO>
__global__ void bias_act_dense_kernel(int64_t numel, ChanWalk cw,
                                      BiasAct<typename Elem<T>::Acc, TypedIO<T>, BIO> a)
{
    using Acc = typename Elem<T>::Acc;
    constexpr int N = Vec<T>::N;
    int64_t vectors = numel / N, first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
            step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t v = first; v < vectors; v += step) {
        GA_TRIP();
        int64_t offset = v * N * (int64_t)sizeof(T);
        Vec<T> x = load_vec<T>(a.x + offset), y = {}, z = {};
        ChanWalk::At c = cw.at(v * N);
#pragma unroll
        for (int j = 0; j < N; j++) {
            Acc zj = a.z_of(Elem<T>::widen(x.v[j]), c.c);
            z.v[j] = Elem<T>::narrow(zj);
            y.v[j] = Elem<T>::narrow(Act<Acc>::fwd(a.act, zj));
            cw.step(c);
        }
        if (a.preact)
            store_vec<T>(a.preact + offset, z);
        store_vec<T>(a.y + offset, y);
    }
    for (int64_t i = vectors * N + first; i < numel; i += step) {
        GA_TRIP();
        int64_t offset = i * (int64_t)sizeof(T);
        Acc z = a.z_of(a.x_io.load(a.x + offset), cw.at(i).c);
        if (a.preact)
            a.p_io.store(a.preact + offset, z);
        a.y_io.store(a.y + offset, Act<Acc>::fwd(a.act, z));
    }
}

/* ------------------------------------------------------------ backward */

/* One activation_backward call's tensors: grad, aux (read only for an
 * activation), dz (NULL: not written) and the bias gradient, with the
 * access of each (SIO rounds dz to the dtype the sums take it in, dz's). */
template <typename Acc, typename IO, typename BGIO> struct Bwd {
    const char *grad;
    const char *aux;
    char *dz;
    char *bias_grad;
    int64_t bias_grad_size;
    IO g_io, a_io, dz_io, s_io;
    BGIO bg_io;
    ga_activation act;

    /* dz = grad * act'(aux), written to dz when there is one; returns dz as
     * stored (rounded to its dtype), which is what the bias gradient sums.
     * Every element is read before it is written, so dz may be grad. */
    __device__ __forceinline__ Acc dz_value(const char *g, const char *x, char *dz_at) const
    {
        Acc gv = (Acc)g_io.load(g);
        Acc v = act == GA_ACT_NONE ? gv : gv * Act<Acc>::grad(act, (Acc)a_io.load(x));
        if (dz_at)
            dz_io.store(dz_at, v);
        return s_io.round(v);
    }
    __device__ __forceinline__ void store_bias_grad(int64_t c, Acc s) const
    {
        bg_io.store(bias_grad + c * bias_grad_size, s);
    }
};

template <typename Acc, typename IO, typename BGIO>
__global__ void act_backward_kernel(ga_ew_layout L, int64_t numel, Bwd<Acc, IO, BGIO> a)
{
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < numel;
         idx += (int64_t)gridDim.x * blockDim.x) {
        GA_TRIP();
        int64_t off[3], c;
        walk_offsets(L, -1, idx, off, &c);
        a.dz_value(a.grad + off[0], a.aux ? a.aux + off[1] : nullptr, a.dz + off[2]);
    }
}

/* Dense grad, aux and dz of T in one memory order: 16 bytes at a time. */
template <typename T, typename BGIO>
__global__ void act_backward_dense_kernel(int64_t numel,
                                          Bwd<typename Elem<T>::Acc, TypedIO<T>, BGIO> a)
{
    using Acc = typename Elem<T>::Acc;
    constexpr int N = Vec<T>::N;
    int64_t vectors = numel / N, first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
            step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t v = first; v < vectors; v += step) {
        GA_TRIP();
        int64_t offset = v * N * (int64_t)sizeof(T);
        Vec<T> g = load_vec<T>(a.grad + offset), x = {}, dz = {};
        if (a.act != GA_ACT_NONE)
            x = load_vec<T>(a.aux + offset);
#pragma unroll
        for (int j = 0; j < N; j++) {
            Acc gv = Elem<T>::widen(g.v[j]);
            Acc d = a.act == GA_ACT_NONE ? gv : gv * Act<Acc>::grad(a.act, Elem<T>::widen(x.v[j]));
            dz.v[j] = Elem<T>::narrow(d);
        }
        store_vec<T>(a.dz + offset, dz);
    }
    for (int64_t i = vectors * N + first; i < numel; i += step) {
        GA_TRIP();
        int64_t offset = i * (int64_t)sizeof(T);
        a.dz_value(a.grad + offset, a.aux ? a.aux + offset : nullptr, a.dz + offset);
    }
}

/* ------------------------------------------------- the bias gradient */

/* The reduced elements r = first, first + step, ... < end of one channel:
 * their byte offsets in the three tensors, stepped without a division per
 * element for up to two reduced dims (the layouts of NCHW and NHWC
 * tensors), divided out for more. */
struct RedCursor {
    const ga_red_layout *L;
    int64_t r, step;
    int64_t inner = 1, inner_step = 0, outer_step = 0; /* two dims: (r / inner, r % inner) */
    int64_t i_in = 0, off[3] = {0, 0, 0};

    __device__ __forceinline__ RedCursor(const ga_red_layout &layout, int64_t first, int64_t by)
        : L(&layout), r(first), step(by)
    {
        inner = L->ndim == 2 ? L->shape[1] : 1;
        inner_step = by % inner;
        outer_step = by / inner;
        if (L->ndim <= 2) {
            int64_t o = first / inner;
            i_in = first - o * inner;
#pragma unroll
            for (int k = 0; k < 3; k++)
                off[k] = L->ndim == 2 ? o * L->strides[k][0] + i_in * L->strides[k][1]
                                      : first * L->strides[k][0];
        } else {
            int64_t unused;
            walk_offsets(*L, -1, first, off, &unused);
        }
    }
    __device__ __forceinline__ void next()
    {
        r += step;
        if (L->ndim == 1) {
#pragma unroll
            for (int k = 0; k < 3; k++)
                off[k] += step * L->strides[k][0];
        } else if (L->ndim == 2) {
            i_in += inner_step;
            int64_t carry = i_in >= inner;
            if (carry)
                i_in -= inner;
#pragma unroll
            for (int k = 0; k < 3; k++)
                off[k] += (outer_step + carry) * L->strides[k][0] +
                          (inner_step - carry * inner) * L->strides[k][1];
        } else {
            int64_t unused;
            walk_offsets(*L, -1, r, off, &unused);
        }
    }
};

/* Adds the elements r = first, first + step, ... < end of channel c to a
 * sum in increasing order (writing dz on the way). */
template <typename Acc, typename IO, typename BGIO>
__device__ __forceinline__ Acc reduce_channel(const ga_red_layout &L, const Bwd<Acc, IO, BGIO> &a,
                                              int64_t c, int64_t first, int64_t end, int64_t step)
{
    Acc s = 0;
    const char *grad = a.grad + c * L.cstride[0];
    const char *aux = a.aux ? a.aux + c * L.cstride[1] : nullptr;
    char *dz = a.dz ? a.dz + c * L.cstride[2] : nullptr;
    if (first >= end)
        return s;
    for (RedCursor at(L, first, step); at.r < end; at.next()) {
        GA_TRIP();
        s += a.dz_value(grad + at.off[0], aux ? aux + at.off[1] : nullptr,
                        dz ? dz + at.off[2] : nullptr);
    }
    return s;
}

/* Few elements per channel: one thread sums a whole channel. */
template <typename Acc, typename IO, typename BGIO>
__global__ void bgrad_thread_kernel(ga_red_layout L, Bwd<Acc, IO, BGIO> a)
{
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < L.C;
         c += (int64_t)gridDim.x * blockDim.x) {
        GA_TRIP();
        a.store_bias_grad(c, reduce_channel(L, a, c, 0, L.R, 1));
    }
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

/* One chunk's sum of channel c: the final bias gradient when the channel
 * has one chunk, else a partial sum for bgrad_finish_kernel. */
template <typename Acc, typename IO, typename BGIO>
__device__ __forceinline__ void put_chunk_sum(const Bwd<Acc, IO, BGIO> &a, Acc *partials, int64_t C,
                                              int64_t chunk, int64_t chunks, int64_t c, Acc s)
{
    if (chunks == 1)
        a.store_bias_grad(c, s);
    else
        partials[chunk * C + c] = s;
}

/* The channel is the fastest-varying dim (the bias gradient of a row-major
 * activation, or of a channels-last one): a block takes W = 32 neighbouring
 * channels of one chunk (blockIdx.y), its 16 thread rows walk the chunk's
 * reduced indices, so a warp reads a whole row segment of 32 channels. */
constexpr int kTileWidth = 32;

template <typename Acc, typename IO, typename BGIO, int W = kTileWidth>
__global__ void __launch_bounds__(kRedThreads)
    bgrad_tile_kernel(ga_red_layout L, Bwd<Acc, IO, BGIO> a, int64_t chunk_rows, Acc *partials)
{
    constexpr int H = kRedThreads / W;
    __shared__ Acc part[kRedThreads];
    int ch = threadIdx.x % W, lane = threadIdx.x / W;
    int64_t chunk = blockIdx.y, chunks = gridDim.y;
    int64_t first = chunk * chunk_rows, end = first + chunk_rows < L.R ? first + chunk_rows : L.R;
    for (int64_t tile = blockIdx.x; tile * W < L.C; tile += gridDim.x) {
        GA_TRIP();
        int64_t c = tile * W + ch;
        Acc s = c < L.C ? reduce_channel(L, a, c, first + lane, end, H) : (Acc)0;
        part[threadIdx.x] = s;
        __syncthreads();
        tree_reduce<Acc, W>(part, lane, ch);
        if (lane == 0 && c < L.C) /* thread ch's own element */
            put_chunk_sum(a, partials, L.C, chunk, chunks, c, part[ch]);
    }
}

/* The channel varies slower than the reduced dims (e.g. NCHW): a block per
 * channel and chunk (blockIdx.y), its threads walk the chunk, neighbours
 * reading neighbouring elements. */
template <typename Acc, typename IO, typename BGIO>
__global__ void __launch_bounds__(kRedThreads)
    bgrad_block_kernel(ga_red_layout L, Bwd<Acc, IO, BGIO> a, int64_t chunk_rows, Acc *partials)
{
    __shared__ Acc part[kRedThreads];
    int64_t chunk = blockIdx.y, chunks = gridDim.y;
    int64_t first = chunk * chunk_rows, end = first + chunk_rows < L.R ? first + chunk_rows : L.R;
    for (int64_t c = blockIdx.x; c < L.C; c += gridDim.x) {
        GA_TRIP();
        part[threadIdx.x] = reduce_channel(L, a, c, first + threadIdx.x, end, kRedThreads);
        __syncthreads();
        tree_reduce<Acc, 1>(part, threadIdx.x, 0);
        if (threadIdx.x == 0) /* thread 0's own element */
            put_chunk_sum(a, partials, L.C, chunk, chunks, c, part[0]);
    }
}

/* The second pass: each channel's partial sums added in chunk order. */
template <typename Acc, typename IO, typename BGIO>
__global__ void bgrad_finish_kernel(int64_t C, int64_t chunks, const Acc *partials,
                                    Bwd<Acc, IO, BGIO> a)
{
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
         c += (int64_t)gridDim.x * blockDim.x) {
        Acc s = 0;
        for (int64_t k = 0; k < chunks; k++) {
            GA_TRIP();
            s += partials[k * C + c];
        }
        a.store_bias_grad(c, s);
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

/* Whether the tensors (NULLs skipped) all have `first`'s dtype. */
bool one_dtype(const ga_tensor *first, const ga_tensor *const *others, int n)
{
    for (int k = 0; k < n; k++)
        if (others[k] && others[k]->dtype != first->dtype)
            return false;
    return true;
}

/* Whether the tensors (NULLs skipped) fill one dense block each, with the
 * same strides (one memory order, any: channels-last included) and
 * 16-byte-aligned starts; then element i of memory order sits at byte
 * i * itemsize of each, and *cw gives its index along channel_dim (-1:
 * none). */
bool dense_alike(const ga_tensor *const *ts, int n, int channel_dim, ChanWalk *cw)
{
    const ga_tensor *t0 = ts[0];
    int64_t item = (int64_t)ga_dtype_itemsize(t0->dtype);
    for (int k = 0; k < n; k++) {
        if (!ts[k])
            continue;
        if ((uintptr_t)ts[k]->data % 16)
            return false;
        for (int d = 0; d < t0->ndim; d++)
            if (t0->shape[d] > 1 && ts[k]->strides[d] != t0->strides[d])
                return false;
    }
    /* dense: the dims, from the smallest stride up, each step over the
     * ones inside it exactly */
    int order[GA_MAX_NDIM], m = 0;
    for (int d = 0; d < t0->ndim; d++)
        if (t0->shape[d] > 1)
            order[m++] = d;
    std::sort(order, order + m, [&](int a, int b) { return t0->strides[a] < t0->strides[b]; });
    int64_t extent = item;
    for (int i = 0; i < m; i++) {
        if (t0->strides[order[i]] != extent)
            return false;
        extent *= t0->shape[order[i]];
    }
    cw->C = 1;
    cw->inner = 1;
    if (channel_dim >= 0 && t0->shape[channel_dim] > 1) {
        cw->C = t0->shape[channel_dim];
        cw->inner = t0->strides[channel_dim] / item;
    }
    return true;
}

/* --------------------------------------------------------- dispatching */

/* The bias_act call with access policies IO (x, y, preact) and BIO (the
 * bias) and compute type Acc: the dense kernel when it applies, else the
 * strided one. */
template <typename Acc, typename IO, typename BIO>
ga_status launch_bias_act(const ga_ew_layout &L, int64_t numel, const BiasAct<Acc, IO, BIO> &a,
                          cudaStream_t s)
{
    GA_LAUNCH(grid_for(numel, kThreads), kThreads, 0, s, bias_act_kernel<Acc, IO, BIO>)
    (L, numel, a);
    GA_CUDA_LAUNCH_CHECK("bias_act_kernel");
    return ga_ok();
}

template <typename T, typename BIO>
ga_status launch_typed_bias_act(const ga_ew_layout &L, int64_t numel,
                                const BiasAct<typename Elem<T>::Acc, TypedIO<T>, BIO> &a,
                                bool dense, const ChanWalk &cw, cudaStream_t s)
{
    if (!dense)
        return launch_bias_act(L, numel, a, s);
    GA_LAUNCH(grid_for(numel, (int64_t)kThreads * Vec<T>::N), kThreads, 0, s,
              bias_act_dense_kernel<T, BIO>)
    (numel, cw, a);
    GA_CUDA_LAUNCH_CHECK("bias_act_dense_kernel");
    return ga_ok();
}

/* The typed bias_act of one dtype T, the bias either T or float32. */
template <typename T>
ga_status typed_bias_act(const ga_bias_act_desc *desc, const ga_ew_layout &L, int64_t numel,
                         bool dense, const ChanWalk &cw, cudaStream_t s)
{
    using Acc = typename Elem<T>::Acc;
    const ga_tensor *pre = &desc->preact;
    if (!desc->bias || desc->bias_dtype == desc->x.dtype) {
        BiasAct<Acc, TypedIO<T>, TypedIO<T>> a = {(const char *)desc->x.data,
                                                  (char *)desc->y.data,
                                                  pre->data ? (char *)pre->data : nullptr,
                                                  (const char *)desc->bias,
                                                  sizeof(T),
                                                  {},
                                                  {},
                                                  {},
                                                  {},
                                                  desc->activation};
        return launch_typed_bias_act<T>(L, numel, a, dense, cw, s);
    }
    if constexpr (!std::is_same<T, double>::value) { /* a float32 bias beside 16-bit tensors */
        BiasAct<Acc, TypedIO<T>, TypedIO<float>> a = {(const char *)desc->x.data,
                                                      (char *)desc->y.data,
                                                      pre->data ? (char *)pre->data : nullptr,
                                                      (const char *)desc->bias,
                                                      sizeof(float),
                                                      {},
                                                      {},
                                                      {},
                                                      {},
                                                      desc->activation};
        return launch_typed_bias_act<T>(L, numel, a, dense, cw, s);
    }
    return GA_STATUS(GA_ERR_INVALID_VALUE, "bias_activation: no typed path for this bias dtype");
}

/* The reduction's plan: which kernel, how many chunks of how many rows. */
struct ReducePlan {
    enum Kind { THREAD, BLOCK, TILE } kind = THREAD;
    int64_t chunk_rows = 0, chunks = 1;
    size_t workspace = 0; /* bytes of partial sums when chunks > 1 */
};

/* A function of the layout, the compute type's size and whether the
 * caller's workspace holds the partial sums: never of the GPU. */
ReducePlan plan_reduction(const ga_red_layout &L, size_t acc_size, size_t workspace_size)
{
    ReducePlan p;
    if (L.R <= kSmallReduce)
        return p; /* THREAD: one chunk */
    bool channel_inner = L.C >= 64;
    for (int d = 0; d < L.ndim && channel_inner; d++)
        channel_inner = abs64(L.cstride[0]) < abs64(L.strides[0][d]);
    /* chunks spread the work whatever the channel count, so tiles can be
     * as wide as a warp (a whole row segment per load) */
    p.kind = channel_inner ? ReducePlan::TILE : ReducePlan::BLOCK;
    int64_t rows = channel_inner ? kRedThreads / kTileWidth : kRedThreads;
    int64_t chunk = rows * kChunkTrips;
    int64_t chunks = (L.R + chunk - 1) / chunk;
    if (chunks > kMaxChunks) {
        chunk = ((L.R + kMaxChunks - 1) / kMaxChunks + rows - 1) / rows * rows;
        chunks = (L.R + chunk - 1) / chunk;
    }
    size_t need = (size_t)chunks * (size_t)L.C * acc_size;
    if (chunks > 1 && need <= workspace_size) {
        p.chunk_rows = chunk;
        p.chunks = chunks;
        p.workspace = need;
    } else {
        p.chunk_rows = L.R;
        p.chunks = 1;
    }
    return p;
}

template <typename Acc, typename IO, typename BGIO>
ga_status launch_bias_grad(const ga_red_layout &L, const Bwd<Acc, IO, BGIO> &a, const ReducePlan &p,
                           void *workspace, cudaStream_t s)
{
    Acc *partials = (Acc *)workspace;
    unsigned chunks = (unsigned)p.chunks;
    switch (p.kind) {
    case ReducePlan::THREAD:
        GA_LAUNCH(grid_for(L.C, kThreads), kThreads, 0, s, bgrad_thread_kernel<Acc, IO, BGIO>)
        (L, a);
        GA_CUDA_LAUNCH_CHECK("bgrad_thread_kernel");
        return ga_ok();
    case ReducePlan::BLOCK:
        GA_LAUNCH(dim3(grid_for(L.C, 1), chunks), kRedThreads, 0, s,
                  bgrad_block_kernel<Acc, IO, BGIO>)
        (L, a, p.chunk_rows, partials);
        GA_CUDA_LAUNCH_CHECK("bgrad_block_kernel");
        break;
    case ReducePlan::TILE:
        GA_LAUNCH(dim3(grid_for(L.C, kTileWidth), chunks), kRedThreads, 0, s,
                  bgrad_tile_kernel<Acc, IO, BGIO>)
        (L, a, p.chunk_rows, partials);
        GA_CUDA_LAUNCH_CHECK("bgrad_tile_kernel");
        break;
    }
    if (p.chunks > 1) {
        GA_LAUNCH(grid_for(L.C, kThreads), kThreads, 0, s, bgrad_finish_kernel<Acc, IO, BGIO>)
        (L.C, p.chunks, partials, a);
        GA_CUDA_LAUNCH_CHECK("bgrad_finish_kernel");
    }
    return ga_ok();
}

/* Everything an activation_backward call decides before its launch. */
struct BwdCall {
    const ga_tensor *g, *aux, *dz; /* aux, dz NULL when not read / written */
    const ga_tensor *ts[3];
    bool has_bg, f64, typed;
    ga_dtype sum_dtype;
};

BwdCall describe_backward(const ga_act_backward_desc *desc)
{
    BwdCall c;
    c.g = &desc->grad_y;
    c.aux = desc->activation != GA_ACT_NONE ? &desc->aux : nullptr;
    c.dz = desc->dz.data ? &desc->dz : nullptr;
    c.ts[0] = c.g;
    c.ts[1] = c.aux;
    c.ts[2] = c.dz;
    c.has_bg = desc->bias_grad != NULL;
    c.f64 = ga_act_backward_in_double(desc) != 0;
    c.sum_dtype = ga_act_backward_sum_dtype(desc);
    /* one dtype for grad, aux, dz and the sums; the bias gradient that or
     * float32 (float64 only beside float64) */
    const ga_tensor *others[2] = {c.aux, c.dz};
    c.typed = one_dtype(c.g, others, 2) && c.sum_dtype == c.g->dtype &&
              (!c.has_bg || desc->bias_grad_dtype == c.g->dtype ||
               (desc->bias_grad_dtype == GA_FLOAT32 && c.g->dtype != GA_FLOAT64));
    return c;
}

/* The call's partial-sum layout and plan (the workspace asked for). */
ReducePlan backward_plan(const ga_act_backward_desc *desc, const BwdCall &c, size_t workspace_size,
                         ga_red_layout *L)
{
    ga_red_layout_make(c.g, c.ts, desc->channel_dim, L);
    return plan_reduction(*L, c.f64 ? sizeof(double) : sizeof(float), workspace_size);
}

/* The backward call with access policies chosen: elementwise (no bias
 * gradient), or dz and the bias gradient in one pass over the data. */
template <typename Acc, typename IO, typename BGIO>
ga_status run_backward(const ga_act_backward_desc *desc, const BwdCall &c,
                       const Bwd<Acc, IO, BGIO> &a, cudaStream_t s)
{
    if (!c.has_bg) {
        ga_ew_layout L;
        int64_t numel = ga_ew_layout_make(c.g, c.ts, -1, &L);
        if (numel == 0)
            return ga_ok();
        GA_LAUNCH(grid_for(numel, kThreads), kThreads, 0, s, act_backward_kernel<Acc, IO, BGIO>)
        (L, numel, a);
        GA_CUDA_LAUNCH_CHECK("act_backward_kernel");
        return ga_ok();
    }
    ga_red_layout L;
    ReducePlan p = backward_plan(desc, c, desc->workspace ? desc->workspace_size : 0, &L);
    if (L.C == 0)
        return ga_ok();
    return launch_bias_grad(L, a, p, desc->workspace, s);
}

template <typename T, typename BGIO>
ga_status run_typed_backward(const ga_act_backward_desc *desc, const BwdCall &c,
                             size_t bias_grad_size, cudaStream_t s)
{
    using Acc = typename Elem<T>::Acc;
    Bwd<Acc, TypedIO<T>, BGIO> a = {(const char *)c.g->data,
                                    c.aux ? (const char *)c.aux->data : nullptr,
                                    c.dz ? (char *)c.dz->data : nullptr,
                                    (char *)desc->bias_grad,
                                    (int64_t)bias_grad_size,
                                    {},
                                    {},
                                    {},
                                    {},
                                    {},
                                    desc->activation};
    ChanWalk unused;
    if (!c.has_bg && c.dz && dense_alike(c.ts, 3, -1, &unused)) {
        int64_t numel = ga_numel(c.g);
        GA_LAUNCH(grid_for(numel, (int64_t)kThreads * Vec<T>::N), kThreads, 0, s,
                  act_backward_dense_kernel<T, BGIO>)
        (numel, a);
        GA_CUDA_LAUNCH_CHECK("act_backward_dense_kernel");
        return ga_ok();
    }
    return run_backward(desc, c, a, s);
}

template <typename T>
ga_status typed_backward(const ga_act_backward_desc *desc, const BwdCall &c, cudaStream_t s)
{
    if constexpr (!std::is_same<T, double>::value) { /* float32 sums of 16-bit gradients */
        if (c.has_bg && desc->bias_grad_dtype != c.g->dtype)
            return run_typed_backward<T, TypedIO<float>>(desc, c, sizeof(float), s);
    }
    return run_typed_backward<T, TypedIO<T>>(desc, c, sizeof(T), s);
}

/* Whether the typed paths may take tensor k of a layout: element-aligned
 * (a view may start anywhere; those take the run-time path). */
bool typed_ok(const ga_tensor *const *ts, int n)
{
    for (int k = 0; k < n; k++) {
        if (!ts[k])
            continue;
        size_t item = ga_dtype_itemsize(ts[k]->dtype);
        if ((uintptr_t)ts[k]->data % item)
            return false;
        for (int d = 0; d < ts[k]->ndim; d++)
            if (ts[k]->shape[d] > 1 && ts[k]->strides[d] % (int64_t)item)
                return false;
    }
    return true;
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

    GA_NVTX_RANGE("bias_activation");
    GA_WITH_DEVICE(device);
    cudaStream_t s = ga_cu_stream(stream);
    const ga_tensor *others[2] = {y, has_pre ? pre : NULL};
    size_t bias_size = has_bias ? ga_dtype_itemsize(desc->bias_dtype) : 0;
    bool typed = one_dtype(x, others, 2) && typed_ok(ts, 3) &&
                 (!has_bias || ((uintptr_t)desc->bias % bias_size == 0 &&
                                (desc->bias_dtype == x->dtype ||
                                 (desc->bias_dtype == GA_FLOAT32 && x->dtype != GA_FLOAT64))));
    if (typed) {
        ChanWalk cw;
        bool dense = dense_alike(ts, 3, has_bias ? desc->channel_dim : -1, &cw);
        switch (x->dtype) {
        case GA_FLOAT16: return typed_bias_act<__half>(desc, L, numel, dense, cw, s);
        case GA_BFLOAT16: return typed_bias_act<__nv_bfloat16>(desc, L, numel, dense, cw, s);
        case GA_FLOAT32: return typed_bias_act<float>(desc, L, numel, dense, cw, s);
        default: return typed_bias_act<double>(desc, L, numel, dense, cw, s);
        }
    }
    /* any mix of dtypes: convert.h at run time */
    DynIO xio = {x->dtype, ew_aligned(x->data, ga_dtype_itemsize(x->dtype), L, 0)};
    DynIO yio = {y->dtype, ew_aligned(y->data, ga_dtype_itemsize(y->dtype), L, 1)};
    DynIO pio = {has_pre ? pre->dtype : y->dtype,
                 has_pre && ew_aligned(pre->data, ga_dtype_itemsize(pre->dtype), L, 2)};
    DynIO bio = {has_bias ? desc->bias_dtype : x->dtype,
                 has_bias && (uintptr_t)desc->bias % bias_size == 0};
    /* one body for both accumulators: acc is a value of the type */
    auto run = [&](auto acc) {
        BiasAct<decltype(acc), DynIO, DynIO> a = {(const char *)x->data,
                                                  (char *)y->data,
                                                  has_pre ? (char *)pre->data : nullptr,
                                                  (const char *)desc->bias,
                                                  (int64_t)bias_size,
                                                  xio,
                                                  yio,
                                                  pio,
                                                  bio,
                                                  desc->activation};
        return launch_bias_act(L, numel, a, s);
    };
    return ga_bias_act_in_double(desc) ? run(0.0) : run(0.0f);
}

extern "C" size_t ga_cuda_activation_backward_workspace(const ga_act_backward_desc *desc)
{
    if (ga_check_act_backward(desc, __func__).error || !desc->bias_grad ||
        ga_act_backward_is_noop(desc))
        return 0;
    BwdCall c = describe_backward(desc);
    ga_red_layout L;
    return backward_plan(desc, c, SIZE_MAX, &L).workspace;
}

extern "C" ga_status ga_cuda_activation_backward(int device, const ga_act_backward_desc *desc,
                                                 ga_stream stream)
{
    GA_TRY_STATUS(ga_check_act_backward(desc, __func__));
    if (ga_act_backward_is_noop(desc))
        return ga_ok();
    BwdCall c = describe_backward(desc);
    if (!c.has_bg && ga_numel(c.g) == 0)
        return ga_ok();

    GA_NVTX_RANGE("activation_backward");
    GA_WITH_DEVICE(device);
    cudaStream_t s = ga_cu_stream(stream);
    size_t bg_size = c.has_bg ? ga_dtype_itemsize(desc->bias_grad_dtype) : 0;
    bool bg_aligned = c.has_bg && (uintptr_t)desc->bias_grad % bg_size == 0;
    if (c.typed && typed_ok(c.ts, 3) && (!c.has_bg || bg_aligned)) {
        switch (c.g->dtype) {
        case GA_FLOAT16: return typed_backward<__half>(desc, c, s);
        case GA_BFLOAT16: return typed_backward<__nv_bfloat16>(desc, c, s);
        case GA_FLOAT32: return typed_backward<float>(desc, c, s);
        default: return typed_backward<double>(desc, c, s);
        }
    }
    /* any mix of dtypes: convert.h at run time; alignment per tensor as
     * the walk (elementwise or reduction) sees it */
    bool aligned[3] = {false, false, false};
    if (!c.has_bg) {
        ga_ew_layout L;
        if (ga_ew_layout_make(c.g, c.ts, -1, &L) == 0)
            return ga_ok();
        for (int k = 0; k < 3; k++)
            aligned[k] =
                c.ts[k] && ew_aligned(c.ts[k]->data, ga_dtype_itemsize(c.ts[k]->dtype), L, k);
    } else {
        ga_red_layout L;
        ga_red_layout_make(c.g, c.ts, desc->channel_dim, &L);
        for (int k = 0; k < 3; k++)
            aligned[k] = c.ts[k] && L.R > 0 &&
                         red_aligned(c.ts[k]->data, ga_dtype_itemsize(c.ts[k]->dtype), L, k);
    }
    DynIO gio = {c.g->dtype, aligned[0]};
    DynIO aio = {c.aux ? c.aux->dtype : c.g->dtype, aligned[1]};
    DynIO dzio = {c.dz ? c.dz->dtype : c.g->dtype, aligned[2]};
    DynIO sio = {c.sum_dtype, true};
    DynIO bgio = {c.has_bg ? desc->bias_grad_dtype : c.g->dtype, bg_aligned};
    /* as in ga_cuda_bias_activation */
    auto run = [&](auto acc) {
        Bwd<decltype(acc), DynIO, DynIO> a = {(const char *)c.g->data,
                                              c.aux ? (const char *)c.aux->data : nullptr,
                                              c.dz ? (char *)c.dz->data : nullptr,
                                              (char *)desc->bias_grad,
                                              (int64_t)bg_size,
                                              gio,
                                              aio,
                                              dzio,
                                              sio,
                                              bgio,
                                              desc->activation};
        return run_backward(desc, c, a, s);
    };
    return c.f64 ? run(0.0) : run(0.0f);
}
