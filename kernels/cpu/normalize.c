/*
 * normalize.c — the loader's image transform on the CPU (uint8 HWC images
 * to normalized float16/bfloat16/float32/float64, NCHW or NHWC).
 *
 * The input is uint8, so there are only 256 outputs per channel: each call
 * evaluates them once with the formula the GPU uses (ga_normalize_value and
 * kernels/convert.h, so the two agree bit for bit) and the images are then
 * transformed by table lookup.
 */
#include <stdlib.h>
#include <string.h>

#include "../convert.h"
#include "parallel.h"

typedef struct {
    const ga_normalize_desc *d;
    const unsigned char *table; /* [channel][value] -> the output element's bytes */
    size_t out_size;
} normalize_job;

static ga_status check(const ga_normalize_desc *d)
{
    if (d->n < 0 || d->h < 0 || d->w < 0 || d->c < 1 || d->c > GA_NORMALIZE_MAX_CHANNELS)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "normalize: bad image shape or channel count");
    if (!ga_dtype_is_float(d->dtype))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "normalize: the output dtype must be a float type");
    return ga_ok();
}

/* Elements of one size at a time, so the copies compile to plain moves. */
#define GA_NORMALIZE_IMAGE(TYPE)                                       \
    do {                                                               \
        const TYPE *lut = (const TYPE *)job->table;                    \
        TYPE *dst = (TYPE *)job->d->dst + image * hw * c;              \
        if (job->d->nchw) {                                            \
            for (int64_t ch = 0; ch < c; ch++) {                       \
                const TYPE *row = lut + ch * 256;                      \
                TYPE *plane = dst + ch * hw;                           \
                for (int64_t p = 0; p < hw; p++)                       \
                    plane[p] = row[src[p * c + ch]];                   \
            }                                                          \
        } else {                                                       \
            for (int64_t p = 0; p < hw; p++)                           \
                for (int64_t ch = 0; ch < c; ch++)                     \
                    dst[p * c + ch] = lut[ch * 256 + src[p * c + ch]]; \
        }                                                              \
    } while (0)

static void normalize_range(void *ctx, int64_t begin, int64_t end)
{
    const normalize_job *job = (const normalize_job *)ctx;
    int64_t hw = job->d->h * job->d->w, c = job->d->c;
    for (int64_t image = begin; image < end; image++) {
        const uint8_t *src = job->d->src + image * hw * c;
        switch (job->out_size) {
        case 2: GA_NORMALIZE_IMAGE(uint16_t); break;
        case 4: GA_NORMALIZE_IMAGE(uint32_t); break;
        default: GA_NORMALIZE_IMAGE(uint64_t); break;
        }
    }
}

ga_status ga_cpu_normalize_images(const ga_normalize_desc *desc)
{
    GA_TRY_STATUS(check(desc));
    size_t out_size = ga_dtype_itemsize(desc->dtype);
    unsigned char *table = malloc((size_t)desc->c * 256 * out_size);
    if (!table)
        return ga_status_make(GA_ERR_HOST_OUT_OF_MEMORY, 0, NULL,
                              "could not allocate the normalize table", "ga_cpu_normalize_images",
                              __FILE__, __LINE__);
    for (int64_t ch = 0; ch < desc->c; ch++) {
        for (int x = 0; x < 256; x++) {
            ga_value v;
            v.is_float = 1;
            v.i = 0;
            v.f = ga_normalize_value(desc, (uint8_t)x, ch);
            ga_store(desc->dtype, table + ((size_t)ch * 256 + (size_t)x) * out_size, v);
        }
    }
    normalize_job job = {desc, table, out_size};
    int64_t per_image = desc->h * desc->w * desc->c;
    int64_t grain = per_image > 0 ? 1 + 65536 / per_image : desc->n;
    ga_parallel_for(desc->n, grain, normalize_range, &job);
    free(table);
    return ga_ok();
}
