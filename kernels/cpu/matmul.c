/*
 * matmul.c — D[b] = epilogue(A[b] @ B[b]) on the CPU: the fallback when
 * there is no GPU and the oracle that kernels/cuda/matmul.cu is tested against.
 *
 * Blocked as GotoBLAS/BLIS do: an MC x KC block of A and a KC x NC block of
 * B are packed (and converted to the compute type: float, double for
 * float64) into contiguous slivers of MR rows and panels of NR columns, and a
 * register-blocked micro-kernel multiplies one sliver by one panel into an
 * MR x NR tile of a float (double) accumulator.  The accumulator holds a
 * whole MC x NC output block until its last K block is done; only then does
 * the epilogue run and D get written, so D can be of any dtype.
 *
 * Each element of the product is one running sum over k = 0, 1, ..., K-1 in
 * that order (the micro-kernel carries it from one K block to the next), so
 * the bits do not depend on the block sizes, on which thread computes a block
 * or on how many threads there are.  Threads split the output only: tasks
 * are (batch, MC rows, NC columns) blocks, taken from a shared counter.
 * The column sums are made deterministic the same way: every block sums its
 * rows in order into its own row of partial sums, and the partials are then
 * added in block order.
 *
 * The micro-kernel is picked at run time: AVX2 with FMA on x86-64 CPUs that
 * have it, else plain C on GCC vector types (SSE2, NEON, ...) with a separate
 * multiply and add.  The two round differently, so a product may differ in
 * its last bits between machines, never between runs on one machine.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../activation.h"
#include "../convert.h"
#include "parallel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define GA_HAVE_FMA_KERNELS 1
#define GA_TARGET_FMA __attribute__((target("avx2,fma")))
#else
#define GA_HAVE_FMA_KERNELS 0
#endif

/* Rows of a sliver of packed A; columns of a panel of packed B are NR_F
 * floats or NR_D doubles (two 256-bit registers).  6 x 2 accumulators + 2
 * B vectors + 1 broadcast A value use 15 of the 16 AVX registers. */
#define MR 6
#define NR_F 16
#define NR_D 8
#define NR_MAX 16

/* Block sizes (see the benchmark in the report): a KC x NR panel of B
 * stays in L1 (16 KiB) while the MC x KC block of A streams from L2. */
#define KC 256
#define MC 144
#define NC 512

/* Below this many multiply-adds a GEMM runs on the calling thread: waking
 * the pool would cost more than it saves. */
#define GA_GEMM_PARALLEL_MIN (1 << 18)

/* Rows per task of the a_row_sums pass, and elements per task there. */
#define ROW_SUM_BLOCK 256
#define GA_CPU_GRAIN 65536

/* ------------------------------------------------------------ elements */

/* -------------------------------------------------------- micro-kernels */

/* c[MR][NR] (+)= sum over k < kc of a[k][MR] (outer) b[k][NR]; with `first`
 * the sum starts from zero instead of c.  Every c element is one running
 * sum in k order, whatever kernel runs. */
typedef void (*micro_kernel_fn)(int64_t kc, const void *a, const void *b, void *c, int first);

typedef float ga_v4f __attribute__((vector_size(16)));
typedef double ga_v2d __attribute__((vector_size(16)));

/* Portable kernels: 16-byte vectors (SSE2, NEON, or scalar code where there
 * are none), the tile done in column halves so that the 12 accumulators of
 * a half fit in 16 registers. */
static void kernel_f32_generic(int64_t kc, const void *ap, const void *bp, void *cp, int first)
{
    float *c = (float *)cp;
    for (int h = 0; h < NR_F; h += 8) {
        const float *a = (const float *)ap, *b = (const float *)bp + h;
        ga_v4f acc[MR][2];
        for (int i = 0; i < MR; i++)
            for (int v = 0; v < 2; v++) {
                if (first)
                    acc[i][v] = (ga_v4f){0, 0, 0, 0};
                else
                    memcpy(&acc[i][v], c + i * NR_F + h + 4 * v, 16);
            }
        for (int64_t k = 0; k < kc; k++, a += MR, b += NR_F) {
            ga_v4f b0, b1;
            memcpy(&b0, b, 16);
            memcpy(&b1, b + 4, 16);
            for (int i = 0; i < MR; i++) {
                acc[i][0] += a[i] * b0;
                acc[i][1] += a[i] * b1;
            }
        }
        for (int i = 0; i < MR; i++)
            memcpy(c + i * NR_F + h, acc[i], 32);
    }
}

