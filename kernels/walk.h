/*
 * walk.h — how both backends walk strided tensors (walk.c): the pair walk of
 * copies, the elementwise walk of the epilogues, the reduction walk of the
 * bias gradient.  Host code.
 */
#ifndef GPUACCEL_KERNELS_WALK_H
#define GPUACCEL_KERNELS_WALK_H

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Two tensors of the same shape walked together: dims of size 1 dropped and
 * neighbouring dims merged wherever both tensors allow, so that the inner
 * loop is as long as possible.  The last dim is the innermost. */
typedef struct {
    int ndim;
    int64_t shape[GA_MAX_NDIM];
    int64_t dst_strides[GA_MAX_NDIM];
    int64_t src_strides[GA_MAX_NDIM];
} ga_pair_layout;

/* Returns the number of elements (0 for an empty tensor, in which case the
 * layout is not filled).  src may be NULL for a single tensor (fill). */
int64_t ga_pair_layout_make(const ga_tensor *dst, const ga_tensor *src, ga_pair_layout *out);

/* Up to three tensors of one shape walked together (the elementwise
 * epilogues): dims of size 1 dropped and neighbours merged where every
 * tensor allows; the channel dim is never merged, so that its index can be
 * recovered.  The last dim is the innermost. */
typedef struct {
    int ndim;
    int chan; /* merged dim that holds the channel index; -1: none (index 0) */
    int64_t shape[GA_MAX_NDIM];
    int64_t strides[3][GA_MAX_NDIM]; /* bytes */
} ga_ew_layout;

/* Returns the number of elements of shape_of (0 for an empty shape, in
 * which case the layout has ndim 0 and is not filled further).  A NULL
 * t[k] gets zero strides; channel_dim -1: no channel. */
int64_t ga_ew_layout_make(const ga_tensor *shape_of, const ga_tensor *const t[3], int channel_dim,
                          ga_ew_layout *out);

/* A reduction over every dim but the channel dim (the bias gradient): the
 * channel dim apart, the other dims (merged where the three tensors allow)
 * enumerated row-major as the reduced index r in [0, R).  There is always
 * at least one reduced dim (one of one element when R is 0 or 1). */
typedef struct {
    int ndim;
    int64_t C, R;
    int64_t cstride[3];              /* the channel dim's strides (bytes) */
    int64_t shape[GA_MAX_NDIM];      /* the reduced dims */
    int64_t strides[3][GA_MAX_NDIM]; /* bytes */
} ga_red_layout;

void ga_red_layout_make(const ga_tensor *shape_of, const ga_tensor *const t[3], int channel_dim,
                        ga_red_layout *out);

#ifdef __cplusplus
}
#endif

#endif
