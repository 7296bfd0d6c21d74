/*
 * epilogue.c — the elementwise epilogues of a linear layer on the CPU:
 *   forward:  y = act(x + bias[c]), preact <- x + bias
 *   backward: dz = grad_y * act'(aux), bias_grad[c] <- sum of dz over every dim but c
 * on N-dimensional strided tensors of any float dtype.
 *
 * Twin of kernels/cuda/epilogue.cu: the same conversions (kernels/convert.h),
 * the same formulas (kernels/activation.h), the same compute type (float,
 * double when a float64 tensor takes part) and the same validation, so the
 * elementwise results agree bit for bit with the GPU's.  The bias gradient
 * sums in another order than the GPU's (so its last bits may differ), but
 * in a fixed one: the reduced index is cut into chunks that depend only on
 * the shape, each chunk is summed in order, and the chunk sums are added in
 * chunk order, so the bits do not depend on the thread count.
 */
#include <stdlib.h>
#include <string.h>

#include "../activation.h"
#include "../convert.h"
#include "../check.h"
#include "../walk.h"
#include "parallel.h"

/* Elements per task, and per inner segment (a stack buffer per operand). */
#define GA_CPU_GRAIN 65536
#define SEG 256

/* Bias-gradient chunks: at most MAX_CHUNKS along the reduced index, and at
 * most PARTIAL_LIMIT partial sums in all (memory, for huge channel counts). */
#define CHUNK_ELEMS 65536
#define MAX_CHUNKS 64
#define PARTIAL_LIMIT (1 << 22)

/* ------------------------------------------------------------ elements */

/* v rounded to `dtype` and back: what a store then a load would give. */
static void round_f(ga_dtype dtype, int64_t n, float *v)
{
    switch (dtype) {
    case GA_FLOAT16:
        for (int64_t k = 0; k < n; k++)
            v[k] = (float)ga_f16_to_f64(ga_f64_to_f16(v[k]));
        break;
    case GA_BFLOAT16:
        for (int64_t k = 0; k < n; k++)
            v[k] = (float)ga_bf16_to_f64(ga_f64_to_bf16(v[k]));
        break;
    default: /* float32 and float64 hold every float */ break;
    }
}

static void round_d(ga_dtype dtype, int64_t n, double *v)
{
    switch (dtype) {
    case GA_FLOAT16:
        for (int64_t k = 0; k < n; k++)
            v[k] = ga_f16_to_f64(ga_f64_to_f16(v[k]));
        break;
    case GA_BFLOAT16:
        for (int64_t k = 0; k < n; k++)
            v[k] = ga_bf16_to_f64(ga_f64_to_bf16(v[k]));
        break;
    case GA_FLOAT32:
        for (int64_t k = 0; k < n; k++)
            v[k] = (float)v[k];
        break;
    default: break;
    }
}

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static int64_t abs64(int64_t v)
{
    return v < 0 ? -v : v;
}

/* ------------------------------------------------------------- layouts */

/* Byte offsets of the start of row `row` (all dims but the innermost) and
 * its channel index (when the channel dim is not the innermost). */
static void ew_row(const ga_ew_layout *L, int64_t row, int64_t off[3], int64_t *chan)
{
    off[0] = off[1] = off[2] = 0;
    *chan = 0;
    for (int k = L->ndim - 2; k >= 0; k--) {
        int64_t i = row % L->shape[k];
        row /= L->shape[k];
        for (int t = 0; t < 3; t++)
            off[t] += i * L->strides[t][k];
        if (k == L->chan)
            *chan = i;
    }
}

/* Byte offsets of the start of the innermost row holding index r. */
static void red_row(const ga_red_layout *L, int64_t r, int64_t off[3])
{
    off[0] = off[1] = off[2] = 0;
    r /= L->shape[L->ndim - 1];
    for (int k = L->ndim - 2; k >= 0; k--) {
        int64_t i = r % L->shape[k];
        r /= L->shape[k];
        for (int t = 0; t < 3; t++)
            off[t] += i * L->strides[t][k];
    }
}

/* ------------------------------------------------------------- forward */

typedef struct {
    const ga_bias_act_desc *d;
    ga_ew_layout L;
    int f64;
} bias_act_job;

