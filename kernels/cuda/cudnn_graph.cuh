/*
 * cudnn_graph.cuh — cuDNN's graph (backend) API as gpuaccel uses it, for
 * any operation graph: descriptors that destroy themselves, the statuses
 * that mean "this graph does not run here" and the fallback reasons they
 * become, per-thread handles, building tensors, pointwise operations and
 * operation graphs, and the search for an execution plan (heuristics,
 * numerical-note filter, finalization within a budget, trial runs and
 * timing, and the engine choice written as a short string that another
 * process can rebuild).  conv.cu describes convolutions with it; what a
 * graph computes, and which graphs to try in what order, is the caller's.
 *
 * Host code (kernels/cuda/cudnn_graph.cu); the CUDA build only.
 */
#ifndef GPUACCEL_CUDA_CUDNN_GRAPH_CUH
#define GPUACCEL_CUDA_CUDNN_GRAPH_CUH

#include <stdint.h>

#include <cudnn.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common.cuh"

namespace ga_cudnn
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

/* ========================================================= descriptors */

/* Called once cuDNN and the plan caches exist: from then on, descriptors
 * alive at process exit are left to the OS instead of being destroyed
 * through a library that may already be shutting down. */
void register_exit_hook();
bool exiting();

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
        if (d_ && !exiting())
            cudnnBackendDestroyDescriptor(d_);
        d_ = nullptr;
    }

  private:
    cudnnBackendDescriptor_t d_ = nullptr;
};

ga_status make_desc(cudnnBackendDescriptorType_t type, Desc *out);

/* ============================================== statuses and refusals */

/* Internally GA_ERR_NOT_SUPPORTED means "cuDNN cannot do this here, take
 * the next route"; a caller always has a route that cannot refuse (its
 * own kernels), so it never reaches csrc/. */
ga_status unsupported(const char *why, const char *where, const char *file, int line);
#define GA_CUDNN_UNSUPPORTED(why) ga_cudnn::unsupported((why), __func__, __FILE__, __LINE__)
bool is_unsupported(const ga_status &st);

/* Statuses that mean "this graph / configuration does not run here": the
 * parameter and not-supported families, a missing engine sub-library and a
 * failed runtime compilation.  Anything else is a real error. */
bool soft_failure(cudnnStatus_t s);

/* Why a soft failure made a route fall back (kernels.h's reasons); the
 * status of an unsupported ga_status is cuDNN's, or one of these two. */
constexpr int kNoStatus = 0;   /* gpuaccel's own "no engine" */
constexpr int kNoPlanRan = -1; /* plans finalized, none executed */
ga_fallback_reason cudnn_reason(int status);

/* A finalization's status: ok, unsupported with cuDNN's own reason (read,
 * and so cleared, right after the failure), or a real error. */
ga_status finalize_status(cudnnStatus_t s, const char *call, const char *file, int line);

/* Setting an attribute only fails on a wrong name, type or count — a bug
 * here, reported as such; finalizing checks the content and may say "not
 * supported", which selects the next route. */
#define GA_SET(desc, name, type, count, values) \
    GA_CUDNN_TRY(cudnnBackendSetAttribute((desc), (name), (type), (count), (values)))
