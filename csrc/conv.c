/*
 * conv.c — conv2d and conv2d_backward: their arguments checked (every
 * error names the argument, what was given and what is accepted), the
 * tensors described to the backend in logical NCHW order whatever the
 * layout, and the convolutions run on kernels/cpu or on cuDNN on the op's
 * stream, with the engine choice persisted in the tuning file
 * (gpuaccel/_tuning.py) and a workspace from workspace.c.
 */
#include "conv.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "fallback.h"
#include "opcall.h"
#include "settings.h"
#include "workspace.h"

static ga_op_counters conv_counts;

PyObject *ga_py_conv_stats(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    uint64_t matmul_hits, matmul_misses, conv_hits, conv_misses;
    ga_cuda_plan_cache_stats(&matmul_hits, &matmul_misses, &conv_hits, &conv_misses);
    return ga_op_counters_dict(&conv_counts, conv_hits, conv_misses);
}

/* The cuDNN workspace budget: GPUACCEL_CONV_WORKSPACE_MB, default 256 MiB. */
static size_t conv_workspace_size(void)
{
    const char *env = getenv("GPUACCEL_CONV_WORKSPACE_MB");
    long mb = env && *env ? strtol(env, NULL, 10) : 256;
    return (size_t)(mb > 0 ? mb : 256) << 20;
}

/* ---------------------------------------------------- geometry and tuning */

static int parse_pair(PyObject *obj, int default_value, int minimum, int out[2], const char *op,
                      const char *name)
{
    if (!obj || obj == Py_None) {
        out[0] = out[1] = default_value;
        return 0;
    }
    PyObject *items[2] = {obj, obj};
    if (PyTuple_Check(obj) || PyList_Check(obj)) {
        if (PySequence_Length(obj) != 2)
            goto bad;
        items[0] = PySequence_GetItem(obj, 0);
        items[1] = PySequence_GetItem(obj, 1);
        Py_XDECREF(items[0]);
        Py_XDECREF(items[1]);
    }
    for (int k = 0; k < 2; k++) {
        if (!items[k] || !PyLong_Check(items[k]) || PyBool_Check(items[k]))
            goto bad;
        long value = PyLong_AsLong(items[k]);
        if (value < minimum || value > (1 << 20))
            goto bad;
        out[k] = (int)value;
    }
    return 0;
bad:
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "%s: %s must be an int >= %d or a pair of them, got %R", op,
                 name, minimum, obj);
    return -1;
}

typedef struct {
    ga_conv_geometry geom;
    int nhwc; /* the layout argument: shapes given as NHWC (and KRSC weights) */
} conv_args;

static int parse_conv_args(PyObject *stride, PyObject *padding, PyObject *dilation,
                           PyObject *groups, PyObject *layout, conv_args *out, const char *op)
{
    memset(out, 0, sizeof *out);
    if (parse_pair(stride, 1, 1, out->geom.stride, op, "stride") < 0 ||
        parse_pair(padding, 0, 0, out->geom.padding, op, "padding") < 0 ||
        parse_pair(dilation, 1, 1, out->geom.dilation, op, "dilation") < 0)
        return -1;
    long long g = 1;
    if (groups && groups != Py_None) {
        g = PyLong_Check(groups) && !PyBool_Check(groups) ? PyLong_AsLongLong(groups) : -1;
        if (g < 1 || g > INT_MAX) { /* more groups than any tensor has channels */
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "%s: groups must be an int from 1 to the number of "
                         "input channels, got %R",
                         op, groups);
            return -1;
        }
    }
    out->geom.groups = (int)g;
    const char *l = !layout || layout == Py_None ? "NCHW" : ga_exact_utf8(layout);
    if (!l || (strcmp(l, "NCHW") && strcmp(l, "NHWC"))) {
        PyErr_Format(PyExc_ValueError, "%s: layout must be 'NCHW' or 'NHWC', got %R", op, layout);
        return -1;
    }
    out->nhwc = strcmp(l, "NHWC") == 0;
    /* allow_tf32 is filled once the operands' dtype and device are known */
    out->geom.deterministic = ga_deterministic();
    return 0;
}

