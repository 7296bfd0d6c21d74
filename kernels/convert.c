/*
 * convert.c — the out-of-line part of convert.h: a fill value's bytes.
 */
#include <string.h>

#include "convert.h"

void ga_scalar_to_bytes(ga_scalar value, ga_dtype dtype, unsigned char out[8])
{
    ga_value v;
    v.is_float = !value.is_integer;
    v.i = value.i;
    v.f = value.f;
    memset(out, 0, 8);
    ga_store(dtype, out, v);
}
