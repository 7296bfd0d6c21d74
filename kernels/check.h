/*
 * check.h — the checks both backends make of their entry points' arguments,
 * and the epilogue facts they decide alike (check.c); with the small
 * tensor predicates they use.  Host code.
 */
#ifndef GPUACCEL_KERNELS_CHECK_H
#define GPUACCEL_KERNELS_CHECK_H

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

static inline int ga_valid_shape(const ga_tensor *t)
{
    if (t->ndim < 0 || t->ndim > GA_MAX_NDIM)
        return 0;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0)
            return 0;
    return 1;
}

static inline int ga_same_shape(const ga_tensor *a, const ga_tensor *b)
{
    if (a->ndim != b->ndim)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return 0;
    return 1;
}

/* Whether a and b are the same elements (the strides of size-1 dims do not
 * matter). */
static inline int ga_same_view(const ga_tensor *a, const ga_tensor *b)
{
    if (a->data != b->data || a->dtype != b->dtype || !ga_same_shape(a, b))
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] > 1 && a->strides[d] != b->strides[d])
            return 0;
    return 1;
}

static inline int64_t ga_numel(const ga_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

/* The checks of copy and fill (src NULL): a known dtype, and src of dst's
 * shape. */
ga_status ga_check_copy(const ga_tensor *dst, const ga_tensor *src, const char *entry);

/* The checks of the elementwise epilogues, one set of rules for both
 * backends: dtypes, activation, shapes, channel_dim, and the data of
 * tensors with elements that the call will touch.  `entry` (the caller's
 * name) is the failing call the message names. */
ga_status ga_check_bias_act(const ga_bias_act_desc *desc, const char *entry);
ga_status ga_check_act_backward(const ga_act_backward_desc *desc, const char *entry);

/* Whether a checked epilogue call has nothing to do: y = x with nothing to
 * add, apply or save; neither dz nor a bias gradient asked for, or dz =
 * grad_y in place with no activation and no bias gradient. */
int ga_bias_act_is_noop(const ga_bias_act_desc *desc);
int ga_act_backward_is_noop(const ga_act_backward_desc *desc);

/* The epilogues' compute type, the same on both backends: double when a
 * float64 tensor takes part, else float. */
int ga_bias_act_in_double(const ga_bias_act_desc *desc);
int ga_act_backward_in_double(const ga_act_backward_desc *desc);

/* The dtype whose rounding the bias gradient sums dz with: dz's, as it is
 * stored; without a dz, as dz's dtype would store it (grad_y's when dz
 * carries no float dtype). */
ga_dtype ga_act_backward_sum_dtype(const ga_act_backward_desc *desc);

#ifdef __cplusplus
}
#endif

#endif