#define GA_FINALIZE(desc)                                                                        \
    do {                                                                                         \
        ga_cudnn_discard_last_error();                                                           \
        GA_TRY_STATUS(ga_cudnn::finalize_status(                                                 \
            cudnnBackendFinalize(desc), "cudnnBackendFinalize(" #desc ")", __FILE__, __LINE__)); \
    } while (0)

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

    void keep(ga_fallback_reason why, int st, const char *what);
    /* an unsupported status: cuDNN's (or gpuaccel's own) reason and text */
    void keep(const ga_status &st, ga_fallback_reason floor = GA_FALLBACK_NONE);
};

/* ============================================================ handles */

/* The handle the calling thread holds for `device`, or null (then
 * thread_handle takes one). */
cudnnHandle_t held_handle(int device);
/* The calling thread's handle for `device` (which is current): a cuDNN
 * handle must not be used by two threads at once, so each thread takes its
 * own from a pool (handles go back to it when the thread exits and are
 * never destroyed, so plans finalized with them stay valid). */
ga_status thread_handle(int device, cudnnHandle_t *out);
/* cuDNN gets 0 for the legacy default stream: the special handle value 1 is
 * only defined for the runtime it was created by. */
cudaStream_t cudnn_stream(cudaStream_t s);
/* Whether work queued on `s` is being captured into a CUDA graph (true
 * when that cannot be told: then be as careful as under capture). */
bool stream_capturing(cudaStream_t s);

/* ============================================================= graphs */

/* The descriptors of one operation graph.  Kept alive with every plan made
 * from it: cuDNN does not promise that a finalized plan is independent of
 * the descriptors it was built from. */
struct Graph {
    std::vector<Desc> parts;   /* tensors, operation descriptors, operations */
    Desc op_graph;             /* destroyed before the parts */
    std::vector<int64_t> uids; /* the real (non-virtual) tensors, in variant-pack order */
};

/* A tensor of the graph (virtual: an intermediate the engine keeps to
 * itself, not in the variant pack). */
ga_status add_tensor(Graph &g, int64_t uid, cudnnDataType_t type, int ndim, const int64_t *dims,
                     const int64_t *strides, int64_t align, bool is_virtual,
                     cudnnBackendDescriptor_t *out);
/* cuDNN's forward pointwise mode for an activation (kernels/activation.h's
 * definition: SWISH_FWD with beta 1 is silu, GELU_FWD the erf form);
 * false for one it has none for (hardswish), which then runs as gpuaccel's
 * own kernel after the graph. */
bool activation_mode(ga_activation act, cudnnPointwiseMode_t *mode);
/* out = mode(in), or out = mode(in, b) for binary modes (b null for unary
 * ones), computed in `precision`; the swish modes get beta 1 (silu). */
ga_status add_pointwise(Graph &g, cudnnDataType_t precision, cudnnPointwiseMode_t mode,
                        cudnnBackendDescriptor_t in, cudnnBackendDescriptor_t b,
                        cudnnBackendDescriptor_t out, cudnnBackendDescriptor_t *op_out);
/* The operation graph of `ops` (handle may be null: cuDNN >= 9.8 does not
 * need it, and without a GPU none can be created). */
ga_status finish_graph(Graph &g, cudnnHandle_t handle,
                       const std::vector<cudnnBackendDescriptor_t> &ops);

/* ============================================================== plans */

/* Which engines a request may use: the rules PyTorch applies. */
struct EngineRules {
    bool deterministic = false; /* no engine noted NONDETERMINISTIC */
    bool strict_fp32 = false;   /* float32 without TF32: no tensor-core engine */
    size_t workspace = 0;       /* bytes a plan may use */
};

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

/* Whether the engine's numerical notes fit the rules; engines that convert
 * their inputs down (bf16 squeezed into fp16's range, say) never do. */
ga_status engine_allowed(cudnnBackendDescriptor_t engine, const EngineRules &rules, bool *allowed);
/* Finalizes a plan for `cfg`; *ok stays false when the config does not run
 * here or needs more workspace than there is (both normal outcomes). */
ga_status finalize_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t cfg, size_t ws_limit,
                        Desc *plan, int64_t *workspace, bool *ok, Refusal *why = nullptr);
/* The heuristic's configs for `mode`, in its order, filtered by the rules
 * and the workspace, that finalize into plans within the budget. */
ga_status heuristic_plans(cudnnHandle_t handle, const std::shared_ptr<Graph> &g,
                          const EngineRules &rules, cudnnBackendHeurMode_t mode,
                          std::vector<std::shared_ptr<ExecPlan>> *out, Refusal *why,
                          SearchBudget *budget);
/* Rebuilds exactly the engine config `c` for the graph; *out stays empty
 * when it no longer applies (another cuDNN, GPU or request). */
ga_status plan_from_choice(cudnnHandle_t handle, const std::shared_ptr<Graph> &g,
                           const EngineRules &rules, const EngineChoice &c,
                           std::shared_ptr<ExecPlan> *out);
/* Reads back the engine index and knob settings of a plan's config. */
ga_status describe_choice(const ExecPlan &ep, EngineChoice *c);

/* "eng<index>[:k<type>=<value>,...]" */
std::string engine_choice_string(const EngineChoice &c);
/* Its inverse, from s[pos] to the end; false for anything else. */
bool parse_engine_choice(const std::string &s, size_t pos, EngineChoice *c);

/* ========================================================== execution */

/* The variant pack: the graph's real tensors (pointers in g.uids order)
 * and the workspace (null for none). */
ga_status make_variant_pack(const Graph &g, const std::vector<void *> &pointers, void *workspace,
                            Desc *out);
ga_status execute_plan(cudnnHandle_t handle, const ExecPlan &ep, const Desc &pack);

/* Picks the candidate to use.  Each runs once (a config that finalizes may
 * still fail to launch here); the survivors are timed on `s` when
 * `time_them` and there are several.  The inputs are only read and the
 * outputs are overwritten again by the chosen plan, so the trial runs leave
 * no trace. */
ga_status pick_plan(cudnnHandle_t handle, cudaStream_t s, const Desc &pack,
                    const std::vector<std::shared_ptr<ExecPlan>> &cands, bool time_them,
                    size_t *best, bool *timed);

/* A plan for a built graph: the preferred engine config when it still
 * applies, else the heuristic's candidates (mode A, then the fallback
 * mode), timed unless results must be deterministic — then the heuristic's
 * order decides, so every process picks the same engine.  Unsupported
 * (with `why` told why) when no engine runs the graph. */
ga_status search_plan(cudnnHandle_t handle, cudaStream_t s, const std::shared_ptr<Graph> &g,
                      const EngineRules &rules, const Desc &pack, const EngineChoice *preferred,
                      std::shared_ptr<ExecPlan> *plan, EngineChoice *choice, bool *tuned,
                      Refusal *why);

} // namespace ga_cudnn

#endif