static void kernel_f64_generic(int64_t kc, const void *ap, const void *bp, void *cp, int first)
{
    double *c = (double *)cp;
    for (int h = 0; h < NR_D; h += 4) {
        const double *a = (const double *)ap, *b = (const double *)bp + h;
        ga_v2d acc[MR][2];
        for (int i = 0; i < MR; i++)
            for (int v = 0; v < 2; v++) {
                if (first)
                    acc[i][v] = (ga_v2d){0, 0};
                else
                    memcpy(&acc[i][v], c + i * NR_D + h + 2 * v, 16);
            }
        for (int64_t k = 0; k < kc; k++, a += MR, b += NR_D) {
            ga_v2d b0, b1;
            memcpy(&b0, b, 16);
            memcpy(&b1, b + 2, 16);
            for (int i = 0; i < MR; i++) {
                acc[i][0] += a[i] * b0;
                acc[i][1] += a[i] * b1;
            }
        }
        for (int i = 0; i < MR; i++)
            memcpy(c + i * NR_D + h, acc[i], 32);
    }
}

#if GA_HAVE_FMA_KERNELS
/* Explicit intrinsics: the build is ISO C (-std=c11), where GCC never
 * contracts a * b + c into an FMA, and auto-vectorized fmaf() code keeps the
 * tile in memory instead of registers.  The 12 accumulators are named
 * variables, not an array: GCC spills an array to the stack every step. */
#define GA_FMA_ROW(i, T, FMA, BCAST)     \
    do {                                 \
        T ai_ = BCAST(a + (i));          \
        c##i##0 = FMA(ai_, b0, c##i##0); \
        c##i##1 = FMA(ai_, b1, c##i##1); \
    } while (0)

#define GA_FMA_TILE(T, W, LOAD, STORE, ZERO, FMA, BCAST)              \
    do {                                                              \
        T c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51; \
        if (first) {                                                  \
            c00 = c01 = c10 = c11 = c20 = c21 = ZERO();               \
            c30 = c31 = c40 = c41 = c50 = c51 = ZERO();               \
        } else {                                                      \
            c00 = LOAD(c + 0 * 2 * W), c01 = LOAD(c + 0 * 2 * W + W); \
            c10 = LOAD(c + 1 * 2 * W), c11 = LOAD(c + 1 * 2 * W + W); \
            c20 = LOAD(c + 2 * 2 * W), c21 = LOAD(c + 2 * 2 * W + W); \
            c30 = LOAD(c + 3 * 2 * W), c31 = LOAD(c + 3 * 2 * W + W); \
            c40 = LOAD(c + 4 * 2 * W), c41 = LOAD(c + 4 * 2 * W + W); \
            c50 = LOAD(c + 5 * 2 * W), c51 = LOAD(c + 5 * 2 * W + W); \
        }                                                             \
        for (int64_t k = 0; k < kc; k++, a += MR, b += 2 * W) {       \
            T b0 = LOAD(b), b1 = LOAD(b + W);                         \
            GA_FMA_ROW(0, T, FMA, BCAST);                             \
            GA_FMA_ROW(1, T, FMA, BCAST);                             \
            GA_FMA_ROW(2, T, FMA, BCAST);                             \
            GA_FMA_ROW(3, T, FMA, BCAST);                             \
            GA_FMA_ROW(4, T, FMA, BCAST);                             \
            GA_FMA_ROW(5, T, FMA, BCAST);                             \
        }                                                             \
        STORE(c + 0 * 2 * W, c00), STORE(c + 0 * 2 * W + W, c01);     \
        STORE(c + 1 * 2 * W, c10), STORE(c + 1 * 2 * W + W, c11);     \
        STORE(c + 2 * 2 * W, c20), STORE(c + 2 * 2 * W + W, c21);     \
        STORE(c + 3 * 2 * W, c30), STORE(c + 3 * 2 * W + W, c31);     \
        STORE(c + 4 * 2 * W, c40), STORE(c + 4 * 2 * W + W, c41);     \
        STORE(c + 5 * 2 * W, c50), STORE(c + 5 * 2 * W + W, c51);     \
    } while (0)

