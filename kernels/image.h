/*
 * image.h — the image resize filter both backends compute, so that a batch
 * decoded on the CPU and one decoded on the GPU sample the same pixels
 * with the same weights.
 *
 * The filter is torchvision's antialiased bilinear resize (torch's
 * upsample_bilinear2d_aa, PIL's BILINEAR): when an axis shrinks by
 * `scale` > 1 the triangle widens to `scale` input pixels each side, so
 * every input pixel counts (no aliasing); when it grows it is plain
 * bilinear.  Taps past the axis's input range are dropped and the rest
 * renormalized, as torch does at the image's border.
 */
#ifndef GPUACCEL_IMAGE_H
#define GPUACCEL_IMAGE_H

#include "kernels.h"

/* Half-width of the filter, in input pixels. */
GA_HD double ga_resize_support(const ga_resize_axis *a)
{
    return a->scale >= 1.0 ? a->scale : 1.0;
}

/* The taps of output pixel k: input pixels [*first, *first + *count), in
 * the axis's local coordinates (0 = pixel a->lo); *center is the output
 * pixel's center in the same coordinates. */
GA_HD void ga_resize_taps(const ga_resize_axis *a, int64_t k, int64_t *first, int64_t *count,
                          double *center)
{
    double support = ga_resize_support(a);
    double c = a->origin - (double)a->lo + a->scale * ((double)k + 0.5);
    /* torch truncates toward zero here (an int cast), then clamps */
    int64_t lo = (int64_t)(c - support + 0.5);
    int64_t hi = (int64_t)(c + support + 0.5);
    int64_t size = a->hi - a->lo;
    lo = lo < 0 ? 0 : lo;
    hi = hi > size ? size : hi;
    *first = lo;
    *count = hi > lo ? hi - lo : 0;
    *center = c;
}

/* The unnormalized weight of local input pixel j for an output pixel
 * centered at `center`. */
GA_HD double ga_resize_weight(const ga_resize_axis *a, int64_t j, double center)
{
    double inv = a->scale >= 1.0 ? 1.0 / a->scale : 1.0;
    double x = ((double)j - center + 0.5) * inv;
    x = x < 0 ? -x : x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

#endif
