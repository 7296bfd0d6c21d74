/*
 * matmul.cu — D[b] = epilogue(A[b] @ B[b]) on the GPU with cuBLASLt.
 *
 * gpuaccel's matrices are row-major (NumPy order); cuBLASLt's are
 * column-major.  A row-major M x N matrix is, byte for byte, a column-major
 * N x M matrix, so D = A @ B is computed as D^T = B^T @ A^T: cuBLASLt's
 * "A" is our B, its "B" our A, its m our N and its n our M.  In that frame
 *   - our bias (one value per column of D) is cuBLASLt's bias (one per row),
 *   - our col_sums (sum of D over rows) are its BGRAD of the output (DGELU_BGRAD),
 *   - our a_row_sums (sum over k of A) are its BGRADB (sum over k of its B).
 *
 * Four ways to run, tried in this order; the first that can express the
 * call runs it, and matmul_stats() counts all but the first as fallbacks:
 *   1. fused: one cuBLASLt call with the epilogue (BIAS, RELU(_BIAS),
 *      GELU(_AUX)(_BIAS) — tanh-GELU, DGELU(_BGRAD), BGRADB);
 *   2. split, for an activation cuBLASLt's epilogues do not have (the
 *      exact erf GELU, silu, hardswish, sigmoid; relu when its
 *      pre-activation is kept, which RELU_AUX keeps only as a bit mask):
 *      the GEMM and its bias in one cuBLASLt call (BIAS epilogue) writing
 *      the pre-activation z once — into preact when it is kept, else into
 *      D — then epilogue.cu's activation kernel, D = act(z).  cuDNN's graph
 *      API could fuse these into a runtime-compiled matmul kernel, but it
 *      compiles one per shape (NVRTC, at every new batch or sequence
 *      length) and needs a warm-up before CUDA-graph capture; cuBLASLt
 *      needs neither, and the split costs one more pass over z;
 *   3. unfused: a plain cuBLASLt GEMM into D, then epilogue.cu's kernels
 *      (bias + activation, activation gradient + column sums, row sums of A)
 *      — when cuBLASLt has no algorithm for the fused epilogue (alignment,
 *      an aux leading dimension, relu's pre-activation, which cuBLASLt
 *      only keeps as a bit mask, ...);
 *   4. generic: a tiled CUDA kernel for any strides, any float dtype and a
 *      K of zero, then the same epilogue kernels — when cuBLASLt cannot
 *      describe the layout at all (no unit stride, negative strides).
 * A valid input therefore never ends in CUBLAS_STATUS_NOT_SUPPORTED.  The
 * report says why a call did not run fused (ga_fallback_reason, with
 * cuBLASLt's status and text): csrc/fallback.c counts the reasons and applies
 * the fallback policy to the ones that may hide a bug (INVALID_VALUE) or
 * cost the most (no algorithm even for the plain GEMM).
 *
 * Plans (matrix layouts + the heuristic's best algorithms, or "cuBLASLt
 * cannot" and why)
 * are cached per process by everything that decides them: device, shapes,
 * leading dimensions, batch strides, dtypes, epilogue, pointer alignments,
 * TF32 and determinism flags.  The matmul descriptor itself is built on each
 * call (a host-only struct) because it carries the call's pointers.
 */
#include <stdint.h>
#include <string.h>

#include <atomic>
#include <mutex>
#include <string>

#include <cublasLt.h>

#include "../kernels.h"
#include "common.cuh"
#include "fallback.h"
#include "plan_cache.h"