/* Elements [i, i + n) of one innermost row (n <= SEG). */
static void bias_act_f(const bias_act_job *job, const char *x, char *y, char *pre, const int64_t *s,
                       int64_t chan, int64_t i, int64_t n)
{
    const ga_bias_act_desc *d = job->d;
    float v[SEG], b[SEG];
    ga_gather_f(d->x.dtype, x, s[0], n, v, 1);
    if (d->bias) {
        int64_t size = (int64_t)ga_dtype_itemsize(d->bias_dtype);
        if (job->L.chan == job->L.ndim - 1) /* the channel is the innermost dim */
            ga_gather_f(d->bias_dtype, (const char *)d->bias + i * size, size, n, b, 1);
        else
            ga_gather_f(d->bias_dtype, (const char *)d->bias + chan * size, 0, n, b, 1);
        for (int64_t k = 0; k < n; k++)
            v[k] += b[k];
    }
    if (pre)
        ga_scatter_f(d->preact.dtype, pre, s[2], n, v);
    if (d->activation != GA_ACT_NONE)
        for (int64_t k = 0; k < n; k++)
            v[k] = ga_activate_f(d->activation, v[k]);
    ga_scatter_f(d->y.dtype, y, s[1], n, v);
}

static void bias_act_d(const bias_act_job *job, const char *x, char *y, char *pre, const int64_t *s,
                       int64_t chan, int64_t i, int64_t n)
{
    const ga_bias_act_desc *d = job->d;
    double v[SEG], b[SEG];
    ga_gather_d(d->x.dtype, x, s[0], n, v, 1);
    if (d->bias) {
        int64_t size = (int64_t)ga_dtype_itemsize(d->bias_dtype);
        if (job->L.chan == job->L.ndim - 1)
            ga_gather_d(d->bias_dtype, (const char *)d->bias + i * size, size, n, b, 1);
        else
            ga_gather_d(d->bias_dtype, (const char *)d->bias + chan * size, 0, n, b, 1);
        for (int64_t k = 0; k < n; k++)
            v[k] += b[k];
    }
    if (pre)
        ga_scatter_d(d->preact.dtype, pre, s[2], n, v);
    if (d->activation != GA_ACT_NONE)
        for (int64_t k = 0; k < n; k++)
            v[k] = ga_activate_d(d->activation, v[k]);
    ga_scatter_d(d->y.dtype, y, s[1], n, v);
}

/* Elements [begin, end) in row-major order, a row piece at a time. */
static void bias_act_range(void *ctx, int64_t begin, int64_t end)
{
    const bias_act_job *job = (const bias_act_job *)ctx;
    const ga_bias_act_desc *d = job->d;
    const ga_ew_layout *L = &job->L;
    int inner = L->ndim - 1;
    int64_t len = L->shape[inner];
    const int64_t s[3] = {L->strides[0][inner], L->strides[1][inner], L->strides[2][inner]};
    for (int64_t e = begin; e < end;) {
        int64_t row = e / len, i = e % len, n = min64(min64(len - i, end - e), SEG);
        int64_t off[3], chan;
        ew_row(L, row, off, &chan);
        const char *x = (const char *)d->x.data + off[0] + i * s[0];
        char *y = (char *)d->y.data + off[1] + i * s[1];
        char *pre = d->preact.data ? (char *)d->preact.data + off[2] + i * s[2] : NULL;
        if (job->f64)
            bias_act_d(job, x, y, pre, s, chan, i, n);
        else
            bias_act_f(job, x, y, pre, s, chan, i, n);
        e += n;
    }
}

ga_status ga_cpu_bias_activation(const ga_bias_act_desc *desc)
{
    GA_TRY_STATUS(ga_check_bias_act(desc, __func__));
    const ga_tensor *x = &desc->x, *y = &desc->y, *pre = &desc->preact;
    int has_pre = pre->data != NULL, has_bias = desc->bias != NULL;
    bias_act_job job;
    const ga_tensor *ts[3] = {x, y, has_pre ? pre : NULL};
    int64_t numel = ga_ew_layout_make(x, ts, has_bias ? desc->channel_dim : -1, &job.L);
    if (numel == 0 || ga_bias_act_is_noop(desc))
        return ga_ok();
    job.d = desc;
    job.f64 = ga_bias_act_in_double(desc);
    /* an exp, erf or tanh per element: smaller tasks are still worth a thread */
    int64_t grain = ga_activation_is_cheap(desc->activation) ? GA_CPU_GRAIN : GA_CPU_GRAIN / 8;
    ga_parallel_for(numel, grain, bias_act_range, &job);
    return ga_ok();
}

