/*
 * image.c — per-sample geometry (torchvision's RandomResizedCrop, Resize,
 * CenterCrop and RandomHorizontalFlip, drawn from a counter-based random
 * stream) and the CPU's antialiased resize.
 *
 * The resize is separable, horizontal pass first, rounded to uint8 in
 * between, as torch's uint8 resize (and PIL's) does, with PIL's fixed-point
 * weights: what torchvision v2 gives for a uint8 image, within a unit.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../image.h"
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include "image.h"

/* ------------------------------------------------------------ random */

/* SplitMix64: a sample's numbers depend only on (seed, epoch, index,
 * stream), whichever thread decodes it and in whatever order. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct {
    uint64_t state;
} sample_rng;

static sample_rng rng_for(const ga_image_transform *t, int64_t index, uint64_t stream)
{
    uint64_t s = mix64(t->seed + 0x9e3779b97f4a7c15ULL);
    s = mix64(s ^ (uint64_t)t->epoch);
    s = mix64(s ^ (uint64_t)index);
    s = mix64(s ^ stream);
    sample_rng r = {s};
    return r;
}

static uint64_t next64(sample_rng *r)
{
    r->state += 0x9e3779b97f4a7c15ULL;
    return mix64(r->state);
}

/* Uniform in [0, 1). */
static double uniform(sample_rng *r)
{
    return (double)(next64(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform integer in [0, n), n >= 1 (Lemire's multiply, unbiased enough
 * at image sizes: the bias is below 2^-40). */
static int64_t below(sample_rng *r, int64_t n)
{
    return (int64_t)(((unsigned __int128)next64(r) * (uint64_t)n) >> 64);
}

/* ---------------------------------------------------------- geometry */

enum { STREAM_CROP = 1, STREAM_FLIP = 2 };

/* torchvision's RandomResizedCrop.get_params: ten tries at an area and an
 * aspect ratio drawn uniformly (the ratio's logarithm), then the largest
 * centered crop within the ratio range. */
static void random_crop(const ga_image_transform *t, sample_rng *r, int64_t width, int64_t height,
                        int64_t *top, int64_t *left, int64_t *h, int64_t *w)
{
    double area = (double)width * (double)height;
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * (t->scale_lo + (t->scale_hi - t->scale_lo) * uniform(r));
        double ratio = exp(t->log_ratio_lo + (t->log_ratio_hi - t->log_ratio_lo) * uniform(r));
        int64_t cw = (int64_t)nearbyint(sqrt(target * ratio));
        int64_t ch = (int64_t)nearbyint(sqrt(target / ratio));
        if (cw > 0 && cw <= width && ch > 0 && ch <= height) {
            *top = below(r, height - ch + 1);
            *left = below(r, width - cw + 1);
            *h = ch, *w = cw;
            return;
        }
    }
    double in_ratio = (double)width / (double)height;
    double lo = exp(t->log_ratio_lo), hi = exp(t->log_ratio_hi);
    int64_t cw = width, ch = height;
    if (in_ratio < lo)
        ch = (int64_t)nearbyint((double)cw / lo);
    else if (in_ratio > hi)
        cw = (int64_t)nearbyint((double)ch * hi);
    *top = (height - ch) / 2;
    *left = (width - cw) / 2;
    *h = ch, *w = cw;
}

/* One axis of Resize then CenterCrop: `size` source pixels resized to
 * `resized`, of which `out` are kept from the center (zero padding
 * around a smaller image, as torchvision's CenterCrop pads). */
static void center_axis(int64_t size, int64_t resized, int64_t out, ga_resize_axis *a,
                        int64_t *start, int64_t *count)
{
    double scale = (double)size / (double)resized;
    int64_t first = 0;
    if (resized >= out) {
        first = (int64_t)nearbyint((double)(resized - out) / 2.0);
        *start = 0, *count = out;
    } else {
        *start = (out - resized) / 2, *count = resized;
    }
    a->origin = (double)first * scale;
    a->scale = scale;
    a->lo = 0, a->hi = size;
}

void ga_image_plan(const ga_image_transform *t, int64_t index, int64_t width, int64_t height,
                   ga_image_geometry *g)
{
    memset(g, 0, sizeof *g);
    g->out_h = t->out_h, g->out_w = t->out_w;
    if (t->random_crop) {
        sample_rng r = rng_for(t, index, STREAM_CROP);
        int64_t top, left, h, w;
        random_crop(t, &r, width, height, &top, &left, &h, &w);
        g->ny = t->out_h, g->nx = t->out_w;
        g->ry.origin = (double)top, g->ry.scale = (double)h / (double)t->out_h;
        g->ry.lo = top, g->ry.hi = top + h;
        g->rx.origin = (double)left, g->rx.scale = (double)w / (double)t->out_w;
        g->rx.lo = left, g->rx.hi = left + w;
        g->crop_top = top, g->crop_left = left, g->crop_h = h, g->crop_w = w;
    } else {
        int64_t rh = height, rw = width;
        if (t->resize_short > 0) {
            int64_t shorter = width <= height ? width : height;
            int64_t longer = width <= height ? height : width;
            int64_t new_long =
                (int64_t)((double)t->resize_short * (double)longer / (double)shorter);
            rw = width <= height ? t->resize_short : new_long;
            rh = width <= height ? new_long : t->resize_short;
        } else if (t->resize_h > 0) {
            rh = t->resize_h, rw = t->resize_w;
        }
        center_axis(height, rh, t->out_h, &g->ry, &g->y0, &g->ny);
        center_axis(width, rw, t->out_w, &g->rx, &g->x0, &g->nx);
        g->crop_h = rh, g->crop_w = rw;
    }
    if (t->flip_p > 0) {
        sample_rng r = rng_for(t, index, STREAM_FLIP);
        g->flip = uniform(&r) < t->flip_p;
    }
}

ga_image_format ga_image_format_of(const uint8_t *data, size_t size)
{
    if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF)
        return GA_IMAGE_JPEG;
    if (size >= 8 && memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0)
        return GA_IMAGE_PNG;
    return GA_IMAGE_UNKNOWN;
}

/* -------------------------------------------------------- workspace */

ga_image_workspace *ga_cpu_image_workspace_new(void)
{
    return calloc(1, sizeof(ga_image_workspace));
}

void ga_cpu_image_workspace_free(ga_image_workspace *ws)
{
    if (!ws)
        return;
    free(ws->y.taps), free(ws->y.weights), free(ws->x.taps), free(ws->x.weights);
    free(ws->y.fweights), free(ws->x.fweights);
    free(ws->rows), free(ws->acc), free(ws->line), free(ws->fline);
    free(ws);
}

int ga_image_reserve(void **buf, size_t *cap, size_t size)
{
    if (size <= *cap)
        return 0;
    size_t grown = *cap * 3 / 2 > size ? *cap * 3 / 2 : size;
    void *p = realloc(*buf, grown);
    if (!p)
        return -1;
    *buf = p;
    *cap = grown;
    return 0;
}

ga_status ga_image_error(ga_image_workspace *ws, ga_error error, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ws->message, sizeof ws->message, fmt, ap);
    va_end(ap);
    return ga_status_make(error, 0, NULL, ws->message, "decode", __FILE__, __LINE__);
}

