/*
 * cudnn_graph.cu — cuDNN's graph (backend) API for any operation graph:
 * see cudnn_graph.cuh.  Host code; no kernels.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <mutex>

#include "cudnn_graph.cuh"

namespace ga_cudnn
{

/* ========================================================= descriptors */

namespace
{

/* Set at process exit, before the plan caches are destroyed: by then
 * cuDNN's own state may already be gone, so cached descriptors are left to
 * the OS rather than destroyed through a library that is shutting down. */
std::atomic<bool> g_exiting{false};

void mark_exiting()
{
    g_exiting.store(true);
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

} // namespace

bool exiting()
{
    return g_exiting.load();
}

/* Registered after the plan cache and cuDNN exist, so that it runs before
 * either is torn down (exit handlers and static destructors run in reverse
 * order of registration). */
void register_exit_hook()
{
    static std::once_flag once;
    std::call_once(once, [] { std::atexit(mark_exiting); });
}

ga_status make_desc(cudnnBackendDescriptorType_t type, Desc *out)
{
    cudnnBackendDescriptor_t d = nullptr;
    GA_CUDNN_TRY(cudnnBackendCreateDescriptor(type, &d));
    *out = Desc(d);
    return ga_ok();
}

ga_status unsupported(const char *why, const char *where, const char *file, int line)
{
    return ga_status_make(GA_ERR_NOT_SUPPORTED, 0, 0, why, where, file, line);
}

bool is_unsupported(const ga_status &st)
{
    return st.error == GA_ERR_NOT_SUPPORTED;
}

bool soft_failure(cudnnStatus_t s)
{
    int category = (int)s / 1000 * 1000;
    return category == CUDNN_STATUS_BAD_PARAM || category == CUDNN_STATUS_NOT_SUPPORTED ||
           s == CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED ||
           s == CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED;
}

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

void Refusal::keep(ga_fallback_reason why, int st, const char *what)
{
    if (why <= reason)
        return;
    reason = why;
    status = st;
    text = what ? what : "";
}

void Refusal::keep(const ga_status &st, ga_fallback_reason floor)
{
    if (!is_unsupported(st))
        return;
    ga_fallback_reason why = cudnn_reason(st.code);
    char text_buf[240];
    snprintf(text_buf, sizeof text_buf, "%s%s%s: %s", st.name ? st.name : "", st.name ? " at " : "",
             st.call ? st.call : "cuDNN", st.message ? st.message : "");
    keep(why > floor ? why : floor, st.code, text_buf);
}

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

/* ============================================================ handles */

namespace
{

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

} // namespace

cudnnHandle_t held_handle(int device)
{
    for (auto &h : t_handles.held)
        if (h.first == device)
            return h.second;
    return nullptr;
}

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

cudaStream_t cudnn_stream(cudaStream_t s)
{
    return s == cudaStreamLegacy ? (cudaStream_t)0 : s;
}

bool stream_capturing(cudaStream_t s)
{
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &status) != cudaSuccess) {
        (void)cudaGetLastError();
        return true; /* cannot tell: be as careful as under capture */
    }
    return status != cudaStreamCaptureStatusNone;
}

/* ============================================================= graphs */