/* ------------------------------------------------------------ backward */

typedef struct {
    const ga_act_backward_desc *d;
    ga_activation act;
    ga_dtype sum_dtype; /* dz's dtype: the values are summed as dz stores them */
    int f64;
    const char *grad, *aux; /* aux: NULL without an activation */
    char *dz;               /* NULL: not written */
    ga_ew_layout L;         /* elementwise pass */
    ga_red_layout R;        /* with a bias gradient */
    int channel_inner;      /* the channel dim is the fastest-varying of grad_y */
    int64_t chunk_len, nchunks, cblock, ncblocks;
    void *partial; /* [nchunks][C] of the compute type */
} bwd_job;

/* dz of n elements: grad at g, aux at x (strides s[0], s[1]); written at dz
 * (stride s[2]) when dz is not NULL; v gets dz as stored. */
static void dz_f(const bwd_job *job, const char *g, const char *x, char *dz, const int64_t *s,
                 int64_t n, float *v)
{
    ga_gather_f(job->d->grad_y.dtype, g, s[0], n, v, 1);
    if (job->aux) {
        float a[SEG];
        ga_gather_f(job->d->aux.dtype, x, s[1], n, a, 1);
        for (int64_t k = 0; k < n; k++)
            v[k] *= ga_activation_grad_f(job->act, a[k]);
    }
    round_f(job->sum_dtype, n, v);
    if (dz)
        ga_scatter_f(job->sum_dtype, dz, s[2], n, v);
}

static void dz_d(const bwd_job *job, const char *g, const char *x, char *dz, const int64_t *s,
                 int64_t n, double *v)
{
    ga_gather_d(job->d->grad_y.dtype, g, s[0], n, v, 1);
    if (job->aux) {
        double a[SEG];
        ga_gather_d(job->d->aux.dtype, x, s[1], n, a, 1);
        for (int64_t k = 0; k < n; k++)
            v[k] *= ga_activation_grad_d(job->act, a[k]);
    }
    round_d(job->sum_dtype, n, v);
    if (dz)
        ga_scatter_d(job->sum_dtype, dz, s[2], n, v);
}

/* One segment at byte offsets off[] with element strides s[]: dz written,
 * and its values, as stored, into v (a float or double buffer of SEG). */
static void dz_segment(const bwd_job *job, const int64_t off[3], const int64_t s[3], int64_t n,
                       void *v)
{
    const char *g = job->grad + off[0];
    const char *x = job->aux ? job->aux + off[1] : NULL;
    char *dz = job->dz ? job->dz + off[2] : NULL;
    if (job->f64)
        dz_d(job, g, x, dz, s, n, (double *)v);
    else
        dz_f(job, g, x, dz, s, n, (float *)v);
}

static void act_backward_range(void *ctx, int64_t begin, int64_t end)
{
    const bwd_job *job = (const bwd_job *)ctx;
    const ga_ew_layout *L = &job->L;
    int inner = L->ndim - 1;
    int64_t len = L->shape[inner];
    const int64_t s[3] = {L->strides[0][inner], L->strides[1][inner], L->strides[2][inner]};
    double v[SEG];
    for (int64_t e = begin; e < end;) {
        int64_t row = e / len, i = e % len, n = min64(min64(len - i, end - e), SEG);
        int64_t off[3], chan;
        ew_row(L, row, off, &chan);
        for (int t = 0; t < 3; t++)
            off[t] += i * s[t];
        dz_segment(job, off, s, n, v);
        e += n;
    }
}

/* Adds v[0, n) to acc[0, n) elementwise (channel-inner: one value per channel). */
static void add_to(const bwd_job *job, void *acc, const void *v, int64_t n)
{
    if (job->f64)
        for (int64_t k = 0; k < n; k++)
            ((double *)acc)[k] += ((const double *)v)[k];
    else
        for (int64_t k = 0; k < n; k++)
            ((float *)acc)[k] += ((const float *)v)[k];
}