GA_TARGET_FMA static void kernel_f32_fma(int64_t kc, const void *ap, const void *bp, void *cp,
                                         int first)
{
    const float *a = (const float *)ap, *b = (const float *)bp;
    float *c = (float *)cp;
    GA_FMA_TILE(__m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_setzero_ps, _mm256_fmadd_ps,
                _mm256_broadcast_ss);
}

GA_TARGET_FMA static void kernel_f64_fma(int64_t kc, const void *ap, const void *bp, void *cp,
                                         int first)
{
    const double *a = (const double *)ap, *b = (const double *)bp;
    double *c = (double *)cp;
    GA_FMA_TILE(__m256d, 4, _mm256_loadu_pd, _mm256_storeu_pd, _mm256_setzero_pd, _mm256_fmadd_pd,
                _mm256_broadcast_sd);
}

static int cpu_has_fma(void)
{
    __builtin_cpu_init(); /* needed when called before the constructors ran */
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

/* ---------------------------------------------------------------- plan */

typedef void (*gather_fn)(ga_dtype dtype, const char *src, int64_t stride, int64_t n, void *out,
                          int64_t out_stride);

/* The compute type and what works on it. */
typedef struct {
    size_t elem; /* sizeof(float) or sizeof(double) */
    int64_t nr;
    gather_fn gather;
    micro_kernel_fn kernel;
} gemm_kind;

/* An operand with byte strides. */
typedef struct {
    const char *data;
    ga_dtype dtype;
    int64_t rs, cs, bs;
} operand;

typedef struct {
    const ga_matmul_desc *desc;
    gemm_kind kind;
    int64_t batch, M, N, K;
    int64_t mblocks, nblocks, ntasks;
    operand a, b, d, preact, aux;
    const void *bias;  /* N values of the compute type, or NULL */
    void *col_partial; /* [batch * mblocks][N] of the compute type, or NULL */
    char *slots;       /* per-thread packing buffers */
    size_t slot_bytes, a_bytes, b_bytes;
    atomic_llong next_task;
} gemm_job;

static operand operand_of(const ga_matrix *m)
{
    int64_t size = (int64_t)ga_dtype_itemsize(m->dtype);
    operand o = {(const char *)m->data, m->dtype, m->row_stride * size, m->col_stride * size,
                 m->batch_stride * size};
    return o;
}

static const char *at(const operand *o, int64_t b, int64_t i, int64_t j)
{
    return o->data + b * o->bs + i * o->rs + j * o->cs;
}

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static int64_t abs64(int64_t v)
{
    return v < 0 ? -v : v;
}

static int64_t round_up(int64_t v, int64_t to)
{
    return (v + to - 1) / to * to;
}

static size_t align64(size_t bytes)
{
    return (bytes + 63) & ~(size_t)63;
}

/* ------------------------------------------------------------- packing */

/* src (element [0, 0] of the block) mc x kc into slivers of MR rows, each
 * k-major (MR values per k), the rows past mc zero.  The loop order follows
 * the smaller stride so that the source is read in order. */
static void pack_a(const gemm_kind *kind, char *dst, const operand *A, const char *src, int64_t mc,
                   int64_t kc)
{
    size_t e = kind->elem;
    for (int64_t p = 0; p < mc; p += MR, dst += (size_t)(kc * MR) * e) {
        int64_t rows = min64(MR, mc - p);
        const char *s = src + p * A->rs;
        if (abs64(A->rs) < abs64(A->cs)) {
            for (int64_t k = 0; k < kc; k++)
                kind->gather(A->dtype, s + k * A->cs, A->rs, rows, dst + (size_t)(k * MR) * e, 1);
        } else {
            for (int64_t r = 0; r < rows; r++)
                kind->gather(A->dtype, s + r * A->rs, A->cs, kc, dst + (size_t)r * e, MR);
        }
        for (int64_t k = 0; rows < MR && k < kc; k++)
            memset(dst + (size_t)(k * MR + rows) * e, 0, (size_t)(MR - rows) * e);
    }
}

/* src kc x nc into panels of NR columns, each k-major, the columns past nc
 * zero. */
static void pack_b(const gemm_kind *kind, char *dst, const operand *B, const char *src, int64_t kc,
                   int64_t nc)
{
    size_t e = kind->elem;
    int64_t nr = kind->nr;
    for (int64_t q = 0; q < nc; q += nr, dst += (size_t)(kc * nr) * e) {
        int64_t cols = min64(nr, nc - q);
        const char *s = src + q * B->cs;
        if (abs64(B->cs) <= abs64(B->rs)) {
            for (int64_t k = 0; k < kc; k++)
                kind->gather(B->dtype, s + k * B->rs, B->cs, cols, dst + (size_t)(k * nr) * e, 1);
        } else {
            for (int64_t c = 0; c < cols; c++)
                kind->gather(B->dtype, s + c * B->cs, B->rs, kc, dst + (size_t)c * e, nr);
        }
        for (int64_t k = 0; cols < nr && k < kc; k++)
            memset(dst + (size_t)(k * nr + cols) * e, 0, (size_t)(nr - cols) * e);
    }
}

/* ------------------------------------------------------------ epilogue */

/* One row segment v[0, n) of the accumulator: element (b, i, j + c).
 * colsum (backward, or NULL) gets the values as computed, before they are
 * rounded to D's dtype. */
static void epilogue_f(const gemm_job *job, int64_t b, int64_t i, int64_t j, int64_t n, float *v,
                       float *colsum)
{
    const ga_matmul_desc *d = job->desc;
    if (d->dact != GA_ACT_NONE) {
        float aux[NR_MAX];
        ga_gather_f(job->aux.dtype, at(&job->aux, b, i, j), job->aux.cs, n, aux, 1);
        for (int64_t c = 0; c < n; c++)
            v[c] *= ga_activation_grad_f(d->dact, aux[c]);
    }
    if (job->bias) {
        const float *bias = (const float *)job->bias + j;
        for (int64_t c = 0; c < n; c++)
            v[c] += bias[c];
    }
    if (job->preact.data)
        ga_scatter_f(job->preact.dtype, (char *)at(&job->preact, b, i, j), job->preact.cs, n, v);
    if (d->activation != GA_ACT_NONE)
        for (int64_t c = 0; c < n; c++)
            v[c] = ga_activate_f(d->activation, v[c]);
    if (colsum)
        for (int64_t c = 0; c < n; c++)
            colsum[c] += v[c];
    ga_scatter_f(job->d.dtype, (char *)at(&job->d, b, i, j), job->d.cs, n, v);
}

static void epilogue_d(const gemm_job *job, int64_t b, int64_t i, int64_t j, int64_t n, double *v,
                       double *colsum)
{
    const ga_matmul_desc *d = job->desc;
    if (d->dact != GA_ACT_NONE) {
        double aux[NR_MAX];
        ga_gather_d(job->aux.dtype, at(&job->aux, b, i, j), job->aux.cs, n, aux, 1);
        for (int64_t c = 0; c < n; c++)
            v[c] *= ga_activation_grad_d(d->dact, aux[c]);
    }
    if (job->bias) {
        const double *bias = (const double *)job->bias + j;
        for (int64_t c = 0; c < n; c++)
            v[c] += bias[c];
    }
    if (job->preact.data)
        ga_scatter_d(job->preact.dtype, (char *)at(&job->preact, b, i, j), job->preact.cs, n, v);
    if (d->activation != GA_ACT_NONE)
        for (int64_t c = 0; c < n; c++)
            v[c] = ga_activate_d(d->activation, v[c]);
    if (colsum)
        for (int64_t c = 0; c < n; c++)
            colsum[c] += v[c];
    ga_scatter_d(job->d.dtype, (char *)at(&job->d, b, i, j), job->d.cs, n, v);
}

/* The block's accumulator tiles, [panel][sliver][MR][NR], through the
 * epilogue.  Panels outside, rows inside: each column's partial sum adds
 * the block's rows in increasing order. */
static void finish_block(const gemm_job *job, char *acc, int64_t b, int64_t ib, int64_t i0,
                         int64_t j0, int64_t mc, int64_t nc)
{
    size_t e = job->kind.elem;
    int64_t nr = job->kind.nr, slivers = (mc + MR - 1) / MR;
    char *colsum = NULL;
    if (job->col_partial) {
        colsum = (char *)job->col_partial + (size_t)((b * job->mblocks + ib) * job->N + j0) * e;
        memset(colsum, 0, (size_t)nc * e);
    }
    for (int64_t q = 0; q * nr < nc; q++) {
        int64_t cols = min64(nr, nc - q * nr);
        for (int64_t p = 0; p < slivers; p++) {
            char *tile = acc + (size_t)((q * slivers + p) * MR * nr) * e;
            for (int64_t r = 0; r < MR && p * MR + r < mc; r++) {
                int64_t i = i0 + p * MR + r, j = j0 + q * nr;
                void *row = tile + (size_t)(r * nr) * e;
                char *cs = colsum ? colsum + (size_t)(q * nr) * e : NULL;
                if (e == sizeof(float))
                    epilogue_f(job, b, i, j, cols, (float *)row, (float *)cs);
                else
                    epilogue_d(job, b, i, j, cols, (double *)row, (double *)cs);
            }
        }
    }
}

/* --------------------------------------------------------------- tasks */

/* Output block `task` = (batch entry, MC rows, NC columns), all of K. */
static void run_task(const gemm_job *job, char *slot, int64_t task)
{
    int64_t jb = task % job->nblocks, rest = task / job->nblocks;
    int64_t ib = rest % job->mblocks, b = rest / job->mblocks;
    int64_t i0 = ib * MC, j0 = jb * NC;
    int64_t mc = min64(MC, job->M - i0), nc = min64(NC, job->N - j0);
    int64_t nr = job->kind.nr, slivers = (mc + MR - 1) / MR, panels = (nc + nr - 1) / nr;
    size_t e = job->kind.elem;
    char *abuf = slot, *bbuf = slot + job->a_bytes, *acc = bbuf + job->b_bytes;
    for (int64_t k0 = 0; k0 < job->K; k0 += KC) {
        int64_t kc = min64(KC, job->K - k0);
        pack_a(&job->kind, abuf, &job->a, at(&job->a, b, i0, k0), mc, kc);
        pack_b(&job->kind, bbuf, &job->b, at(&job->b, b, k0, j0), kc, nc);
        /* a B panel stays in L1 while the A slivers stream past it */
        for (int64_t q = 0; q < panels; q++)
            for (int64_t p = 0; p < slivers; p++)
                job->kind.kernel(kc, abuf + (size_t)(p * kc * MR) * e,
                                 bbuf + (size_t)(q * kc * nr) * e,
                                 acc + (size_t)((q * slivers + p) * MR * nr) * e, k0 == 0);
    }
    if (job->K == 0) /* an empty sum: the epilogue still applies */
        memset(acc, 0, (size_t)(panels * slivers * MR * nr) * e);
    finish_block(job, acc, b, ib, i0, j0, mc, nc);
}

/* One call per pool thread (or one for all, inline): slot `begin`'s buffers
 * serve every task this call takes. */
static void run_tasks(void *ctx, int64_t begin, int64_t end)
{
    (void)end;
    gemm_job *job = (gemm_job *)ctx;
    char *slot = job->slots + (size_t)begin * job->slot_bytes;
    for (;;) {
        int64_t task = atomic_fetch_add(&job->next_task, 1);
        if (task >= job->ntasks)
            return;
        run_task(job, slot, task);
    }
}

/* col_sums[j] = the partial rows added in block order. */
static void reduce_col_sums(void *ctx, int64_t begin, int64_t end)
{
    gemm_job *job = (gemm_job *)ctx;
    int64_t rows = job->batch * job->mblocks, N = job->N;
    ga_dtype dtype = job->desc->col_sums_dtype;
    char *out = (char *)job->desc->col_sums + begin * (int64_t)ga_dtype_itemsize(dtype);
    int64_t stride = (int64_t)ga_dtype_itemsize(dtype);
    for (int64_t j0 = begin; j0 < end; j0 += NR_MAX) {
        int64_t n = min64(NR_MAX, end - j0);
        if (job->kind.elem == sizeof(float)) {
            float s[NR_MAX] = {0};
            const float *part = (const float *)job->col_partial + j0;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < n; c++)
                    s[c] += part[r * N + c];
            ga_scatter_f(dtype, out + (j0 - begin) * stride, stride, n, s);
        } else {
            double s[NR_MAX] = {0};
            const double *part = (const double *)job->col_partial + j0;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < n; c++)
                    s[c] += part[r * N + c];
            ga_scatter_d(dtype, out + (j0 - begin) * stride, stride, n, s);
        }
    }
}