namespace
{

constexpr int kMaxDevices = 64;

/* ------------------------------------------------------------ handles */

std::mutex handle_mutex;
cublasLtHandle_t handles[kMaxDevices];

ga_status lt_handle(int device, cublasLtHandle_t *out)
{
    if (device < 0 || device >= kMaxDevices)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: device ordinal out of range");
    std::lock_guard<std::mutex> lock(handle_mutex);
    if (!handles[device])
        GA_CUBLAS_TRY(cublasLtCreate(&handles[device]));
    *out = handles[device];
    return ga_ok();
}

/* ------------------------------------------------------------ cuBLASLt */

cudaDataType_t lt_type(ga_dtype dtype)
{
    switch (dtype) {
    case GA_FLOAT16: return CUDA_R_16F;
    case GA_BFLOAT16: return CUDA_R_16BF;
    case GA_FLOAT32: return CUDA_R_32F;
    default: return CUDA_R_64F;
    }
}

/* How cuBLASLt sees X^T: a column-major matrix `rows x cols` with leading
 * dimension ld and op(X') = X^T.  False when X has no unit stride (or a
 * negative one): cuBLASLt cannot describe it. */
struct LtOperand {
    cublasOperation_t op;
    uint64_t rows, cols;
    int64_t ld;
};

bool transposed_operand(const ga_matrix &X, LtOperand *out)
{
    int64_t r = X.rows, c = X.cols;
    if ((c == 1 || X.col_stride == 1) && (r == 1 || X.row_stride >= (c > 1 ? c : 1))) {
        /* row-major X is column-major X^T (c x r) */
        out->op = CUBLAS_OP_N;
        out->rows = (uint64_t)c;
        out->cols = (uint64_t)r;
        out->ld = r == 1 ? (c > 1 ? c : 1) : X.row_stride;
        return true;
    }
    if ((r == 1 || X.row_stride == 1) && (c == 1 || X.col_stride >= (r > 1 ? r : 1))) {
        /* column-major X (r x c), transposed by the op */
        out->op = CUBLAS_OP_T;
        out->rows = (uint64_t)r;
        out->cols = (uint64_t)c;
        out->ld = c == 1 ? (r > 1 ? r : 1) : X.col_stride;
        return true;
    }
    return false;
}

/* An output-shaped matrix (D, preact, dact_aux) as column-major D^T:
 * row-major with a unit column stride. */
bool output_ld(const ga_matrix &X, int64_t *ld)
{
    if (!(X.cols == 1 || X.col_stride == 1))
        return false;
    int64_t need = X.cols > 1 ? X.cols : 1;
    if (X.rows == 1) {
        *ld = X.row_stride >= need ? X.row_stride : need;
        return true;
    }
    if (X.row_stride < need)
        return false;
    *ld = X.row_stride;
    return true;
}

bool batch_ok(const ga_matrix &X, int64_t batch, bool output)
{
    if (batch == 1)
        return true;
    return output ? X.batch_stride > 0 : X.batch_stride >= 0;
}

uint32_t alignment_of(const void *p)
{
    uintptr_t v = (uintptr_t)p;
    uint32_t a = 256;
    while (a > 1 && v % a)
        a >>= 1;
    return a;
}

/* The cuBLASLt epilogue for a descriptor, or why none is asked for (then
 * the GEMM runs plain and epilogue.cu finishes):
 *   - cublasLt.h's dtype rules: the bias has D's type, a bias gradient the
 *     output's type (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, _BIAS_POINTER);
 *     gpuaccel also sums float32 bias gradients of 16-bit outputs, which
 *     cuBLASLt would refuse at run time;
 *   - what cuBLASLt cannot express: relu's pre-activation (RELU_AUX keeps
 *     a bit mask), DRELU (it wants that mask), a per-batch bias gradient;
 *   - determinism: the BGRAD epilogues reduce inside cuBLASLt, which does
 *     not document them as deterministic, so set_deterministic(True) sums
 *     with epilogue.cu's fixed-order reduction instead;
 *   - accuracy: cuBLASLt's GELU and DGELU epilogues are not float64-exact
 *     (measured on an H200: 2.5e-10 off on values of order 1, where a
 *     float64 GELU is within 1e-15), so float64 GELUs run in gpuaccel's
 *     kernel, in float64. */
ga_fallback_reason fused_epilogue(const ga_matmul_desc *desc, cublasLtEpilogue_t *out)
{
    bool bias = desc->bias != NULL, preact = desc->preact.data != NULL;
    ga_dtype d_type = desc->d.dtype;
    if (desc->a_row_sums) {
        if (desc->a_row_sums_dtype != d_type)
            return GA_FALLBACK_EPILOGUE;
        if (desc->deterministic)
            return GA_FALLBACK_DETERMINISTIC;
        *out = CUBLASLT_EPILOGUE_BGRADB;
        return GA_FALLBACK_NONE;
    }
    if (desc->dact == GA_ACT_GELU_TANH) {
        if (desc->dact_aux.dtype != d_type || d_type == GA_FLOAT64)
            return GA_FALLBACK_EPILOGUE;
        if (desc->col_sums) {
            /* cuBLASLt's bias gradient is per batch (BIAS_BATCH_STRIDE),
             * col_sums sums over the batch too: fused only for one */
            if (desc->batch != 1 || desc->col_sums_dtype != d_type)
                return GA_FALLBACK_EPILOGUE;
            if (desc->deterministic)
                return GA_FALLBACK_DETERMINISTIC;
        }
        *out = desc->col_sums ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
        return GA_FALLBACK_NONE;
    }
    if (desc->dact != GA_ACT_NONE || desc->col_sums)
        return GA_FALLBACK_EPILOGUE; /* DRELU needs cuBLASLt's bit mask, not values */
    if (bias && desc->bias_dtype != d_type)
        return GA_FALLBACK_EPILOGUE;
    switch (desc->activation) {
    case GA_ACT_NONE:
        if (preact)
            return GA_FALLBACK_EPILOGUE;
        *out = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
        return GA_FALLBACK_NONE;
    case GA_ACT_RELU:
        if (preact)
            return GA_FALLBACK_EPILOGUE; /* RELU_AUX keeps a bit mask, not z */
        *out = bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
        return GA_FALLBACK_NONE;
    case GA_ACT_GELU_TANH:
        if (d_type == GA_FLOAT64)
            return GA_FALLBACK_EPILOGUE; /* not float64-accurate in cuBLASLt */
        if (preact) {
            if (desc->preact.dtype != d_type)
                return GA_FALLBACK_EPILOGUE;
            *out = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        } else {
            *out = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
        }
        return GA_FALLBACK_NONE;
    default: return GA_FALLBACK_EPILOGUE; /* cuBLASLt's epilogues know relu and tanh-GELU only */
    }
}

/* The split route (see the top of the file) for a descriptor whose forward
 * epilogue cuBLASLt cannot fuse: false when it does not apply (no
 * activation, a backward epilogue, a bias of another dtype than D's);
 * else *z_desc is the GEMM + bias part, writing z into preact (kept) or D,
 * with its epilogue, and *why says why the activation runs apart. */
bool split_epilogue(const ga_matmul_desc *desc, ga_matmul_desc *z_desc, cublasLtEpilogue_t *out,
                    const char **why)
{
    if (desc->activation == GA_ACT_NONE || desc->dact != GA_ACT_NONE || desc->col_sums ||
        desc->a_row_sums || (desc->bias && desc->bias_dtype != desc->d.dtype))
        return false;
    *z_desc = *desc;
    z_desc->activation = GA_ACT_NONE;
    if (desc->preact.data)
        z_desc->d = desc->preact;
    memset(&z_desc->preact, 0, sizeof z_desc->preact);
    *out = desc->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    switch (desc->activation) {
    case GA_ACT_RELU:
        *why = desc->preact.data
                   ? "cuBLASLt keeps relu's pre-activation only as a bit mask (RELU_AUX): GEMM + "
                     "bias in cuBLASLt into the pre-activation, then gpuaccel's relu kernel "
                     "(split route)"
                   : "cuBLASLt refused its relu epilogue here: GEMM + bias in cuBLASLt, then "
                     "gpuaccel's relu kernel (split route)";
        break;
    case GA_ACT_GELU:
        *why = "cuBLASLt's GELU epilogues are the tanh approximation: GEMM + bias in cuBLASLt, "
               "then gpuaccel's exact (erf) GELU kernel (split route)";
        break;
    case GA_ACT_GELU_TANH:
        *why = desc->d.dtype == GA_FLOAT64
                   ? "cuBLASLt's tanh-GELU epilogue is not float64-accurate: GEMM + bias in "
                     "cuBLASLt, then gpuaccel's tanh-GELU kernel in float64 (split route)"
                   : "cuBLASLt refused its tanh-GELU epilogue here: GEMM + bias in cuBLASLt, then "
                     "gpuaccel's tanh-GELU kernel (split route)";
        break;
    default:
        *why = "cuBLASLt has no epilogue for this activation (relu and tanh-GELU only): GEMM + "
               "bias in cuBLASLt, then gpuaccel's activation kernel (split route)";
        break;
    }
    return true;
}

const char *epilogue_name(cublasLtEpilogue_t e)
{
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_RELU: return "RELU";
    case CUBLASLT_EPILOGUE_RELU_BIAS: return "RELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU: return "GELU";
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return "DGELU_BGRAD";
    case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    default: return "?";
    }
}

