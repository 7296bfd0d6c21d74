/*
 * internal.h — helpers shared by the two backends (host code only).
 */
#ifndef GPUACCEL_KERNELS_INTERNAL_H
#define GPUACCEL_KERNELS_INTERNAL_H

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

#ifdef __cplusplus
}
#endif

#endif