/* a_row_sums[i] = A[0, i, 0] + A[0, i, 1] + ... in k order, whichever way
 * the loops run (the stride decides which reads memory in order). */
static void row_sums_f(const gemm_job *job, int64_t i0, int64_t n, float *s, float *buf)
{
    const operand *A = &job->a;
    memset(s, 0, (size_t)n * sizeof *s);
    if (abs64(A->rs) < abs64(A->cs)) {
        for (int64_t k = 0; k < job->K; k++) {
            ga_gather_f(A->dtype, at(A, 0, i0, k), A->rs, n, buf, 1);
            for (int64_t r = 0; r < n; r++)
                s[r] += buf[r];
        }
        return;
    }
    for (int64_t r = 0; r < n; r++)
        for (int64_t k0 = 0; k0 < job->K; k0 += ROW_SUM_BLOCK) {
            int64_t len = min64(ROW_SUM_BLOCK, job->K - k0);
            ga_gather_f(A->dtype, at(A, 0, i0 + r, k0), A->cs, len, buf, 1);
            for (int64_t k = 0; k < len; k++)
                s[r] += buf[k];
        }
}

static void row_sums_d(const gemm_job *job, int64_t i0, int64_t n, double *s, double *buf)
{
    const operand *A = &job->a;
    memset(s, 0, (size_t)n * sizeof *s);
    if (abs64(A->rs) < abs64(A->cs)) {
        for (int64_t k = 0; k < job->K; k++) {
            ga_gather_d(A->dtype, at(A, 0, i0, k), A->rs, n, buf, 1);
            for (int64_t r = 0; r < n; r++)
                s[r] += buf[r];
        }
        return;
    }
    for (int64_t r = 0; r < n; r++)
        for (int64_t k0 = 0; k0 < job->K; k0 += ROW_SUM_BLOCK) {
            int64_t len = min64(ROW_SUM_BLOCK, job->K - k0);
            ga_gather_d(A->dtype, at(A, 0, i0 + r, k0), A->cs, len, buf, 1);
            for (int64_t k = 0; k < len; k++)
                s[r] += buf[k];
        }
}

