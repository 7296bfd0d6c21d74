/*
 * conv.cu — 2-D convolution on the GPU: forward (with bias, activation and
 * the pre-activation output fused in), backward data and backward filter.
 *
 * The work goes to cuDNN's graph (backend) API (cudnn_graph.cuh: the
 * descriptors, handles and plan search any graph uses; this file describes
 * convolutions and picks routes).  Each call describes its problem as an
 * operation graph — conv fprop [-> add bias] [-> activation]
 * for forward, one dgrad or wgrad operation for the backward ops — and
 * runs an execution plan for it.  Plans are chosen once per problem, like
 * torch.backends.cudnn.benchmark, but the choice is also handed to the
 * caller as a short string ("eng12:k1=0,k3=2") so that the next process can
 * rebuild exactly that engine configuration without timing again.
 *
 * Routes, tried in this order until one works:
 *   graph    the requested graph (the fused one when there is an epilogue;
 *            its activation one of cuDNN's pointwise modes: RELU_FWD,
 *            GELU_FWD (erf), GELU_APPROX_TANH_FWD, SWISH_FWD (beta 1: silu),
 *            SIGMOID_FWD — cuDNN has none for hardswish, whose layers start
 *            at the next route);
 *   split    (bias and an activation) conv + bias as the graph, into the
 *            pre-activation (or y), then the activation by
 *            ga_cuda_bias_activation: conv -> add -> act fuses only on
 *            runtime-fusion engines for anything but ReLU (cuDNN's
 *            conv-bias-activation engines know ReLU and identity), while
 *            conv -> add fuses on as many engines as the conv alone — and a
 *            saved pre-activation is written once either way;
 *   unfused  conv-only graph into y, then ga_cuda_bias_activation (fused
 *            graphs need runtime-fusion engines, which many layouts,
 *            dtypes and GPUs lack);
 *   direct   gpuaccel's own direct-convolution kernels (conv_direct.cu):
 *            slow, but correct for every stride pattern, group count and
 *            float dtype.
 * The route and engine that worked are cached per problem (plan_cache.h),
 * failures included, so a problem pays for the search once per process.
 * Why a problem did not get its fused graph is cached with it and
 * reported on every call (ga_op_report.reason, see kernels.h).
 *
 * CUDA graph capture: a capturing call runs a plan this thread has ready,
 * or the direct kernels; it never tunes (heuristics, finalization, trial
 * runs, timing) inside the capture, and fails with a message asking for
 * an eager warm-up step instead, before touching the stream.
 *
 * Threads: a cuDNN handle must not be used by two threads at once, and
 * cuDNN's release notes (Limitations) do not promise that an execution plan
 * is safe to share between threads for every engine — PyTorch keeps its
 * cuDNN plan caches thread_local for that reason.  So each thread takes its
 * own handle per device from a pool (handles go back to the pool when the
 * thread exits and are never destroyed), and a cache entry keeps one
 * finalized plan per handle: the engine choice (the search, the timing) is
 * shared by all threads, so a new thread pays one finalization of the
 * chosen config, not a search.  cuDNN's kernel cache would spare runtime
 * fusion's recompilation in that finalization, but it works only for
 * graphs marked dynamic-shape, which changes which engines apply to them:
 * not done without a GPU to see the engines it leaves.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cudnn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../activation.h"
#include "../check.h"
#include "common.cuh"
#include "conv_direct.cuh"
#include "cudnn_graph.cuh"
#include "plan_cache.h"

namespace
{

using namespace ga_cudnn;

/* ================================================================ graph ids */

/* Tensor unique ids inside a graph.  x, w, y are the convolution's roles:
 * forward reads x, w and writes y; backward data reads y (dy), w and writes
 * x (dx); backward filter reads x, y (dy) and writes w (dw). */
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3, kUidBias = 4, kUidPreact = 5;
constexpr int64_t kUidConvOut = 101, kUidAddOut = 102; /* virtual */

enum GraphKind { GRAPH_CONV = 0, GRAPH_FUSED = 1, GRAPH_BIAS = 2 };
enum Route { ROUTE_GRAPH = 0, ROUTE_UNFUSED = 1, ROUTE_DIRECT = 2, ROUTE_SPLIT = 3 };

/* ================================================================ problem */

/* One tensor as the graph and the direct kernels see it, in NCHW order. */
struct View {
    void *data = nullptr;
    int64_t dims[4] = {0, 0, 0, 0};
    int64_t strides[4] = {0, 0, 0, 0}; /* elements, size-1 dims normalized (graph) */
    int64_t align = 0;                 /* bytes the pointer is aligned to, at most 16 */
    int vote = 0;                      /* +1 channels-last, -1 channels-first, 0 either */
};

struct Problem {
    GaConvOp op = GA_CONV_FWD;
    ga_dtype dtype = GA_FLOAT32;
    int64_t itemsize = 4;
    ga_conv_geometry geom;
    View x, w, y;
    bool has_bias = false;
    View bias; /* dims (1, K, 1, 1) */
    ga_activation act = GA_ACT_NONE;
    bool has_preact = false;
    View preact;
    bool nhwc = false; /* the layout the graph describes (finish_problem) */
    void *ws = nullptr;
    size_t ws_size = 0;   /* usable workspace bytes (0 without a workspace) */
    bool eligible = true; /* every tensor is describable to cuDNN */
    /* the tensors as given: the epilogue, copies and the direct route */
    const ga_tensor *tx = nullptr, *tw = nullptr, *ty = nullptr, *tpreact = nullptr;
};

