/*
 * conv.c — 2-D convolution on the CPU (forward, data gradient, filter
 * gradient): the fallback when there is no GPU and the oracle that
 * kernels/cuda/conv.cu is tested against.
 *
 * Every op is im2col + ga_cpu_matmul.  The work is cut into units (an
 * image, or a band of its rows when that is needed to bound memory or to
 * give every thread work) and each pool thread takes units from a shared
 * counter.  A thread unfolds its unit into its own buffer and runs the
 * unit's GEMMs itself (one per group; a GEMM called from inside a range
 * function runs inline), so the unfolded block is multiplied while it is
 * still in that thread's cache, and the buffers stay bounded: at most
 * GA_CONV_BUFFER_BYTES for all threads together.  With a single unit the
 * calling thread runs it and the GEMM threads itself.
 *
 * The unfolded matrix follows x's memory layout, so that im2col copies runs
 * that are contiguous in x and the GEMM's packing reads it in order:
 *   channels-first x:  col[c][r][s][pixel]      (pixel = p * Q + q in the band)
 *   channels-last x:   col[pixel][g][r][s][c']  (c' = c - g * C/groups)
 * For group g it is the (pixels x C/groups*R*S) operand of the GEMM, given by
 * strides; the weights are repacked once per call, [k][c'r s] or [k][r s c']
 * to match.  The unfolded data is x's own dtype (an exact copy), so the GEMM
 * converts it as it packs, and y can be the GEMM's output directly:
 *
 *   forward          y_g (pixels x K/g)   = col_g @ w_g^T, bias per column =
 *                                           per channel, in either layout
 *   data gradient    dcol_g (pixels x CRS/g) = dy_g @ w_g, in float (double),
 *                    then each dx element gathers its (at most R*S) terms
 *   filter gradient  dw_g (K/g x CRS/g)   = dy_g^T @ col_g per unit, the
 *                                           unit results added in a fixed order
 *
 * A 1x1 convolution with stride 1 and no padding needs no im2col: x (and dx
 * for the data gradient) is already the matrix, in any layout whose pixels
 * are one stride apart.
 *
 * The data gradient is a gather, not a scatter-add: a unit is a band of
 * input rows, its GEMM produces the output rows that band reads (a few rows
 * of halo are computed twice when a band is not a whole image) and every dx
 * element is written once — zero where no output pixel reads it (stride >
 * kernel) — so nothing is accumulated into dx and no two threads share one.
 *
 * Determinism: a GEMM element is one running sum in k order wherever it is
 * computed (kernels/cpu/matmul.c), the gather adds its terms in (r, s)
 * order, and the filter gradient's units and their grouping into partial
 * sums depend on the shapes only; the forward and data-gradient units may
 * depend on the thread count because no sum crosses a unit.  So the bits do
 * not depend on the thread count.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../activation.h"
#include "../convert.h"
#include "../check.h"
#include "parallel.h"

/* All the threads' unit buffers together (a unit bigger than this runs
 * alone: one output row is the smallest unit). */
#ifndef GA_CONV_BUFFER_BYTES
#define GA_CONV_BUFFER_BYTES ((int64_t)64 << 20)
#endif
/* The filter gradient's unit size and its partial sums (these decide the
 * order of the sums, so they must not depend on the thread count). */
#ifndef GA_CONV_UNIT_BYTES
#define GA_CONV_UNIT_BYTES ((int64_t)8 << 20)
#endif
#ifndef GA_CONV_PARTIAL_BYTES
#define GA_CONV_PARTIAL_BYTES ((int64_t)16 << 20)
#endif
#define GA_CONV_MAX_PARTIALS 32
#define GA_CONV_FILTER_UNITS 32
/* A band smaller than this many pixels makes a GEMM too thin to be worth
 * the split. */
#define GA_CONV_MIN_PIXELS 256
#define GA_CPU_GRAIN 65536

/* ------------------------------------------------------------- helpers */

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

/* Rounding toward -inf (a of any sign, b > 0). */
static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return -floor_div(-a, b);
}

/* a * b for a, b >= 0, INT64_MAX when it overflows (sizes only). */
static int64_t sat_mul(int64_t a, int64_t b)
{
    if (a == 0 || b == 0)
        return 0;
    return a > INT64_MAX / b ? INT64_MAX : a * b;
}

static int64_t sat_add(int64_t a, int64_t b)
{
    return a > INT64_MAX - b ? INT64_MAX : a + b;
}

static int64_t align64(int64_t bytes)
{
    return bytes > INT64_MAX - 63 ? INT64_MAX : (bytes + 63) & ~(int64_t)63;
}

/* ------------------------------------------------------------ elements */

/* n elements of e bytes from src (byte stride ss) to contiguous dst; the
 * dtypes match, so this is an exact copy. */
static void copy_in(char *dst, const char *src, int64_t ss, int64_t n, int64_t e)
{
    if (ss == e) {
        memcpy(dst, src, (size_t)(n * e));
        return;
    }
    switch (e) {
    case 2:
        for (int64_t k = 0; k < n; k++)
            memcpy(dst + 2 * k, src + k * ss, 2);
        break;
    case 4:
        for (int64_t k = 0; k < n; k++)
            memcpy(dst + 4 * k, src + k * ss, 4);
        break;
    default:
        for (int64_t k = 0; k < n; k++)
            memcpy(dst + 8 * k, src + k * ss, 8);
        break;
    }
}

/* n elements from contiguous src to dst (byte stride ds). */
static void copy_out(char *dst, int64_t ds, const char *src, int64_t n, int64_t e)
{
    if (ds == e) {
        memcpy(dst, src, (size_t)(n * e));
        return;
    }
    for (int64_t k = 0; k < n; k++)
        memcpy(dst + k * ds, src + k * e, (size_t)e);
}

/* ---------------------------------------------------------------- shape */

typedef struct {
    ga_dtype dtype;  /* of every tensor */
    ga_dtype cdtype; /* the compute type: float32, or float64 for float64 */
    int64_t e, ce;   /* their sizes */
    int64_t N, C, H, W, K, R, S, P, Q;
    int64_t G, Cg, Kg, RS, CRS, CRSg;
    int64_t sh, sw, ph, pw, dh, dw;
    int nhwc;      /* the unfolded layout: col[pixel][g][r][s][c'] */
    int pointwise; /* 1x1, stride 1, no padding: x may be the GEMM operand itself */
} conv_shape;

