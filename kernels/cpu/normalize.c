/*
 * normalize.c — the loader's image transform on the CPU (uint8 HWC images
 * to normalized float16/bfloat16/float32/float64, NCHW or NHWC).
 *
 * Every output is fma(x, scale, shift) rounded once to float (to double for
 * float64), then to the output dtype, nearest even: ga_normalize_value and
 * kernels/convert.h, the formula the GPU uses, so the two agree bit for bit.
 *
 * Two ways to get there, picked at run time:
 *  - AVX2 with FMA and F16C on x86-64 CPUs that have them: the same fused
 *    multiply-add on eight lanes at once (vfmadd rounds once, as fmaf
 *    does), the narrowing done with the same rounding (F16C's conversion
 *    for float16, the nearest-even bit trick for bfloat16);
 *  - a table lookup: a uint8 input has only 256 outputs per channel, each
 *    evaluated once per call with the scalar formula.  It also takes the
 *    pixels the vector loops leave over, and every channel count or
 *    layout they do not handle.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../convert.h"
#include "parallel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define GA_HAVE_AVX2_NORMALIZE 1
#define GA_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define GA_HAVE_AVX2_NORMALIZE 0
#endif

/* NHWC vectors repeat their channel pattern every lcm(c, 8) elements. */
#define GA_NORMALIZE_MAX_PERIOD (8 * GA_NORMALIZE_MAX_CHANNELS)

typedef struct {
    const ga_normalize_desc *d;
    const unsigned char *table; /* [channel][value] -> the output element's bytes */
    size_t out_size;
    int vector;     /* the AVX2 loops apply */
    int64_t period; /* NHWC: elements before the channel pattern repeats */
    /* per-lane multiplier and offset over one period (NCHW: one per channel) */
    float scale_f[GA_NORMALIZE_MAX_PERIOD], shift_f[GA_NORMALIZE_MAX_PERIOD];
    double scale_d[GA_NORMALIZE_MAX_PERIOD], shift_d[GA_NORMALIZE_MAX_PERIOD];
} normalize_job;

static ga_status check(const ga_normalize_desc *d)
{
    if (d->n < 0 || d->h < 0 || d->w < 0 || d->c < 1 || d->c > GA_NORMALIZE_MAX_CHANNELS)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "normalize: bad image shape or channel count");
    if (!ga_dtype_is_float(d->dtype))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "normalize: the output dtype must be a float type");
    return ga_ok();
}

/* ------------------------------------------------------ table lookup */

/* Elements of one size at a time, so the copies compile to plain moves. */
#define GA_NORMALIZE_PIXELS(TYPE)                                            \
    do {                                                                     \
        const TYPE *lut = (const TYPE *)job->table;                          \
        TYPE *dst = (TYPE *)out;                                             \
        /* element (p, ch) of the source: channels last, or first */         \
        int64_t ps = job->d->src_chw ? 1 : c, cs = job->d->src_chw ? hw : 1; \
        if (job->d->nchw) {                                                  \
            for (int64_t ch = 0; ch < c; ch++) {                             \
                const TYPE *row = lut + ch * 256;                            \
                TYPE *plane = dst + ch * hw;                                 \
                for (int64_t p = p0; p < p1; p++)                            \
                    plane[p] = row[src[p * ps + ch * cs]];                   \
            }                                                                \
        } else {                                                             \
            for (int64_t p = p0; p < p1; p++)                                \
                for (int64_t ch = 0; ch < c; ch++)                           \
                    dst[p * c + ch] = lut[ch * 256 + src[p * ps + ch * cs]]; \
        }                                                                    \
    } while (0)

/* Pixels [p0, p1) of one image (src: its first pixel; out: its output). */
static void lookup_pixels(const normalize_job *job, const uint8_t *src, void *out, int64_t p0,
                          int64_t p1)
{
    int64_t hw = job->d->h * job->d->w, c = job->d->c;
    switch (job->out_size) {
    case 2: GA_NORMALIZE_PIXELS(uint16_t); break;
    case 4: GA_NORMALIZE_PIXELS(uint32_t); break;
    default: GA_NORMALIZE_PIXELS(uint64_t); break;
    }
}

/* ------------------------------------------------------------ AVX2 */

#if GA_HAVE_AVX2_NORMALIZE

static int cpu_has_avx2(void)
{
    __builtin_cpu_init(); /* needed when called before the constructors ran */
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}

/* Eight uint8 values (the low 8 bytes of x) normalized with the per-lane
 * multipliers and offsets at lane index `k` of the job's tables, stored
 * as eight elements of `dtype` at dst.  Inlined into loops that each fix
 * the dtype, so the switch is resolved outside them. */