static void row_sums_range(void *ctx, int64_t begin, int64_t end)
{
    gemm_job *job = (gemm_job *)ctx;
    ga_dtype dtype = job->desc->a_row_sums_dtype;
    int64_t size = (int64_t)ga_dtype_itemsize(dtype);
    for (int64_t blk = begin; blk < end; blk++) {
        int64_t i0 = blk * ROW_SUM_BLOCK, n = min64(ROW_SUM_BLOCK, job->M - i0);
        char *out = (char *)job->desc->a_row_sums + i0 * size;
        if (job->kind.elem == sizeof(float)) {
            float s[ROW_SUM_BLOCK], buf[ROW_SUM_BLOCK];
            row_sums_f(job, i0, n, s, buf);
            ga_scatter_f(dtype, out, size, n, s);
        } else {
            double s[ROW_SUM_BLOCK], buf[ROW_SUM_BLOCK];
            row_sums_d(job, i0, n, s, buf);
            ga_scatter_d(dtype, out, size, n, s);
        }
    }
}

/* ---------------------------------------------------------- validation */

static int is_m_by_n(const ga_matrix *m, int64_t rows, int64_t cols)
{
    return m->rows == rows && m->cols == cols;
}

/* Whether a matrix with elements lacks its data. */
static int missing(const ga_matrix *m, int64_t batch)
{
    return batch > 0 && m->rows > 0 && m->cols > 0 && m->data == NULL;
}