bool epilogue_has_aux(cublasLtEpilogue_t e)
{
    return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
           e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}

bool epilogue_has_bias_pointer(cublasLtEpilogue_t e)
{
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS ||
           e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
           e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADB;
}

/* Everything one cuBLASLt call needs besides its pointers. */
struct LtCall {
    LtOperand first, second; /* cuBLASLt's A (our B^T) and B (our A^T) */
    int64_t ldd, ld_aux;
    int64_t batch;
    cublasLtEpilogue_t epilogue;
    cublasComputeType_t compute;
    cudaDataType_t scale_type, a_type, d_type, bias_type, aux_type;
    const void *bias_ptr; /* bias, col_sums or a_row_sums */
    void *aux_ptr;        /* preact or dact_aux */
    int64_t aux_batch_stride;
};

void layout_destroy(cublasLtMatrixLayout_t l)
{
    if (l)
        cublasLtMatrixLayoutDestroy(l);
}

/* Algorithms asked of the heuristic per plan: when the best one turns out
 * not to run for a call (cublasLtMatmul answers NOT_SUPPORTED on some
 * problems the heuristic accepted), the next is tried before the fused
 * form is given up for the shape. */
constexpr int kMaxAlgos = 8;

/* A cached plan: the four layouts and the heuristic's algorithms, best
 * first; `next` is the first that has not failed.  With none left the
 * plan is not usable, and `refusal` says why (read by the report). */