/* Adds v[0, n) in order to *acc (channel-outer: a run of one channel). */
static void sum_into(const bwd_job *job, void *acc, const void *v, int64_t n)
{
    if (job->f64) {
        double s = *(double *)acc;
        for (int64_t k = 0; k < n; k++)
            s += ((const double *)v)[k];
        *(double *)acc = s;
    } else {
        float s = *(float *)acc;
        for (int64_t k = 0; k < n; k++)
            s += ((const float *)v)[k];
        *(float *)acc = s;
    }
}

/* Chunk [r0, r1) of channels [c0, c1), the channel the fastest-varying:
 * for each r, a run of channels summed into the chunk's partial row. */
static void chunk_channel_inner(const bwd_job *job, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                                char *part)
{
    const ga_red_layout *R = &job->R;
    size_t e = job->f64 ? sizeof(double) : sizeof(float);
    int inner = R->ndim - 1;
    double v[SEG];
    for (int64_t r = r0; r < r1; r++) {
        int64_t off[3];
        red_row(R, r, off);
        int64_t i = r % R->shape[inner];
        for (int64_t c = c0; c < c1; c += SEG) {
            int64_t n = min64(SEG, c1 - c), at[3];
            for (int t = 0; t < 3; t++)
                at[t] = off[t] + i * R->strides[t][inner] + c * R->cstride[t];
            dz_segment(job, at, R->cstride, n, v);
            add_to(job, part + (size_t)c * e, v, n);
        }
    }
}

/* Chunk [r0, r1) of channels [c0, c1), the channel a slower dim: each
 * channel's elements of the chunk summed in order, an innermost run at a
 * time. */
static void chunk_channel_outer(const bwd_job *job, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                                char *part)
{
    const ga_red_layout *R = &job->R;
    size_t e = job->f64 ? sizeof(double) : sizeof(float);
    int inner = R->ndim - 1;
    int64_t len = R->shape[inner];
    const int64_t s[3] = {R->strides[0][inner], R->strides[1][inner], R->strides[2][inner]};
    double v[SEG];
    for (int64_t c = c0; c < c1; c++) {
        char *acc = part + (size_t)c * e;
        for (int64_t r = r0; r < r1;) {
            int64_t i = r % len, n = min64(min64(len - i, r1 - r), SEG), off[3];
            red_row(R, r, off);
            for (int t = 0; t < 3; t++)
                off[t] += i * s[t] + c * R->cstride[t];
            dz_segment(job, off, s, n, v);
            sum_into(job, acc, v, n);
            r += n;
        }
    }
}

/* Work item = (chunk, channel block); the partial sums are zeroed in
 * ga_cpu_activation_backward. */
static void bias_grad_range(void *ctx, int64_t begin, int64_t end)
{
    const bwd_job *job = (const bwd_job *)ctx;
    size_t e = job->f64 ? sizeof(double) : sizeof(float);
    for (int64_t item = begin; item < end; item++) {
        int64_t chunk = item / job->ncblocks, cb = item % job->ncblocks;
        int64_t r0 = chunk * job->chunk_len, r1 = min64(job->R.R, r0 + job->chunk_len);
        int64_t c0 = cb * job->cblock, c1 = min64(job->R.C, c0 + job->cblock);
        char *part = (char *)job->partial + (size_t)(chunk * job->R.C) * e;
        if (job->channel_inner)
            chunk_channel_inner(job, r0, r1, c0, c1, part);
        else
            chunk_channel_outer(job, r0, r1, c0, c1, part);
    }
}

/* bias_grad[c] = the chunk sums added in chunk order. */
static void bias_grad_store(void *ctx, int64_t begin, int64_t end)
{
    const bwd_job *job = (const bwd_job *)ctx;
    ga_dtype dtype = job->d->bias_grad_dtype;
    int64_t size = (int64_t)ga_dtype_itemsize(dtype), C = job->R.C;
    for (int64_t c0 = begin; c0 < end; c0 += SEG) {
        int64_t n = min64(SEG, end - c0);
        char *out = (char *)job->d->bias_grad + c0 * size;
        if (job->f64) {
            double s[SEG] = {0};
            for (int64_t k = 0; k < job->nchunks; k++)
                add_to(job, s, (const double *)job->partial + k * C + c0, n);
            ga_scatter_d(dtype, out, size, n, s);
        } else {
            float s[SEG] = {0};
            for (int64_t k = 0; k < job->nchunks; k++)
                add_to(job, s, (const float *)job->partial + k * C + c0, n);
            ga_scatter_f(dtype, out, size, n, s);
        }
    }
}