static ga_status check_desc(const ga_matmul_desc *d)
{
    const ga_matrix *a = &d->a, *b = &d->b, *out = &d->d;
    int64_t M = a->rows, N = b->cols;
    if (d->batch < 0 || a->rows < 0 || a->cols < 0 || b->rows < 0 || b->cols < 0)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: negative batch or matrix size");
    if (a->cols != b->rows)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: a's columns must equal b's rows");
    if (!is_m_by_n(out, M, N))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: d must have a's rows and b's columns");
    if (!ga_dtype_is_float(a->dtype) || b->dtype != a->dtype)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: a and b must share one dtype: float16, "
                                               "bfloat16, float32 or float64");
    int narrow = a->dtype == GA_FLOAT16 || a->dtype == GA_BFLOAT16;
    if (out->dtype != a->dtype && !(narrow && out->dtype == GA_FLOAT32))
        return GA_STATUS(GA_ERR_INVALID_VALUE,
                         "matmul: d must have a's dtype, or float32 for float16/bfloat16 inputs");
    if (!ga_activation_is_valid(d->activation) || !ga_activation_is_valid(d->dact))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: unknown activation");
    int forward = d->bias || d->activation != GA_ACT_NONE || d->preact.data;
    int backward = d->dact != GA_ACT_NONE || d->col_sums;
    if (forward && backward)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: the forward epilogue (bias, activation, "
                                               "preact) and the backward one (dact, col_sums) "
                                               "exclude each other");
    if (d->bias && d->bias_dtype != a->dtype && d->bias_dtype != out->dtype)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: bias must have a's or d's dtype");
    if (d->preact.data && (!is_m_by_n(&d->preact, M, N) || d->preact.dtype != out->dtype))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: preact must be M x N of d's dtype");
    if (d->dact != GA_ACT_NONE &&
        (!is_m_by_n(&d->dact_aux, M, N) ||
         (d->dact_aux.dtype != a->dtype && d->dact_aux.dtype != out->dtype)))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: dact_aux must be M x N of a's or d's "
                                               "dtype");
    if (d->col_sums && d->col_sums_dtype != GA_FLOAT32 && d->col_sums_dtype != out->dtype)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: col_sums must be float32 or d's dtype");
    if (d->a_row_sums) {
        if (d->batch != 1)
            return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: a_row_sums needs batch 1");
        if (forward || backward)
            return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: a_row_sums takes no other epilogue");
        if (d->a_row_sums_dtype != GA_FLOAT32 && d->a_row_sums_dtype != out->dtype)
            return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: a_row_sums must be float32 or d's "
                                                   "dtype");
    }
    if (missing(a, d->batch) || missing(b, d->batch) || missing(out, d->batch) ||
        (d->dact != GA_ACT_NONE && missing(&d->dact_aux, d->batch)))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "matmul: a matrix with elements has no data");
    return ga_ok();
}