struct LtPlan {
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algos[kMaxAlgos];
    int nalgos = 0;
    std::atomic<int> next{0}; /* advanced by any thread that finds an algorithm failing */
    std::mutex mutex;         /* guards the refusal */
    ga_fallback_reason reason = GA_FALLBACK_NONE;
    int status = 0;
    std::string refusal;
    ~LtPlan()
    {
        layout_destroy(a);
        layout_destroy(b);
        layout_destroy(c);
        layout_destroy(d);
    }
    bool usable() const
    {
        return next.load() < nalgos;
    }
    void refuse(ga_fallback_reason why, cublasStatus_t st, const std::string &text)
    {
        std::lock_guard<std::mutex> lock(mutex);
        reason = why;
        status = (int)st;
        refusal = text;
    }
    void report(ga_op_report *rep, ga_fallback_reason floor)
    {
        std::lock_guard<std::mutex> lock(mutex);
        ga_op_report_fallback(rep, reason > floor ? reason : floor, status, refusal.c_str());
    }
};

ga_status make_layout(cublasLtMatrixLayout_t *out, cudaDataType_t type, uint64_t rows,
                      uint64_t cols, int64_t ld, int64_t batch, int64_t batch_stride)
{
    GA_CUBLAS_TRY(cublasLtMatrixLayoutCreate(out, type, rows, cols, ld));
    if (batch > 1) {
        int32_t count = (int32_t)batch;
        GA_CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                       &count, sizeof count));
        GA_CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(
            *out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride, sizeof batch_stride));
    }
    return ga_ok();
}

/* The call's matmul descriptor (freed by the caller). */
ga_status make_matmul_desc(const LtCall &c, cublasLtMatmulDesc_t *out)
{
    GA_CUBLAS_TRY(cublasLtMatmulDescCreate(out, c.compute, c.scale_type));
    cublasLtMatmulDesc_t d = *out;
    GA_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &c.first.op,
                                                 sizeof c.first.op));
    GA_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &c.second.op,
                                                 sizeof c.second.op));
    GA_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epilogue,
                                                 sizeof c.epilogue));
    if (epilogue_has_bias_pointer(c.epilogue)) {
        GA_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &c.bias_ptr, sizeof c.bias_ptr));
        int32_t bt = (int32_t)c.bias_type;
        GA_CUBLAS_TRY(
            cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    if (epilogue_has_aux(c.epilogue)) {
        GA_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                     &c.aux_ptr, sizeof c.aux_ptr));
        GA_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                     &c.ld_aux, sizeof c.ld_aux));
        if (c.batch > 1)
            GA_CUBLAS_TRY(
                cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE,
                                               &c.aux_batch_stride, sizeof c.aux_batch_stride));
    }
    return ga_ok();
}