/* The chunks depend on R and C only, never on the thread count. */
static void plan_chunks(bwd_job *job)
{
    int64_t R = job->R.R, C = job->R.C;
    int64_t chunks = R > 0 && C > 0 ? R / (CHUNK_ELEMS / C + 1) : 1;
    int64_t cap = PARTIAL_LIMIT / C;
    if (chunks > MAX_CHUNKS)
        chunks = MAX_CHUNKS;
    if (chunks > cap)
        chunks = cap;
    if (chunks < 1)
        chunks = 1;
    job->chunk_len = R > 0 ? (R + chunks - 1) / chunks : 1;
    job->nchunks = R > 0 ? (R + job->chunk_len - 1) / job->chunk_len : 1;
    /* channel blocks only split the work: they do not change any sum */
    int64_t per_chunk = job->chunk_len > 0 ? job->chunk_len : 1;
    job->cblock = job->channel_inner ? SEG : 1 + GA_CPU_GRAIN / per_chunk;
    job->ncblocks = (C + job->cblock - 1) / job->cblock;
}

static ga_status run_bias_grad(bwd_job *job, const ga_tensor *const ts[3])
{
    const ga_act_backward_desc *d = job->d;
    ga_red_layout_make(&d->grad_y, ts, d->channel_dim, &job->R);
    if (job->R.C == 0)
        return ga_ok();
    int inner = job->R.ndim - 1;
    job->channel_inner =
        job->R.R > 1 && job->R.C > 1 && abs64(job->R.cstride[0]) < abs64(job->R.strides[0][inner]);
    plan_chunks(job);
    size_t e = job->f64 ? sizeof(double) : sizeof(float);
    job->partial = calloc((size_t)(job->nchunks * job->R.C), e);
    if (!job->partial)
        return ga_status_make(GA_ERR_HOST_OUT_OF_MEMORY, 0, NULL,
                              "could not allocate the bias-gradient partial sums",
                              "ga_cpu_activation_backward", __FILE__, __LINE__);
    if (job->R.R > 0) {
        int64_t items = job->nchunks * job->ncblocks;
        int64_t per_item = job->chunk_len * min64(job->cblock, job->R.C);
        ga_parallel_for(items, 1 + GA_CPU_GRAIN / per_item, bias_grad_range, job);
    }
    ga_parallel_for(job->R.C, 1 + GA_CPU_GRAIN / job->nchunks, bias_grad_store, job);
    free(job->partial);
    return ga_ok();
}

ga_status ga_cpu_activation_backward(const ga_act_backward_desc *desc)
{
    GA_TRY_STATUS(ga_check_act_backward(desc, __func__));
    const ga_tensor *g = &desc->grad_y, *aux = &desc->aux, *dz = &desc->dz;
    ga_activation act = desc->activation;
    int has_dz = dz->data != NULL, has_bg = desc->bias_grad != NULL;
    if (ga_act_backward_is_noop(desc))
        return ga_ok();

    bwd_job job;
    memset(&job, 0, sizeof job);
    job.d = desc;
    job.act = act;
    job.sum_dtype = ga_act_backward_sum_dtype(desc);
    job.f64 = ga_act_backward_in_double(desc);
    job.grad = (const char *)g->data;
    job.aux = act != GA_ACT_NONE ? (const char *)aux->data : NULL;
    job.dz = has_dz ? (char *)dz->data : NULL;
    const ga_tensor *ts[3] = {g, act != GA_ACT_NONE ? aux : NULL, has_dz ? dz : NULL};
    if (has_bg)
        return run_bias_grad(&job, ts);
    int64_t numel = ga_ew_layout_make(g, ts, -1, &job.L);
    if (numel == 0)
        return ga_ok();
    int64_t grain = ga_activation_is_cheap(act) ? GA_CPU_GRAIN : GA_CPU_GRAIN / 8;
    ga_parallel_for(numel, grain, act_backward_range, &job);
    return ga_ok();
}