/* Checks x (N, C, H, W), w (K, C/groups, R, S) and y (N, K, P, Q) against
 * the geometry (x, y: dx, dy for the data gradient; w: dw for the filter
 * gradient) and fills s. */
static ga_status conv_setup(const ga_conv_geometry *g, const ga_tensor *x, const ga_tensor *w,
                            const ga_tensor *y, conv_shape *s)
{
    if (!g || !x || !w || !y)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: a NULL argument");
    if (x->ndim != 4 || w->ndim != 4 || y->ndim != 4)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: x, w and y must be 4-D");
    if (!ga_dtype_is_float(x->dtype) || w->dtype != x->dtype || y->dtype != x->dtype)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: x, w and y must share one dtype: "
                                               "float16, bfloat16, float32 or float64");
    for (int d = 0; d < 4; d++)
        if (x->shape[d] < 0 || w->shape[d] < 0 || y->shape[d] < 0)
            return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: negative size");
    for (int k = 0; k < 2; k++)
        if (g->stride[k] < 1 || g->dilation[k] < 1 || g->padding[k] < 0)
            return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: stride and dilation must be >= 1 "
                                                   "and padding >= 0");
    if (g->groups < 1 || x->shape[1] % g->groups || w->shape[0] % g->groups)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: groups must be >= 1 and divide the "
                                               "input and output channels");
    if (w->shape[1] * g->groups != x->shape[1])
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: w must have C/groups input channels");
    if (w->shape[2] < 1 || w->shape[3] < 1)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: the kernel must be at least 1 x 1");
    int64_t out[2];
    for (int k = 0; k < 2; k++) {
        int64_t span = (int64_t)g->dilation[k] * (w->shape[2 + k] - 1) + 1;
        int64_t room = x->shape[2 + k] + 2 * (int64_t)g->padding[k] - span;
        if (room < 0)
            return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: the dilated kernel is larger than "
                                                   "the padded input");
        out[k] = room / g->stride[k] + 1;
    }
    if (y->shape[0] != x->shape[0] || y->shape[1] != w->shape[0] || y->shape[2] != out[0] ||
        y->shape[3] != out[1])
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: y must be (N, K, P, Q) with P and Q "
                                               "given by the geometry");
    if ((ga_numel(x) && !x->data) || (ga_numel(w) && !w->data) || (ga_numel(y) && !y->data))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: a tensor with elements has no data");

    memset(s, 0, sizeof *s);
    s->dtype = x->dtype;
    s->cdtype = x->dtype == GA_FLOAT64 ? GA_FLOAT64 : GA_FLOAT32;
    s->e = (int64_t)ga_dtype_itemsize(s->dtype);
    s->ce = (int64_t)ga_dtype_itemsize(s->cdtype);
    s->N = x->shape[0], s->C = x->shape[1], s->H = x->shape[2], s->W = x->shape[3];
    s->K = w->shape[0], s->R = w->shape[2], s->S = w->shape[3];
    s->P = out[0], s->Q = out[1];
    s->G = g->groups, s->Cg = s->C / s->G, s->Kg = s->K / s->G;
    s->RS = s->R * s->S, s->CRSg = s->Cg * s->RS, s->CRS = s->C * s->RS;
    s->sh = g->stride[0], s->sw = g->stride[1];
    s->ph = g->padding[0], s->pw = g->padding[1];
    s->dh = g->dilation[0], s->dw = g->dilation[1];
    /* channels-last when neighbouring channels are closer than neighbouring
     * pixels: then im2col copies runs of channels */
    int64_t sc = x->strides[1] < 0 ? -x->strides[1] : x->strides[1];
    int64_t sp = x->strides[s->W > 1 ? 3 : 2];
    sp = sp < 0 ? -sp : sp;
    s->nhwc = s->C > 1 && sc < sp;
    s->pointwise = s->R == 1 && s->S == 1 && s->sh == 1 && s->sw == 1 && s->ph == 0 && s->pw == 0;
    return ga_ok();
}

/* The q of output columns that kernel column `sx` reads from inside x:
 * [*lo, *hi).  Likewise for rows with p. */
static void q_range(const conv_shape *s, int64_t sx, int64_t *lo, int64_t *hi)
{
    int64_t off = sx * s->dw - s->pw;
    *lo = max64(0, ceil_div(-off, s->sw));
    *hi = max64(*lo, min64(s->Q, floor_div(s->W - 1 - off, s->sw) + 1));
}

/* Where (c', r, s) of a group sits in an unfolded row (and in the packed
 * weights). */
static int64_t crs_index(const conv_shape *s, int64_t cg, int64_t r, int64_t sx)
{
    return s->nhwc ? (r * s->S + sx) * s->Cg + cg : (cg * s->R + r) * s->S + sx;
}

/* -------------------------------------------------------------- matrices */

/* A tensor's pixels as GEMM rows: (p, q) walk as one index, and the pixel
 * and channel strides are whole elements. */
typedef struct {
    int ok;
    int64_t pix, chan; /* in elements */
} tmat;

static tmat as_matrix(const ga_tensor *t, int64_t e)
{
    tmat m = {0, 0, 0};
    int64_t P = t->shape[2], Q = t->shape[3];
    int64_t pix = Q > 1 ? t->strides[3] : t->strides[2];
    if (P > 1 && Q > 1 && t->strides[2] != Q * t->strides[3])
        return m;
    if (pix % e || t->strides[1] % e)
        return m;
    m.ok = 1;
    m.pix = pix / e;
    m.chan = t->strides[1] / e;
    return m;
}

/* A (pixels x channels) operand: element (i, j) of group g at
 * data + (g * goff + i * rs + j * cs) * element size. */
typedef struct {
    char *data;
    int64_t rs, cs, goff;
} operand;