/* A 4-D array as a ga_tensor in logical NCHW (or KCRS) order: with
 * layout NHWC the array's dims are (N, H, W, C) and are permuted. */
static ga_tensor logical(const ArrayObject *a, int nhwc)
{
    ga_tensor t = ga_array_tensor(a);
    if (nhwc) {
        static const int perm[4] = {0, 3, 1, 2};
        for (int d = 0; d < 4; d++) {
            t.shape[d] = a->shape[perm[d]];
            t.strides[d] = a->strides[perm[d]];
        }
    }
    return t;
}

/* An output of logical dims (N, C, H, W): the user's `out_obj` (shaped as
 * the layout says), or a new array shaped so and, for NCHW, in
 * channels-last memory when `like` is (as torch does). */
static ArrayObject *conv_output(ga_state *st, const ga_op *op, PyObject *out_obj,
                                const int64_t dims[4], ga_dtype dtype, int nhwc,
                                const ga_tensor *like)
{
    int64_t nhwc_shape[4] = {dims[0], dims[2], dims[3], dims[1]};
    if (out_obj && out_obj != Py_None)
        return ga_op_result(st, op, out_obj, dtype, 4, nhwc ? nhwc_shape : dims);
    int64_t item = (int64_t)ga_dtype_itemsize(dtype);
    int channels_last = !nhwc && like && like->shape[1] > 1 && like->strides[1] == item &&
                        like->strides[3] == like->shape[1] * item;
    if (!nhwc && !channels_last)
        return ga_op_empty(st, op, dtype, 4, dims);
    ArrayObject *a = ga_op_empty(st, op, dtype, 4, nhwc_shape);
    if (!a || nhwc)
        return a;
    /* present it as NCHW with NHWC strides */
    int64_t strides[4] = {a->strides[0], a->strides[3], a->strides[1], a->strides[2]};
    ArrayObject *v = ga_array_view(st, a, a->data, 4, dims, strides);
    Py_DECREF(a);
    return v;
}

static int conv_output_size(const ga_tensor *x, const ga_tensor *w, const ga_conv_geometry *g,
                            int64_t out[2], const char *op)
{
    for (int k = 0; k < 2; k++) {
        int64_t in = x->shape[2 + k], kernel = w->shape[2 + k];
        int64_t span = (int64_t)g->dilation[k] * (kernel - 1) + 1;
        int64_t size = (in + 2 * (int64_t)g->padding[k] - span) / g->stride[k] + 1;
        if (in + 2 * (int64_t)g->padding[k] < span || size < 1) {
            PyErr_Format(PyExc_ValueError,
                         "%s: the output %s would be empty: input %lld + 2*padding %d is smaller "
                         "than the dilated kernel (%lld); use a smaller kernel, dilation or more "
                         "padding",
                         op, k ? "width" : "height", (long long)in, g->padding[k], (long long)span);
            return -1;
        }
        out[k] = size;
    }
    return 0;
}

static int check_conv_shapes(const ga_tensor *x, const ga_tensor *w, const conv_args *a,
                             const char *op)
{
    int64_t groups = a->geom.groups;
    const char *wname = a->nhwc ? "(out_channels, kh, kw, in_channels/groups)"
                                : "(out_channels, in_channels/groups, kh, kw)";
    if (x->ndim != 4 || w->ndim != 4) {
        PyErr_Format(PyExc_ValueError, "%s: x must be 4-D (%s) and weight 4-D %s", op,
                     a->nhwc ? "N, H, W, C" : "N, C, H, W", wname);
        return -1;
    }
    if (x->shape[1] % groups || w->shape[0] % groups) {
        PyErr_Format(PyExc_ValueError,
                     "%s: groups=%lld must divide the input channels (%lld) and the output "
                     "channels (%lld)",
                     op, (long long)groups, (long long)x->shape[1], (long long)w->shape[0]);
        return -1;
    }
    if (w->shape[1] * groups != x->shape[1]) {
        PyErr_Format(PyExc_ValueError,
                     "%s: weight %s has %lld input channels per group, so x must have %lld "
                     "channels (groups=%lld), but it has %lld",
                     op, wname, (long long)w->shape[1], (long long)(w->shape[1] * groups),
                     (long long)groups, (long long)x->shape[1]);
        return -1;
    }
    return 0;
}