/* ---------------------------------------------------------------- entry */

static gemm_kind pick_kind(ga_dtype dtype)
{
    int f64 = dtype == GA_FLOAT64;
    gemm_kind k = {f64 ? sizeof(double) : sizeof(float), f64 ? NR_D : NR_F,
                   f64 ? ga_gather_d : ga_gather_f, f64 ? kernel_f64_generic : kernel_f32_generic};
#if GA_HAVE_FMA_KERNELS
    if (cpu_has_fma())
        k.kernel = f64 ? kernel_f64_fma : kernel_f32_fma;
#endif
    return k;
}

static ga_status out_of_memory(void)
{
    return ga_status_make(GA_ERR_HOST_OUT_OF_MEMORY, 0, NULL,
                          "could not allocate the GEMM packing buffers", "ga_cpu_matmul", __FILE__,
                          __LINE__);
}

/* Sizes the buffers: per-slot packing space (clipped to the problem, so a
 * small GEMM takes little memory), the converted bias and the column
 * partials.  Returns 0 when the total does not fit in a size_t. */
static int plan_buffers(gemm_job *job, int64_t nslots, size_t *bias_at, size_t *partial_at,
                        size_t *total)
{
    size_t e = job->kind.elem;
    int64_t mc = round_up(min64(MC, job->M), MR), nc = round_up(min64(NC, job->N), job->kind.nr);
    int64_t kc = min64(KC, job->K);
    job->a_bytes = align64((size_t)(mc * kc) * e);
    job->b_bytes = align64((size_t)(kc * nc) * e);
    job->slot_bytes = job->a_bytes + job->b_bytes + align64((size_t)(mc * nc) * e);
    size_t bytes = (size_t)nslots * job->slot_bytes;
    *bias_at = bytes;
    if (job->desc->bias)
        bytes += align64((size_t)job->N * e);
    *partial_at = bytes;
    if (job->desc->col_sums) {
        int64_t rows = job->batch * job->mblocks;
        if (job->N > 0 && (uint64_t)rows > (SIZE_MAX / 2 - bytes) / e / (uint64_t)job->N)
            return 0;
        bytes += align64((size_t)(rows * job->N) * e);
    }
    *total = bytes;
    return 1;
}