bool has_epilogue(const Problem &p)
{
    return p.op == GA_CONV_FWD && (p.has_bias || p.act != GA_ACT_NONE);
}

/* Whether the epilogue can be one graph with the convolution: cuDNN has a
 * pointwise mode for its activation (it has none for hardswish). */
bool fusable(const Problem &p)
{
    cudnnPointwiseMode_t mode;
    return has_epilogue(p) && (p.act == GA_ACT_NONE || activation_mode(p.act, &mode));
}

/* Whether the split route applies: a bias for the graph and an
 * activation for the kernel after it. */
bool can_split(const Problem &p)
{
    return p.op == GA_CONV_FWD && p.has_bias && p.act != GA_ACT_NONE;
}

int64_t pointer_alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    if (a == 0)
        return 16;
    a &= ~a + 1; /* lowest set bit */
    return a >= 16 ? 16 : (int64_t)a;
}

/* Gives each size-1 dim (whose stride never matters for addressing, and
 * which frameworks set to anything) the stride a packed tensor of the
 * layout would have: cuDNN engines pick kernels by the layout the strides
 * describe, and a 1x1 map or a batch of one must not look like another
 * layout than its neighbours. */
void normalize_strides(const int64_t dims[4], int64_t strides[4], bool nhwc)
{
    static const int nchw_order[4] = {3, 2, 1, 0}; /* innermost first */
    static const int nhwc_order[4] = {1, 3, 2, 0};
    const int *order = nhwc ? nhwc_order : nchw_order;
    int64_t extent = 1;
    for (int i = 0; i < 4; i++) {
        int d = order[i];
        if (dims[d] == 1)
            strides[d] = extent;
        else
            extent = std::max(extent, strides[d] * dims[d]);
    }
}

/* What a tensor says about its layout: channels inside every non-trivial
 * spatial dim (+1), outside all of them (-1), or nothing (0: one channel,
 * a 1x1 map, or a mixed order). */
int layout_vote(const int64_t dims[4], const int64_t strides[4])
{
    if (dims[1] <= 1)
        return 0;
    bool spatial = false, inner = true, outer = true;
    for (int d = 2; d < 4; d++) {
        if (dims[d] <= 1)
            continue;
        spatial = true;
        inner = inner && strides[1] < strides[d];
        outer = outer && strides[1] > strides[d];
    }
    return !spatial ? 0 : inner ? 1 : outer ? -1 : 0;
}

/* Fills v from t; returns whether cuDNN can take it as is: every dim
 * non-empty, positive strides in whole elements, an element-aligned
 * pointer (zero or negative strides, overlaps and odd offsets go to the
 * direct kernels).  The strides are normalized later, by finish_problem. */
bool make_view(const ga_tensor *t, int64_t itemsize, View *v)
{
    bool ok = t->data != nullptr;
    v->data = t->data;
    v->align = pointer_alignment(t->data);
    ok = ok && v->align >= itemsize;
    for (int d = 0; d < 4; d++) {
        v->dims[d] = t->shape[d];
        v->strides[d] = t->strides[d] / itemsize;
        ok = ok && t->shape[d] > 0;
        if (t->shape[d] > 1)
            ok = ok && t->strides[d] > 0 && t->strides[d] % itemsize == 0;
    }
    v->vote = layout_vote(v->dims, v->strides);
    return ok;
}

void make_bias_view(const void *bias, int64_t k, int64_t itemsize, bool nhwc, View *v)
{
    v->data = const_cast<void *>(bias);
    v->align = pointer_alignment(bias);
    int64_t dims[4] = {1, k, 1, 1};
    for (int d = 0; d < 4; d++) {
        v->dims[d] = dims[d];
        v->strides[d] = d == 1 ? 1 : k;
    }
    /* in the problem's layout, so the add sees one: (K,1,1,1) or (K,1,K,K) */
    normalize_strides(v->dims, v->strides, nhwc);
}

/* Packed strides of y's shape in the problem's layout, for the virtual
 * intermediates. */
void packed_strides(const Problem &p, int64_t strides[4])
{
    const int64_t *d = p.y.dims;
    if (p.nhwc) {
        strides[1] = 1;
        strides[3] = d[1];
        strides[2] = d[1] * d[3];
        strides[0] = d[1] * d[3] * d[2];
    } else {
        strides[3] = 1;
        strides[2] = d[3];
        strides[1] = d[3] * d[2];
        strides[0] = d[3] * d[2] * d[1];
    }
}

cudnnDataType_t io_type(ga_dtype d)
{
    switch (d) {
    case GA_FLOAT16: return CUDNN_DATA_HALF;
    case GA_BFLOAT16: return CUDNN_DATA_BFLOAT16;
    case GA_FLOAT64: return CUDNN_DATA_DOUBLE;
    default: return CUDNN_DATA_FLOAT;
    }
}