/* The tuning-file key of a cuDNN call, and the lookup/store through
 * gpuaccel._tuning (the JSON file lives on the Python side). */
static void tuning_key(char *key, size_t size, const char *op, const ga_tensor *const *ts, int n,
                       const ga_conv_geometry *g, const char *extra)
{
    int used = snprintf(key, size, "%s|%s|s%d,%d|p%d,%d|d%d,%d|g%d|tf32=%d|det=%d|%s", op,
                        ga_dtype_name(ts[0]->dtype), g->stride[0], g->stride[1], g->padding[0],
                        g->padding[1], g->dilation[0], g->dilation[1], g->groups, g->allow_tf32,
                        g->deterministic, extra);
    for (int k = 0; k < n && used > 0 && (size_t)used < size; k++) {
        const ga_tensor *t = ts[k];
        used +=
            snprintf(key + used, size - (size_t)used, "|%lldx%lldx%lldx%lld:%lld,%lld,%lld,%lld",
                     (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2],
                     (long long)t->shape[3], (long long)t->strides[0], (long long)t->strides[1],
                     (long long)t->strides[2], (long long)t->strides[3]);
    }
}

static PyObject *tuning_call(const char *fn, int device, const char *key, const char *value)
{
    PyObject *mod = PyImport_ImportModule("gpuaccel._tuning");
    if (!mod)
        return NULL;
    PyObject *r = value ? PyObject_CallMethod(mod, fn, "iss", device, key, value)
                        : PyObject_CallMethod(mod, fn, "is", device, key);
    Py_DECREF(mod);
    return r;
}

typedef ga_status (*cuda_conv_fn)(void *ctx, void *ws, size_t ws_size, ga_stream s,
                                  ga_conv_tuning *tuning);

/* Runs a cuDNN call with the persisted engine choice and persists a new
 * one; counts it in conv_stats(). */