GA_TARGET_AVX2 static inline __attribute__((always_inline)) void
store8(const normalize_job *job, ga_dtype dtype, __m128i x, int64_t k, void *dst)
{
    __m256i wide = _mm256_cvtepu8_epi32(x);
    if (dtype == GA_FLOAT64) {
        __m256d lo = _mm256_cvtepi32_pd(_mm256_castsi256_si128(wide));
        __m256d hi = _mm256_cvtepi32_pd(_mm256_extracti128_si256(wide, 1));
        lo = _mm256_fmadd_pd(lo, _mm256_loadu_pd(job->scale_d + k),
                             _mm256_loadu_pd(job->shift_d + k));
        hi = _mm256_fmadd_pd(hi, _mm256_loadu_pd(job->scale_d + k + 4),
                             _mm256_loadu_pd(job->shift_d + k + 4));
        _mm256_storeu_pd((double *)dst, lo);
        _mm256_storeu_pd((double *)dst + 4, hi);
        return;
    }
    __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(wide), _mm256_loadu_ps(job->scale_f + k),
                               _mm256_loadu_ps(job->shift_f + k));
    switch (dtype) {
    case GA_FLOAT32: _mm256_storeu_ps((float *)dst, v); break;
    case GA_FLOAT16:
        _mm_storeu_si128((__m128i *)dst, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        break;
    default: { /* bfloat16: add 0x7fff plus the lowest kept bit, keep the top half */
        __m256i bits = _mm256_castps_si256(v);
        __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
        bits = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
        bits = _mm256_srli_epi32(bits, 16);
        __m128i packed =
            _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
        _mm_storeu_si128((__m128i *)dst, packed);
        break;
    }
    }
}

/* NHWC (and any one-channel image): the output is the input's element
 * order, so the image is one run of elements whose channel pattern repeats
 * every job->period elements (a multiple of 8).  Returns how many leading
 * pixels it did. */
GA_TARGET_AVX2 static inline __attribute__((always_inline)) int64_t
vector_interleaved(const normalize_job *job, ga_dtype dtype, const uint8_t *src, void *out)
{
    int64_t c = job->d->c, elements = job->d->h * job->d->w * c, period = job->period;
    int64_t done = elements - elements % period; /* whole periods only */
    char *dst = (char *)out;
    size_t size = job->out_size;
    for (int64_t e = 0; e < done; e += period)
        for (int64_t k = 0; k < period; k += 8)
            store8(job, dtype, _mm_loadl_epi64((const __m128i *)(src + e + k)), k,
                   dst + (size_t)(e + k) * size);
    return done / c;
}

/* NCHW with three channels: sixteen pixels (48 bytes) at a time, split
 * into their R, G and B bytes by shuffles, each written to its plane.
 * Returns how many leading pixels it did. */
GA_TARGET_AVX2 static inline __attribute__((always_inline)) int64_t
vector_planar3(const normalize_job *job, ga_dtype dtype, const uint8_t *src, void *out)
{
    int64_t hw = job->d->h * job->d->w, done = hw - hw % 16;
    size_t size = job->out_size;
    char *plane[3];
    for (int ch = 0; ch < 3; ch++)
        plane[ch] = (char *)out + (size_t)(ch * hw) * size;
    /* byte j of channel ch of the 16 pixels comes from byte 3j + ch of the
     * 48: of the first, second or third 16-byte load (-1 zeroes the lane) */
    __m128i pick[3][3];
    for (int ch = 0; ch < 3; ch++) {
        for (int part = 0; part < 3; part++) {
            signed char idx[16];
            for (int j = 0; j < 16; j++) {
                int from = 3 * j + ch - 16 * part;
                idx[j] = from >= 0 && from < 16 ? (signed char)from : (signed char)-1;
            }
            pick[ch][part] = _mm_loadu_si128((const __m128i *)idx);
        }
    }
    for (int64_t p = 0; p < done; p += 16) {
        const uint8_t *s = src + 3 * p;
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i d = _mm_loadu_si128((const __m128i *)(s + 32));
        for (int ch = 0; ch < 3; ch++) {
            __m128i x = _mm_or_si128(
                _mm_or_si128(_mm_shuffle_epi8(a, pick[ch][0]), _mm_shuffle_epi8(b, pick[ch][1])),
                _mm_shuffle_epi8(d, pick[ch][2]));
            char *o = plane[ch] + (size_t)p * size;
            store8(job, dtype, x, 8 * ch, o);
            store8(job, dtype, _mm_unpackhi_epi64(x, x), 8 * ch, o + 8 * size);
        }
    }
    return done;
}

/* The vector loop for one image, instantiated per output dtype. */
#define GA_NORMALIZE_VECTOR_IMAGE(NAME, DTYPE)                                                  \
    GA_TARGET_AVX2 static int64_t NAME(const normalize_job *job, const uint8_t *src, void *out) \
    {                                                                                           \
        return job->d->nchw && job->d->c == 3 ? vector_planar3(job, DTYPE, src, out)            \
                                              : vector_interleaved(job, DTYPE, src, out);       \
    }