/* float for float16/bfloat16/float32, double for float64 */
cudnnDataType_t compute_type(ga_dtype d)
{
    return d == GA_FLOAT64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
}

void *uid_pointer(const Problem &p, int64_t uid)
{
    switch (uid) {
    case kUidX: return p.x.data;
    case kUidW: return p.w.data;
    case kUidY: return p.y.data;
    case kUidBias: return p.bias.data;
    case kUidPreact: return p.preact.data;
    default: return nullptr;
    }
}

/* The plan cache key: everything the graph, the engine filter and the
 * workspace limit depend on (the pointers only through their alignment). */
void key_view(std::string &key, const View &v)
{
    for (int d = 0; d < 4; d++) {
        ga_key_append(key, v.dims[d]);
        ga_key_append(key, v.strides[d]);
    }
    ga_key_append(key, v.align);
}

std::string make_key(int device, const Problem &p)
{
    std::string key;
    key.reserve(512);
    key.append("gpuaccel.conv2d.v1");
    ga_key_append(key, device);
    ga_key_append(key, (int)p.op);
    ga_key_append(key, (int)p.dtype);
    const ga_conv_geometry &g = p.geom;
    for (int i = 0; i < 2; i++) {
        ga_key_append(key, g.stride[i]);
        ga_key_append(key, g.padding[i]);
        ga_key_append(key, g.dilation[i]);
    }
    ga_key_append(key, g.groups);
    ga_key_append(key, (int)(g.allow_tf32 != 0));
    ga_key_append(key, (int)(g.deterministic != 0));
    ga_key_append(key, (int)p.nhwc);
    key_view(key, p.x);
    key_view(key, p.w);
    key_view(key, p.y);
    ga_key_append(key, (int)p.has_bias);
    if (p.has_bias)
        key_view(key, p.bias);
    ga_key_append(key, (int)p.act);
    ga_key_append(key, (int)p.has_preact);
    if (p.has_preact)
        key_view(key, p.preact);
    ga_key_append(key, (uint64_t)p.ws_size);
    return key;
}

/* ================================================================= graphs */

ga_status add_real_tensor(Graph &g, int64_t uid, const Problem &p, const View &v,
                          cudnnBackendDescriptor_t *out)
{
    return add_tensor(g, uid, io_type(p.dtype), 4, v.dims, v.strides, v.align, false, out);
}

/* An intermediate the engine keeps in registers: y's shape, compute type. */
ga_status add_virtual_tensor(Graph &g, int64_t uid, const Problem &p, cudnnBackendDescriptor_t *out)
{
    int64_t strides[4];
    packed_strides(p, strides);
    return add_tensor(g, uid, compute_type(p.dtype), 4, p.y.dims, strides, 16, true, out);
}

ga_status add_conv(Graph &g, const Problem &p, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t w, cudnnBackendDescriptor_t y,
                   cudnnBackendDescriptor_t *op_out)
{
    Desc conv;
    GA_TRY_STATUS(make_desc(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &conv));
    cudnnDataType_t comp = compute_type(p.dtype);
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION; /* what DL frameworks call conv */
    int64_t spatial = 2;
    int64_t dilation[2] = {p.geom.dilation[0], p.geom.dilation[1]};
    int64_t stride[2] = {p.geom.stride[0], p.geom.stride[1]};
    int64_t padding[2] = {p.geom.padding[0], p.geom.padding[1]};
    GA_SET(conv.get(), CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    GA_SET(conv.get(), CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    GA_SET(conv.get(), CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
    GA_SET(conv.get(), CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation);
    GA_SET(conv.get(), CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride);
    /* symmetric padding: post = pre gives P = (H + 2 pad - dil (R-1) - 1) / stride + 1 */
    GA_SET(conv.get(), CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, padding);
    GA_SET(conv.get(), CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, padding);
    GA_FINALIZE(conv.get());
    cudnnBackendDescriptor_t conv_raw = conv.get();
    g.parts.push_back(std::move(conv));

    /* alpha/beta have the compute type's precision: double for float64 */
    float alpha_f = 1.0f, beta_f = 0.0f;
    double alpha_d = 1.0, beta_d = 0.0;
    bool f64 = p.dtype == GA_FLOAT64;
    cudnnBackendAttributeType_t scalar_type = f64 ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
    const void *alpha = f64 ? (const void *)&alpha_d : (const void *)&alpha_f;
    const void *beta = f64 ? (const void *)&beta_d : (const void *)&beta_f;
    const cudnnBackendDescriptorType_t op_types[3] = {
        CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR};
    Desc op;
    GA_TRY_STATUS(make_desc(op_types[p.op], &op));
    const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    switch (p.op) {
    case GA_CONV_FWD:
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, D, 1, &x);
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, D, 1, &w);
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, D, 1, &y);
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, D, 1, &conv_raw);
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, scalar_type, 1, alpha);
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, scalar_type, 1, beta);
        break;
    case GA_CONV_BWD_DATA:
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, D, 1, &x);
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, D, 1, &w);
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, D, 1, &y);
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, D, 1, &conv_raw);
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, scalar_type, 1, alpha);
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, scalar_type, 1, beta);
        break;
    case GA_CONV_BWD_FILTER:
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, D, 1, &x);
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, D, 1, &w);
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, D, 1, &y);
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, D, 1, &conv_raw);
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, scalar_type, 1, alpha);
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, scalar_type, 1, beta);
        break;
    }
    GA_FINALIZE(op.get());
    *op_out = op.get();
    g.parts.push_back(std::move(op));
    return ga_ok();
}

