/*
 * conv_key.c — the key of a convolution problem: see conv_key.h.
 *
 * Built on every CUDA conv call (the plan-cache lookup), so it is written
 * with a small integer formatter rather than snprintf.
 */
#include "conv_key.h"

#include <string.h>

typedef struct {
    char *buf;
    size_t size, len;
    int overflow;
} key_writer;

static void put_text(key_writer *k, const char *text)
{
    size_t n = strlen(text);
    if (k->len + n >= k->size) {
        k->overflow = 1;
        return;
    }
    memcpy(k->buf + k->len, text, n);
    k->len += n;
}

static void put_int(key_writer *k, int64_t value)
{
    char digits[24];
    int n = 0;
    uint64_t v = value < 0 ? 0 - (uint64_t)value : (uint64_t)value;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    if (value < 0)
        digits[n++] = '-';
    if (k->len + (size_t)n >= k->size) {
        k->overflow = 1;
        return;
    }
    while (n)
        k->buf[k->len++] = digits[--n];
}

static int64_t alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    if (!a)
        return 16;
    a &= ~a + 1; /* the lowest set bit */
    return a >= 16 ? 16 : (int64_t)a;
}

/* " <name>N,C,H,W/s0,s1,s2,s3@align" */
static void put_tensor(key_writer *k, const char *name, const ga_tensor *t)
{
    int ndim = t->ndim < 0 ? 0 : t->ndim > GA_MAX_NDIM ? GA_MAX_NDIM : t->ndim;
    put_text(k, " ");
    put_text(k, name);
    for (int d = 0; d < ndim; d++) {
        if (d)
            put_text(k, ",");
        put_int(k, t->shape[d]);
    }
    put_text(k, "/");
    for (int d = 0; d < ndim; d++) {
        if (d)
            put_text(k, ",");
        put_int(k, t->shape[d] > 1 ? t->strides[d] : 0);
    }
    put_text(k, "@");
    put_int(k, alignment(t->data));
}

size_t ga_conv_key(char *buf, size_t size, ga_conv_key_op op, const ga_conv_geometry *geom,
                   const ga_tensor *x, const ga_tensor *w, const ga_tensor *y, const void *bias,
                   ga_activation act, const ga_tensor *preact, size_t workspace_size)
{
    static const char *const ops[3] = {"fwd", "bwd_data", "bwd_filter"};
    static const char *const dtypes[GA_NUM_DTYPES] = {"bool",    "uint8",  "int8",    "int16",
                                                      "int32",   "int64",  "float16", "bfloat16",
                                                      "float32", "float64"};
    key_writer k = {buf, size, 0, 0};
    if (!size)
        return 0;
    put_text(&k, "conv2d.v2 ");
    put_text(&k, (unsigned)op < 3 ? ops[op] : "?");
    put_text(&k, " ");
    put_text(&k, (unsigned)x->dtype < GA_NUM_DTYPES ? dtypes[x->dtype] : "?");
    const char *geometry[3] = {" s", " p", " d"};
    const int *values[3] = {geom->stride, geom->padding, geom->dilation};
    for (int g = 0; g < 3; g++) {
        put_text(&k, geometry[g]);
        put_int(&k, values[g][0]);
        put_text(&k, ",");
        put_int(&k, values[g][1]);
    }
    put_text(&k, " g");
    put_int(&k, geom->groups);
    put_text(&k, geom->allow_tf32 ? " tf32" : " fp32");
    put_text(&k, geom->deterministic ? " det" : "");
    put_tensor(&k, "x", x);
    put_tensor(&k, "w", w);
    put_tensor(&k, "y", y);
    if (op == GA_CONV_KEY_FWD) {
        if (bias) {
            put_text(&k, " bias@");
            put_int(&k, alignment(bias));
        }
        put_text(&k, " ");
        put_text(&k, ga_activation_name(act)); /* a name: the enum's numbers may change */
        if (preact && preact->data)
            put_tensor(&k, "z", preact);
    }
    put_text(&k, " ws");
    put_int(&k, (int64_t)workspace_size);
    if (k.overflow) {
        buf[0] = '\0';
        return 0;
    }
    buf[k.len] = '\0';
    return k.len;
}
