/*
 * walk.c — how both backends walk strided tensors: dims of size 1 dropped
 * and neighbouring dims merged wherever every tensor allows, so that inner
 * loops (and CUDA index arithmetic) run over as few, as long dims as
 * possible.  Host code, shared by kernels/cpu and kernels/cuda.
 */
#include "walk.h"

int64_t ga_pair_layout_make(const ga_tensor *dst, const ga_tensor *src, ga_pair_layout *out)
{
    int64_t numel = 1;
    int n = 0;
    for (int d = 0; d < dst->ndim; d++) {
        int64_t size = dst->shape[d];
        numel *= size;
        if (size == 0)
            return 0;
        if (size == 1)
            continue;
        int64_t ds = dst->strides[d];
        int64_t ss = src ? src->strides[d] : 0;
        /* merge into the previous (outer) dim when it steps over exactly
         * this dim's extent in both tensors */
        if (n > 0 && out->dst_strides[n - 1] == ds * size && out->src_strides[n - 1] == ss * size) {
            out->shape[n - 1] *= size;
            out->dst_strides[n - 1] = ds;
            out->src_strides[n - 1] = ss;
            continue;
        }
        out->shape[n] = size;
        out->dst_strides[n] = ds;
        out->src_strides[n] = ss;
        n++;
    }
    if (n == 0) { /* a single element */
        out->shape[0] = 1;
        out->dst_strides[0] = 0;
        out->src_strides[0] = 0;
        n = 1;
    }
    out->ndim = n;
    return numel;
}

/* Appends dim d (of `size` elements) of the three tensors (NULL: zero
 * strides) to the n dims walked so far, merged into the last of them when
 * may_merge and that one steps over exactly this dim's extent in every
 * tensor; returns the new number of dims. */
static int add_dim(int64_t shape[GA_MAX_NDIM], int64_t strides[3][GA_MAX_NDIM], int n,
                   const ga_tensor *const t[3], int d, int64_t size, int may_merge)
{
    int64_t s[3];
    for (int k = 0; k < 3; k++)
        s[k] = t[k] ? t[k]->strides[d] : 0;
    int merge = may_merge && n > 0;
    for (int k = 0; k < 3 && merge; k++)
        merge = strides[k][n - 1] == s[k] * size;
    if (merge) {
        shape[n - 1] *= size;
        for (int k = 0; k < 3; k++)
            strides[k][n - 1] = s[k];
        return n;
    }
    shape[n] = size;
    for (int k = 0; k < 3; k++)
        strides[k][n] = s[k];
    return n + 1;
}

/* No dim left (a single element, or a reduction over at most one): one
 * dim of one element keeps the loops simple. */
static int at_least_one_dim(int64_t shape[GA_MAX_NDIM], int64_t strides[3][GA_MAX_NDIM], int n)
{
    if (n > 0)
        return n;
    shape[0] = 1;
    for (int k = 0; k < 3; k++)
        strides[k][0] = 0;
    return 1;
}

int64_t ga_ew_layout_make(const ga_tensor *shape_of, const ga_tensor *const t[3], int channel_dim,
                          ga_ew_layout *out)
{
    int64_t numel = 1;
    int n = 0;
    out->chan = -1;
    for (int d = 0; d < shape_of->ndim; d++) {
        int64_t size = shape_of->shape[d];
        numel *= size;
        if (size == 0) {
            out->ndim = 0;
            return 0;
        }
        if (size == 1)
            continue; /* a size-1 channel dim: the channel index is always 0 */
        int may_merge = d != channel_dim && out->chan != n - 1;
        n = add_dim(out->shape, out->strides, n, t, d, size, may_merge);
        if (d == channel_dim)
            out->chan = n - 1;
    }
    out->ndim = at_least_one_dim(out->shape, out->strides, n);
    return numel;
}

void ga_red_layout_make(const ga_tensor *shape_of, const ga_tensor *const t[3], int channel_dim,
                        ga_red_layout *out)
{
    int n = 0;
    out->C = shape_of->shape[channel_dim];
    out->R = 1;
    for (int k = 0; k < 3; k++)
        out->cstride[k] = t[k] ? t[k]->strides[channel_dim] : 0;
    for (int d = 0; d < shape_of->ndim; d++) {
        if (d == channel_dim)
            continue;
        int64_t size = shape_of->shape[d];
        out->R *= size;
        if (size <= 1)
            continue; /* R == 0 leaves every channel's sum at 0 */
        n = add_dim(out->shape, out->strides, n, t, d, size, 1);
    }
    out->ndim = at_least_one_dim(out->shape, out->strides, n);
}