/* GRAPH_CONV: the convolution alone (forward into y, or dgrad / wgrad).
 * GRAPH_FUSED (forward only):
 *   conv(x, w) -> c  [-> c + bias -> z]  [-> act(z) -> y]
 * where every intermediate is virtual (compute type) except that the input
 * of the activation is the real preact tensor when preact is requested.
 * (preact without an activation is y itself and is copied afterwards.) */
ga_status build_graph(cudnnHandle_t handle, const Problem &p, GraphKind kind,
                      std::shared_ptr<Graph> *out)
{
    auto g = std::make_shared<Graph>();
    cudnnBackendDescriptor_t x = nullptr, w = nullptr, y = nullptr;
    GA_TRY_STATUS(add_real_tensor(*g, kUidX, p, p.x, &x));
    GA_TRY_STATUS(add_real_tensor(*g, kUidW, p, p.w, &w));
    /* every tensor of the graph is an operand of its ops (the variant pack
     * names exactly those): the split graph with a saved pre-activation
     * writes that, not y */
    if (!(kind == GRAPH_BIAS && p.has_preact))
        GA_TRY_STATUS(add_real_tensor(*g, kUidY, p, p.y, &y));
    std::vector<cudnnBackendDescriptor_t> ops;
    cudnnBackendDescriptor_t op = nullptr;
    if (kind == GRAPH_CONV) {
        GA_TRY_STATUS(add_conv(*g, p, x, w, y, &op));
        ops.push_back(op);
    } else if (kind == GRAPH_BIAS) {
        /* conv(x, w) -> c (virtual) -> c + bias -> z, z the saved
         * pre-activation when there is one, else y (activated in place) */
        cudnnBackendDescriptor_t c = nullptr, b = nullptr, z = y;
        if (p.has_preact)
            GA_TRY_STATUS(add_real_tensor(*g, kUidPreact, p, p.preact, &z));
        GA_TRY_STATUS(add_virtual_tensor(*g, kUidConvOut, p, &c));
        GA_TRY_STATUS(add_conv(*g, p, x, w, c, &op));
        ops.push_back(op);
        GA_TRY_STATUS(add_real_tensor(*g, kUidBias, p, p.bias, &b));
        GA_TRY_STATUS(add_pointwise(*g, compute_type(p.dtype), CUDNN_POINTWISE_ADD, c, b, z, &op));
        ops.push_back(op);
    } else {
        bool act = p.act != GA_ACT_NONE;
        bool preact_real = p.has_preact && act;
        cudnnBackendDescriptor_t preact = nullptr, c = nullptr;
        if (preact_real)
            GA_TRY_STATUS(add_real_tensor(*g, kUidPreact, p, p.preact, &preact));
        if (!p.has_bias && preact_real)
            c = preact;
        else
            GA_TRY_STATUS(add_virtual_tensor(*g, kUidConvOut, p, &c));
        GA_TRY_STATUS(add_conv(*g, p, x, w, c, &op));
        ops.push_back(op);
        cudnnBackendDescriptor_t z = c;
        if (p.has_bias) {
            cudnnBackendDescriptor_t b = nullptr;
            GA_TRY_STATUS(add_real_tensor(*g, kUidBias, p, p.bias, &b));
            if (!act)
                z = y;
            else if (preact_real)
                z = preact;
            else
                GA_TRY_STATUS(add_virtual_tensor(*g, kUidAddOut, p, &z));
            GA_TRY_STATUS(
                add_pointwise(*g, compute_type(p.dtype), CUDNN_POINTWISE_ADD, c, b, z, &op));
            ops.push_back(op);
        }
        if (act) {
            cudnnPointwiseMode_t mode;
            if (!ga_cudnn::activation_mode(p.act, &mode))
                return GA_CUDNN_UNSUPPORTED("cuDNN has no pointwise mode for this activation");
            GA_TRY_STATUS(add_pointwise(*g, compute_type(p.dtype), mode, z, nullptr, y, &op));
            ops.push_back(op);
        }
    }
    GA_TRY_STATUS(finish_graph(*g, handle, ops));
    *out = std::move(g);
    return ga_ok();
}

/* ================================================================== plans */

/* Which engines the problem may use: no nondeterministic engine when
 * deterministic results are asked for, and for float32 without allow_tf32
 * no engine that uses tensor cores. */
EngineRules rules_of(const Problem &p)
{
    EngineRules r;
    r.deterministic = p.geom.deterministic != 0;
    r.strict_fp32 = p.dtype == GA_FLOAT32 && !p.geom.allow_tf32;
    r.workspace = p.ws_size;
    return r;
}

/* The variant pack of a graph built for the problem. */
ga_status make_variant_pack(const Graph &g, const Problem &p, Desc *out)
{
    std::vector<void *> pointers;
    for (int64_t uid : g.uids)
        pointers.push_back(uid_pointer(p, uid));
    return ga_cudnn::make_variant_pack(g, pointers, p.ws_size ? p.ws : nullptr, out);
}