ga_status add_tensor(Graph &g, int64_t uid, cudnnDataType_t type, int ndim, const int64_t *dims,
                     const int64_t *strides, int64_t align, bool is_virtual,
                     cudnnBackendDescriptor_t *out)
{
    Desc t;
    GA_TRY_STATUS(make_desc(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t));
    GA_SET(t.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    GA_SET(t.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, ndim, dims);
    GA_SET(t.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, ndim, strides);
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

bool activation_mode(ga_activation act, cudnnPointwiseMode_t *mode)
{
    switch (act) {
    case GA_ACT_RELU: *mode = CUDNN_POINTWISE_RELU_FWD; return true;
    case GA_ACT_GELU: *mode = CUDNN_POINTWISE_GELU_FWD; return true;
    case GA_ACT_GELU_TANH: *mode = CUDNN_POINTWISE_GELU_APPROX_TANH_FWD; return true;
    case GA_ACT_SILU: *mode = CUDNN_POINTWISE_SWISH_FWD; return true;
    case GA_ACT_SIGMOID: *mode = CUDNN_POINTWISE_SIGMOID_FWD; return true;
    default: return false;
    }
}

ga_status add_pointwise(Graph &g, cudnnDataType_t precision, cudnnPointwiseMode_t mode,
                        cudnnBackendDescriptor_t in, cudnnBackendDescriptor_t b,
                        cudnnBackendDescriptor_t out, cudnnBackendDescriptor_t *op_out)
{
    Desc pw;
    GA_TRY_STATUS(make_desc(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw));
    GA_SET(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    GA_SET(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
    if (mode == CUDNN_POINTWISE_SWISH_FWD || mode == CUDNN_POINTWISE_SWISH_BWD) {
        /* swish(x) = x sigmoid(beta x): beta 1 is silu (set as the frontend does, a double) */
        double beta = 1.0;
        GA_SET(pw.get(), CUDNN_ATTR_POINTWISE_SWISH_BETA, CUDNN_TYPE_DOUBLE, 1, &beta);
    }
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

ga_status finish_graph(Graph &g, cudnnHandle_t handle,
                       const std::vector<cudnnBackendDescriptor_t> &ops)
{
    GA_TRY_STATUS(make_desc(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &g.op_graph));
    GA_SET(g.op_graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
           (int64_t)ops.size(), ops.data());
    /* optional since cuDNN 9.8 (deprecated there), required before; the
     * descriptor test (tests/test_cuda_descriptors.py) builds graphs with
     * no handle, since without a GPU cudnnCreate fails */
    if (handle)
        GA_SET(g.op_graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    GA_FINALIZE(g.op_graph.get());
    return ga_ok();
}

/* ============================================================== plans */

ga_status engine_allowed(cudnnBackendDescriptor_t engine, const EngineRules &rules, bool *allowed)
{
    cudnnBackendNumericalNote_t notes[kMaxNotes];
    int64_t n = 0;
    GA_CUDNN_TRY(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                          CUDNN_TYPE_NUMERICAL_NOTE, kMaxNotes, &n, notes));
    *allowed = true;
    for (int64_t i = 0; i < std::min<int64_t>(n, kMaxNotes); i++) {
        if (rules.deterministic && notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)
            *allowed = false;
        if (notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)
            *allowed = false;
        if (rules.strict_fp32 && notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE)
            *allowed = false;
    }
    return ga_ok();
}

ga_status finalize_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t cfg, size_t ws_limit,
                        Desc *plan, int64_t *workspace, bool *ok, Refusal *why)
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

ga_status heuristic_plans(cudnnHandle_t handle, const std::shared_ptr<Graph> &g,
                          const EngineRules &rules, cudnnBackendHeurMode_t mode,
                          std::vector<std::shared_ptr<ExecPlan>> *out, Refusal *why,
                          SearchBudget *budget)
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
        GA_TRY_STATUS(engine_allowed(engine.get(), rules, &allowed));
        if (!allowed)
            continue;
        /* skip configs known to need too much workspace before paying for a
         * finalization (which may compile kernels); cuDNN < 9.2 lacks the
         * attribute, and the plan's own size is checked below anyway */
        int64_t cfg_ws = 0;
        if (cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE,
                                     CUDNN_TYPE_INT64, 1, &n, &cfg_ws) == CUDNN_STATUS_SUCCESS &&
            (cfg_ws < 0 || (uint64_t)cfg_ws > (uint64_t)rules.workspace))
            continue;
        budget->finalizations--;
        auto ep = std::make_shared<ExecPlan>();
        bool ok = false;
        GA_TRY_STATUS(
            finalize_plan(handle, cfg.get(), rules.workspace, &ep->plan, &ep->workspace, &ok, why));
        if (!ok)
            continue;
        ep->graph = g;
        ep->engine = std::move(engine);
        ep->cfg = std::move(cfg);
        out->push_back(std::move(ep));
    }
    return ga_ok();
}

/* Every failure here is "does not apply": the choice came from a file. */
ga_status plan_from_choice(cudnnHandle_t handle, const std::shared_ptr<Graph> &g,
                           const EngineRules &rules, const EngineChoice &c,
                           std::shared_ptr<ExecPlan> *out)
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
    GA_TRY_STATUS(engine_allowed(engine, rules, &allowed));
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
    GA_TRY_STATUS(
        finalize_plan(handle, ep->cfg.get(), rules.workspace, &ep->plan, &ep->workspace, &ok));
    if (ok)
        *out = std::move(ep);
    return ga_ok();
}

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