/* ----------------------------------------------------------- resize */

/* The taps of `n` output pixels along axis a, as fixed-point weights that
 * sum to 1 << GA_RESIZE_BITS (torch normalizes the float weights first,
 * PIL rounds each: both here). */
static int plan_axis(ga_resize_plan *p, const ga_resize_axis *a, int64_t n)
{
    size_t taps_cap = (size_t)p->ntaps_cap * sizeof *p->taps;
    if (ga_image_reserve((void **)&p->taps, &taps_cap, (size_t)n * sizeof *p->taps) < 0)
        return -1;
    p->ntaps_cap = (int64_t)(taps_cap / sizeof *p->taps);
    int64_t most = (int64_t)ceil(ga_resize_support(a)) * 2 + 2;
    size_t weights_cap = (size_t)p->nweights_cap * sizeof *p->weights;
    size_t fweights_cap = weights_cap;
    if (ga_image_reserve((void **)&p->weights, &weights_cap,
                         (size_t)(n * most) * sizeof *p->weights) < 0 ||
        ga_image_reserve((void **)&p->fweights, &fweights_cap,
                         (size_t)(n * most) * sizeof *p->fweights) < 0)
        return -1;
    p->nweights_cap = (int64_t)(weights_cap / sizeof *p->weights);
    p->lo = a->hi - a->lo, p->hi = 0;
    /* every output pixel gets the same number of weights, the largest
     * count, zeros past its own (one loop length for the whole axis) */
    p->taps_max = 1;
    for (int64_t k = 0; k < n; k++) {
        int64_t first, count;
        double center;
        ga_resize_taps(a, k, &first, &count, &center);
        p->taps_max = count > p->taps_max ? count : p->taps_max;
    }
    p->taps_max = p->taps_max > most ? most : p->taps_max;
    int64_t at = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t first, count;
        double center, total = 0;
        ga_resize_taps(a, k, &first, &count, &center);
        count = count > most ? most : count;
        /* the end taps' weights can be 0: keep the span tight */
        while (count > 1 && ga_resize_weight(a, first + count - 1, center) == 0.0)
            count--;
        while (count > 1 && ga_resize_weight(a, first, center) == 0.0)
            first++, count--;
        for (int64_t j = 0; j < count; j++)
            total += ga_resize_weight(a, first + j, center);
        ga_resize_tap *tap = &p->taps[k];
        tap->first = first;
        tap->count = count;
        tap->weights = at;
        for (int64_t j = 0; j < p->taps_max; j++) {
            double v = j >= count  ? 0.0
                       : total > 0 ? ga_resize_weight(a, first + j, center) / total
                                   : 1.0 / (double)count;
            p->fweights[at] = (float)v;
            p->weights[at++] = (int32_t)lrint(v * (double)(1 << GA_RESIZE_BITS));
        }
        if (count > 0) {
            p->lo = first < p->lo ? first : p->lo;
            p->hi = first + count > p->hi ? first + count : p->hi;
        }
    }
    if (p->hi <= p->lo)
        p->lo = p->hi = 0;
    return 0;
}