ga_status execute_plan(cudnnHandle_t handle, const ExecPlan &ep, const Problem &p)
{
    Desc pack;
    GA_TRY_STATUS(make_variant_pack(*ep.graph, p, &pack));
    return ga_cudnn::execute_plan(handle, ep, pack);
}

/* Builds the graph and finds a plan for it (search_plan). */
ga_status tune_graph(cudnnHandle_t handle, cudaStream_t s, const Problem &p, GraphKind kind,
                     const EngineChoice *preferred, std::shared_ptr<ExecPlan> *plan,
                     EngineChoice *choice, bool *tuned, Refusal *why)
{
    *tuned = false;
    plan->reset();
    std::shared_ptr<Graph> g;
    GA_TRY_STATUS(build_graph(handle, p, kind, &g));
    Desc pack; /* the candidates share one graph, so one variant pack */
    GA_TRY_STATUS(make_variant_pack(*g, p, &pack));
    return search_plan(handle, s, g, rules_of(p), pack, preferred, plan, choice, tuned, why);
}

/* ============================================================ execution */

/* Nothing that tunes may run inside a stream capture: the heuristics,
 * plan finalization (which may compile and load modules), the trial runs
 * and their timing (an event synchronization) would fail there or
 * invalidate the user's capture.  So a capturing call needs its problem's
 * plan ready for this thread; without one it fails here, before anything
 * touches the stream, with what to do about it. */
ga_status refuse_in_capture(const Problem &p, cudaStream_t s)
{
    if (!stream_capturing(s))
        return ga_ok();
    static const char *const ops[3] = {"conv2d", "conv2d_backward (input gradient)",
                                       "conv2d_backward (weight gradient)"};
    static thread_local char message[400];
    snprintf(message, sizeof message,
             "%s: this shape has no cuDNN plan on this thread yet, and choosing one cannot run "
             "inside a CUDA graph capture; run one step with the same shapes, dtypes and layouts "
             "eagerly on this thread before capturing (a warm-up, as torch.cuda.graphs asks)",
             ops[p.op]);
    return ga_status_make(GA_ERR_CUDA, (int)cudaErrorStreamCaptureUnsupported,
                          "cudaErrorStreamCaptureUnsupported", message, "cudaStreamIsCapturing",
                          __FILE__, __LINE__);
}

/* ===================================================== the cached choice */

/* What the cache holds per problem: the route, the engine choice shared by
 * every thread, and one plan per cuDNN handle. */
struct Entry {
    Route route = ROUTE_DIRECT;
    EngineChoice choice;
    std::string chosen;
    Refusal why; /* why not the fused graph (or not cuDNN at all): every call reports it */
    std::mutex mutex;
    std::unordered_map<cudnnHandle_t, std::shared_ptr<ExecPlan>> plans;
};

/* The engine choice (engine_choice_string), prefixed "unfused:" or "split:"
 * for those routes; "direct" for the direct kernels. */
std::string choice_string(Route route, const EngineChoice &c)
{
    if (route == ROUTE_DIRECT)
        return "direct";
    const char *prefix = route == ROUTE_UNFUSED ? "unfused:" : route == ROUTE_SPLIT ? "split:" : "";
    return prefix + engine_choice_string(c);
}

/* The inverse of choice_string; false for anything else (the caller then
 * tunes as if nothing was preferred). */
bool parse_choice(const char *text, Route *route, EngineChoice *c)
{
    std::string s(text, strnlen(text, 256));
    if (s == "direct") {
        *route = ROUTE_DIRECT;
        return true;
    }
    size_t pos = 0;
    *route = ROUTE_GRAPH;
    if (s.compare(0, 8, "unfused:") == 0) {
        *route = ROUTE_UNFUSED;
        pos = 8;
    } else if (s.compare(0, 6, "split:") == 0) {
        *route = ROUTE_SPLIT;
        pos = 6;
    }
    return parse_engine_choice(s, pos, c);
}

/* This handle's plan for a cached choice when it has one already. */
std::shared_ptr<ExecPlan> ready_plan(cudnnHandle_t handle, Entry &e)
{
    std::lock_guard<std::mutex> lock(e.mutex);
    auto it = e.plans.find(handle);
    return it != e.plans.end() ? it->second : nullptr;
}

/* This handle's plan for a cached choice, rebuilt (without tuning) the
 * first time a thread meets the problem. */
ga_status entry_plan(cudnnHandle_t handle, const Problem &p, Entry &e,
                     std::shared_ptr<ExecPlan> *out)
{
    {
        std::lock_guard<std::mutex> lock(e.mutex);
        auto it = e.plans.find(handle);
        if (it != e.plans.end()) {
            *out = it->second;
            return ga_ok();
        }
    }
    /* no lock while building: only this thread uses this handle */
    GraphKind kind = e.route == ROUTE_SPLIT                      ? GRAPH_BIAS
                     : e.route == ROUTE_GRAPH && has_epilogue(p) ? GRAPH_FUSED
                                                                 : GRAPH_CONV;
    std::shared_ptr<Graph> g;
    GA_TRY_STATUS(build_graph(handle, p, kind, &g));
    GA_TRY_STATUS(plan_from_choice(handle, g, rules_of(p), e.choice, out));
    if (!*out)
        return GA_CUDNN_UNSUPPORTED("the cached engine config does not finalize on this handle");
    std::lock_guard<std::mutex> lock(e.mutex);
    e.plans[handle] = *out;
    return ga_ok();
}

