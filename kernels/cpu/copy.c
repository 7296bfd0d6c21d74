/*
 * copy.c — strided copy with dtype conversion, and fill, on the CPU.
 *
 * The reference for kernels/cuda/copy.cu: both convert through
 * kernels/convert.h, so their results are identical bit for bit.
 */
#include <string.h>

#include "../convert.h"
#include "../check.h"
#include "../walk.h"
#include "parallel.h"

/* Inner loops, one per (source, destination) dtype pair, so that the
 * conversion's switches fold away. */
typedef void (*ga_cast_row_fn)(char *dst, int64_t dst_stride, const char *src, int64_t src_stride,
                               int64_t n);

#define GA_DEFINE_CAST(SRC, DST)                                                                  \
    static void cast_##SRC##_##DST(char *dst, int64_t ds, const char *src, int64_t ss, int64_t n) \
    {                                                                                             \
        for (int64_t k = 0; k < n; k++)                                                           \
            ga_convert_element(DST, dst + k * ds, SRC, src + k * ss);                             \
    }

/* X-macro tables, laid out by hand */
/* clang-format off */
#define GA_CAST_ROW(X, SRC)                                                     \
    X(SRC, GA_BOOL) X(SRC, GA_UINT8) X(SRC, GA_INT8) X(SRC, GA_INT16)           \
    X(SRC, GA_INT32) X(SRC, GA_INT64) X(SRC, GA_FLOAT16) X(SRC, GA_BFLOAT16)    \
    X(SRC, GA_FLOAT32) X(SRC, GA_FLOAT64)

#define GA_CAST_ALL(X)                                                          \
    GA_CAST_ROW(X, GA_BOOL) GA_CAST_ROW(X, GA_UINT8) GA_CAST_ROW(X, GA_INT8)    \
    GA_CAST_ROW(X, GA_INT16) GA_CAST_ROW(X, GA_INT32) GA_CAST_ROW(X, GA_INT64)  \
    GA_CAST_ROW(X, GA_FLOAT16) GA_CAST_ROW(X, GA_BFLOAT16)                      \
    GA_CAST_ROW(X, GA_FLOAT32) GA_CAST_ROW(X, GA_FLOAT64)
/* clang-format on */

GA_CAST_ALL(GA_DEFINE_CAST)

#define GA_CAST_ENTRY(SRC, DST) [SRC][DST] = cast_##SRC##_##DST,
static const ga_cast_row_fn cast_table[GA_NUM_DTYPES][GA_NUM_DTYPES] = {GA_CAST_ALL(GA_CAST_ENTRY)};

/* Same-dtype rows: memcpy when both sides are dense. */
static void copy_row_same(char *dst, int64_t ds, const char *src, int64_t ss, int64_t n,
                          size_t itemsize)
{
    if (ds == (int64_t)itemsize && ss == (int64_t)itemsize) {
        memcpy(dst, src, (size_t)n * itemsize);
        return;
    }
    for (int64_t k = 0; k < n; k++)
        memcpy(dst + k * ds, src + k * ss, itemsize);
}

/* Filled rows: memset when the element is one byte and the row dense. */
static void fill_row(char *d, int64_t ds, int64_t n, const unsigned char *pattern, size_t itemsize)
{
    if (itemsize == 1 && ds == 1) {
        memset(d, pattern[0], (size_t)n);
        return;
    }
    for (int64_t k = 0; k < n; k++)
        memcpy(d + k * ds, pattern, itemsize);
}

typedef struct {
    const ga_tensor *dst, *src;
    ga_pair_layout layout;
    int64_t rows;    /* product of the outer dims */
    int64_t row_len; /* the innermost dim */
    ga_cast_row_fn cast;
    size_t itemsize;              /* copy of one dtype, and fill */
    const unsigned char *pattern; /* fill: the element's bytes */
} copy_job;

/* Byte offsets of outer row `row` in dst and src. */
static void row_offsets(const ga_pair_layout *L, int64_t row, int64_t *doff, int64_t *soff)
{
    int64_t d = 0, s = 0;
    for (int k = L->ndim - 2; k >= 0; k--) {
        int64_t i = row % L->shape[k];
        row /= L->shape[k];
        d += i * L->dst_strides[k];
        s += i * L->src_strides[k];
    }
    *doff = d;
    *soff = s;
}

/* n elements of one row, dst at d (byte stride ds), src at s (ss): filled
 * with the pattern, cast, or copied. */
static void row_op(const copy_job *job, char *d, int64_t ds, const char *s, int64_t ss, int64_t n)
{
    if (job->pattern)
        fill_row(d, ds, n, job->pattern, job->itemsize);
    else if (job->cast)
        job->cast(d, ds, s, ss, n);
    else
        copy_row_same(d, ds, s, ss, n, job->itemsize);
}

static void whole_rows(void *ctx, int64_t begin, int64_t end)
{
    const copy_job *job = (const copy_job *)ctx;
    const ga_pair_layout *L = &job->layout;
    int inner = L->ndim - 1;
    for (int64_t row = begin; row < end; row++) {
        int64_t doff, soff;
        row_offsets(L, row, &doff, &soff);
        const char *s = job->src ? (const char *)job->src->data + soff : NULL;
        row_op(job, (char *)job->dst->data + doff, L->dst_strides[inner], s, L->src_strides[inner],
               job->row_len);
    }
}

/* A single long row is split across threads by element ranges instead. */
static void one_row(void *ctx, int64_t begin, int64_t end)
{
    const copy_job *job = (const copy_job *)ctx;
    int64_t ds = job->layout.dst_strides[0], ss = job->layout.src_strides[0];
    const char *s = job->src ? (const char *)job->src->data + begin * ss : NULL;
    row_op(job, (char *)job->dst->data + begin * ds, ds, s, ss, end - begin);
}

/* Elements per task: big enough that a task costs more than handing it out. */
#define GA_CPU_GRAIN 65536

/* The job's numel elements, in tasks of whole rows or of pieces of one row. */
static void run_job(copy_job *job, int64_t numel)
{
    job->itemsize = ga_dtype_itemsize(job->dst->dtype);
    job->row_len = job->layout.shape[job->layout.ndim - 1];
    job->rows = numel / job->row_len;
    if (job->rows == 1)
        ga_parallel_for(job->row_len, GA_CPU_GRAIN, one_row, job);
    else
        ga_parallel_for(job->rows, 1 + GA_CPU_GRAIN / job->row_len, whole_rows, job);
}

ga_status ga_cpu_copy(const ga_tensor *dst, const ga_tensor *src)
{
    GA_TRY_STATUS(ga_check_copy(dst, src, __func__));
    copy_job job;
    memset(&job, 0, sizeof job);
    job.dst = dst;
    job.src = src;
    int64_t numel = ga_pair_layout_make(dst, src, &job.layout);
    if (numel == 0)
        return ga_ok();
    job.cast = dst->dtype == src->dtype ? NULL : cast_table[src->dtype][dst->dtype];
    run_job(&job, numel);
    return ga_ok();
}

ga_status ga_cpu_fill(const ga_tensor *dst, ga_scalar value)
{
    GA_TRY_STATUS(ga_check_copy(dst, NULL, __func__));
    unsigned char pattern[8];
    ga_scalar_to_bytes(value, dst->dtype, pattern);
    copy_job job;
    memset(&job, 0, sizeof job);
    job.dst = dst;
    int64_t numel = ga_pair_layout_make(dst, NULL, &job.layout);
    if (numel == 0)
        return ga_ok();
    job.pattern = pattern;
    run_job(&job, numel);
    return ga_ok();
}