/* Rows [p0, ...) of image n of a tensor that as_matrix accepted. */
static operand tensor_operand(const ga_tensor *t, tmat m, int64_t n, int64_t p0, int64_t per_group)
{
    operand o = {(char *)t->data + n * t->strides[0] + p0 * t->strides[2], m.pix, m.chan,
                 per_group * m.chan};
    return o;
}

/* For a tensor that as_matrix accepted: the row stride (elements) at which
 * every image's pixels form one matrix, row n * P * Q + p * Q + q (one
 * pixel per image, or a channels-last layout with the images dense), or 0.
 * A 1x1 conv then runs one GEMM of N * P * Q rows instead of one per image,
 * which for the 1x1-pixel convs of squeeze-excitation blocks is one row. */
static int64_t merged_rows(const ga_tensor *t, tmat m, int64_t e)
{
    if (t->shape[0] < 2 || t->strides[0] % e)
        return 0;
    int64_t image = t->strides[0] / e, pixels = t->shape[2] * t->shape[3];
    if (pixels == 1)
        return image;
    return image == pixels * m.pix ? m.pix : 0;
}

/* An unfolded block of M pixels (col, or dcol). */
static operand col_operand(const conv_shape *s, char *col, int64_t M)
{
    operand o = {col, 1, M, s->CRSg * M};
    if (s->nhwc) {
        o.rs = s->CRS;
        o.cs = 1;
        o.goff = s->CRSg;
    }
    return o;
}

/* A packed (pixels x K) buffer. */
static operand packed_operand(const conv_shape *s, char *buf)
{
    operand o = {buf, s->K, 1, s->Kg};
    return o;
}

static ga_matrix mat(const char *data, ga_dtype dtype, int64_t rows, int64_t cols, int64_t rs,
                     int64_t cs)
{
    ga_matrix m = {(void *)data, dtype, rows, cols, rs, cs, 0};
    return m;
}

/* ------------------------------------------------------ im2col, packing */

/* Output rows [p0, p1) of image n unfolded into col (x's dtype), zeros
 * where the kernel reads padding. */
static void im2col(const conv_shape *s, const ga_tensor *x, int64_t n, int64_t p0, int64_t p1,
                   char *col)
{
    int64_t e = s->e, Q = s->Q, M = (p1 - p0) * Q;
    const int64_t *st = x->strides;
    const char *xn = (const char *)x->data + n * st[0];
    if (!s->nhwc) {
        for (int64_t sx = 0; sx < s->S; sx++) {
            int64_t qlo, qhi;
            q_range(s, sx, &qlo, &qhi);
            int64_t w0 = qlo * s->sw - s->pw + sx * s->dw;
            for (int64_t c = 0; c < s->C; c++)
                for (int64_t r = 0; r < s->R; r++) {
                    char *row = col + ((c * s->R + r) * s->S + sx) * M * e;
                    for (int64_t p = p0; p < p1; p++, row += Q * e) {
                        int64_t h = p * s->sh - s->ph + r * s->dh;
                        if (h < 0 || h >= s->H || qlo == qhi) {
                            memset(row, 0, (size_t)(Q * e));
                            continue;
                        }
                        memset(row, 0, (size_t)(qlo * e));
                        copy_in(row + qlo * e, xn + c * st[1] + h * st[2] + w0 * st[3],
                                s->sw * st[3], qhi - qlo, e);
                        memset(row + qhi * e, 0, (size_t)((Q - qhi) * e));
                    }
                }
        }
        return;
    }
    for (int64_t p = p0; p < p1; p++)
        for (int64_t q = 0; q < Q; q++) {
            char *dst = col + ((p - p0) * Q + q) * s->CRS * e;
            for (int64_t r = 0; r < s->R; r++) {
                int64_t h = p * s->sh - s->ph + r * s->dh;
                for (int64_t sx = 0; sx < s->S; sx++) {
                    int64_t w = q * s->sw - s->pw + sx * s->dw;
                    int inside = h >= 0 && h < s->H && w >= 0 && w < s->W;
                    for (int64_t g = 0; g < s->G; g++) {
                        char *d = dst + (g * s->CRSg + (r * s->S + sx) * s->Cg) * e;
                        if (inside)
                            copy_in(d, xn + g * s->Cg * st[1] + h * st[2] + w * st[3], st[1], s->Cg,
                                    e);
                        else
                            memset(d, 0, (size_t)(s->Cg * e));
                    }
                }
            }
        }
}

/* Whether w's memory already is wbuf's layout, [k][crs_index] (a
 * contiguous weight for NCHW unfolding, a channels-last one for NHWC; the
 * strides of dimensions of extent 1 do not matter): then the GEMMs read w
 * itself and nothing is packed. */
static int weights_in_place(const conv_shape *s, const ga_tensor *w)
{
    int64_t want[4] = {s->CRSg, s->nhwc ? 1 : s->RS, s->nhwc ? s->S * s->Cg : s->S,
                       s->nhwc ? s->Cg : 1};
    for (int i = 0; i < 4; i++)
        if (w->shape[i] > 1 && w->strides[i] != want[i] * s->e)
            return 0;
    return 1;
}

/* pack_weights for elements of e bytes; inlined where e is a constant, so
 * that each copy is one move. */
static inline void pack_weights_of(const conv_shape *s, const ga_tensor *w, char *wbuf,
                                   const int64_t e)
{
    const int64_t *st = w->strides;
    const int64_t step = (s->nhwc ? s->Cg : 1) * e;
    for (int64_t k = 0; k < s->K; k++)
        for (int64_t cg = 0; cg < s->Cg; cg++)
            for (int64_t r = 0; r < s->R; r++) {
                const char *src = (const char *)w->data + k * st[0] + cg * st[1] + r * st[2];
                char *dst = wbuf + (k * s->CRSg + crs_index(s, cg, r, 0)) * e;
                for (int64_t sx = 0; sx < s->S; sx++)
                    memcpy(dst + sx * step, src + sx * st[3], (size_t)e);
            }
}

/* w (K, C/g, R, S) as wbuf[k][crs_index] in its own dtype, where
 * weights_in_place says no. */