/* The statuses that mean "cuBLASLt does not run this here", and why:
 * INVALID_VALUE is also what a wrongly described call gets, so it is kept
 * apart (the fallback policy warns about it) from plain NOT_SUPPORTED. */
bool lt_unsupported(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE ||
           s == CUBLAS_STATUS_ARCH_MISMATCH;
}

ga_fallback_reason lt_reason(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_INVALID_VALUE ? GA_FALLBACK_BAD_PARAM : GA_FALLBACK_NOT_SUPPORTED;
}

/* "<call>: <status> (<its text>) for epilogue <E>, D[b] (MxN) = A (MxK) @ B" */
std::string lt_refusal(const char *call, cublasStatus_t st, const LtCall &c,
                       const ga_matmul_desc *desc, const char *what)
{
    char buf[240];
    snprintf(buf, sizeof buf,
             "%s: %s (%s) for epilogue %s, D (%lldx%lld) = A (%lldx%lld) @ B, batch %lld", call,
             cublasLtGetStatusName(st), what ? what : cublasLtGetStatusString(st),
             epilogue_name(c.epilogue), (long long)desc->d.rows, (long long)desc->d.cols,
             (long long)desc->a.rows, (long long)desc->a.cols, (long long)c.batch);
    return buf;
}

struct DescGuard {
    cublasLtMatmulDesc_t d = nullptr;
    ~DescGuard()
    {
        if (d)
            cublasLtMatmulDescDestroy(d);
    }
};

struct PrefGuard {
    cublasLtMatmulPreference_t p = nullptr;
    ~PrefGuard()
    {
        if (p)
            cublasLtMatmulPreferenceDestroy(p);
    }
};

/* The four layouts of `c`: cuBLASLt's A and B (our B^T and A^T), C and D
 * (our D^T). */
ga_status make_layouts(const LtCall &c, const ga_matmul_desc *desc, LtPlan *plan)
{
    GA_TRY_STATUS(make_layout(&plan->a, c.a_type, c.first.rows, c.first.cols, c.first.ld, c.batch,
                              desc->b.batch_stride));
    GA_TRY_STATUS(make_layout(&plan->b, c.a_type, c.second.rows, c.second.cols, c.second.ld,
                              c.batch, desc->a.batch_stride));
    GA_TRY_STATUS(make_layout(&plan->c, c.d_type, (uint64_t)desc->d.cols, (uint64_t)desc->d.rows,
                              c.ldd, c.batch, desc->d.batch_stride));
    GA_TRY_STATUS(make_layout(&plan->d, c.d_type, (uint64_t)desc->d.cols, (uint64_t)desc->d.rows,
                              c.ldd, c.batch, desc->d.batch_stride));
    return ga_ok();
}

/* What the heuristic may choose: the workspace, the operands' alignments,
 * and no split-K reduction when deterministic. */
ga_status make_preference(const ga_matmul_desc *desc, size_t workspace_size, PrefGuard *pref)
{
    GA_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref->p));
    uint64_t ws = workspace_size;
    GA_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
        pref->p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    uint32_t align[4] = {alignment_of(desc->b.data), alignment_of(desc->a.data),
                         alignment_of(desc->d.data), alignment_of(desc->d.data)};
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int k = 0; k < 4; k++)
        GA_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref->p, align_attr[k], &align[k],
                                                           sizeof align[k]));
    if (desc->deterministic) {
        uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
        GA_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
            pref->p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &scheme, sizeof scheme));
    }
    return ga_ok();
}

/* Builds the plan for `c`: layouts and up to kMaxAlgos algorithms.  A
 * heuristic with no answer leaves the plan unusable, with the reason: not
 * an error, the fallback runs. */