int ga_image_resizer_begin(ga_image_workspace *ws, const ga_image_geometry *g)
{
    if (plan_axis(&ws->y, &g->ry, g->ny) < 0 || plan_axis(&ws->x, &g->rx, g->nx) < 0)
        return -1;
    ws->nx = g->nx;
    ws->row_bytes = g->nx * 3;
    ws->flip = g->flip;
    /* a byte more: the last pixel's store writes four */
    size_t rows = (size_t)(ws->y.hi - ws->y.lo) * (size_t)ws->row_bytes + 1;
    if (ga_image_reserve((void **)&ws->rows, &ws->rows_cap, rows) < 0)
        return -1;
    /* zeros past the last pixel: the padded taps and the fourth lane of
     * the last load read them */
    size_t cols = (size_t)(ws->x.hi - ws->x.lo) * 3;
    size_t floats = cols + (size_t)ws->x.taps_max * 3 + 1;
    if (ga_image_reserve((void **)&ws->fline, &ws->fline_cap, floats * sizeof(float)) < 0)
        return -1;
    memset(ws->fline + cols, 0, (floats - cols) * sizeof(float));
    return ga_image_reserve((void **)&ws->acc, &ws->acc_cap,
                            (size_t)(ws->row_bytes ? ws->row_bytes : 1) * sizeof(int32_t));
}

/* Four floats, loaded from anywhere (GCC's vector extension: SSE on
 * x86-64, NEON on ARM). */
typedef float ga_v4f __attribute__((vector_size(16)));

