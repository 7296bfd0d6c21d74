/*
 * layout.c — host-side helpers shared by the CPU and CUDA backends.
 */
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
        if (n > 0 && out->dst_strides[n - 1] == ds * size &&
            out->src_strides[n - 1] == ss * size) {
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