ga_status build_plan(cublasLtHandle_t handle, const LtCall &c, const ga_matmul_desc *desc,
                     size_t workspace_size, LtPlan *plan)
{
    GA_TRY_STATUS(make_layouts(c, desc, plan));
    DescGuard md;
    GA_TRY_STATUS(make_matmul_desc(c, &md.d));
    PrefGuard pref;
    GA_TRY_STATUS(make_preference(desc, workspace_size, &pref));
    cublasLtMatmulHeuristicResult_t results[kMaxAlgos];
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, md.d, plan->a, plan->b, plan->c,
                                                       plan->d, pref.p, kMaxAlgos, results, &found);
    if (st != CUBLAS_STATUS_SUCCESS && !lt_unsupported(st))
        return ga_cublas_error(st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < found && i < kMaxAlgos; i++)
        if (results[i].state == CUBLAS_STATUS_SUCCESS)
            plan->algos[plan->nalgos++] = results[i].algo;
    if (plan->nalgos == 0) {
        cublasStatus_t why = st != CUBLAS_STATUS_SUCCESS ? st : CUBLAS_STATUS_NOT_SUPPORTED;
        plan->refuse(lt_reason(why), why,
                     lt_refusal("cublasLtMatmulAlgoGetHeuristic", why, c, desc,
                                st == CUBLAS_STATUS_SUCCESS ? "no algorithm" : nullptr));
    }
    return ga_ok();
}

std::string plan_key(int device, const LtCall &c, const ga_matmul_desc *desc, size_t workspace_size)
{
    std::string key;
    key.reserve(200);
    ga_key_append(key, device);
    ga_key_append(key, c.first);
    ga_key_append(key, c.second);
    ga_key_append(key, c.ldd);
    ga_key_append(key, c.ld_aux);
    ga_key_append(key, c.batch);
    ga_key_append(key, c.epilogue);
    ga_key_append(key, c.compute);
    ga_key_append(key, c.a_type);
    ga_key_append(key, c.d_type);
    ga_key_append(key, c.bias_type);
    ga_key_append(key, c.aux_batch_stride);
    ga_key_append(key, desc->a.batch_stride);
    ga_key_append(key, desc->b.batch_stride);
    ga_key_append(key, desc->d.batch_stride);
    ga_key_append(key, desc->d.rows);
    ga_key_append(key, desc->d.cols);
    uint32_t align[5] = {alignment_of(desc->a.data), alignment_of(desc->b.data),
                         alignment_of(desc->d.data), alignment_of(c.bias_ptr),
                         alignment_of(c.aux_ptr)};
    ga_key_append(key, align);
    ga_key_append(key, desc->deterministic);
    ga_key_append(key, workspace_size);
    return key;
}

/* Describes the call to cuBLASLt with the given epilogue (DEFAULT for the
 * plain GEMM of the unfused path).  False: cuBLASLt cannot express it. */
bool describe(const ga_matmul_desc *desc, cublasLtEpilogue_t epilogue, LtCall *c)
{
    memset(c, 0, sizeof *c);
    const ga_matrix &A = desc->a, &B = desc->b, &D = desc->d;
    if (desc->batch > INT32_MAX || !batch_ok(A, desc->batch, false) ||
        !batch_ok(B, desc->batch, false) || !batch_ok(D, desc->batch, true))
        return false;
    if (!transposed_operand(B, &c->first) || !transposed_operand(A, &c->second) ||
        !output_ld(D, &c->ldd))
        return false;
    c->batch = desc->batch;
    c->epilogue = epilogue;
    c->a_type = lt_type(A.dtype);
    c->d_type = lt_type(D.dtype);
    switch (A.dtype) {
    case GA_FLOAT64:
        c->compute = CUBLAS_COMPUTE_64F;
        c->scale_type = CUDA_R_64F;
        break;
    case GA_FLOAT32:
        c->compute = desc->allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        c->scale_type = CUDA_R_32F;
        break;
    default:
        c->compute = CUBLAS_COMPUTE_32F;
        c->scale_type = CUDA_R_32F;
        break;
    }
    if (epilogue == CUBLASLT_EPILOGUE_BGRADB) {
        c->bias_ptr = desc->a_row_sums;
        c->bias_type = lt_type(desc->a_row_sums_dtype);
    } else if (epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
        c->bias_ptr = desc->col_sums;
        c->bias_type = lt_type(desc->col_sums_dtype);
    } else if (epilogue_has_bias_pointer(epilogue)) {
        c->bias_ptr = desc->bias;
        c->bias_type = lt_type(desc->bias_dtype);
    }
    if (epilogue_has_aux(epilogue)) {
        const ga_matrix &X = desc->dact != GA_ACT_NONE ? desc->dact_aux : desc->preact;
        if (!output_ld(X, &c->ld_aux) || c->ld_aux % 8 || (uintptr_t)X.data % 16 ||
            !batch_ok(X, desc->batch, true) || (desc->batch > 1 && X.batch_stride % 8))
            return false;
        c->aux_ptr = X.data;
        c->aux_batch_stride = X.batch_stride;
    }
    if (c->bias_ptr && (uintptr_t)c->bias_ptr % 16)
        return false;
    return true;
}