static void pack_weights(const conv_shape *s, const ga_tensor *w, char *wbuf)
{
    switch (s->e) {
    case 2: pack_weights_of(s, w, wbuf, 2); break;
    case 4: pack_weights_of(s, w, wbuf, 4); break;
    default: pack_weights_of(s, w, wbuf, 8); break;
    }
}

/* Rows [p0, p1) of image n of t (N, K, P, Q) as buf[pixel][k]. */
static void pack_rows(const conv_shape *s, const ga_tensor *t, int64_t n, int64_t p0, int64_t p1,
                      char *buf)
{
    const int64_t *st = t->strides;
    for (int64_t p = p0; p < p1; p++)
        for (int64_t q = 0; q < s->Q; q++)
            copy_in(buf + ((p - p0) * s->Q + q) * s->K * s->e,
                    (const char *)t->data + n * st[0] + p * st[2] + q * st[3], st[1], s->K, s->e);
}

/* The inverse: buf[pixel][k] into rows [p0, p1) of image n of t. */
static void unpack_rows(const conv_shape *s, const ga_tensor *t, int64_t n, int64_t p0, int64_t p1,
                        const char *buf)
{
    const int64_t *st = t->strides;
    for (int64_t p = p0; p < p1; p++)
        for (int64_t q = 0; q < s->Q; q++)
            copy_out((char *)t->data + n * st[0] + p * st[2] + q * st[3], st[1],
                     buf + ((p - p0) * s->Q + q) * s->K * s->e, s->K, s->e);
}

/* ----------------------------------------------------------------- units */

/* Tasks taken from a shared counter by nslots pool threads, each with its
 * own slot of buffer (as kernels/cpu/matmul.c runs its blocks). */
typedef ga_status (*task_fn)(const void *op, char *slot, int64_t task);

typedef struct {
    task_fn fn;
    const void *op;
    int64_t ntasks;
    char *slots;
    int64_t slot_bytes;
    atomic_llong next;
    atomic_int failed;
    ga_status status; /* the first failure; read after the join */
} task_run;

static void run_slot(void *ctx, int64_t begin, int64_t end)
{
    (void)end;
    task_run *run = (task_run *)ctx;
    char *slot = run->slots + begin * run->slot_bytes;
    for (;;) {
        int64_t task = atomic_fetch_add(&run->next, 1);
        if (task >= run->ntasks || atomic_load(&run->failed))
            return;
        ga_status st = run->fn(run->op, slot, task);
        if (st.error) {
            if (atomic_exchange(&run->failed, 1) == 0)
                run->status = st;
            return;
        }
    }
}

static ga_status run_tasks(task_fn fn, const void *op, int64_t ntasks, char *slots,
                           int64_t slot_bytes, int64_t nslots)
{
    task_run run;
    run.fn = fn;
    run.op = op;
    run.ntasks = ntasks;
    run.slots = slots;
    run.slot_bytes = slot_bytes;
    atomic_init(&run.next, 0);
    atomic_init(&run.failed, 0);
    run.status = ga_ok();
    /* one slot: this thread, so that the GEMM can use the pool itself */
    if (nslots <= 1)
        run_slot(&run, 0, 1);
    else
        ga_parallel_for(nslots, 1, run_slot, &run);
    return run.status;
}

/* Threads that can hold a slot of slot_bytes within the budget. */
static int64_t slots_for(int64_t slot_bytes, int64_t tasks)
{
    int64_t n = min64(ga_cpu_num_threads(), tasks);
    if (slot_bytes > 0)
        n = min64(n, GA_CONV_BUFFER_BYTES / slot_bytes);
    return max64(1, n);
}

/* Rows per unit (of `extent` rows of `row_bytes` each, `width` pixels wide)
 * for `images` images: as many as the per-thread budget allows, then fewer
 * until there are `target` units, but not below GA_CONV_MIN_PIXELS. */
static int64_t band_rows(int64_t extent, int64_t width, int64_t row_bytes, int64_t budget,
                         int64_t images, int64_t target)
{
    int64_t rows = extent;
    if (row_bytes > 0)
        rows = max64(1, min64(rows, budget / row_bytes));
    int64_t bands = ceil_div(extent, rows);
    if (images > 0 && images * bands < target) {
        int64_t want = ceil_div(target, images);
        int64_t fewest = ceil_div(GA_CONV_MIN_PIXELS, max64(1, width));
        rows = min64(rows, max64(ceil_div(extent, want), fewest));
    }
    return max64(1, rows);
}

static ga_status out_of_memory(void)
{
    return ga_status_make(GA_ERR_HOST_OUT_OF_MEMORY, 0, NULL,
                          "could not allocate the convolution's buffers", "ga_cpu_conv2d", __FILE__,
                          __LINE__);
}

static char *alloc_bytes(int64_t bytes)
{
    if (bytes >= INT64_MAX / 2 || (uint64_t)bytes > SIZE_MAX / 2)
        return NULL;
    return (char *)aligned_alloc(64, (size_t)align64(max64(bytes, 64)));
}

/* --------------------------------------------------------------- forward */

typedef struct {
    const ga_conv_desc *desc;
    conv_shape s;
    int shortcut; /* 1x1: x is the GEMM's A */
    int direct;   /* the GEMM writes y (and preact) in place */
    int merged;   /* and one GEMM takes every image: rows at these strides */
    int64_t x_rs, y_rs, p_rs;
    tmat xm, ym, pm;
    int64_t rows, bands;
    const char *wbuf;
    int64_t col_at, ytmp_at, ptmp_at; /* in a slot */
} fwd_op;

