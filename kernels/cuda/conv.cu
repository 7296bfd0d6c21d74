/*
 * conv.cu — 2-D convolution on the GPU: forward (with bias, activation and
 * the pre-activation output fused in), backward data and backward filter.
 *
 * The work goes to cuDNN's graph (backend) API.  Each call describes its
 * problem as an operation graph — conv fprop [-> add bias] [-> relu/gelu]
 * for forward, one dgrad or wgrad operation for the backward ops — and
 * runs an execution plan for it.  Plans are chosen once per problem, like
 * torch.backends.cudnn.benchmark, but the choice is also handed to the
 * caller as a short string ("eng12:k1=0,k3=2") so that the next process can
 * rebuild exactly that engine configuration without timing again.
 *
 * Routes, tried in this order until one works:
 *   graph    the requested graph (the fused one when there is an epilogue);
 *   split    (bias and an activation) conv + bias as the graph, into the
 *            pre-activation (or y), then the activation by
 *            ga_cuda_bias_activation: conv -> add -> act fuses only on
 *            runtime-fusion engines for GELU (cuDNN's conv-bias-activation
 *            engines know ReLU and identity), while conv -> add fuses on as
 *            many engines as the conv alone — and a saved pre-activation is
 *            written once either way;
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
#include "../internal.h"
#include "common.cuh"
#include "conv_direct.cuh"
#include "plan_cache.h"

namespace
{

/* ============================================================== limits */

/* The first call of a shape pays for its search, and every finalization
 * may compile a kernel (runtime fusion, NVRTC): the search is bounded by
 * the plans it needs and by finalizations and time across both heuristic
 * modes, not per mode. */
constexpr int kMaxCandidates = 6;        /* plans timed per graph */
constexpr int kMaxDeterministic = 2;     /* untimed: the first that runs is taken */
constexpr int kMaxFinalizeAttempts = 12; /* finalizations per search, both modes */
constexpr double kSearchSeconds = 2.0;   /* no new finalization once one plan is in hand */
constexpr int64_t kMaxHeuristicResults = 64;
constexpr int kTimedIterations = 3; /* after one warm-up run */
constexpr int kMaxNotes = 64;       /* more than cuDNN defines, for newer versions */

/* Tensor unique ids inside a graph.  x, w, y are the convolution's roles:
 * forward reads x, w and writes y; backward data reads y (dy), w and writes
 * x (dx); backward filter reads x, y (dy) and writes w (dw). */
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3, kUidBias = 4, kUidPreact = 5;
constexpr int64_t kUidConvOut = 101, kUidAddOut = 102; /* virtual */

enum GraphKind { GRAPH_CONV = 0, GRAPH_FUSED = 1, GRAPH_BIAS = 2 };
enum Route { ROUTE_GRAPH = 0, ROUTE_UNFUSED = 1, ROUTE_DIRECT = 2, ROUTE_SPLIT = 3 };

/* ==================================================== backend descriptors */

/* Set at process exit, before the plan cache is destroyed: by then cuDNN's
 * own state may already be gone, so cached descriptors are left to the OS
 * rather than destroyed through a library that is shutting down. */
std::atomic<bool> g_exiting{false};

void mark_exiting()
{
    g_exiting.store(true);
}

/* Registered after the plan cache and cuDNN exist, so that it runs before
 * either is torn down (exit handlers and static destructors run in reverse
 * order of registration). */
void register_exit_hook()
{
    static std::once_flag once;
    std::call_once(once, [] { std::atexit(mark_exiting); });
}

/* One backend descriptor, destroyed with its owner on every path. */
class Desc
{
  public:
    Desc() = default;
    explicit Desc(cudnnBackendDescriptor_t d) : d_(d) {}
    ~Desc()
    {
        reset();
    }
    Desc(Desc &&other) noexcept : d_(other.d_)
    {
        other.d_ = nullptr;
    }
    Desc &operator=(Desc &&other) noexcept
    {
        if (this != &other) {
            reset();
            d_ = other.d_;
            other.d_ = nullptr;
        }
        return *this;
    }
    Desc(const Desc &) = delete;
    Desc &operator=(const Desc &) = delete;

    cudnnBackendDescriptor_t get() const
    {
        return d_;
    }
    void reset()
    {
        if (d_ && !g_exiting.load())
            cudnnBackendDestroyDescriptor(d_);
        d_ = nullptr;
    }

  private:
    cudnnBackendDescriptor_t d_ = nullptr;
};