/* One cuBLASLt call.  *ran false: cuBLASLt has no algorithm for it (the
 * caller falls back; *plan_out says why); a real failure is returned as
 * an error. */
ga_status lt_matmul(int device, const ga_matmul_desc *desc, const LtCall &c, void *workspace,
                    size_t workspace_size, cudaStream_t s, bool *ran, int *cache_hit,
                    std::shared_ptr<LtPlan> *plan_out)
{
    *ran = false;
    cublasLtHandle_t handle;
    GA_TRY_STATUS(lt_handle(device, &handle));
    GaPlanCache &cache = ga_matmul_plan_cache();
    std::string key = plan_key(device, c, desc, workspace_size);
    std::shared_ptr<LtPlan> plan = std::static_pointer_cast<LtPlan>(cache.find(key));
    *cache_hit = plan != nullptr;
    if (!plan) {
        plan = std::make_shared<LtPlan>();
        GA_TRY_STATUS(build_plan(handle, c, desc, workspace_size, plan.get()));
        cache.insert(key, plan);
    }
    *plan_out = plan;
    if (!plan->usable())
        return ga_ok();
    DescGuard md;
    GA_TRY_STATUS(make_matmul_desc(c, &md.d));
    float one_f = 1.0f, zero_f = 0.0f;
    double one_d = 1.0, zero_d = 0.0;
    const void *alpha = c.scale_type == CUDA_R_64F ? (const void *)&one_d : (const void *)&one_f;
    const void *beta = c.scale_type == CUDA_R_64F ? (const void *)&zero_d : (const void *)&zero_f;
    for (int i = plan->next.load(); i < plan->nalgos; i = plan->next.load()) {
        cublasStatus_t st = cublasLtMatmul(handle, md.d, alpha, desc->b.data, plan->a, desc->a.data,
                                           plan->b, beta, desc->d.data, plan->c, desc->d.data,
                                           plan->d, &plan->algos[i], workspace, workspace_size, s);
        if (st == CUBLAS_STATUS_SUCCESS) {
            *ran = true;
            return ga_ok();
        }
        if (!lt_unsupported(st))
            return ga_cublas_error(st, "cublasLtMatmul", __FILE__, __LINE__);
        /* this algorithm does not run here: the next one, for every later
         * call too (another thread may have moved on already) */
        plan->refuse(lt_reason(st), st, lt_refusal("cublasLtMatmul", st, c, desc, nullptr));
        int expected = i;
        plan->next.compare_exchange_strong(expected, i + 1);
    }
    return ga_ok();
}

} // namespace

extern "C" size_t ga_cuda_matmul_workspace_size(int device)
{
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return (size_t)4 << 20;
    }
    return (size_t)(major >= 9 ? 32 : 4) << 20;
}