static ga_status fwd_unit(const void *ctx, char *slot, int64_t task)
{
    const fwd_op *op = (const fwd_op *)ctx;
    const conv_shape *s = &op->s;
    const ga_conv_desc *d = op->desc;
    int has_pre = d->preact.data != NULL;
    int64_t n = task / op->bands, p0 = task % op->bands * op->rows;
    int64_t p1 = min64(p0 + op->rows, s->P), M = (p1 - p0) * s->Q, e = s->e;
    operand a, y, pre = {NULL, 0, 0, 0};
    if (op->merged) {
        M = s->N * s->P * s->Q;
        a = tensor_operand(&d->x, op->xm, 0, 0, s->Cg);
        a.rs = op->x_rs;
    } else if (op->shortcut) {
        a = tensor_operand(&d->x, op->xm, n, p0, s->Cg);
    } else {
        im2col(s, &d->x, n, p0, p1, slot + op->col_at);
        a = col_operand(s, slot + op->col_at, M);
    }
    if (op->direct) {
        y = tensor_operand(&d->y, op->ym, n, p0, s->Kg);
        if (has_pre)
            pre = tensor_operand(&d->preact, op->pm, n, p0, s->Kg);
        if (op->merged) {
            y.rs = op->y_rs;
            pre.rs = op->p_rs;
        }
    } else {
        y = packed_operand(s, slot + op->ytmp_at);
        if (has_pre)
            pre = packed_operand(s, slot + op->ptmp_at);
    }
    for (int64_t g = 0; g < s->G; g++) {
        ga_matmul_desc m;
        memset(&m, 0, sizeof m);
        m.batch = 1;
        m.a = mat(a.data + g * a.goff * e, s->dtype, M, s->CRSg, a.rs, a.cs);
        m.b = mat(op->wbuf + g * s->Kg * s->CRSg * e, s->dtype, s->CRSg, s->Kg, 1, s->CRSg);
        m.d = mat(y.data + g * y.goff * e, s->dtype, M, s->Kg, y.rs, y.cs);
        m.bias = d->bias ? (const char *)d->bias + g * s->Kg * e : NULL;
        m.bias_dtype = s->dtype;
        m.activation = d->activation;
        if (has_pre)
            m.preact = mat(pre.data + g * pre.goff * e, s->dtype, M, s->Kg, pre.rs, pre.cs);
        m.allow_tf32 = d->geom.allow_tf32;
        m.deterministic = 1;
        GA_TRY_STATUS(ga_cpu_matmul(&m));
    }
    if (!op->direct) {
        unpack_rows(s, &d->y, n, p0, p1, y.data);
        if (has_pre)
            unpack_rows(s, &d->preact, n, p0, p1, pre.data);
    }
    return ga_ok();
}

ga_status ga_cpu_conv2d_forward(const ga_conv_desc *desc)
{
    if (!desc)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: a NULL argument");
    fwd_op op;
    memset(&op, 0, sizeof op);
    GA_TRY_STATUS(conv_setup(&desc->geom, &desc->x, &desc->w, &desc->y, &op.s));
    const conv_shape *s = &op.s;
    int has_pre = desc->preact.data != NULL;
    if (!ga_activation_is_valid(desc->activation))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: unknown activation");
    if (has_pre && (!ga_same_shape(&desc->preact, &desc->y) || desc->preact.dtype != s->dtype))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "conv2d: preact must have y's shape and dtype");
    if (ga_numel(&desc->y) == 0)
        return ga_ok();

    op.desc = desc;
    op.xm = as_matrix(&desc->x, s->e);
    op.shortcut = s->pointwise && op.xm.ok;
    op.ym = as_matrix(&desc->y, s->e);
    if (has_pre)
        op.pm = as_matrix(&desc->preact, s->e);
    op.direct = op.ym.ok && (!has_pre || op.pm.ok);
    if (op.shortcut && op.direct) {
        op.x_rs = merged_rows(&desc->x, op.xm, s->e);
        op.y_rs = merged_rows(&desc->y, op.ym, s->e);
        op.p_rs = has_pre ? merged_rows(&desc->preact, op.pm, s->e) : 1;
        op.merged = op.x_rs && op.y_rs && op.p_rs;
    }

    int64_t threads = ga_cpu_num_threads();
    int64_t col_row = op.shortcut ? 0 : sat_mul(s->Q, sat_mul(s->CRS, s->e));
    int64_t tmp_row = op.direct ? 0 : sat_mul(s->Q, sat_mul(s->K, s->e));
    int64_t row_bytes = sat_add(col_row, has_pre ? sat_mul(2, tmp_row) : tmp_row);
    op.rows = band_rows(s->P, s->Q, row_bytes, GA_CONV_BUFFER_BYTES / threads, s->N,
                        threads > 1 ? 2 * threads : 1);
    if (op.merged)
        op.rows = s->P; /* one unit, whose GEMM uses the pool */
    op.bands = ceil_div(s->P, op.rows);
    op.col_at = 0;
    op.ytmp_at = align64(sat_mul(op.rows, col_row));
    op.ptmp_at = sat_add(op.ytmp_at, align64(sat_mul(op.rows, tmp_row)));
    int64_t slot_bytes = sat_add(op.ptmp_at, has_pre ? align64(sat_mul(op.rows, tmp_row)) : 0);
    int64_t units = op.merged ? 1 : s->N * op.bands;
    int64_t nslots = slots_for(slot_bytes, units);
    int in_place = weights_in_place(s, &desc->w);
    int64_t wbytes = in_place ? 0 : align64(sat_mul(s->K, sat_mul(s->CRSg, s->e)));

    char *mem = alloc_bytes(sat_add(wbytes, sat_mul(nslots, slot_bytes)));
    if (!mem)
        return out_of_memory();
    if (!in_place)
        pack_weights(s, &desc->w, mem);
    op.wbuf = in_place ? (const char *)desc->w.data : mem;
    ga_status st = run_tasks(fwd_unit, &op, units, mem + wbytes, slot_bytes, nslots);
    free(mem);
    return st;
}

/* --------------------------------------------------------- data gradient */

typedef struct {
    conv_shape s;
    const ga_tensor *dy, *dx;
    int shortcut; /* 1x1 with dx a matrix: the GEMM writes dx */
    int direct;   /* dy is the GEMM's A in place */
    int merged;   /* and one GEMM takes every image: rows at these strides */
    int64_t dy_rs, dx_rs;
    tmat dym, dxm;
    int64_t band, bands; /* input rows per unit */
    const char *wbuf;
    int64_t dcol_at, dytmp_at, acc_at;
} bwd_data_op;

/* dx rows [h0, h1) of image n from dcol, the unfolded gradient of the M
 * pixels of output rows [pa, ...): every element sums its terms in (r, s)
 * order, in the compute type T, and is rounded once.  acc: W (channels-
 * first) or C (channels-last) values. */