std::string engine_choice_string(const EngineChoice &c)
{
    char buf[64];
    snprintf(buf, sizeof buf, "eng%lld", (long long)c.engine);
    std::string s = buf;
    for (size_t i = 0; i < c.knobs.size(); i++) {
        snprintf(buf, sizeof buf, "%ck%lld=%lld", i == 0 ? ':' : ',', (long long)c.knobs[i].first,
                 (long long)c.knobs[i].second);
        s += buf;
    }
    return s;
}

namespace
{

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

} // namespace

bool parse_engine_choice(const std::string &s, size_t pos, EngineChoice *c)
{
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

/* ========================================================== execution */

ga_status make_variant_pack(const Graph &g, const std::vector<void *> &pointers, void *workspace,
                            Desc *out)
{
    int64_t n = (int64_t)g.uids.size();
    GA_TRY_STATUS(make_desc(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, out));
    GA_SET(out->get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, g.uids.data());
    GA_SET(out->get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n,
           pointers.data());
    GA_SET(out->get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    GA_CUDNN_TRY(cudnnBackendFinalize(out->get()));
    return ga_ok();
}

ga_status execute_plan(cudnnHandle_t handle, const ExecPlan &ep, const Desc &pack)
{
    GA_CUDNN_TRY(cudnnBackendExecute(handle, ep.plan.get(), pack.get()));
    return ga_ok();
}

ga_status pick_plan(cudnnHandle_t handle, cudaStream_t s, const Desc &pack,
                    const std::vector<std::shared_ptr<ExecPlan>> &cands, bool time_them,
                    size_t *best, bool *timed)
{
    *best = 0;
    *timed = false;
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

ga_status search_plan(cudnnHandle_t handle, cudaStream_t s, const std::shared_ptr<Graph> &g,
                      const EngineRules &rules, const Desc &pack, const EngineChoice *preferred,
                      std::shared_ptr<ExecPlan> *plan, EngineChoice *choice, bool *tuned,
                      Refusal *why)
{
    *tuned = false;
    plan->reset();
    if (preferred) {
        GA_TRY_STATUS(plan_from_choice(handle, g, rules, *preferred, plan));
        if (*plan) {
            *choice = *preferred;
            return ga_ok();
        }
    }
    /* mode A's candidates first; the fallback mode's when none of those
     * finalizes or none of them launches here */
    const cudnnBackendHeurMode_t modes[] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    ga_status last = GA_CUDNN_UNSUPPORTED("no cuDNN engine for this graph");
    SearchBudget budget(rules.deterministic);
    for (cudnnBackendHeurMode_t mode : modes) {
        std::vector<std::shared_ptr<ExecPlan>> cands;
        GA_TRY_STATUS(heuristic_plans(handle, g, rules, mode, &cands, why, &budget));
        if (cands.empty())
            continue;
        size_t best = 0;
        last = pick_plan(handle, s, pack, cands, !rules.deterministic, &best, tuned);
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

} // namespace ga_cudnn