static inline ga_v4f load4(const float *p)
{
    ga_v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint8_t round8(float v)
{
    v += 0.5f;
    return (uint8_t)(v <= 0.0f ? 0 : v >= 255.0f ? 255 : (int)v);
}

/* Stores a pixel's three channels rounded to uint8; may also write the
 * byte after them (the next pixel's, written after this one). */
static inline void store_pixel(uint8_t *out, ga_v4f acc)
{
#ifdef __SSE2__
    __m128 v = _mm_add_ps((__m128)acc, _mm_set1_ps(0.5f));
    v = _mm_min_ps(_mm_max_ps(v, _mm_setzero_ps()), _mm_set1_ps(255.0f));
    __m128i i = _mm_cvttps_epi32(v);
    i = _mm_packs_epi32(i, i);
    i = _mm_packus_epi16(i, i);
    int32_t bytes = _mm_cvtsi128_si32(i);
    memcpy(out, &bytes, 4);
#else
    out[0] = round8(acc[0]), out[1] = round8(acc[1]), out[2] = round8(acc[2]);
#endif
}

/* The horizontal pass for taps of a fixed count (the compiler unrolls it):
 * a pixel's three channels at once in one vector (its fourth lane reads
 * the next pixel's red, and is dropped), each tap one multiply-add.
 * Output pixels go left to right in memory (right to left in k when
 * flipped), so each store's extra byte is overwritten next. */
static inline __attribute__((always_inline)) void
horizontal(const ga_image_workspace *ws, const float *f, uint8_t *out, int64_t taps)
{
    int64_t nx = ws->nx;
    for (int64_t n = 0; n < nx; n++) {
        int64_t k = ws->flip ? nx - 1 - n : n;
        const ga_resize_tap *tap = &ws->x.taps[k];
        const float *w = ws->x.fweights + tap->weights;
        const float *px = f + (tap->first - ws->x.lo) * 3;
        ga_v4f acc = {0, 0, 0, 0};
        for (int64_t j = 0; j < taps; j++)
            acc += w[j] * load4(px + 3 * j);
        store_pixel(out + n * 3, acc);
    }
}

/* Both passes are compiled twice, for any x86-64 and for AVX2 + FMA
 * (Haswell on), and picked per call from what the CPU has, as normalize.c
 * does (not with ifunc-based target_clones, whose resolvers run before
 * the sanitizers' runtimes start). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GA_IMAGE_HASWELL 1
#define GA_TARGET_HASWELL __attribute__((target("avx2,fma")))

static int cpu_has_haswell(void)
{
    __builtin_cpu_init(); /* needed when called before the constructors ran */
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
#define GA_IMAGE_HASWELL 0
#define GA_TARGET_HASWELL
#endif

static inline __attribute__((always_inline)) void resizer_row(ga_image_workspace *ws, int64_t row,
                                                              const uint8_t *rgb, int64_t col0)
{
    uint8_t *out = ws->rows + (size_t)(row - ws->y.lo) * (size_t)ws->row_bytes;
    int64_t cols = ws->x.hi - ws->x.lo;
    const uint8_t *from = rgb + (ws->x.lo - col0) * 3;
    float *f = ws->fline;
    for (int64_t i = 0; i < cols * 3; i++)
        f[i] = (float)from[i];
    switch (ws->x.taps_max) {
    case 1: horizontal(ws, f, out, 1); break;
    case 2: horizontal(ws, f, out, 2); break;
    case 3: horizontal(ws, f, out, 3); break;
    case 4: horizontal(ws, f, out, 4); break;
    case 5: horizontal(ws, f, out, 5); break;
    case 6: horizontal(ws, f, out, 6); break;
    case 7: horizontal(ws, f, out, 7); break;
    case 8: horizontal(ws, f, out, 8); break;
    default: horizontal(ws, f, out, ws->x.taps_max); break;
    }
}

static void resizer_row_generic(ga_image_workspace *ws, int64_t row, const uint8_t *rgb,
                                int64_t col0)
{
    resizer_row(ws, row, rgb, col0);
}

#if GA_IMAGE_HASWELL
GA_TARGET_HASWELL static void resizer_row_haswell(ga_image_workspace *ws, int64_t row,
                                                  const uint8_t *rgb, int64_t col0)
{
    resizer_row(ws, row, rgb, col0);
}
#endif

void ga_image_resizer_row(ga_image_workspace *ws, int64_t row, const uint8_t *rgb, int64_t col0)
{
#if GA_IMAGE_HASWELL
    if (cpu_has_haswell()) {
        resizer_row_haswell(ws, row, rgb, col0);
        return;
    }
#endif
    resizer_row_generic(ws, row, rgb, col0);
}

/* The vertical pass: whole rows of multiply-adds, which the compiler
 * vectorizes (with AVX2 where the CPU has it: SSE2 has no 32-bit
 * multiply). */
static inline __attribute__((always_inline)) void vertical_row(uint8_t *out, int32_t *acc,
                                                               const uint8_t *rows, int64_t n,
                                                               const ga_resize_tap *tap,
                                                               const int32_t *w, int64_t row0)
{
    const int32_t half = 1 << (GA_RESIZE_BITS - 1);
    for (int64_t i = 0; i < n; i++)
        acc[i] = half;
    for (int64_t j = 0; j < tap->count; j++) {
        const uint8_t *src = rows + (size_t)(tap->first + j - row0) * (size_t)n;
        int32_t wj = w[j];
        for (int64_t i = 0; i < n; i++)
            acc[i] += wj * src[i];
    }
    for (int64_t i = 0; i < n; i++) {
        int32_t v = acc[i] >> GA_RESIZE_BITS;
        out[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
}

static void vertical_row_generic(uint8_t *out, int32_t *acc, const uint8_t *rows, int64_t n,
                                 const ga_resize_tap *tap, const int32_t *w, int64_t row0)
{
    vertical_row(out, acc, rows, n, tap, w, row0);
}

#if GA_IMAGE_HASWELL
GA_TARGET_HASWELL static void vertical_row_haswell(uint8_t *out, int32_t *acc, const uint8_t *rows,
                                                   int64_t n, const ga_resize_tap *tap,
                                                   const int32_t *w, int64_t row0)
{
    vertical_row(out, acc, rows, n, tap, w, row0);
}
#endif

static void vertical_sums(uint8_t *out, int32_t *acc, const uint8_t *rows, int64_t n,
                          const ga_resize_tap *tap, const int32_t *w, int64_t row0)
{
#if GA_IMAGE_HASWELL
    if (cpu_has_haswell()) {
        vertical_row_haswell(out, acc, rows, n, tap, w, row0);
        return;
    }
#endif
    vertical_row_generic(out, acc, rows, n, tap, w, row0);
}

void ga_image_resizer_finish(ga_image_workspace *ws, const ga_image_geometry *g, uint8_t *dst)
{
    int64_t out_row = g->out_w * 3;
    int64_t n = ws->row_bytes;
    int32_t *acc = ws->acc;
    /* padding first: the rows outside the image, then the sides of the rest */
    for (int64_t y = 0; y < g->out_h; y++) {
        if (y < g->y0 || y >= g->y0 + g->ny) {
            memset(dst + y * out_row, 0, (size_t)out_row);
            continue;
        }
        uint8_t *line = dst + y * out_row;
        memset(line, 0, (size_t)(g->x0 * 3));
        memset(line + (g->x0 + g->nx) * 3, 0, (size_t)((g->out_w - g->x0 - g->nx) * 3));
        const ga_resize_tap *tap = &ws->y.taps[y - g->y0];
        vertical_sums(line + g->x0 * 3, acc, ws->rows, n, tap, ws->y.weights + tap->weights,
                      ws->y.lo);
    }
}

ga_status ga_cpu_resize_image(const uint8_t *src, int64_t src_h, int64_t src_w, int64_t src_pitch,
                              const ga_image_geometry *g, uint8_t *dst, ga_image_workspace *ws)
{
    if (g->ry.lo < 0 || g->rx.lo < 0 || g->ry.hi > src_h || g->rx.hi > src_w || g->ny < 0 ||
        g->nx < 0 || src_pitch < src_w * 3)
        return ga_image_error(ws, GA_ERR_INVALID_VALUE,
                              "resize: the geometry reads past the %lld x %lld source",
                              (long long)src_h, (long long)src_w);
    if (ga_image_resizer_begin(ws, g) < 0)
        return GA_STATUS(GA_ERR_HOST_OUT_OF_MEMORY, "resize: out of memory for its buffers");
    for (int64_t r = ws->y.lo; r < ws->y.hi; r++)
        ga_image_resizer_row(ws, r, src + (g->ry.lo + r) * src_pitch + g->rx.lo * 3, 0);
    ga_image_resizer_finish(ws, g, dst);
    return ga_ok();
}