static int run_cuda_conv(ga_state *st, const char *op, int device, ga_stream s, const char *key,
                         cuda_conv_fn fn, void *ctx)
{
    ga_conv_tuning tuning;
    memset(&tuning, 0, sizeof tuning);
    PyObject *preferred = tuning_call("lookup", device, key, NULL);
    if (!preferred)
        return -1;
    tuning.preferred = preferred != Py_None ? PyUnicode_AsUTF8(preferred) : NULL;
    if (!tuning.preferred)
        PyErr_Clear(); /* a stored name that is not text: no preference */
    size_t ws_size = conv_workspace_size();
    void *ws = ga_workspace(st, device, s, ws_size);
    if (!ws) {
        /* short of memory for the workspace: engines that need none, or
         * the direct kernels, still run */
        if (!PyErr_ExceptionMatches(st->OutOfMemoryError)) {
            Py_DECREF(preferred);
            return -1;
        }
        PyErr_Clear();
        ws_size = 0;
    }
    ga_status status = fn(ctx, ws, ws_size, s, &tuning);
    int reused = tuning.preferred && !tuning.report.tuned && !tuning.report.cache_hit;
    Py_DECREF(preferred);
    if (status.error)
        return ga_raise(st, status);
    conv_counts.tuning_reused += reused;
    ga_op_count(&conv_counts, op, 1, &tuning.report);
    /* a choice made without the workspace (short of memory) is not kept:
     * the file's key assumes the full budget */
    if (tuning.report.tuned && tuning.chosen[0] && ws) {
        PyObject *r = tuning_call("store", device, key, tuning.chosen);
        if (!r)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

typedef struct {
    int device;
    ga_conv_desc desc;
    const ga_tensor *dy, *w, *dx, *x, *dw;
} conv_ctx;

static ga_status cuda_fwd(void *c, void *ws, size_t n, ga_stream s, ga_conv_tuning *t)
{
    conv_ctx *ctx = (conv_ctx *)c;
    return ga_cuda_conv2d_forward(ctx->device, &ctx->desc, ws, n, s, t);
}

static ga_status cuda_bwd_data(void *c, void *ws, size_t n, ga_stream s, ga_conv_tuning *t)
{
    conv_ctx *ctx = (conv_ctx *)c;
    return ga_cuda_conv2d_backward_data(ctx->device, &ctx->desc.geom, ctx->dy, ctx->w, ctx->dx, ws,
                                        n, s, t);
}

static ga_status cuda_bwd_filter(void *c, void *ws, size_t n, ga_stream s, ga_conv_tuning *t)
{
    conv_ctx *ctx = (conv_ctx *)c;
    return ga_cuda_conv2d_backward_filter(ctx->device, &ctx->desc.geom, ctx->x, ctx->dy, ctx->dw,
                                          ws, n, s, t);
}

/* ---------------------------------------------------------------- conv2d */

typedef struct {
    PyObject *x, *weight, *bias, *stride, *padding, *dilation, *groups, *activation, *layout, *out,
        *save_preactivation, *stream, *preactivation_out;
} conv2d_args;

static const ga_arg_field conv2d_fields[] = {
    GA_ARG(conv2d_args, x),
    GA_ARG(conv2d_args, weight),
    GA_ARG(conv2d_args, bias),
    GA_ARG(conv2d_args, stride),
    GA_ARG(conv2d_args, padding),
    GA_ARG(conv2d_args, dilation),
    GA_ARG(conv2d_args, groups),
    GA_ARG(conv2d_args, activation),
    GA_ARG(conv2d_args, layout),
    GA_ARG(conv2d_args, out),
    GA_ARG(conv2d_args, save_preactivation),
    GA_ARG(conv2d_args, stream),
    GA_ARG(conv2d_args, preactivation_out),
    {NULL, 0},
};

/* y = act(conv(x, w) + bias), and the pre-activation z when asked (tx,
 * tw: f->x_read and f->weight_read in logical order). */
static int run_conv2d_forward(ga_state *st, const ga_forward *f, const conv_args *ca,
                              const ga_tensor *tx, const ga_tensor *tw)
{
    const ga_op *op = &f->op;
    conv_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.desc.geom = ca->geom;
    ctx.desc.x = *tx;
    ctx.desc.w = *tw;
    ctx.desc.y = logical(f->y, ca->nhwc);
    ctx.desc.bias = f->bias ? f->bias->data : NULL;
    ctx.desc.activation = f->act;
    if (f->z)
        ctx.desc.preact = logical(f->z, ca->nhwc);
    if (op->device.type == GA_DEVICE_CPU) {
        ga_status status;
        Py_BEGIN_ALLOW_THREADS
        status = ga_cpu_conv2d_forward(&ctx.desc);
        Py_END_ALLOW_THREADS
        if (status.error)
            return ga_raise(st, status);
        ga_op_count(&conv_counts, op->name, 0, NULL);
        return 0;
    }
    char key[1024], extra[64];
    const ga_tensor *ts[3] = {&ctx.desc.x, &ctx.desc.w, &ctx.desc.y};
    snprintf(extra, sizeof extra, "fwd bias=%d act=%s preact=%d", f->bias != NULL,
             ga_activation_name(f->act), f->z != NULL);
    tuning_key(key, sizeof key, "conv2d", ts, 3, &ca->geom, extra);
    ctx.device = op->device.index;
    ArrayObject *touched[5] = {f->x_read, f->weight_read, f->bias, f->y, f->z};
    if (ga_op_prepare(st, op, touched, 5) < 0 ||
        run_cuda_conv(st, "conv2d", ctx.device, op->stream, key, cuda_fwd, &ctx) < 0)
        return -1;
    return ga_op_record(st, op, touched, 5);
}

static PyObject *conv2d_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    ga_state *st = ga_state_from_module(module);
    conv2d_args arg;
    ga_forward f;
    conv_args ca;
    if (ga_parse_args_into("conv2d", args, nargs, kwnames, conv2d_fields, 3, 2, &arg) < 0 ||
        ga_forward_parse(st, &f, "conv2d", arg.save_preactivation, arg.activation) < 0 ||
        parse_conv_args(arg.stride, arg.padding, arg.dilation, arg.groups, arg.layout, &ca,
                        "conv2d") < 0)
        return NULL;
    PyObject *result = NULL;
    const ga_op *op = &f.op;
    if (ga_forward_begin(st, &f, arg.x, arg.weight, arg.bias, arg.stream) < 0 ||
        (ca.geom.allow_tf32 = ga_allow_tf32(st, op->device, f.x->dtype, GA_TF32_CONV)) < 0 ||
        !(f.x_read = ga_op_describable(st, op, f.x)) ||
        !(f.weight_read = ga_op_describable(st, op, f.weight)))
        goto done;
    ga_tensor tx = logical(f.x_read, ca.nhwc), tw = logical(f.weight_read, ca.nhwc);
    if (check_conv_shapes(&tx, &tw, &ca, "conv2d") < 0)
        goto done;
    if (ga_op_check_bias("conv2d", f.bias, tw.shape[0], "the output channels") < 0)
        goto done;
    int64_t pq[2];
    if (ga_op_dense_bias(st, op, &f.bias) < 0 ||
        conv_output_size(&tx, &tw, &ca.geom, pq, "conv2d") < 0)
        goto done;
    int64_t ydims[4] = {tx.shape[0], tw.shape[0], pq[0], pq[1]};
    if (!(f.y = conv_output(st, op, arg.out, ydims, f.x->dtype, ca.nhwc, &tx)))
        goto done;
    if (f.save && f.act != GA_ACT_NONE && !ga_activation_grad_reads_output(f.act) &&
        !(f.z = conv_output(st, op, arg.preactivation_out, ydims, f.x->dtype, ca.nhwc, &tx)))
        goto done;
    if (run_conv2d_forward(st, &f, &ca, &tx, &tw) < 0)
        goto done;
    result = ga_forward_result(&f);
done:
    result = ga_op_settle_fallbacks(st, result);
    ga_forward_end(&f);
    return result;
}

/* ------------------------------------------------------- conv2d_backward */

typedef struct {
    PyObject *grad_y, *x, *weight, *stride, *padding, *dilation, *groups, *activation, *y,
        *preactivation, *layout, *needs_input_grad, *needs_weight_grad, *needs_bias_grad, *stream,
        *out;
} conv2d_backward_args;

static const ga_arg_field conv2d_backward_fields[] = {
    GA_ARG(conv2d_backward_args, grad_y),
    GA_ARG(conv2d_backward_args, x),
    GA_ARG(conv2d_backward_args, weight),
    GA_ARG(conv2d_backward_args, stride),
    GA_ARG(conv2d_backward_args, padding),
    GA_ARG(conv2d_backward_args, dilation),
    GA_ARG(conv2d_backward_args, groups),
    GA_ARG(conv2d_backward_args, activation),
    GA_ARG(conv2d_backward_args, y),
    GA_ARG(conv2d_backward_args, preactivation),
    GA_ARG(conv2d_backward_args, layout),
    GA_ARG(conv2d_backward_args, needs_input_grad),
    GA_ARG(conv2d_backward_args, needs_weight_grad),
    GA_ARG(conv2d_backward_args, needs_bias_grad),
    GA_ARG(conv2d_backward_args, stream),
    GA_ARG(conv2d_backward_args, out),
    {NULL, 0},
};

/* What the activation's derivative reads: the pre-activation, or y for
 * relu; NULL without an activation, and an error when it is missing. */
static int conv_grad_aux(const conv2d_backward_args *arg, ga_activation act, PyObject **aux)
{
    *aux = NULL;
    if (act == GA_ACT_NONE)
        return 0;
    *aux = arg->preactivation && arg->preactivation != Py_None ? arg->preactivation
           : ga_activation_grad_reads_output(act)              ? arg->y
                                                               : NULL;
    if (*aux && *aux != Py_None)
        return 0;
    if (act == GA_ACT_RELU)
        PyErr_SetString(PyExc_ValueError, "conv2d_backward: activation='relu' needs y (the "
                                          "forward output) or preactivation");
    else
        PyErr_Format(PyExc_ValueError,
                     "conv2d_backward: activation='%s' needs preactivation (from conv2d(..., "
                     "save_preactivation=True))",
                     ga_activation_name(act));
    return -1;
}

/* grad_y (and y or the pre-activation) must have the forward output's
 * shape. */
static int check_grad_y_shape(const ga_tensor *gy, const ArrayObject *grad_y,
                              const ArrayObject *aux, const ga_tensor *x, const ga_tensor *w,
                              const int64_t pq[2], int nhwc)
{
    if (gy->ndim == 4 && gy->shape[0] == x->shape[0] && gy->shape[1] == w->shape[0] &&
        gy->shape[2] == pq[0] && gy->shape[3] == pq[1] &&
        (!aux || (aux->ndim == 4 && memcmp(aux->shape, grad_y->shape, 32) == 0)))
        return 0;
    PyErr_Format(PyExc_ValueError,
                 "conv2d_backward: grad_y (and y/preactivation) must be the forward output's "
                 "shape: %s (%lld, %lld, %lld, %lld)",
                 nhwc ? "N, P, Q, K" : "N, K, P, Q", (long long)x->shape[0],
                 (long long)(nhwc ? pq[0] : w->shape[0]), (long long)(nhwc ? pq[1] : pq[0]),
                 (long long)(nhwc ? w->shape[0] : pq[1]));
    return -1;
}

/* dZ and the bias gradient in one pass; the activation-backward kernel
 * works on logical dims, channel 1. */
static ArrayObject *conv_activation_grad(ga_state *st, const ga_op *op, ArrayObject *gy,
                                         const ga_tensor *tgy, ArrayObject *aux, int nhwc,
                                         ga_activation act, ArrayObject *gb)
{
    ArrayObject *aux_view = NULL, *dz = NULL;
    int64_t dims[4] = {tgy->shape[0], tgy->shape[1], tgy->shape[2], tgy->shape[3]};
    ArrayObject *gy_logical = ga_array_view(st, gy, gy->data, 4, dims, tgy->strides);
    if (gy_logical && aux) {
        ga_tensor ta = logical(aux, nhwc);
        aux_view = ga_array_view(st, aux, aux->data, 4, dims, ta.strides);
    }
    if (gy_logical && (!aux || aux_view))
        dz = ga_op_activation_grad(st, op, gy_logical, aux_view, act, gb, 1);
    Py_XDECREF(gy_logical);
    Py_XDECREF(aux_view);
    return dz;
}

/* The tensors of the backward convolutions, in logical NCHW order. */
typedef struct {
    ga_tensor x, w, dz, dx, dw; /* dx, dw: those asked for */
    int want_dx, want_dw;
} conv_grad_tensors;

/* grad_x = conv_transpose(dz, w) and grad_w = conv(x, dz) as asked. */
static int run_conv2d_backward(ga_state *st, const ga_op *op, const ga_conv_geometry *geom,
                               conv_grad_tensors *t, ArrayObject *const touched[5])
{
    if (op->device.type == GA_DEVICE_CPU) {
        ga_status status = ga_ok();
        Py_BEGIN_ALLOW_THREADS
        if (t->want_dx)
            status = ga_cpu_conv2d_backward_data(geom, &t->dz, &t->w, &t->dx);
        if (t->want_dw && !status.error)
            status = ga_cpu_conv2d_backward_filter(geom, &t->x, &t->dz, &t->dw);
        Py_END_ALLOW_THREADS
        if (status.error)
            return ga_raise(st, status);
        ga_op_count(&conv_counts, op->name, 0, NULL);
        return 0;
    }
    conv_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.desc.geom = *geom;
    ctx.device = op->device.index;
    ctx.dy = &t->dz;
    char key[1024];
    if (ga_op_prepare(st, op, touched, 5) < 0)
        return -1;
    if (t->want_dx) {
        ctx.w = &t->w;
        ctx.dx = &t->dx;
        const ga_tensor *ts[3] = {&t->dz, &t->w, &t->dx};
        tuning_key(key, sizeof key, "conv2d", ts, 3, geom, "bwd_data");
        if (run_cuda_conv(st, "conv2d_backward (input gradient)", ctx.device, op->stream, key,
                          cuda_bwd_data, &ctx) < 0)
            return -1;
    }
    if (t->want_dw) {
        ctx.x = &t->x;
        ctx.dw = &t->dw;
        const ga_tensor *ts[3] = {&t->x, &t->dz, &t->dw};
        tuning_key(key, sizeof key, "conv2d", ts, 3, geom, "bwd_filter");
        if (run_cuda_conv(st, "conv2d_backward (weight gradient)", ctx.device, op->stream, key,
                          cuda_bwd_filter, &ctx) < 0)
            return -1;
    }
    return ga_op_record(st, op, touched, 5);
}

static PyObject *conv2d_backward_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                       PyObject *kwnames)
{
    const char *name = "conv2d_backward";
    conv2d_backward_args arg;
    ga_backward g;
    conv_args ca;
    PyObject *aux;
    if (ga_parse_args_into(name, args, nargs, kwnames, conv2d_backward_fields, 3, 3, &arg) < 0 ||
        ga_backward_parse(ga_state_from_module(module), &g, name, arg.out, arg.needs_input_grad,
                          arg.needs_weight_grad, arg.needs_bias_grad, arg.activation) < 0 ||
        parse_conv_args(arg.stride, arg.padding, arg.dilation, arg.groups, arg.layout, &ca, name) <
            0 ||
        conv_grad_aux(&arg, g.act, &aux) < 0)
        return NULL;
    ga_state *st = ga_state_from_module(module);
    ArrayObject *gyv = NULL, *xv = NULL, *wv = NULL, *dz = NULL;
    PyObject *result = NULL;
    const ga_op *op = &g.op;
    if (ga_backward_begin(st, &g, arg.grad_y, arg.x, arg.weight, aux, arg.stream) < 0 ||
        (ca.geom.allow_tf32 = ga_allow_tf32(st, op->device, g.x->dtype, GA_TF32_CONV)) < 0 ||
        !(xv = ga_op_describable(st, op, g.x)) || !(wv = ga_op_describable(st, op, g.weight)) ||
        !(gyv = ga_op_describable(st, op, g.grad_y)))
        goto done;
    conv_grad_tensors t;
    memset(&t, 0, sizeof t);
    t.x = logical(xv, ca.nhwc), t.w = logical(wv, ca.nhwc);
    ga_tensor tgy = logical(gyv, ca.nhwc);
    int64_t pq[2];
    if (check_conv_shapes(&t.x, &t.w, &ca, name) < 0 ||
        conv_output_size(&t.x, &t.w, &ca.geom, pq, name) < 0 ||
        check_grad_y_shape(&tgy, g.grad_y, g.aux, &t.x, &t.w, pq, ca.nhwc) < 0)
        goto done;
    if (g.need_b &&
        !(g.grad_bias = ga_op_bias_grad_result(st, op, g.outs[2], g.weight->dtype, t.w.shape[0])))
        goto done;
    if (!(dz = conv_activation_grad(st, op, gyv, &tgy, g.aux, ca.nhwc, g.act, g.grad_bias)))
        goto done;
    t.dz = ga_array_tensor(dz);
    ga_dtype dtype = g.x->dtype;
    if (g.need_x && !(g.grad_x = conv_output(st, op, g.outs[0], t.x.shape, dtype, ca.nhwc, &t.x)))
        goto done;
    if (g.need_w &&
        !(g.grad_weight = conv_output(st, op, g.outs[1], t.w.shape, dtype, ca.nhwc, &t.w)))
        goto done;
    if ((t.want_dx = g.grad_x != NULL))
        t.dx = logical(g.grad_x, ca.nhwc);
    if ((t.want_dw = g.grad_weight != NULL))
        t.dw = logical(g.grad_weight, ca.nhwc);
    ArrayObject *touched[5] = {dz, xv, wv, g.grad_x, g.grad_weight};
    if (run_conv2d_backward(st, op, &ca.geom, &t, touched) < 0)
        goto done;
    result = ga_backward_result(&g);
done:
    result = ga_op_settle_fallbacks(st, result);
    ga_backward_end(&g);
    Py_XDECREF(gyv);
    Py_XDECREF(xv);
    Py_XDECREF(wv);
    Py_XDECREF(dz);
    return result;
}

PyObject *ga_py_conv2d(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return ga_op_profiled("gpuaccel::conv2d", conv2d_entry, module, args, nargs, kwnames);
}

PyObject *ga_py_conv2d_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    return ga_op_profiled("gpuaccel::conv2d_backward", conv2d_backward_entry, module, args, nargs,
                          kwnames);
}