#define GA_DEFINE_COL2IM(T, SUFFIX, STORE)                                                       \
    static void col2im_##SUFFIX(const conv_shape *s, const T *dcol, int64_t M, int64_t pa,       \
                                int64_t h0, int64_t h1, T *acc, const ga_tensor *dx, int64_t n)  \
    {                                                                                            \
        const int64_t *st = dx->strides;                                                         \
        char *dxn = (char *)dx->data + n * st[0];                                                \
        int64_t Q = s->Q;                                                                        \
        if (!s->nhwc) {                                                                          \
            for (int64_t c = 0; c < s->C; c++)                                                   \
                for (int64_t h = h0; h < h1; h++) {                                              \
                    memset(acc, 0, (size_t)s->W * sizeof *acc);                                  \
                    for (int64_t r = 0; r < s->R; r++) {                                         \
                        int64_t t = h + s->ph - r * s->dh;                                       \
                        if (t < 0 || t % s->sh || t / s->sh >= s->P)                             \
                            continue;                                                            \
                        const T *base = dcol + (c * s->R + r) * s->S * M + (t / s->sh - pa) * Q; \
                        for (int64_t sx = 0; sx < s->S; sx++) {                                  \
                            int64_t lo, hi, off = sx * s->dw - s->pw;                            \
                            q_range(s, sx, &lo, &hi);                                            \
                            const T *row = base + sx * M;                                        \
                            for (int64_t q = lo; q < hi; q++)                                    \
                                acc[q * s->sw + off] += row[q];                                  \
                        }                                                                        \
                    }                                                                            \
                    STORE(s->dtype, dxn + c * st[1] + h * st[2], st[3], s->W, acc);              \
                }                                                                                \
            return;                                                                              \
        }                                                                                        \
        for (int64_t h = h0; h < h1; h++)                                                        \
            for (int64_t w = 0; w < s->W; w++) {                                                 \
                memset(acc, 0, (size_t)s->C * sizeof *acc);                                      \
                for (int64_t r = 0; r < s->R; r++) {                                             \
                    int64_t t = h + s->ph - r * s->dh;                                           \
                    if (t < 0 || t % s->sh || t / s->sh >= s->P)                                 \
                        continue;                                                                \
                    for (int64_t sx = 0; sx < s->S; sx++) {                                      \
                        int64_t u = w + s->pw - sx * s->dw;                                      \
                        if (u < 0 || u % s->sw || u / s->sw >= Q)                                \
                            continue;                                                            \
                        const T *src = dcol + ((t / s->sh - pa) * Q + u / s->sw) * s->CRS +      \
                                       (r * s->S + sx) * s->Cg;                                  \
                        for (int64_t g = 0; g < s->G; g++) {                                     \
                            const T *sg = src + g * s->CRSg;                                     \
                            T *ag = acc + g * s->Cg;                                             \
                            for (int64_t cg = 0; cg < s->Cg; cg++)                               \
                                ag[cg] += sg[cg];                                                \
                        }                                                                        \
                    }                                                                            \
                }                                                                                \
                STORE(s->dtype, dxn + h * st[2] + w * st[3], st[1], s->C, acc);                  \
            }                                                                                    \
    }

GA_DEFINE_COL2IM(float, f, ga_scatter_f)
GA_DEFINE_COL2IM(double, d, ga_scatter_d)

/* dx rows [h0, h1) of image n that no output pixel reads. */
static void zero_rows(const conv_shape *s, const ga_tensor *dx, int64_t n, int64_t h0, int64_t h1)
{
    const int64_t *st = dx->strides;
    for (int64_t c = 0; c < s->C; c++)
        for (int64_t h = h0; h < h1; h++)
            for (int64_t w = 0; w < s->W; w++)
                memset((char *)dx->data + n * st[0] + c * st[1] + h * st[2] + w * st[3], 0,
                       (size_t)s->e);
}

/* Output rows that input rows [h0, h1) receive gradient from: [*pa, *pb]. */
static void source_rows(const conv_shape *s, int64_t h0, int64_t h1, int64_t *pa, int64_t *pb)
{
    *pa = max64(0, ceil_div(h0 + s->ph - (s->R - 1) * s->dh, s->sh));
    *pb = min64(s->P - 1, floor_div(h1 - 1 + s->ph, s->sh));
}

static ga_status bwd_data_unit(const void *ctx, char *slot, int64_t task)
{
    const bwd_data_op *op = (const bwd_data_op *)ctx;
    const conv_shape *s = &op->s;
    int64_t n = task / op->bands, h0 = task % op->bands * op->band;
    int64_t h1 = min64(h0 + op->band, s->H), pa = 0, pb = 0, e = s->e, M;
    operand a, out;
    if (op->merged) {
        M = s->N * s->P * s->Q;
        a = tensor_operand(op->dy, op->dym, 0, 0, s->Kg);
        a.rs = op->dy_rs;
    } else {
        source_rows(s, h0, h1, &pa, &pb);
        if (pa > pb) {
            zero_rows(s, op->dx, n, h0, h1);
            return ga_ok();
        }
        M = (pb - pa + 1) * s->Q;
        if (op->direct) {
            a = tensor_operand(op->dy, op->dym, n, pa, s->Kg);
        } else {
            pack_rows(s, op->dy, n, pa, pb + 1, slot + op->dytmp_at);
            a = packed_operand(s, slot + op->dytmp_at);
        }
    }
    ga_dtype odt = op->shortcut ? s->dtype : s->cdtype;
    int64_t oe = op->shortcut ? e : s->ce;
    if (op->shortcut) {
        out = tensor_operand(op->dx, op->dxm, n, h0, s->Cg);
        if (op->merged)
            out.rs = op->dx_rs;
    } else {
        out = col_operand(s, slot + op->dcol_at, M);
    }
    for (int64_t g = 0; g < s->G; g++) {
        ga_matmul_desc m;
        memset(&m, 0, sizeof m);
        m.batch = 1;
        m.a = mat(a.data + g * a.goff * e, s->dtype, M, s->Kg, a.rs, a.cs);
        m.b = mat(op->wbuf + g * s->Kg * s->CRSg * e, s->dtype, s->Kg, s->CRSg, s->CRSg, 1);
        m.d = mat(out.data + g * out.goff * oe, odt, M, s->CRSg, out.rs, out.cs);
        m.deterministic = 1;
        GA_TRY_STATUS(ga_cpu_matmul(&m));
    }
    if (!op->shortcut) {
        if (s->cdtype == GA_FLOAT64)
            col2im_d(s, (const double *)out.data, M, pa, h0, h1, (double *)(slot + op->acc_at),
                     op->dx, n);
        else
            col2im_f(s, (const float *)out.data, M, pa, h0, h1, (float *)(slot + op->acc_at),
                     op->dx, n);
    }
    return ga_ok();
}

