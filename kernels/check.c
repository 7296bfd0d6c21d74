/*
 * check.c — the argument checks of the entry points both backends have
 * (copy, fill, the elementwise epilogues), one set of rules for both, and
 * the facts about an epilogue call both backends decide alike (nothing to
 * do, the compute type).  Host code.
 */
#include "activation.h"
#include "check.h"

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