/* A cache miss: find the route (fused graph, conv-only graph + epilogue
 * kernel, direct kernels) and its plan. */
ga_status tune(cudnnHandle_t handle, cudaStream_t s, const Problem &p, const char *preferred,
               std::shared_ptr<Entry> *out, std::shared_ptr<ExecPlan> *plan, bool *tuned)
{
    Route pref_route = ROUTE_DIRECT;
    EngineChoice pref;
    /* "direct" is not honoured as a preference: a newer cuDNN may have an
     * engine now, and finding out costs little */
    bool has_pref =
        preferred && parse_choice(preferred, &pref_route, &pref) && pref_route != ROUTE_DIRECT;
    auto e = std::make_shared<Entry>();
    bool fused = has_epilogue(p);
    *tuned = false;
    /* One route's search: on success the entry takes `route`; a graph
     * with no engine adds its refusal (at least `floor`) to the entry's. */
    auto attempt = [&](GraphKind kind, Route route, ga_fallback_reason floor) -> ga_status {
        bool t = false;
        Refusal why;
        ga_status st =
            tune_graph(handle, s, p, kind, has_pref && pref_route == route ? &pref : nullptr, plan,
                       &e->choice, &t, &why);
        *tuned = *tuned || t;
        if (!st.error)
            e->route = route;
        if (!is_unsupported(st))
            return st;
        why.keep(st, floor);
        e->why.keep(why.reason, why.status, why.text.c_str());
        return ga_ok();
    };
    /* a preference for the split or unfused route says the fused graph
     * found no engine last time: skip its search (runtime fusion may
     * compile).  A fused graph without an engine is a documented limit
     * (runtime fusion is not everywhere); what else went wrong on the way
     * is reported as itself. */
    bool fused_refused = has_pref && (pref_route == ROUTE_UNFUSED || pref_route == ROUTE_SPLIT);
    if (fused && !fusable(p)) {
        /* a documented limit, not a refusal: counted, never warned about */
        char text[160];
        snprintf(text, sizeof text,
                 "cuDNN has no pointwise mode for %s: the convolution (and bias) ran in cuDNN, "
                 "the activation in gpuaccel's kernel",
                 ga_activation_name(p.act));
        e->why.keep(GA_FALLBACK_EPILOGUE, kNoStatus, text);
    } else if (fused && !fused_refused) {
        GA_TRY_STATUS(attempt(GRAPH_FUSED, ROUTE_GRAPH, GA_FALLBACK_NOT_SUPPORTED));
    } else if (fused) {
        e->why.keep(GA_FALLBACK_NOT_SUPPORTED, kNoStatus,
                    "the fused graph was not searched: the tuning file's choice for this shape is "
                    "a partly fused route (its fused graph had no engine when it was tuned)");
    }
    if (can_split(p) && e->route == ROUTE_DIRECT && !(has_pref && pref_route == ROUTE_UNFUSED))
        GA_TRY_STATUS(attempt(GRAPH_BIAS, ROUTE_SPLIT, GA_FALLBACK_NOT_SUPPORTED));
    /* the convolution alone (then the epilogue kernel); without an engine
     * even for it, the direct kernels run */
    if (!fused || e->route == ROUTE_DIRECT)
        GA_TRY_STATUS(
            attempt(GRAPH_CONV, fused ? ROUTE_UNFUSED : ROUTE_GRAPH, GA_FALLBACK_NO_ENGINE));
    e->chosen = choice_string(e->route, e->choice);
    if (e->route != ROUTE_DIRECT)
        e->plans[handle] = *plan;
    else
        plan->reset();
    *out = std::move(e);
    return ga_ok();
}

/* ======================================================= direct route */

ga_status run_direct(const Problem &p, cudaStream_t s)
{
    return ga_conv_direct(p.op, p.geom, *p.tx, *p.tw, *p.ty, p.has_bias ? p.bias.data : nullptr,
                          p.act, p.has_preact ? p.tpreact : nullptr, s);
}

/* ============================================================ the driver */

/* bias + activation + preact over the conv output already in y. */
ga_status run_epilogue(int device, const Problem &p, ga_stream stream)
{
    ga_bias_act_desc d;
    memset(&d, 0, sizeof d);
    d.x = *p.ty;
    d.y = *p.ty;
    if (p.has_preact)
        d.preact = *p.tpreact;
    d.bias = p.has_bias ? p.bias.data : nullptr;
    d.bias_dtype = p.dtype;
    d.channel_dim = 1;
    d.activation = p.act;
    return ga_cuda_bias_activation(device, &d, stream);
}

/* The split route's second half: y = act(z), z being the saved
 * pre-activation the graph wrote (or y itself, in place). */