extern "C" ga_status ga_cuda_matmul(int device, const ga_matmul_desc *desc, void *workspace,
                                    size_t workspace_size, ga_stream stream, ga_op_report *report)
{
    GA_TRY_STATUS(ga_cuda_matmul_check(desc));
    ga_op_report rep = {0, 0, 0, 0};
    const ga_matrix &A = desc->a, &D = desc->d;
    if (desc->batch == 0 || D.rows == 0 || D.cols == 0) {
        if (report)
            *report = rep;
        return ga_cuda_matmul_unfused(device, desc, 0, stream); /* the sums still due */
    }
    GA_NVTX_RANGE("matmul");
    GA_WITH_DEVICE(device);
    cudaStream_t s = ga_cu_stream(stream);
    if (!workspace)
        workspace_size = 0;

    bool done = false;
    LtCall c;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    bool k_zero = A.cols == 0; /* cuBLASLt wants k >= 1: the generic kernel writes zeros */
    /* 1. fused */
    ga_fallback_reason why = k_zero ? GA_FALLBACK_LAYOUT : fused_epilogue(desc, &epilogue);
    if (why == GA_FALLBACK_NONE && !describe(desc, epilogue, &c))
        why = GA_FALLBACK_LAYOUT;
    if (why == GA_FALLBACK_NONE) {
        int hit = 0;
        std::shared_ptr<LtPlan> plan;
        GA_TRY_STATUS(lt_matmul(device, desc, c, workspace, workspace_size, s, &done, &hit, &plan));
        if (done) {
            rep.fused = epilogue != CUBLASLT_EPILOGUE_DEFAULT;
            rep.cache_hit = hit;
            if (report)
                *report = rep;
            return ga_ok();
        }
        /* a plain GEMM the library refused is not something to fall back
         * from: the generic kernel follows */
        plan->report(&rep, epilogue == CUBLASLT_EPILOGUE_DEFAULT ? GA_FALLBACK_NO_ENGINE
                                                                 : GA_FALLBACK_NONE);
    }
    /* 2. split: cuBLASLt's GEMM + bias into z, then the activation (also
     * when the fused call was refused: BIAS runs where GELU_AUX may not) */
    ga_matmul_desc z_desc;
    const char *split_why = nullptr;
    if (!k_zero && split_epilogue(desc, &z_desc, &epilogue, &split_why)) {
        ga_op_report_fallback(&rep, why, 0, why == GA_FALLBACK_EPILOGUE ? split_why : nullptr);
        if (describe(&z_desc, epilogue, &c)) {
            int hit = 0;
            std::shared_ptr<LtPlan> plan;
            GA_TRY_STATUS(
                lt_matmul(device, &z_desc, c, workspace, workspace_size, s, &done, &hit, &plan));
            if (done) {
                GA_TRY_STATUS(ga_cuda_matmul_activation(device, &z_desc.d, &desc->d, desc->batch,
                                                        desc->activation, stream));
                rep.fallback = 1;
                rep.cache_hit = hit;
                ga_op_report_fallback(&rep, GA_FALLBACK_EPILOGUE, 0, split_why);
                if (report)
                    *report = rep;
                return ga_ok();
            }
            plan->report(&rep, GA_FALLBACK_NONE);
        } else {
            ga_op_report_fallback(&rep, GA_FALLBACK_LAYOUT, 0, nullptr);
        }
    } else if (why != GA_FALLBACK_NONE) {
        ga_op_report_fallback(&rep, why, 0, nullptr);
    }
    bool has_epilogue = desc->bias || desc->activation != GA_ACT_NONE || desc->preact.data ||
                        desc->dact != GA_ACT_NONE || desc->col_sums || desc->a_row_sums;
    /* 3. plain cuBLASLt GEMM, 4. the generic kernel; then epilogue.cu */
    if (has_epilogue && !k_zero && describe(desc, CUBLASLT_EPILOGUE_DEFAULT, &c)) {
        int hit = 0;
        std::shared_ptr<LtPlan> plan;
        GA_TRY_STATUS(lt_matmul(device, desc, c, workspace, workspace_size, s, &done, &hit, &plan));
        rep.cache_hit = hit;
        if (!done)
            plan->report(&rep, GA_FALLBACK_NO_ENGINE);
    }
    GA_TRY_STATUS(ga_cuda_matmul_unfused(device, desc, done, stream));
    rep.fallback = has_epilogue || !done;
    if (report)
        *report = rep;
    return ga_ok();
}