ga_status ga_cpu_conv2d_backward_data(const ga_conv_geometry *geom, const ga_tensor *dy,
                                      const ga_tensor *w, const ga_tensor *dx)
{
    bwd_data_op op;
    memset(&op, 0, sizeof op);
    GA_TRY_STATUS(conv_setup(geom, dx, w, dy, &op.s));
    const conv_shape *s = &op.s;
    if (ga_numel(dx) == 0)
        return ga_ok();
    op.dy = dy;
    op.dx = dx;
    op.dym = as_matrix(dy, s->e);
    op.direct = op.dym.ok;
    op.dxm = as_matrix(dx, s->e);
    op.shortcut = s->pointwise && op.dxm.ok;
    if (op.shortcut && op.direct) {
        op.dy_rs = merged_rows(dy, op.dym, s->e);
        op.dx_rs = merged_rows(dx, op.dxm, s->e);
        op.merged = op.dy_rs && op.dx_rs;
    }

    /* a band of `band` input rows reads at most (band - 1 + halo) / stride + 1 output rows */
    int64_t threads = ga_cpu_num_threads(), halo = (s->R - 1) * s->dh;
    int64_t dcol_row = op.shortcut ? 0 : sat_mul(s->Q, sat_mul(s->CRS, s->ce));
    int64_t dy_row = op.direct ? 0 : sat_mul(s->Q, sat_mul(s->K, s->e));
    int64_t row_bytes = sat_add(dcol_row, dy_row), budget = GA_CONV_BUFFER_BYTES / threads;
    int64_t band = s->H;
    if (row_bytes > 0 && sat_mul(min64(s->P, (s->H - 1 + halo) / s->sh + 1), row_bytes) > budget)
        band = max64(1, min64(s->H, sat_mul(budget / row_bytes, s->sh) - halo));
    int64_t target = threads > 1 ? 2 * threads : 1;
    if (s->N * ceil_div(s->H, band) < target) {
        /* bands shorter than 4 halos would recompute too much */
        int64_t want = ceil_div(target, max64(1, s->N));
        int64_t fewest = max64(ceil_div(GA_CONV_MIN_PIXELS, s->W), 4 * halo);
        band = max64(1, min64(band, max64(ceil_div(s->H, want), fewest)));
    }
    if (op.merged)
        band = s->H; /* one unit, whose GEMM uses the pool */
    op.band = band;
    op.bands = ceil_div(s->H, band);
    int64_t out_rows = min64(s->P, (band - 1 + halo) / s->sh + 1);
    op.dcol_at = 0;
    op.dytmp_at = align64(sat_mul(out_rows, dcol_row));
    op.acc_at = sat_add(op.dytmp_at, align64(sat_mul(out_rows, dy_row)));
    int64_t slot_bytes = sat_add(op.acc_at, align64(sat_mul(max64(s->C, s->W), s->ce)));
    int64_t units = op.merged ? 1 : s->N * op.bands;
    int64_t nslots = slots_for(slot_bytes, units);
    int in_place = weights_in_place(s, w);
    int64_t wbytes = in_place ? 0 : align64(sat_mul(s->K, sat_mul(s->CRSg, s->e)));

    char *mem = alloc_bytes(sat_add(wbytes, sat_mul(nslots, slot_bytes)));
    if (!mem)
        return out_of_memory();
    if (!in_place)
        pack_weights(s, w, mem);
    op.wbuf = in_place ? (const char *)w->data : mem;
    ga_status st = run_tasks(bwd_data_unit, &op, units, mem + wbytes, slot_bytes, nslots);
    free(mem);
    return st;
}

/* ------------------------------------------------------- filter gradient */

typedef struct {
    conv_shape s;
    const ga_tensor *x, *dy, *dw;
    int shortcut, direct;
    tmat xm, dym;
    int64_t rows, bands, units, parts;
    int64_t wsize;   /* K * CRSg */
    char *acc;       /* parts x wsize of the compute type: [part][k][crs_index] */
    int dw_in_place; /* dw's memory is one part's layout */
    int64_t col_at, dytmp_at, tmp_at;
} bwd_filter_op;