ga_status run_activation(int device, const Problem &p, ga_stream stream)
{
    ga_bias_act_desc d;
    memset(&d, 0, sizeof d);
    d.x = p.has_preact ? *p.tpreact : *p.ty;
    d.y = *p.ty;
    d.bias = nullptr;
    d.bias_dtype = p.dtype;
    d.channel_dim = 1;
    d.activation = p.act;
    return ga_cuda_bias_activation(device, &d, stream);
}

void write_tuning(ga_conv_tuning *tuning, const ga_op_report &report, const std::string &chosen)
{
    if (!tuning)
        return;
    tuning->report = report;
    /* a choice that does not fit cannot be persisted: report none */
    if (chosen.size() < sizeof tuning->chosen)
        memcpy(tuning->chosen, chosen.c_str(), chosen.size() + 1);
    else
        tuning->chosen[0] = '\0';
}

ga_status run(int device, Problem &p, ga_stream stream, ga_conv_tuning *tuning)
{
    ga_op_report report = {0, 0, 0, 0};
    std::string chosen = "direct";
    Route route = ROUTE_DIRECT;
    cudaStream_t s = ga_cu_stream(stream);
    cudnnHandle_t handle = nullptr;
    std::shared_ptr<ExecPlan> plan;
    if (p.eligible) {
        /* the cache first, then cuDNN, then the exit hook: see mark_exiting */
        GaPlanCache &cache = ga_conv_plan_cache();
        std::string key = make_key(device, p);
        std::shared_ptr<Entry> entry = std::static_pointer_cast<Entry>(cache.find(key));
        /* a problem cached as "direct" needs nothing of cuDNN: no handle
         * (whose creation allocates, which a capture must not see either) */
        bool direct = entry && entry->route == ROUTE_DIRECT;
        handle = direct ? nullptr : held_handle(device);
        if (entry && !direct && handle)
            plan = ready_plan(handle, *entry);
        /* anything but running a ready plan (or the direct kernels) is
         * setup that a capture must not see */
        if (!direct && !plan)
            GA_TRY_STATUS(refuse_in_capture(p, s));
        if (!direct && !handle)
            GA_TRY_STATUS(thread_handle(device, &handle));
        if (!direct) {
            register_exit_hook();
            GA_CUDNN_TRY(cudnnSetStream(handle, cudnn_stream(s)));
        }
        if (entry && !direct && !plan) {
            ga_status st = entry_plan(handle, p, *entry, &plan);
            if (is_unsupported(st))
                entry.reset(); /* tune again below */
            else
                GA_TRY_STATUS(st);
        }
        if (entry) {
            report.cache_hit = 1;
        } else {
            bool tuned = false;
            GA_TRY_STATUS(
                tune(handle, s, p, tuning ? tuning->preferred : nullptr, &entry, &plan, &tuned));
            report.tuned = tuned;
            cache.insert(key, entry);
        }
        route = entry->route;
        chosen = entry->chosen;
        ga_op_report_fallback(&report, entry->why.reason, entry->why.status,
                              entry->why.text.c_str());
    } else {
        ga_op_report_fallback(&report, GA_FALLBACK_LAYOUT, kNoStatus,
                              "a tensor cuDNN cannot take as it is (a zero, negative or "
                              "fractional stride, an empty dim, a misaligned pointer, or a filter "
                              "of 2^31 elements or more): the direct kernels ran");
    }
    switch (route) {
    case ROUTE_GRAPH:
        GA_TRY_STATUS(execute_plan(handle, *plan, p));
        if (p.op == GA_CONV_FWD && p.has_preact && p.act == GA_ACT_NONE)
            GA_TRY_STATUS(ga_cuda_copy(device, p.tpreact, p.ty, stream)); /* z is y */
        break;
    case ROUTE_SPLIT:
    case ROUTE_UNFUSED: {
        GA_TRY_STATUS(execute_plan(handle, *plan, p));
        ga_status st = route == ROUTE_SPLIT ? run_activation(device, p, stream)
                                            : run_epilogue(device, p, stream);
        if (is_unsupported(st)) {
            /* the epilogue kernel turned this layout down: recompute it all */
            route = ROUTE_DIRECT;
            chosen = "direct";
            ga_op_report_fallback(&report, GA_FALLBACK_LAYOUT, kNoStatus,
                                  "the epilogue kernel cannot take this layout: the direct "
                                  "kernels ran");
            st = run_direct(p, s);
        }
        GA_TRY_STATUS(st);
        break;
    }
    case ROUTE_DIRECT: GA_TRY_STATUS(run_direct(p, s)); break;
    }
    report.fused = route == ROUTE_GRAPH && has_epilogue(p);
    report.fallback = route != ROUTE_GRAPH;
    write_tuning(tuning, report, chosen);
    return ga_ok();
}

/* ============================================================ validation */

/* The problem in conv roles (bias, act and preact only for forward):
 * views, one layout for the whole graph, eligibility for cuDNN. */