GA_NORMALIZE_VECTOR_IMAGE(vector_image_f16, GA_FLOAT16)
GA_NORMALIZE_VECTOR_IMAGE(vector_image_bf16, GA_BFLOAT16)
GA_NORMALIZE_VECTOR_IMAGE(vector_image_f32, GA_FLOAT32)
GA_NORMALIZE_VECTOR_IMAGE(vector_image_f64, GA_FLOAT64)

/* Pixels done by the vector loop: the leading ones of the image. */
static int64_t vector_image(const normalize_job *job, const uint8_t *src, void *out)
{
    switch (job->d->dtype) {
    case GA_FLOAT16: return vector_image_f16(job, src, out);
    case GA_BFLOAT16: return vector_image_bf16(job, src, out);
    case GA_FLOAT32: return vector_image_f32(job, src, out);
    default: return vector_image_f64(job, src, out);
    }
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

#endif /* GA_HAVE_AVX2_NORMALIZE */

static void normalize_range(void *ctx, int64_t begin, int64_t end)
{
    const normalize_job *job = (const normalize_job *)ctx;
    int64_t hw = job->d->h * job->d->w, c = job->d->c;
    size_t image_out = (size_t)(hw * c) * job->out_size;
    for (int64_t image = begin; image < end; image++) {
        const uint8_t *src = job->d->src + image * hw * c;
        char *out = (char *)job->d->dst + (size_t)image * image_out;
        int64_t done = 0;
#if GA_HAVE_AVX2_NORMALIZE
        if (job->vector)
            done = vector_image(job, src, out);
#endif
        if (done < hw)
            lookup_pixels(job, src, out, done, hw);
    }
}

/* The vector loops apply to NHWC (or one channel) and to three-channel
 * NCHW images, when the CPU has the instructions and every multiplier and
 * offset is finite (no NaN can come out then, so the bfloat16 bit trick
 * rounds exactly like convert.h).  Fills the per-lane tables. */
static void plan_vectors(normalize_job *job)
{
    job->vector = 0;
#if GA_HAVE_AVX2_NORMALIZE
    const ga_normalize_desc *d = job->d;
    if (!(!d->nchw || d->c == 1 || d->c == 3) || !cpu_has_avx2())
        return;
    if (d->src_chw && d->c != 1) /* the table lookup reads planes */
        return;
    for (int64_t ch = 0; ch < d->c; ch++)
        if (!isfinite((float)d->scale[ch]) || !isfinite((float)d->shift[ch]) ||
            !isfinite(d->scale[ch]) || !isfinite(d->shift[ch]))
            return;
    if (d->nchw && d->c == 3) {
        for (int k = 0; k < 24; k++) { /* eight lanes of each channel */
            job->scale_f[k] = (float)d->scale[k / 8], job->shift_f[k] = (float)d->shift[k / 8];
            job->scale_d[k] = d->scale[k / 8], job->shift_d[k] = d->shift[k / 8];
        }
    } else {
        job->period = d->c / gcd64(d->c, 8) * 8;
        for (int64_t k = 0; k < job->period; k++) {
            int64_t ch = k % d->c;
            job->scale_f[k] = (float)d->scale[ch], job->shift_f[k] = (float)d->shift[ch];
            job->scale_d[k] = d->scale[ch], job->shift_d[k] = d->shift[ch];
        }
    }
    job->vector = 1;
#endif
}

ga_status ga_cpu_normalize_images(const ga_normalize_desc *desc)
{
    GA_TRY_STATUS(check(desc));
    size_t out_size = ga_dtype_itemsize(desc->dtype);
    normalize_job *job = malloc(sizeof *job + (size_t)desc->c * 256 * out_size);
    if (!job)
        return ga_status_make(GA_ERR_HOST_OUT_OF_MEMORY, 0, NULL,
                              "could not allocate the normalize tables", "ga_cpu_normalize_images",
                              __FILE__, __LINE__);
    unsigned char *table = (unsigned char *)(job + 1);
    for (int64_t ch = 0; ch < desc->c; ch++) {
        for (int x = 0; x < 256; x++) {
            ga_value v;
            v.is_float = 1;
            v.i = 0;
            v.f = ga_normalize_value(desc, (uint8_t)x, ch);
            ga_store(desc->dtype, table + ((size_t)ch * 256 + (size_t)x) * out_size, v);
        }
    }
    job->d = desc;
    job->table = table;
    job->out_size = out_size;
    plan_vectors(job);
    int64_t per_image = desc->h * desc->w * desc->c;
    int64_t grain = per_image > 0 ? 1 + 65536 / per_image : desc->n;
    if (desc->in_caller)
        normalize_range(job, 0, desc->n);
    else
        ga_parallel_for(desc->n, grain, normalize_range, job);
    free(job);
    return ga_ok();
}
