/*
 * layout.c — host-side helpers shared by the CPU and CUDA backends: how
 * tensors are walked, and the checks of entry points both backends have.
 */
#include "activation.h"
#include "convert.h"
#include "internal.h"

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

void ga_scalar_to_bytes(ga_scalar value, ga_dtype dtype, unsigned char out[8])
{
    ga_value v;
    v.is_float = !value.is_integer;
    v.i = value.i;
    v.f = value.f;
    memset(out, 0, 8);
    ga_store(dtype, out, v);
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

#define INVALID(entry, msg) \
    ga_status_make(GA_ERR_INVALID_VALUE, 0, NULL, (msg), (entry), __FILE__, __LINE__)

ga_status ga_check_copy(const ga_tensor *dst, const ga_tensor *src, const char *entry)
{
    if ((unsigned)dst->dtype >= GA_NUM_DTYPES || (src && (unsigned)src->dtype >= GA_NUM_DTYPES))
        return INVALID(entry, "unknown dtype");
    if (dst->ndim < 0 || dst->ndim > GA_MAX_NDIM || (src && src->ndim != dst->ndim))
        return INVALID(entry, "dst and src must have the same ndim");
    for (int d = 0; src && d < dst->ndim; d++)
        if (src->shape[d] != dst->shape[d])
            return INVALID(entry, "dst and src must have the same shape");
    return ga_ok();
}

ga_status ga_check_bias_act(const ga_bias_act_desc *desc, const char *entry)
{
    const ga_tensor *x = &desc->x, *y = &desc->y, *pre = &desc->preact;
    int has_pre = pre->data != NULL, has_bias = desc->bias != NULL;
    if (!ga_dtype_is_float(x->dtype) || !ga_dtype_is_float(y->dtype) ||
        (has_pre && !ga_dtype_is_float(pre->dtype)) ||
        (has_bias && !ga_dtype_is_float(desc->bias_dtype)))
        return INVALID(entry, "bias_activation: tensors must be float16, bfloat16, float32 or "
                              "float64");
    if (!ga_activation_is_valid(desc->activation))
        return INVALID(entry, "bias_activation: unknown activation");
    if (!ga_valid_shape(x) || !ga_same_shape(x, y) || (has_pre && !ga_same_shape(x, pre)))
        return INVALID(entry, "bias_activation: x, y and preact must have one shape");
    if (has_bias && (desc->channel_dim < 0 || desc->channel_dim >= x->ndim))
        return INVALID(entry, "bias_activation: channel_dim out of range");
    if (ga_numel(x) != 0 && (!x->data || !y->data))
        return INVALID(entry, "bias_activation: x or y has no data");
    return ga_ok();
}

ga_status ga_check_act_backward(const ga_act_backward_desc *desc, const char *entry)
{
    const ga_tensor *g = &desc->grad_y, *aux = &desc->aux, *dz = &desc->dz;
    ga_activation act = desc->activation;
    int has_dz = dz->data != NULL, has_bg = desc->bias_grad != NULL;
    if (!ga_activation_is_valid(act))
        return INVALID(entry, "activation_backward: unknown activation");
    if (!ga_dtype_is_float(g->dtype) || (act != GA_ACT_NONE && !ga_dtype_is_float(aux->dtype)) ||
        (has_dz && !ga_dtype_is_float(dz->dtype)) ||
        (has_bg && !ga_dtype_is_float(desc->bias_grad_dtype)))
        return INVALID(entry, "activation_backward: tensors must be float16, bfloat16, float32 "
                              "or float64");
    if (!ga_valid_shape(g) || (act != GA_ACT_NONE && !ga_same_shape(g, aux)) ||
        (has_dz && !ga_same_shape(g, dz)))
        return INVALID(entry, "activation_backward: grad_y, aux and dz must have one shape");
    if (has_bg && (desc->channel_dim < 0 || desc->channel_dim >= g->ndim))
        return INVALID(entry, "activation_backward: channel_dim out of range");
    /* with neither dz nor bias_grad there is nothing to compute */
    if ((has_dz || has_bg) && ga_numel(g) > 0 && (!g->data || (act != GA_ACT_NONE && !aux->data)))
        return INVALID(entry, "activation_backward: grad_y or aux has no data");
    return ga_ok();
}

int ga_bias_act_is_noop(const ga_bias_act_desc *desc)
{
    return !desc->bias && !desc->preact.data && desc->activation == GA_ACT_NONE &&
           ga_same_view(&desc->x, &desc->y);
}

int ga_act_backward_is_noop(const ga_act_backward_desc *desc)
{
    if (!desc->bias_grad && !desc->dz.data)
        return 1;
    return desc->activation == GA_ACT_NONE && !desc->bias_grad &&
           ga_same_view(&desc->grad_y, &desc->dz);
}

int ga_bias_act_in_double(const ga_bias_act_desc *desc)
{
    return desc->x.dtype == GA_FLOAT64 || desc->y.dtype == GA_FLOAT64 ||
           (desc->preact.data && desc->preact.dtype == GA_FLOAT64) ||
           (desc->bias && desc->bias_dtype == GA_FLOAT64);
}

int ga_act_backward_in_double(const ga_act_backward_desc *desc)
{
    return desc->grad_y.dtype == GA_FLOAT64 ||
           (desc->activation != GA_ACT_NONE && desc->aux.dtype == GA_FLOAT64) ||
           (desc->dz.data && desc->dz.dtype == GA_FLOAT64) ||
           (desc->bias_grad && desc->bias_grad_dtype == GA_FLOAT64);
}

ga_dtype ga_act_backward_sum_dtype(const ga_act_backward_desc *desc)
{
    const ga_tensor *dz = &desc->dz;
    return dz->data || ga_dtype_is_float(dz->dtype) ? dz->dtype : desc->grad_y.dtype;
}