void init_problem(Problem *p, GaConvOp op, const ga_conv_geometry *g, const ga_tensor *x,
                  const ga_tensor *w, const ga_tensor *y, const void *bias, ga_activation act,
                  const ga_tensor *preact, void *workspace, size_t workspace_size)
{
    *p = Problem();
    p->op = op;
    p->dtype = x->dtype;
    p->itemsize = (int64_t)ga_dtype_itemsize(x->dtype);
    p->geom = *g;
    bool ok = make_view(x, p->itemsize, &p->x);
    ok = make_view(w, p->itemsize, &p->w) && ok;
    ok = make_view(y, p->itemsize, &p->y) && ok;
    p->act = act;
    if (preact && preact->data) {
        p->has_preact = true;
        p->tpreact = preact;
        ok = make_view(preact, p->itemsize, &p->preact) && ok;
    }
    /* the layout most tensors show (channels-first on a tie or when none
     * shows one); tensors that show none are described in it */
    int vote = p->x.vote + p->w.vote + p->y.vote + (p->has_preact ? p->preact.vote : 0);
    p->nhwc = vote > 0;
    View *views[4] = {&p->x, &p->w, &p->y, &p->preact};
    for (int i = 0; i < (p->has_preact ? 4 : 3); i++)
        normalize_strides(views[i]->dims, views[i]->strides, p->nhwc);
    if (bias) {
        p->has_bias = true;
        make_bias_view(bias, y->shape[1], p->itemsize, p->nhwc, &p->bias);
        ok = ok && p->bias.align >= p->itemsize;
    }
    /* cuDNN's implicit-GEMM kernels index the filter with 32-bit offsets
     * (the frontend refuses such graphs for the same reason) */
    ok = ok && ga_numel(w) <= (int64_t)INT32_MAX;
    p->eligible = ok;
    p->ws = workspace;
    p->ws_size = workspace ? workspace_size : 0;
    p->tx = x;
    p->tw = w;
    p->ty = y;
}

void reset_tuning(ga_conv_tuning *tuning)
{
    if (!tuning)
        return;
    tuning->chosen[0] = '\0';
    memset(&tuning->report, 0, sizeof tuning->report);
}

/* No C++ exception may cross the C ABI. */
template <typename F> ga_status guarded(F &&body)
{
    try {
        return body();
    } catch (const std::bad_alloc &) {
        return GA_STATUS(GA_ERR_HOST_OUT_OF_MEMORY, "conv2d: host allocation failed");
    } catch (...) {
        return GA_STATUS(GA_ERR_CUDNN, "conv2d: unexpected C++ exception");
    }
}

/* An op whose arguments are checked, in conv roles: nothing to do when the
 * tensor it writes is empty, else its problem set up and run. */
ga_status run_op(int device, GaConvOp op, const ga_conv_geometry *g, const ga_tensor *x,
                 const ga_tensor *w, const ga_tensor *y, const void *bias, ga_activation act,
                 const ga_tensor *preact, void *workspace, size_t workspace_size, ga_stream stream,
                 ga_conv_tuning *tuning)
{
    const ga_tensor *out = op == GA_CONV_FWD ? y : op == GA_CONV_BWD_DATA ? x : w;
    if (ga_numel(out) == 0)
        return ga_ok();
    return guarded([&]() -> ga_status {
        GA_WITH_DEVICE(device);
        Problem p;
        init_problem(&p, op, g, x, w, y, bias, act, preact, workspace, workspace_size);
        return run(device, p, stream, tuning);
    });
}

} // namespace

/* ======================================================== entry points */

extern "C" ga_status ga_cuda_conv2d_forward(int device, const ga_conv_desc *desc, void *workspace,
                                            size_t workspace_size, ga_stream stream,
                                            ga_conv_tuning *tuning)
{
    GA_NVTX_RANGE("conv2d_fwd");
    reset_tuning(tuning);
    GA_TRY_STATUS(ga_conv_check_forward(desc));
    return run_op(device, GA_CONV_FWD, &desc->geom, &desc->x, &desc->w, &desc->y, desc->bias,
                  desc->activation, &desc->preact, workspace, workspace_size, stream, tuning);
}

extern "C" ga_status ga_cuda_conv2d_backward_data(int device, const ga_conv_geometry *geom,
                                                  const ga_tensor *dy, const ga_tensor *w,
                                                  const ga_tensor *dx, void *workspace,
                                                  size_t workspace_size, ga_stream stream,
                                                  ga_conv_tuning *tuning)
{
    GA_NVTX_RANGE("conv2d_bwd_data");
    reset_tuning(tuning);
    GA_TRY_STATUS(ga_conv_check(geom, dx, w, dy));
    return run_op(device, GA_CONV_BWD_DATA, geom, dx, w, dy, nullptr, GA_ACT_NONE, nullptr,
                  workspace, workspace_size, stream, tuning);
}

extern "C" ga_status ga_cuda_conv2d_backward_filter(int device, const ga_conv_geometry *geom,
                                                    const ga_tensor *x, const ga_tensor *dy,
                                                    const ga_tensor *dw, void *workspace,
                                                    size_t workspace_size, ga_stream stream,
                                                    ga_conv_tuning *tuning)
{
    GA_NVTX_RANGE("conv2d_bwd_filter");
    reset_tuning(tuning);
    GA_TRY_STATUS(ga_conv_check(geom, x, dw, dy));
    return run_op(device, GA_CONV_BWD_FILTER, geom, x, dw, dy, nullptr, GA_ACT_NONE, nullptr,
                  workspace, workspace_size, stream, tuning);
}