static void convert_bias(gemm_job *job, void *out)
{
    int64_t size = (int64_t)ga_dtype_itemsize(job->desc->bias_dtype);
    job->kind.gather(job->desc->bias_dtype, (const char *)job->desc->bias, size, job->N, out, 1);
    job->bias = out;
}

ga_status ga_cpu_matmul(const ga_matmul_desc *desc)
{
    GA_TRY_STATUS(check_desc(desc));
    gemm_job job;
    memset(&job, 0, sizeof job);
    job.desc = desc;
    job.kind = pick_kind(desc->a.dtype);
    job.batch = desc->batch;
    job.M = desc->a.rows;
    job.N = desc->b.cols;
    job.K = desc->a.cols;
    job.mblocks = (job.M + MC - 1) / MC;
    job.nblocks = (job.N + NC - 1) / NC;
    job.ntasks = job.batch * job.mblocks * job.nblocks;
    job.a = operand_of(&desc->a);
    job.b = operand_of(&desc->b);
    job.d = operand_of(&desc->d);
    if (desc->preact.data)
        job.preact = operand_of(&desc->preact);
    if (desc->dact != GA_ACT_NONE)
        job.aux = operand_of(&desc->dact_aux);

    int64_t work = job.batch * job.M * job.N * (job.K + 1);
    int64_t nslots = work < GA_GEMM_PARALLEL_MIN ? 1 : min64(ga_cpu_num_threads(), job.ntasks);
    if (nslots < 1)
        nslots = 1;
    size_t bias_at, partial_at, total;
    char *mem = NULL;
    if (!plan_buffers(&job, job.ntasks ? nslots : 0, &bias_at, &partial_at, &total) ||
        (total && !(mem = (char *)aligned_alloc(64, align64(total)))))
        return out_of_memory();
    job.slots = mem;
    if (desc->bias && job.N > 0)
        convert_bias(&job, mem + bias_at);
    if (desc->col_sums)
        job.col_partial = mem + partial_at;
    atomic_init(&job.next_task, 0);

    if (job.ntasks > 0)
        ga_parallel_for(nslots, 1, run_tasks, &job);
    if (desc->col_sums)
        ga_parallel_for(job.N, 1 + GA_CPU_GRAIN / (1 + job.batch * job.mblocks), reduce_col_sums,
                        &job);
    if (desc->a_row_sums)
        ga_parallel_for((job.M + ROW_SUM_BLOCK - 1) / ROW_SUM_BLOCK,
                        1 + GA_CPU_GRAIN / (ROW_SUM_BLOCK * (job.K + 1)), row_sums_range, &job);
    free(mem);
    return ga_ok();
}