/* Partial sum `part`: the filter gradient of its units, in unit order. */
static ga_status bwd_filter_part(const void *ctx, char *slot, int64_t part)
{
    const bwd_filter_op *op = (const bwd_filter_op *)ctx;
    const conv_shape *s = &op->s;
    int64_t e = s->e, ce = s->ce;
    int64_t u0 = part * op->units / op->parts, u1 = (part + 1) * op->units / op->parts;
    char *acc = op->acc + part * op->wsize * ce;
    for (int64_t u = u0; u < u1; u++) {
        int64_t n = u / op->bands, p0 = u % op->bands * op->rows;
        int64_t p1 = min64(p0 + op->rows, s->P), M = (p1 - p0) * s->Q;
        operand a, b;
        if (op->direct) {
            a = tensor_operand(op->dy, op->dym, n, p0, s->Kg);
        } else {
            pack_rows(s, op->dy, n, p0, p1, slot + op->dytmp_at);
            a = packed_operand(s, slot + op->dytmp_at);
        }
        if (op->shortcut) {
            b = tensor_operand(op->x, op->xm, n, p0, s->Cg);
        } else {
            im2col(s, op->x, n, p0, p1, slot + op->col_at);
            b = col_operand(s, slot + op->col_at, M);
        }
        char *out = u == u0 ? acc : slot + op->tmp_at;
        for (int64_t g = 0; g < s->G; g++) {
            ga_matmul_desc m;
            memset(&m, 0, sizeof m);
            m.batch = 1;
            m.a = mat(a.data + g * a.goff * e, s->dtype, s->Kg, M, a.cs, a.rs); /* dy_g^T */
            m.b = mat(b.data + g * b.goff * e, s->dtype, M, s->CRSg, b.rs, b.cs);
            m.d = mat(out + g * s->Kg * s->CRSg * ce, s->cdtype, s->Kg, s->CRSg, s->CRSg, 1);
            m.deterministic = 1;
            GA_TRY_STATUS(ga_cpu_matmul(&m));
        }
        if (u == u0)
            continue;
        if (s->cdtype == GA_FLOAT64) {
            double *dst = (double *)acc;
            const double *src = (const double *)out;
            for (int64_t i = 0; i < op->wsize; i++)
                dst[i] += src[i];
        } else {
            float *dst = (float *)acc;
            const float *src = (const float *)out;
            for (int64_t i = 0; i < op->wsize; i++)
                dst[i] += src[i];
        }
    }
    return ga_ok();
}

/* dw rows [k0, k1): the partial sums added in part order, rounded once. */
#define GA_SUM_PARTS(T)                                     \
    for (int64_t i = k0 * s->CRSg; i < k1 * s->CRSg; i++) { \
        T v = 0;                                            \
        for (int64_t j = 0; j < op->parts; j++)             \
            v += ((const T *)op->acc)[j * op->wsize + i];   \
        ((T *)op->dw->data)[i] = v;                         \
    }

static void store_dw(void *ctx, int64_t k0, int64_t k1)
{
    const bwd_filter_op *op = (const bwd_filter_op *)ctx;
    const conv_shape *s = &op->s;
    const int64_t *st = op->dw->strides;
    if (op->dw_in_place && s->dtype == s->cdtype) {
        /* dw is acc's layout and type: the sums go straight in, in the same order */
        if (s->cdtype == GA_FLOAT64) {
            GA_SUM_PARTS(double)
        } else {
            GA_SUM_PARTS(float)
        }
        return;
    }
    for (int64_t k = k0; k < k1; k++)
        for (int64_t cg = 0; cg < s->Cg; cg++)
            for (int64_t r = 0; r < s->R; r++)
                for (int64_t sx = 0; sx < s->S; sx++) {
                    int64_t i = k * s->CRSg + crs_index(s, cg, r, sx);
                    char *dst =
                        (char *)op->dw->data + k * st[0] + cg * st[1] + r * st[2] + sx * st[3];
                    if (s->cdtype == GA_FLOAT64) {
                        double v = 0.0;
                        for (int64_t j = 0; j < op->parts; j++)
                            v += ((const double *)op->acc)[j * op->wsize + i];
                        ga_scatter_d(s->dtype, dst, 0, 1, &v);
                    } else {
                        float v = 0.0f;
                        for (int64_t j = 0; j < op->parts; j++)
                            v += ((const float *)op->acc)[j * op->wsize + i];
                        ga_scatter_f(s->dtype, dst, 0, 1, &v);
                    }
                }
}

#undef GA_SUM_PARTS

ga_status ga_cpu_conv2d_backward_filter(const ga_conv_geometry *geom, const ga_tensor *x,
                                        const ga_tensor *dy, const ga_tensor *dw)
{
    bwd_filter_op op;
    memset(&op, 0, sizeof op);
    GA_TRY_STATUS(conv_setup(geom, x, dw, dy, &op.s));
    const conv_shape *s = &op.s;
    if (ga_numel(dw) == 0)
        return ga_ok();
    op.x = x;
    op.dy = dy;
    op.dw = dw;
    op.xm = as_matrix(x, s->e);
    op.shortcut = s->pointwise && op.xm.ok;
    op.dym = as_matrix(dy, s->e);
    op.direct = op.dym.ok;

    /* Everything that decides the order of the sums — the units and their
     * grouping into partial sums — comes from the shapes alone. */
    int64_t col_row = op.shortcut ? 0 : sat_mul(s->Q, sat_mul(s->CRS, s->e));
    int64_t dy_row = op.direct ? 0 : sat_mul(s->Q, sat_mul(s->K, s->e));
    op.rows = band_rows(s->P, s->Q, sat_add(col_row, dy_row), GA_CONV_UNIT_BYTES, s->N,
                        GA_CONV_FILTER_UNITS);
    op.bands = ceil_div(s->P, op.rows);
    op.units = s->N * op.bands;
    op.wsize = s->K * s->CRSg;
    op.dw_in_place = weights_in_place(s, dw);
    int64_t part_bytes = align64(sat_mul(op.wsize, s->ce));
    op.parts = min64(op.units, GA_CONV_MAX_PARTIALS);
    op.parts = min64(op.parts, max64(1, GA_CONV_PARTIAL_BYTES / part_bytes));
    op.col_at = 0;
    op.dytmp_at = align64(sat_mul(op.rows, col_row));
    op.tmp_at = sat_add(op.dytmp_at, align64(sat_mul(op.rows, dy_row)));
    int64_t slot_bytes = sat_add(op.tmp_at, op.units > op.parts ? part_bytes : 0);
    int64_t nslots = slots_for(slot_bytes, op.parts);

    int64_t acc_bytes = sat_mul(op.parts, part_bytes);
    char *mem = alloc_bytes(sat_add(acc_bytes, sat_mul(nslots, slot_bytes)));
    if (!mem)
        return out_of_memory();
    op.acc = mem;
    ga_status st = ga_ok();
    if (op.parts > 0) /* no images: dw = 0 */
        st = run_tasks(bwd_filter_part, &op, op.parts, mem + acc_bytes, slot_bytes, nslots);
    if (!st.error)
        ga_parallel_for(s->K, 1 + GA_CPU_GRAIN / max64(1, s->CRSg * max64(1, op.parts)), store_dw,
                        &op);
    free(mem);
    return st;
}