ga_status make_desc(cudnnBackendDescriptorType_t type, Desc *out)
{
    cudnnBackendDescriptor_t d = nullptr;
    GA_CUDNN_TRY(cudnnBackendCreateDescriptor(type, &d));
    *out = Desc(d);
    return ga_ok();
}

/* Internally GA_ERR_NOT_SUPPORTED means "cuDNN cannot do this here, take
 * the next route"; it never reaches the caller, since the direct kernels
 * accept every valid problem. */
ga_status unsupported(const char *why, const char *where, const char *file, int line)
{
    return ga_status_make(GA_ERR_NOT_SUPPORTED, 0, 0, why, where, file, line);
}
#define CONV_UNSUPPORTED(why) unsupported((why), __func__, __FILE__, __LINE__)

bool is_unsupported(const ga_status &st)
{
    return st.error == GA_ERR_NOT_SUPPORTED;
}

/* Statuses that mean "this graph / configuration does not run here": the
 * parameter and not-supported families, a missing engine sub-library and a
 * failed runtime compilation.  Anything else is a real error. */
bool soft_failure(cudnnStatus_t s)
{
    int category = (int)s / 1000 * 1000;
    return category == CUDNN_STATUS_BAD_PARAM || category == CUDNN_STATUS_NOT_SUPPORTED ||
           s == CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED ||
           s == CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED;
}

/* Why a soft failure made a route fall back (kernels.h's reasons); the
 * status of an unsupported ga_status is cuDNN's, or one of these two. */
constexpr int kNoStatus = 0;   /* gpuaccel's own "no engine" */
constexpr int kNoPlanRan = -1; /* plans finalized, none executed */
ga_fallback_reason cudnn_reason(int status)
{
    if (status == kNoPlanRan)
        return GA_FALLBACK_EXECUTION;
    if (status == CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED)
        return GA_FALLBACK_SUBLIBRARY;
    if (status == CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED)
        return GA_FALLBACK_COMPILATION;
    if (status / 1000 * 1000 == CUDNN_STATUS_BAD_PARAM)
        return GA_FALLBACK_BAD_PARAM;
    return GA_FALLBACK_NOT_SUPPORTED;
}

/* What a search may still spend (see the limits above). */
struct SearchBudget {
    int finalizations = kMaxFinalizeAttempts;
    int wanted = kMaxCandidates;
    std::chrono::steady_clock::time_point deadline =
        std::chrono::steady_clock::now() +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(kSearchSeconds));

    explicit SearchBudget(bool deterministic)
        : wanted(deterministic ? kMaxDeterministic : kMaxCandidates)
    {
    }
    /* whether one more finalization is allowed with `have` plans in hand */
    bool allows(int have) const
    {
        if (have >= wanted || finalizations <= 0)
            return false;
        return have == 0 || std::chrono::steady_clock::now() < deadline;
    }
};

/* Why a route was not taken, kept across the attempts of a search: the
 * most severe refusal met (its text copied, since cuDNN's message lives in
 * a per-thread buffer that the next failure overwrites). */
struct Refusal {
    ga_fallback_reason reason = GA_FALLBACK_NONE;
    int status = kNoStatus;
    std::string text;

    void keep(ga_fallback_reason why, int st, const char *what)
    {
        if (why <= reason)
            return;
        reason = why;
        status = st;
        text = what ? what : "";
    }
    /* an unsupported status: cuDNN's (or gpuaccel's own) reason and text */
    void keep(const ga_status &st, ga_fallback_reason floor = GA_FALLBACK_NONE)
    {
        if (!is_unsupported(st))
            return;
        ga_fallback_reason why = cudnn_reason(st.code);
        char text_buf[240];
        snprintf(text_buf, sizeof text_buf, "%s%s%s: %s", st.name ? st.name : "",
                 st.name ? " at " : "", st.call ? st.call : "cuDNN", st.message ? st.message : "");
        keep(why > floor ? why : floor, st.code, text_buf);
    }
};

ga_status finalize_status(cudnnStatus_t s, const char *call, const char *file, int line)
{
    if (s == CUDNN_STATUS_SUCCESS)
        return ga_ok();
    if (soft_failure(s)) {
        (void)cudaGetLastError(); /* a failed module load must not be blamed on a later launch */
        /* cuDNN's reason, read (and so cleared) right after the failure */
        const char *detail = ga_cudnn_last_error_text();
        return ga_status_make(GA_ERR_NOT_SUPPORTED, (int)s, cudnnGetErrorString(s),
                              detail[0] ? detail : "cuDNN rejected this graph", call, file, line);
    }
    return ga_cudnn_error(s, call, file, line);
}

/* Setting an attribute only fails on a wrong name, type or count — a bug
 * here, reported as such; finalizing checks the content and may say "not
 * supported", which selects the next route. */
#define GA_SET(desc, name, type, count, values) \
    GA_CUDNN_TRY(cudnnBackendSetAttribute((desc), (name), (type), (count), (values)))
#define GA_FINALIZE(desc)                                                                      \
    do {                                                                                       \
        ga_cudnn_discard_last_error();                                                         \
        GA_TRY_STATUS(finalize_status(cudnnBackendFinalize(desc),                              \
                                      "cudnnBackendFinalize(" #desc ")", __FILE__, __LINE__)); \
    } while (0)

/* ================================================================ handles */

/* Handles are pooled, never destroyed: a plan finalized with a handle stays
 * valid for as long as the cache holds it, and the thread that takes the
 * handle next inherits those plans. */
struct HandlePool {
    std::mutex mutex;
    std::vector<std::pair<int, cudnnHandle_t>> idle;
};

HandlePool &handle_pool()
{
    static HandlePool *pool = new HandlePool; /* outlives every thread */
    return *pool;
}

struct ThreadHandles {
    std::vector<std::pair<int, cudnnHandle_t>> held;
    ~ThreadHandles()
    {
        if (held.empty())
            return;
        HandlePool &pool = handle_pool();
        std::lock_guard<std::mutex> lock(pool.mutex);
        for (auto &h : held)
            pool.idle.push_back(h);
    }
};

thread_local ThreadHandles t_handles;

/* The handle the calling thread holds for `device`, or null (then
 * thread_handle takes one). */
cudnnHandle_t held_handle(int device)
{
    for (auto &h : t_handles.held)
        if (h.first == device)
            return h.second;
    return nullptr;
}

/* The calling thread's handle for `device` (which is current). */
ga_status thread_handle(int device, cudnnHandle_t *out)
{
    for (auto &h : t_handles.held) {
        if (h.first == device) {
            *out = h.second;
            return ga_ok();
        }
    }
    HandlePool &pool = handle_pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    cudnnHandle_t handle = nullptr;
    for (size_t i = 0; i < pool.idle.size(); i++) {
        if (pool.idle[i].first == device) {
            handle = pool.idle[i].second;
            pool.idle.erase(pool.idle.begin() + (ptrdiff_t)i);
            break;
        }
    }
    /* created under the lock: cuDNN wants concurrent first cudnnCreate calls
     * serialized */
    if (!handle)
        GA_CUDNN_TRY(cudnnCreate(&handle));
    t_handles.held.emplace_back(device, handle);
    *out = handle;
    return ga_ok();
}

/* cuDNN gets 0 for the legacy default stream: the special handle value 1 is
 * only defined for the runtime it was created by. */
cudaStream_t cudnn_stream(cudaStream_t s)
{
    return s == cudaStreamLegacy ? (cudaStream_t)0 : s;
}

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

/* The descriptors of one operation graph.  Kept alive with every plan made
 * from it: cuDNN does not promise that a finalized plan is independent of
 * the descriptors it was built from. */
struct Graph {
    std::vector<Desc> parts;   /* tensors, conv/pointwise descriptors, operations */
    Desc op_graph;             /* destroyed before the parts */
    std::vector<int64_t> uids; /* the real (non-virtual) tensors */
};

ga_status add_tensor(Graph &g, int64_t uid, cudnnDataType_t type, const int64_t dims[4],
                     const int64_t strides[4], int64_t align, bool is_virtual,
                     cudnnBackendDescriptor_t *out)
{
    Desc t;
    GA_TRY_STATUS(make_desc(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t));
    GA_SET(t.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    GA_SET(t.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    GA_SET(t.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    GA_SET(t.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    GA_SET(t.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    if (is_virtual) {
        bool yes = true;
        GA_SET(t.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
    }
    GA_FINALIZE(t.get());
    *out = t.get();
    if (!is_virtual)
        g.uids.push_back(uid);
    g.parts.push_back(std::move(t));
    return ga_ok();
}

ga_status add_real_tensor(Graph &g, int64_t uid, const Problem &p, const View &v,
                          cudnnBackendDescriptor_t *out)
{
    return add_tensor(g, uid, io_type(p.dtype), v.dims, v.strides, v.align, false, out);
}

/* An intermediate the engine keeps in registers: y's shape, compute type. */
ga_status add_virtual_tensor(Graph &g, int64_t uid, const Problem &p, cudnnBackendDescriptor_t *out)
{
    int64_t strides[4];
    packed_strides(p, strides);
    return add_tensor(g, uid, compute_type(p.dtype), p.y.dims, strides, 16, true, out);
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

/* out = mode(in) or out = in + b (b may be null for unary modes). */
ga_status add_pointwise(Graph &g, const Problem &p, cudnnPointwiseMode_t mode,
                        cudnnBackendDescriptor_t in, cudnnBackendDescriptor_t b,
                        cudnnBackendDescriptor_t out, cudnnBackendDescriptor_t *op_out)
{
    Desc pw;
    GA_TRY_STATUS(make_desc(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw));
    cudnnDataType_t prec = compute_type(p.dtype);
    GA_SET(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    GA_SET(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    GA_FINALIZE(pw.get());
    cudnnBackendDescriptor_t pw_raw = pw.get();
    g.parts.push_back(std::move(pw));

    Desc op;
    GA_TRY_STATUS(make_desc(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &op));
    const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    GA_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, D, 1, &pw_raw);
    GA_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, D, 1, &in);
    if (b)
        GA_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, D, 1, &b);
    GA_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, D, 1, &out);
    /* out = act(alpha1 * in) or alpha1 * in + alpha2 * b: set to 1 as the
     * frontend does (it passes float scalars whatever the compute type) */
    float one = 1.0f;
    GA_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    GA_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
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
        GA_TRY_STATUS(add_pointwise(*g, p, CUDNN_POINTWISE_ADD, c, b, z, &op));
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
            GA_TRY_STATUS(add_pointwise(*g, p, CUDNN_POINTWISE_ADD, c, b, z, &op));
            ops.push_back(op);
        }
        if (act) {
            cudnnPointwiseMode_t mode = p.act == GA_ACT_RELU ? CUDNN_POINTWISE_RELU_FWD
                                                             : CUDNN_POINTWISE_GELU_APPROX_TANH_FWD;
            GA_TRY_STATUS(add_pointwise(*g, p, mode, z, nullptr, y, &op));
            ops.push_back(op);
        }
    }
    GA_TRY_STATUS(make_desc(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &g->op_graph));
    GA_SET(g->op_graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
           (int64_t)ops.size(), ops.data());
    /* optional since cuDNN 9.8 (deprecated there), required before; the
     * descriptor test (tests/test_cuda_descriptors.py) builds graphs with
     * no handle, since without a GPU cudnnCreate fails */
    if (handle)
        GA_SET(g->op_graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    GA_FINALIZE(g->op_graph.get());
    *out = std::move(g);
    return ga_ok();
}

/* ================================================================== plans */

/* An engine and its knob settings: what is persisted between processes. */
struct EngineChoice {
    int64_t engine = -1;
    std::vector<std::pair<int64_t, int64_t>> knobs; /* (cudnnBackendKnobType_t, value) */
};

/* A finalized plan, with everything it was made from. */
struct ExecPlan {
    std::shared_ptr<Graph> graph;
    Desc engine;
    std::vector<Desc> knob_choices;
    Desc cfg;
    Desc plan; /* destroyed first */
    int64_t workspace = 0;
};

/* Whether the engine's numerical notes fit the request: no
 * nondeterministic engine when deterministic results are asked for, no
 * engine that converts its inputs down (bf16 squeezed into fp16's range,
 * say) for any dtype, and for float32 without allow_tf32 no engine that
 * uses tensor cores — the rules PyTorch applies. */
ga_status engine_allowed(cudnnBackendDescriptor_t engine, const Problem &p, bool *allowed)
{
    cudnnBackendNumericalNote_t notes[kMaxNotes];
    int64_t n = 0;
    GA_CUDNN_TRY(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                          CUDNN_TYPE_NUMERICAL_NOTE, kMaxNotes, &n, notes));
    bool strict_fp32 = p.dtype == GA_FLOAT32 && !p.geom.allow_tf32;
    *allowed = true;
    for (int64_t i = 0; i < std::min<int64_t>(n, kMaxNotes); i++) {
        if (p.geom.deterministic && notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)
            *allowed = false;
        if (notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)
            *allowed = false;
        if (strict_fp32 && notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE)
            *allowed = false;
    }
    return ga_ok();
}

/* Finalizes a plan for `cfg`; *ok stays false when the config does not run
 * here or needs more workspace than there is (both normal outcomes). */
ga_status finalize_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t cfg, size_t ws_limit,
                        Desc *plan, int64_t *workspace, bool *ok, Refusal *why = nullptr)
{
    *ok = false;
    Desc d;
    GA_TRY_STATUS(make_desc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &d));
    /* deprecated from cuDNN 9.8 but accepted; earlier 9.x require it */
    GA_SET(d.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    GA_SET(d.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
           &cfg);
    ga_cudnn_discard_last_error();
    cudnnStatus_t fin = cudnnBackendFinalize(d.get());
    if (fin != CUDNN_STATUS_SUCCESS) {
        ga_status st = finalize_status(fin, "cudnnBackendFinalize(plan)", __FILE__, __LINE__);
        (void)cudaGetLastError();
        if (why)
            why->keep(st); /* a config that does not finalize: the next one is tried */
        return ga_ok();
    }
    int64_t n = 0, size = 0;
    GA_CUDNN_TRY(cudnnBackendGetAttribute(d.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                          CUDNN_TYPE_INT64, 1, &n, &size));
    if (size < 0 || (uint64_t)size > (uint64_t)ws_limit)
        return ga_ok();
    *plan = std::move(d);
    *workspace = size;
    *ok = true;
    return ga_ok();
}

/* The heuristic's configs for `mode`, in its order, filtered by the notes
 * and the workspace, that finalize into plans: at most kMaxCandidates. */
ga_status heuristic_plans(cudnnHandle_t handle, const std::shared_ptr<Graph> &g, const Problem &p,
                          cudnnBackendHeurMode_t mode, std::vector<std::shared_ptr<ExecPlan>> *out,
                          Refusal *why, SearchBudget *budget)
{
    Desc heur;
    GA_TRY_STATUS(make_desc(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
    cudnnBackendDescriptor_t og = g->op_graph.get();
    GA_SET(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
           &og);
    GA_SET(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    ga_cudnn_discard_last_error();
    ga_status st = finalize_status(cudnnBackendFinalize(heur.get()), "cudnnBackendFinalize(heur)",
                                   __FILE__, __LINE__);
    if (is_unsupported(st)) {
        why->keep(st);
        return ga_ok(); /* this mode has nothing for the graph */
    }
    GA_TRY_STATUS(st);
    int64_t count = 0;
    GA_CUDNN_TRY(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    count = std::min(count, kMaxHeuristicResults);
    if (count <= 0)
        return ga_ok();
    /* results are copied into engine-config descriptors we create */
    std::vector<Desc> cfgs((size_t)count);
    std::vector<cudnnBackendDescriptor_t> raw((size_t)count);
    for (int64_t i = 0; i < count; i++) {
        GA_TRY_STATUS(make_desc(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[(size_t)i]));
        raw[(size_t)i] = cfgs[(size_t)i].get();
    }
    int64_t got = 0;
    GA_CUDNN_TRY(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()));
    got = std::min(got, count);
    for (int64_t i = 0; i < got; i++) {
        if (!budget->allows((int)out->size()))
            break;
        Desc &cfg = cfgs[(size_t)i];
        Desc engine;
        GA_TRY_STATUS(make_desc(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine));
        cudnnBackendDescriptor_t engine_raw = engine.get();
        int64_t n = 0;
        GA_CUDNN_TRY(cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine_raw));
        bool allowed = false;
        GA_TRY_STATUS(engine_allowed(engine.get(), p, &allowed));
        if (!allowed)
            continue;
        /* skip configs known to need too much workspace before paying for a
         * finalization (which may compile kernels); cuDNN < 9.2 lacks the
         * attribute, and the plan's own size is checked below anyway */
        int64_t cfg_ws = 0;
        if (cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE,
                                     CUDNN_TYPE_INT64, 1, &n, &cfg_ws) == CUDNN_STATUS_SUCCESS &&
            (cfg_ws < 0 || (uint64_t)cfg_ws > (uint64_t)p.ws_size))
            continue;
        budget->finalizations--;
        auto ep = std::make_shared<ExecPlan>();
        bool ok = false;
        GA_TRY_STATUS(
            finalize_plan(handle, cfg.get(), p.ws_size, &ep->plan, &ep->workspace, &ok, why));
        if (!ok)
            continue;
        ep->graph = g;
        ep->engine = std::move(engine);
        ep->cfg = std::move(cfg);
        out->push_back(std::move(ep));
    }
    return ga_ok();
}

/* Rebuilds exactly the engine config `c` for the graph; *out stays empty
 * when it no longer applies (another cuDNN, GPU or request), so the caller
 * tunes instead.  Every failure here is "does not apply": the choice came
 * from a file. */
ga_status plan_from_choice(cudnnHandle_t handle, const std::shared_ptr<Graph> &g, const Problem &p,
                           const EngineChoice &c, std::shared_ptr<ExecPlan> *out)
{
    out->reset();
    cudnnBackendDescriptor_t og = g->op_graph.get();
    int64_t n = 0, engines = 0;
    GA_CUDNN_TRY(cudnnBackendGetAttribute(og, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT,
                                          CUDNN_TYPE_INT64, 1, &n, &engines));
    if (c.engine < 0 || c.engine >= engines)
        return ga_ok();
    auto ep = std::make_shared<ExecPlan>();
    ep->graph = g;
    GA_TRY_STATUS(make_desc(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &ep->engine));
    cudnnBackendDescriptor_t engine = ep->engine.get();
    int64_t index = c.engine;
    GA_SET(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og);
    GA_SET(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index);
    if (cudnnBackendFinalize(engine) != CUDNN_STATUS_SUCCESS)
        return ga_ok();
    bool allowed = false;
    GA_TRY_STATUS(engine_allowed(engine, p, &allowed));
    if (!allowed)
        return ga_ok();
    std::vector<cudnnBackendDescriptor_t> choices;
    for (const auto &k : c.knobs) {
        Desc choice;
        GA_TRY_STATUS(make_desc(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &choice));
        cudnnBackendKnobType_t type = (cudnnBackendKnobType_t)k.first;
        int64_t value = k.second;
        if (cudnnBackendSetAttribute(choice.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                                     CUDNN_TYPE_KNOB_TYPE, 1, &type) != CUDNN_STATUS_SUCCESS ||
            cudnnBackendSetAttribute(choice.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE,
                                     CUDNN_TYPE_INT64, 1, &value) != CUDNN_STATUS_SUCCESS ||
            cudnnBackendFinalize(choice.get()) != CUDNN_STATUS_SUCCESS)
            return ga_ok();
        choices.push_back(choice.get());
        ep->knob_choices.push_back(std::move(choice));
    }
    GA_TRY_STATUS(make_desc(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &ep->cfg));
    GA_SET(ep->cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &engine);
    if (!choices.empty() &&
        cudnnBackendSetAttribute(ep->cfg.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)choices.size(),
                                 choices.data()) != CUDNN_STATUS_SUCCESS)
        return ga_ok();
    if (cudnnBackendFinalize(ep->cfg.get()) != CUDNN_STATUS_SUCCESS)
        return ga_ok();
    bool ok = false;
    GA_TRY_STATUS(finalize_plan(handle, ep->cfg.get(), p.ws_size, &ep->plan, &ep->workspace, &ok));
    if (ok)
        *out = std::move(ep);
    return ga_ok();
}

/* Reads back the engine index and knob settings of a plan's config. */
ga_status describe_choice(const ExecPlan &ep, EngineChoice *c)
{
    int64_t n = 0;
    GA_CUDNN_TRY(cudnnBackendGetAttribute(ep.engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
                                          CUDNN_TYPE_INT64, 1, &n, &c->engine));
    std::vector<Desc> knobs(CUDNN_KNOB_TYPE_COUNTS);
    std::vector<cudnnBackendDescriptor_t> raw(CUDNN_KNOB_TYPE_COUNTS);
    for (size_t i = 0; i < knobs.size(); i++) {
        GA_TRY_STATUS(make_desc(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &knobs[i]));
        raw[i] = knobs[i].get();
    }
    int64_t got = 0;
    GA_CUDNN_TRY(cudnnBackendGetAttribute(ep.cfg.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                          (int64_t)CUDNN_KNOB_TYPE_COUNTS, &got, raw.data()));
    c->knobs.clear();
    for (int64_t i = 0; i < std::min<int64_t>(got, CUDNN_KNOB_TYPE_COUNTS); i++) {
        cudnnBackendKnobType_t type = CUDNN_KNOB_TYPE_COUNTS;
        int64_t value = 0;
        GA_CUDNN_TRY(cudnnBackendGetAttribute(raw[(size_t)i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                                              CUDNN_TYPE_KNOB_TYPE, 1, &n, &type));
        GA_CUDNN_TRY(cudnnBackendGetAttribute(raw[(size_t)i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE,
                                              CUDNN_TYPE_INT64, 1, &n, &value));
        c->knobs.emplace_back((int64_t)type, value);
    }
    return ga_ok();
}

/* ============================================================ execution */

ga_status make_variant_pack(const Graph &g, const Problem &p, Desc *out)
{
    std::vector<void *> pointers;
    for (int64_t uid : g.uids)
        pointers.push_back(uid_pointer(p, uid));
    void *ws = p.ws_size ? p.ws : nullptr;
    int64_t n = (int64_t)g.uids.size();
    GA_TRY_STATUS(make_desc(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, out));
    GA_SET(out->get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, g.uids.data());
    GA_SET(out->get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n,
           pointers.data());
    GA_SET(out->get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    GA_CUDNN_TRY(cudnnBackendFinalize(out->get()));
    return ga_ok();
}

ga_status execute_plan(cudnnHandle_t handle, const ExecPlan &ep, const Problem &p)
{
    Desc pack;
    GA_TRY_STATUS(make_variant_pack(*ep.graph, p, &pack));
    GA_CUDNN_TRY(cudnnBackendExecute(handle, ep.plan.get(), pack.get()));
    return ga_ok();
}

class Event
{
  public:
    Event() = default;
    ~Event()
    {
        if (e_)
            cudaEventDestroy(e_);
    }
    Event(const Event &) = delete;
    Event &operator=(const Event &) = delete;
    ga_status create()
    {
        GA_CUDA_TRY(cudaEventCreate(&e_));
        return ga_ok();
    }
    cudaEvent_t get() const
    {
        return e_;
    }

  private:
    cudaEvent_t e_ = nullptr;
};

/* Whether work queued on `s` is being captured into a CUDA graph. */
bool stream_capturing(cudaStream_t s)
{
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &status) != cudaSuccess) {
        (void)cudaGetLastError();
        return true; /* cannot tell: be as careful as under capture */
    }
    return status != cudaStreamCaptureStatusNone;
}

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

/* Picks the candidate to use.  Each runs once (a config that finalizes may
 * still fail to launch here); the survivors are timed on the caller's
 * stream when `time_them` and there are several.  The inputs are only
 * read and the outputs are overwritten again by the chosen plan, so the
 * trial runs leave no trace. */
ga_status pick_plan(cudnnHandle_t handle, cudaStream_t s, const Problem &p,
                    const std::vector<std::shared_ptr<ExecPlan>> &cands, bool time_them,
                    size_t *best, bool *timed)
{
    *best = 0;
    *timed = false;
    Desc pack; /* the candidates share one graph, so one variant pack */
    GA_TRY_STATUS(make_variant_pack(*cands[0]->graph, p, &pack));
    std::vector<size_t> alive;
    for (size_t i = 0; i < cands.size(); i++) {
        if (cudnnBackendExecute(handle, cands[i]->plan.get(), pack.get()) == CUDNN_STATUS_SUCCESS)
            alive.push_back(i);
        else
            (void)cudaGetLastError();
    }
    if (alive.empty())
        return ga_status_make(GA_ERR_NOT_SUPPORTED, kNoPlanRan, "no plan ran",
                              "cuDNN's plans for this graph finalized but none executed",
                              "cudnnBackendExecute", __FILE__, __LINE__);
    *best = alive[0];
    if (!time_them || alive.size() == 1)
        return ga_ok();
    Event start, end;
    GA_TRY_STATUS(start.create());
    GA_TRY_STATUS(end.create());
    float best_ms = std::numeric_limits<float>::infinity();
    for (size_t i : alive) {
        GA_CUDA_TRY(cudaEventRecord(start.get(), s));
        bool failed = false;
        for (int it = 0; it < kTimedIterations && !failed; it++)
            failed = cudnnBackendExecute(handle, cands[i]->plan.get(), pack.get()) !=
                     CUDNN_STATUS_SUCCESS;
        GA_CUDA_TRY(cudaEventRecord(end.get(), s));
        GA_CUDA_TRY(cudaEventSynchronize(end.get()));
        if (failed) {
            (void)cudaGetLastError();
            continue;
        }
        float ms = 0.0f;
        GA_CUDA_TRY(cudaEventElapsedTime(&ms, start.get(), end.get()));
        if (ms < best_ms) {
            best_ms = ms;
            *best = i;
        }
    }
    *timed = true;
    return ga_ok();
}

/* Builds the graph and finds a plan for it: the preferred engine config
 * when it still applies, else the heuristic's candidates (mode A, then the
 * fallback mode), timed unless results must be deterministic — then the
 * heuristic's order decides, so every process picks the same engine. */
ga_status tune_graph(cudnnHandle_t handle, cudaStream_t s, const Problem &p, GraphKind kind,
                     const EngineChoice *preferred, std::shared_ptr<ExecPlan> *plan,
                     EngineChoice *choice, bool *tuned, Refusal *why)
{
    *tuned = false;
    plan->reset();
    std::shared_ptr<Graph> g;
    GA_TRY_STATUS(build_graph(handle, p, kind, &g));
    if (preferred) {
        GA_TRY_STATUS(plan_from_choice(handle, g, p, *preferred, plan));
        if (*plan) {
            *choice = *preferred;
            return ga_ok();
        }
    }
    /* mode A's candidates first; the fallback mode's when none of those
     * finalizes or none of them launches here */
    const cudnnBackendHeurMode_t modes[] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    ga_status last = CONV_UNSUPPORTED("no cuDNN engine for this graph");
    SearchBudget budget(p.geom.deterministic != 0);
    for (cudnnBackendHeurMode_t mode : modes) {
        std::vector<std::shared_ptr<ExecPlan>> cands;
        GA_TRY_STATUS(heuristic_plans(handle, g, p, mode, &cands, why, &budget));
        if (cands.empty())
            continue;
        size_t best = 0;
        last = pick_plan(handle, s, p, cands, !p.geom.deterministic, &best, tuned);
        if (is_unsupported(last)) {
            why->keep(last);
            continue;
        }
        GA_TRY_STATUS(last);
        GA_TRY_STATUS(describe_choice(*cands[best], choice));
        *plan = cands[best];
        return ga_ok();
    }
    return last;
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

/* "eng<index>[:k<type>=<value>,...]", prefixed "unfused:" for the unfused
 * route; "direct" for the direct kernels. */
std::string choice_string(Route route, const EngineChoice &c)
{
    if (route == ROUTE_DIRECT)
        return "direct";
    char buf[64];
    std::string s = route == ROUTE_UNFUSED ? "unfused:" : route == ROUTE_SPLIT ? "split:" : "";
    snprintf(buf, sizeof buf, "eng%lld", (long long)c.engine);
    s += buf;
    for (size_t i = 0; i < c.knobs.size(); i++) {
        snprintf(buf, sizeof buf, "%ck%lld=%lld", i == 0 ? ':' : ',', (long long)c.knobs[i].first,
                 (long long)c.knobs[i].second);
        s += buf;
    }
    return s;
}

bool parse_int(const std::string &s, size_t *pos, int64_t *out)
{
    size_t i = *pos;
    bool negative = i < s.size() && s[i] == '-';
    if (negative)
        i++;
    if (i >= s.size() || s[i] < '0' || s[i] > '9')
        return false;
    int64_t v = 0;
    for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; i++) {
        if (v > (std::numeric_limits<int64_t>::max() - (s[i] - '0')) / 10)
            return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = negative ? -v : v;
    *pos = i;
    return true;
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
    if (s.compare(pos, 3, "eng") != 0)
        return false;
    pos += 3;
    if (!parse_int(s, &pos, &c->engine) || c->engine < 0)
        return false;
    c->knobs.clear();
    if (pos == s.size())
        return true;
    if (s[pos] != ':')
        return false;
    pos++;
    for (;;) {
        int64_t type = 0, value = 0;
        if (pos >= s.size() || s[pos] != 'k')
            return false;
        pos++;
        if (!parse_int(s, &pos, &type) || pos >= s.size() || s[pos] != '=')
            return false;
        pos++;
        if (!parse_int(s, &pos, &value))
            return false;
        if (type < 0 || type >= CUDNN_KNOB_TYPE_COUNTS)
            return false;
        c->knobs.emplace_back(type, value);
        if (pos == s.size())
            return true;
        if (s[pos] != ',')
            return false;
        pos++;
    }
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
    GA_TRY_STATUS(plan_from_choice(handle, g, p, e.choice, out));
    if (!*out)
        return CONV_UNSUPPORTED("the cached engine config does not finalize on this handle");
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
    if (fused && !fused_refused) {
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
