/*
 * ops.c — matmul, linear, linear_backward, conv2d, conv2d_backward: the
 * arguments parsed and checked (every error names the argument, what was
 * given and what is accepted), the operands described to the backend, and
 * the call dispatched to kernels/cpu or kernels/cuda on the right stream
 * with a workspace from the pool.  One place for both ops' machinery:
 * workspaces, settings (precision, determinism) and statistics.
 */
#include "npy.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "create.h"
#include "ops.h"
#include "torch.h"
#include "transfer.h"

#define GA_MAX_WORKSPACES 32

/* ------------------------------------------------------------ settings */

static int allow_tf32 = 0;    /* set_matmul_precision("high") */
static int deterministic = 0; /* set_deterministic(True) */

typedef struct {
    uint64_t calls, cpu_calls, cuda_calls, fused, fallback, tuned, tuning_reused;
} op_counters;

static op_counters matmul_counts, conv_counts;

static void count_call(op_counters *c, int cuda, const ga_op_report *report)
{
    c->calls++;
    if (!cuda) {
        c->cpu_calls++;
        return;
    }
    c->cuda_calls++;
    c->fused += report->fused;
    c->fallback += report->fallback;
    c->tuned += report->tuned;
}

PyObject *ga_py_set_matmul_precision(PyObject *module, PyObject *arg)
{
    (void)module;
    const char *p = ga_exact_utf8(arg);
    if (p && strcmp(p, "highest") == 0) {
        allow_tf32 = 0;
    } else if (p && strcmp(p, "high") == 0) {
        allow_tf32 = 1;
    } else {
        PyErr_Format(PyExc_ValueError,
                     "set_matmul_precision: precision must be 'highest' (full float32) or 'high' "
                     "(float32 matmuls and convolutions may use TF32 tensor cores), got %R",
                     arg);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *ga_py_get_matmul_precision(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    return PyUnicode_FromString(allow_tf32 ? "high" : "highest");
}

PyObject *ga_py_set_deterministic(PyObject *module, PyObject *arg)
{
    (void)module;
    if (!PyBool_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "set_deterministic: mode must be True or False, got %.200s",
                     ga_type_name(arg));
        return NULL;
    }
    deterministic = arg == Py_True;
    Py_RETURN_NONE;
}

PyObject *ga_py_get_deterministic(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    return PyBool_FromLong(deterministic);
}

static PyObject *counters_dict(const op_counters *c, uint64_t hits, uint64_t misses)
{
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "calls",
                         (unsigned long long)c->calls, "cpu_calls",
                         (unsigned long long)c->cpu_calls, "cuda_calls",
                         (unsigned long long)c->cuda_calls, "fused", (unsigned long long)c->fused,
                         "fallback", (unsigned long long)c->fallback, "tuned",
                         (unsigned long long)c->tuned, "tuning_reused",
                         (unsigned long long)c->tuning_reused, "plan_cache_hits",
                         (unsigned long long)hits, "plan_cache_misses",
                         (unsigned long long)misses);
}

PyObject *ga_py_matmul_stats(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    uint64_t mh, mm, ch, cm;
    ga_cuda_plan_cache_stats(&mh, &mm, &ch, &cm);
    return counters_dict(&matmul_counts, mh, mm);
}

PyObject *ga_py_conv_stats(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    uint64_t mh, mm, ch, cm;
    ga_cuda_plan_cache_stats(&mh, &mm, &ch, &cm);
    return counters_dict(&conv_counts, ch, cm);
}

/* ---------------------------------------------------------- workspaces */

/* One workspace per (device, stream), grown to the largest request: work
 * queued on a stream runs in order, so consecutive ops can share it. */
typedef struct {
    int device;
    ga_stream stream;
    uint64_t thread; /* for the per-thread default stream: one per thread */
    ga_block *block;
} workspace_entry;

static workspace_entry workspaces[GA_MAX_WORKSPACES];
static int nworkspaces;

static void *workspace_for(ga_state *st, int device, ga_stream stream, size_t size)
{
    /* a workspace is reused in its stream's order only; handle 2 is a
     * different stream in each thread */
    int per_thread = stream == GA_STREAM_PER_THREAD;
    uint64_t self = ga_thread_token();
    workspace_entry *w = NULL;
    for (int k = 0; k < nworkspaces && !w; k++)
        if (workspaces[k].device == device && workspaces[k].stream == stream &&
            (!per_thread || workspaces[k].thread == self))
            w = &workspaces[k];
    if (!w) {
        if (nworkspaces == GA_MAX_WORKSPACES) {
            /* many streams: recycle the oldest entry (freed in its stream's order) */
            ga_block_free(workspaces[0].block);
            memmove(&workspaces[0], &workspaces[1], (GA_MAX_WORKSPACES - 1) * sizeof *workspaces);
            nworkspaces--;
        }
        w = &workspaces[nworkspaces++];
        w->device = device;
        w->stream = stream;
        w->thread = self;
        w->block = NULL;
    }
    if (!w->block || w->block->size < size) {
        if (w->block)
            ga_block_free(w->block);
        w->block = ga_block_alloc(st, GA_MEM_DEVICE, device, size, stream);
        if (!w->block) {
            *w = workspaces[--nworkspaces];
            return NULL;
        }
    }
    return w->block->ptr;
}

/* The cuDNN workspace budget: GPUACCEL_CONV_WORKSPACE_MB, default 256 MiB. */
static size_t conv_workspace_size(void)
{
    const char *env = getenv("GPUACCEL_CONV_WORKSPACE_MB");
    long mb = env && *env ? strtol(env, NULL, 10) : 256;
    return (size_t)(mb > 0 ? mb : 256) << 20;
}

/* -------------------------------------------------------------- operands */

/* An operand as an Array (a new reference), without copying. */
static ArrayObject *operand(ga_state *st, PyObject *obj, const char *name)
{
    if (ga_is_array(st, obj))
        return (ArrayObject *)Py_NewRef(obj);
    if (ga_is_torch_tensor(st, obj))
        return ga_from_torch(st, obj);
    /* arrays only: a list or a number is not silently turned into one */
    int has = PyArray_Check(obj) ? 1 : ga_has_attr(obj, st->str_dlpack);
    if (has == 0)
        has = ga_has_attr(obj, st->str_cuda_array_interface);
    if (has < 0)
        return NULL;
    if (!has) {
        PyErr_Format(PyExc_TypeError,
                     "%s must be a gpuaccel Array or a tensor that exports DLPack (torch, NumPy, "
                     "CuPy, JAX), got %.200s",
                     name, ga_type_name(obj));
        return NULL;
    }
    return ga_asarray(st, obj, NULL, NULL, -1, NULL);
}

static int check_float(ArrayObject *a, const char *op, const char *name)
{
    if (!ga_dtype_is_float(a->dtype)) {
        PyErr_Format(PyExc_TypeError,
                     "%s: %s must be float16, bfloat16, float32 or float64, got %s", op, name,
                     ga_dtype_name(a->dtype));
        return -1;
    }
    return 0;
}

static int check_same_device(ArrayObject *const *arrays, const char *const *names, int n,
                             const char *op)
{
    for (int k = 1; k < n; k++) {
        if (arrays[k] && !ga_device_equal(arrays[k]->device, arrays[0]->device)) {
            char a[32], b[32];
            PyErr_Format(PyExc_ValueError,
                         "%s: all inputs must be on one device, but %s is on %s and %s is on %s",
                         op, names[0], ga_device_str(arrays[0]->device, a, sizeof a), names[k],
                         ga_device_str(arrays[k]->device, b, sizeof b));
            return -1;
        }
    }
    return 0;
}

static int parse_activation(PyObject *obj, ga_activation *out, const char *op)
{
    const char *name = obj == NULL || obj == Py_None ? "none"
                                                       : ga_exact_utf8(obj);
    if (name && strcmp(name, "none") == 0)
        *out = GA_ACT_NONE;
    else if (name && strcmp(name, "relu") == 0)
        *out = GA_ACT_RELU;
    else if (name && strcmp(name, "gelu") == 0)
        *out = GA_ACT_GELU;
    else {
        PyErr_Format(PyExc_ValueError,
                     "%s: activation must be None, 'relu' or 'gelu' (tanh approximation), got %R",
                     op, obj);
        return -1;
    }
    return 0;
}

static int element_strides_ok(ArrayObject *a)
{
    int64_t itemsize = (int64_t)ga_dtype_itemsize(a->dtype);
    for (int d = 0; d < a->ndim; d++)
        if (a->strides[d] % itemsize)
            return 0;
    return 1;
}

/* An operand the backend can describe: element strides (a copy otherwise).
 * `sobj` (from op_stream) is the op's stream: helper copies run on it. */
static ArrayObject *describable(ga_state *st, ArrayObject *a, PyObject *sobj)
{
    if (element_strides_ok(a))
        return (ArrayObject *)Py_NewRef(a);
    return ga_array_copy_to(st, a, a->device, a->dtype, 0, sobj);
}

/* A new contiguous array, or `out` checked against what the op writes. */
static ArrayObject *result_array(ga_state *st, PyObject *out_obj, ga_dtype dtype, int ndim,
                                 const int64_t *shape, ga_device device, const ga_stream *stream,
                                 const char *op)
{
    if (!out_obj || out_obj == Py_None)
        return ga_array_empty(st, dtype, ndim, shape, device, 0, stream);
    ArrayObject *out = operand(st, out_obj, "out");
    if (!out)
        return NULL;
    int ok = out->ndim == ndim && memcmp(out->shape, shape, (size_t)ndim * 8) == 0;
    if (!ok || out->dtype != dtype || !ga_device_equal(out->device, device) ||
        (out->flags & GA_ARRAY_READONLY) || !element_strides_ok(out)) {
        PyObject *want = PyTuple_New(ndim);
        for (int d = 0; want && d < ndim; d++)
            PyTuple_SET_ITEM(want, d, PyLong_FromLongLong(shape[d]));
        char dev[32];
        if (want)
            PyErr_Format(PyExc_ValueError,
                         "%s: out must be a writable %s array of shape %R on %s; got one of shape "
                         "%zd dims, dtype %s%s",
                         op, ga_dtype_name(dtype), want, ga_device_str(device, dev, sizeof dev),
                         (Py_ssize_t)out->ndim, ga_dtype_name(out->dtype),
                         (out->flags & GA_ARRAY_READONLY) ? ", read-only" : "");
        Py_XDECREF(want);
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* Prepares, on the CUDA stream, every array an op reads or writes (the
 * first use of gpuaccel memory on a new stream waits for its allocation). */
static int prepare_all(ga_state *st, ArrayObject *const *arrays, int n, ga_stream s)
{
    for (int k = 0; k < n; k++)
        if (arrays[k] && ga_array_prepare_stream(st, arrays[k], s) < 0)
            return -1;
    return 0;
}

static int record_all(ga_state *st, ArrayObject *const *arrays, int n, ga_stream s)
{
    for (int k = 0; k < n; k++)
        if (arrays[k] && ga_array_record_stream(st, arrays[k], s) < 0)
            return -1;
    return 0;
}

/* ---------------------------------------------------------------- GEMM */

/* Runs one GEMM descriptor on the device of `device` (stream `s` for CUDA),
 * counting it in the matmul statistics. */
static int run_matmul(ga_state *st, ga_matmul_desc *desc, ga_device device, ga_stream s)
{
    desc->allow_tf32 = allow_tf32;
    desc->deterministic = deterministic;
    ga_op_report report = {0, 0, 0, 0};
    ga_status status;
    if (device.type == GA_DEVICE_CPU) {
        Py_BEGIN_ALLOW_THREADS status = ga_cpu_matmul(desc);
        Py_END_ALLOW_THREADS
    } else {
        size_t ws_size = ga_cuda_matmul_workspace_size(device.index);
        void *ws = workspace_for(st, device.index, s, ws_size);
        if (!ws && ws_size)
            return -1;
        status = ga_cuda_matmul(device.index, desc, ws, ws_size, s, &report);
    }
    if (status.error)
        return ga_raise(st, status);
    count_call(&matmul_counts, device.type == GA_DEVICE_CUDA, &report);
    return 0;
}

/* The stream an op with stream=None runs on: gpuaccel's current stream
 * when one is set (`with stream:`), else, for an op on torch tensors,
 * torch's current stream (where torch queued the work that wrote them and
 * will queue the work that reads the result), else the legacy default
 * stream. */
static int default_stream(ga_state *st, int device, int on_torch_tensors, ga_stream *out)
{
    int made_current = ga_stream_made_current(st, device, out);
    if (made_current != 0 || !on_torch_tensors)
        return made_current < 0 ? -1 : 0;
    return ga_torch_current_stream(st, device, out) < 0 ? -1 : 0;
}

/* The stream an op runs on, into *s: `stream=` when given, else the default
 * for its leading operand (torch's current stream for a torch tensor).
 * Returns it as an object too (a new reference; None for a CPU op), for
 * the helpers that take one (ga_copy_into, ga_array_copy_to), so that their
 * copies queue on the very stream the op runs on; NULL on failure. */
static PyObject *op_stream(ga_state *st, const ArrayObject *lead, PyObject *stream_obj,
                           ga_stream *s)
{
    *s = NULL;
    if (lead->device.type != GA_DEVICE_CUDA)
        return Py_NewRef(Py_None);
    int device = lead->device.index;
    int from_torch = lead->base && ga_is_torch_tensor(st, lead->base);
    if (ga_ensure_cuda_device(st, device) < 0 ||
        (stream_obj == NULL || stream_obj == Py_None
             ? default_stream(st, device, from_torch, s)
             : ga_stream_from_object(st, stream_obj, device, s, "stream")) < 0)
        return NULL;
    return PyLong_FromVoidPtr((void *)*s);
}

/* Leading dims of `a` before the last `keep` as one dimension, when their
 * strides allow (else -1).  The stride is 0 when it does not matter (no
 * row, or one); rows that alias each other (a broadcast, stride 0) are not
 * a matrix a GEMM can read or write: -1. */
static int collapse_leading(const ArrayObject *a, int keep, int64_t *count, int64_t *stride)
{
    int lead = a->ndim - keep;
    int64_t n = 1, s = 0;
    int first = 1;
    for (int d = 0; d < a->ndim; d++) {
        if (a->shape[d] == 0) { /* nothing to read or write: any stride will do */
            for (int e = 0; e < lead; e++)
                n *= a->shape[e];
            *count = n;
            *stride = 0;
            return 0;
        }
    }
    for (int d = lead - 1; d >= 0; d--) {
        if (a->shape[d] == 1)
            continue;
        if (first) {
            s = a->strides[d];
            first = 0;
        } else if (a->strides[d] != s * n) {
            return -1;
        }
        n *= a->shape[d];
    }
    if (!first && s == 0 && n > 1)
        return -1;
    *count = n;
    *stride = first ? 0 : s;
    return 0;
}

/* The kernels read a bias as a dense vector: a strided one (a view with a
 * step, reversed, broadcast) is copied first. */
static int dense_bias(ga_state *st, ArrayObject **bias, PyObject *sobj)
{
    if (!*bias || ga_array_is_contiguous(*bias))
        return 0;
    ArrayObject *c = ga_array_copy_to(st, *bias, (*bias)->device, (*bias)->dtype, 0, sobj);
    if (!c)
        return -1;
    Py_SETREF(*bias, c);
    return 0;
}

/* ---------------------------------------------------------------- matmul */

PyObject *ga_py_matmul(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames)
{
    static const char *const names[] = {"a", "b", "bias", "activation", "out", "out_dtype",
                                        "stream", NULL};
    PyObject *v[7];
    if (ga_parse_args("matmul", args, nargs, kwnames, names, 2, 2, v) < 0)
        return NULL;
    ga_state *st = ga_state_from_module(module);
    ArrayObject *a = NULL, *b = NULL, *bias = NULL, *d = NULL, *av = NULL, *bv = NULL,
                *user_out = NULL;
    PyObject *result = NULL, *sobj = NULL;
    ga_activation act;
    if (parse_activation(v[3], &act, "matmul") < 0)
        return NULL;
    if (!(a = operand(st, v[0], "a")) || !(b = operand(st, v[1], "b")))
        goto done;
    if (v[2] && v[2] != Py_None && !(bias = operand(st, v[2], "bias")))
        goto done;
    {
        ArrayObject *all[3] = {a, b, bias};
        const char *all_names[3] = {"a", "b", "bias"};
        if (check_same_device(all, all_names, 3, "matmul") < 0 || check_float(a, "matmul", "a") < 0)
            goto done;
    }
    if (b->dtype != a->dtype) {
        PyErr_Format(PyExc_TypeError, "matmul: a and b must have the same dtype, got %s and %s",
                     ga_dtype_name(a->dtype), ga_dtype_name(b->dtype));
        goto done;
    }
    if (a->ndim < 1 || b->ndim < 1) {
        PyErr_SetString(PyExc_ValueError, "matmul: a and b must have at least one dimension");
        goto done;
    }
    /* NumPy's rules: a 1-D a is a row, a 1-D b a column, dropped from the result */
    int a_vec = a->ndim == 1, b_vec = b->ndim == 1;
    int64_t a_shape[GA_MAX_NDIM + 1], a_str[GA_MAX_NDIM + 1], b_shape[GA_MAX_NDIM + 1],
        b_str[GA_MAX_NDIM + 1];
    int an = a->ndim + a_vec, bn = b->ndim + b_vec;
    if (a_vec) {
        a_shape[0] = 1, a_str[0] = 0, a_shape[1] = a->shape[0], a_str[1] = a->strides[0];
    } else {
        memcpy(a_shape, a->shape, (size_t)a->ndim * 8);
        memcpy(a_str, a->strides, (size_t)a->ndim * 8);
    }
    if (b_vec) {
        b_shape[0] = b->shape[0], b_str[0] = b->strides[0], b_shape[1] = 1, b_str[1] = 0;
    } else {
        memcpy(b_shape, b->shape, (size_t)b->ndim * 8);
        memcpy(b_str, b->strides, (size_t)b->ndim * 8);
    }
    int64_t M = a_shape[an - 2], K = a_shape[an - 1], N = b_shape[bn - 1];
    if (b_shape[bn - 2] != K) {
        PyErr_Format(PyExc_ValueError,
                     "matmul: a's last dimension (%lld) must equal b's %s dimension (%lld)",
                     (long long)K, b_vec ? "only" : "second-to-last", (long long)b_shape[bn - 2]);
        goto done;
    }
    /* broadcast the batch dimensions */
    int nb = (an > bn ? an : bn) - 2;
    int64_t batch_shape[GA_MAX_NDIM], sa[GA_MAX_NDIM], sb[GA_MAX_NDIM];
    for (int k = 0; k < nb; k++) {
        int ia = k - (nb - (an - 2)), ib = k - (nb - (bn - 2));
        int64_t ea = ia >= 0 ? a_shape[ia] : 1, eb = ib >= 0 ? b_shape[ib] : 1;
        if (ea != eb && ea != 1 && eb != 1) {
            PyErr_Format(PyExc_ValueError,
                         "matmul: batch dimensions %lld (of a) and %lld (of b) do not broadcast",
                         (long long)ea, (long long)eb);
            goto done;
        }
        batch_shape[k] = ea > eb ? ea : eb;
        sa[k] = ia >= 0 && ea != 1 ? a_str[ia] : 0;
        sb[k] = ib >= 0 && eb != 1 ? b_str[ib] : 0;
    }
    ga_dtype out_dtype = a->dtype;
    if (v[5] && v[5] != Py_None) {
        if (ga_dtype_from_object(st, v[5], &out_dtype, "out_dtype") < 0)
            goto done;
        int ok = out_dtype == a->dtype ||
                 (out_dtype == GA_FLOAT32 && (a->dtype == GA_FLOAT16 || a->dtype == GA_BFLOAT16));
        if (!ok) {
            PyErr_Format(PyExc_ValueError,
                         "matmul: out_dtype must be the inputs' dtype (%s)%s, got %s",
                         ga_dtype_name(a->dtype),
                         a->dtype == GA_FLOAT16 || a->dtype == GA_BFLOAT16 ? " or float32" : "",
                         ga_dtype_name(out_dtype));
            goto done;
        }
    }
    if (bias && (bias->ndim != 1 || bias->shape[0] != N)) {
        PyErr_Format(PyExc_ValueError, "matmul: bias must have shape (%lld,), got %d dimensions",
                     (long long)N, bias->ndim);
        goto done;
    }
    ga_stream s;
    if (!(sobj = op_stream(st, a, v[6], &s)))
        goto done;
    /* the result: batch dims, then (M, N), minus the vector dims */
    int64_t out_shape[GA_MAX_NDIM + 2];
    int on = 0;
    for (int k = 0; k < nb; k++)
        out_shape[on++] = batch_shape[k];
    if (!a_vec)
        out_shape[on++] = M;
    if (!b_vec)
        out_shape[on++] = N;
    if (on > GA_MAX_NDIM) {
        PyErr_SetString(PyExc_ValueError, "matmul: the result has too many dimensions");
        goto done;
    }
    if (!(d = result_array(st, v[4], out_dtype, on, out_shape, a->device,
                           a->device.type == GA_DEVICE_CUDA ? &s : NULL, "matmul")))
        goto done;
    if (!(av = describable(st, a, sobj)) || !(bv = describable(st, b, sobj)))
        goto done;
    if (ga_arrays_may_overlap(d, av) || ga_arrays_may_overlap(d, bv) ||
        (bias && ga_arrays_may_overlap(d, bias))) {
        /* out is also an input: compute aside, copy at the end (as NumPy) */
        user_out = d;
        if (!(d = ga_array_empty(st, out_dtype, on, out_shape, a->device, 0,
                                 a->device.type == GA_DEVICE_CUDA ? &s : NULL)))
            goto done;
    }
    if (dense_bias(st, &bias, sobj) < 0)
        goto done;
    /* cuBLASLt's fused bias has D's dtype (a float16/bfloat16 bias with a
     * float32 result would not fuse): widened, exactly, on the GPU */
    if (bias && bias->dtype != out_dtype &&
        (bias->dtype != a->dtype || a->device.type == GA_DEVICE_CUDA)) {
        ArrayObject *cast = ga_array_copy_to(st, bias, bias->device, out_dtype, 0, sobj);
        if (!cast)
            goto done;
        Py_SETREF(bias, cast);
    }
    /* the result's strides, in the (batch..., M, N) frame */
    int64_t d_str[GA_MAX_NDIM + 2];
    {
        int k = 0;
        for (int j = 0; j < nb; j++)
            d_str[j] = d->strides[k++];
        d_str[nb] = a_vec ? 0 : d->strides[k++];
        d_str[nb + 1] = b_vec ? 0 : d->strides[k++];
    }
    /* one kernel call per outer batch index; the innermost batch dim (if
     * any) goes to the kernel as its batch */
    int64_t inner = nb ? batch_shape[nb - 1] : 1;
    int64_t outer = 1;
    for (int k = 0; k < nb - 1; k++)
        outer *= batch_shape[k];
    int64_t item_a = (int64_t)ga_dtype_itemsize(a->dtype), item_d = (int64_t)ga_dtype_itemsize(out_dtype);
    ArrayObject *touched[4] = {av, bv, bias, d};
    if (a->device.type == GA_DEVICE_CUDA && prepare_all(st, touched, 4, s) < 0)
        goto done;
    for (int64_t o = 0; o < outer; o++) {
        int64_t rem = o, off_a = 0, off_b = 0, off_d = 0;
        for (int k = nb - 2; k >= 0; k--) {
            int64_t i = rem % batch_shape[k];
            rem /= batch_shape[k];
            off_a += i * sa[k];
            off_b += i * sb[k];
            off_d += i * d_str[k];
        }
        ga_matmul_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.batch = inner;
        desc.a = (ga_matrix){(char *)av->data + off_a, a->dtype, M, K, a_str[an - 2] / item_a,
                             a_str[an - 1] / item_a, nb ? sa[nb - 1] / item_a : 0};
        desc.b = (ga_matrix){(char *)bv->data + off_b, b->dtype, K, N, b_str[bn - 2] / item_a,
                             b_str[bn - 1] / item_a, nb ? sb[nb - 1] / item_a : 0};
        desc.d = (ga_matrix){(char *)d->data + off_d, out_dtype, M, N, d_str[nb] / item_d,
                             d_str[nb + 1] / item_d, nb ? d_str[nb - 1] / item_d : 0};
        if (a_vec)
            desc.a.row_stride = K, desc.d.row_stride = N;
        if (b_vec)
            desc.b.col_stride = 1, desc.d.col_stride = 1;
        desc.bias = bias ? bias->data : NULL;
        desc.bias_dtype = bias ? bias->dtype : out_dtype;
        desc.activation = act;
        if (run_matmul(st, &desc, a->device, s) < 0)
            goto done;
    }
    if (a->device.type == GA_DEVICE_CUDA && record_all(st, touched, 4, s) < 0)
        goto done;
    if (user_out) {
        if (ga_copy_into(st, user_out, d, sobj) < 0)
            goto done;
        Py_SETREF(d, (ArrayObject *)Py_NewRef(user_out));
    }
    result = Py_NewRef(d);
done:
    Py_XDECREF(sobj);
    Py_XDECREF(user_out);
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(av);
    Py_XDECREF(bv);
    Py_XDECREF(bias);
    Py_XDECREF(d);
    return result;
}

/* ---------------------------------------------------------------- linear */

/* x (..., K) as an M x K matrix (a contiguous copy when its leading dims
 * cannot be merged). */
static ArrayObject *rows_view(ga_state *st, ArrayObject *x, int64_t *M, int64_t *row_stride,
                              PyObject *sobj)
{
    ArrayObject *xv = describable(st, x, sobj);
    if (!xv)
        return NULL;
    if (collapse_leading(xv, 1, M, row_stride) < 0) {
        ArrayObject *c = ga_array_copy_to(st, xv, xv->device, xv->dtype, 0, sobj);
        Py_DECREF(xv);
        if (!c)
            return NULL;
        xv = c;
        collapse_leading(xv, 1, M, row_stride);
    }
    if (*row_stride == 0)
        *row_stride = xv->shape[xv->ndim - 1] * (int64_t)ga_dtype_itemsize(xv->dtype);
    return xv;
}

PyObject *ga_py_linear(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames)
{
    static const char *const names[] = {"x", "weight", "bias", "activation", "out",
                                        "save_preactivation", "stream", "preactivation_out", NULL};
    PyObject *v[8];
    if (ga_parse_args("linear", args, nargs, kwnames, names, 4, 2, v) < 0)
        return NULL;
    ga_state *st = ga_state_from_module(module);
    ArrayObject *x = NULL, *w = NULL, *bias = NULL, *xv = NULL, *wv = NULL, *y = NULL, *z = NULL;
    PyObject *result = NULL, *sobj = NULL;
    ga_activation act;
    int save = v[5] ? PyObject_IsTrue(v[5]) : 0;
    if (save < 0 || parse_activation(v[3], &act, "linear") < 0)
        return NULL;
    if (!(x = operand(st, v[0], "x")) || !(w = operand(st, v[1], "weight")))
        goto done;
    if (v[2] && v[2] != Py_None && !(bias = operand(st, v[2], "bias")))
        goto done;
    {
        ArrayObject *all[3] = {x, w, bias};
        const char *all_names[3] = {"x", "weight", "bias"};
        if (check_same_device(all, all_names, 3, "linear") < 0 || check_float(x, "linear", "x") < 0)
            goto done;
    }
    if (w->ndim != 2 || x->ndim < 1) {
        PyErr_Format(PyExc_ValueError,
                     "linear: weight must be 2-D (out_features, in_features) and x at least 1-D; "
                     "got weight with %d and x with %d dimensions",
                     w->ndim, x->ndim);
        goto done;
    }
    int64_t N = w->shape[0], K = w->shape[1];
    if (x->shape[x->ndim - 1] != K) {
        PyErr_Format(PyExc_ValueError,
                     "linear: x's last dimension (%lld) must equal weight's in_features (%lld)",
                     (long long)x->shape[x->ndim - 1], (long long)K);
        goto done;
    }
    if (w->dtype != x->dtype || (bias && bias->dtype != x->dtype)) {
        PyErr_Format(PyExc_TypeError,
                     "linear: x, weight and bias must share one dtype, got %s, %s and %s",
                     ga_dtype_name(x->dtype), ga_dtype_name(w->dtype),
                     bias ? ga_dtype_name(bias->dtype) : "no bias");
        goto done;
    }
    if (bias && (bias->ndim != 1 || bias->shape[0] != N)) {
        PyErr_Format(PyExc_ValueError, "linear: bias must have shape (%lld,)", (long long)N);
        goto done;
    }
    ga_stream s;
    if (!(sobj = op_stream(st, x, v[6], &s)) || dense_bias(st, &bias, sobj) < 0)
        goto done;
    int64_t shape[GA_MAX_NDIM];
    memcpy(shape, x->shape, (size_t)x->ndim * 8);
    shape[x->ndim - 1] = N;
    const ga_stream *sp = x->device.type == GA_DEVICE_CUDA ? &s : NULL;
    if (!(y = result_array(st, v[4], x->dtype, x->ndim, shape, x->device, sp, "linear")))
        goto done;
    if (save && act == GA_ACT_GELU &&
        !(z = result_array(st, v[7], x->dtype, x->ndim, shape, x->device, sp, "linear")))
        goto done;
    int64_t M, x_row;
    if (!(xv = rows_view(st, x, &M, &x_row, sobj)) || !(wv = describable(st, w, sobj)))
        goto done;
    /* y may be any strided `out`: write through a contiguous temporary then */
    ArrayObject *target = y;
    int64_t y_rows, y_row;
    if (collapse_leading(y, 1, &y_rows, &y_row) < 0 || ga_arrays_may_overlap(y, xv) ||
        ga_arrays_may_overlap(y, wv) || (bias && ga_arrays_may_overlap(y, bias))) {
        target = ga_array_empty(st, x->dtype, x->ndim, shape, x->device, 0, sp);
        if (!target)
            goto done;
        collapse_leading(target, 1, &y_rows, &y_row);
    } else {
        Py_INCREF(target);
    }
    if (y_row == 0)
        y_row = N * (int64_t)ga_dtype_itemsize(x->dtype);
    int64_t item = (int64_t)ga_dtype_itemsize(x->dtype);
    ga_matmul_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = 1;
    desc.a = (ga_matrix){xv->data, x->dtype, M, K, x_row / item, xv->strides[xv->ndim - 1] / item, 0};
    /* B = weight^T: K x N */
    desc.b = (ga_matrix){wv->data, w->dtype, K, N, wv->strides[1] / item, wv->strides[0] / item, 0};
    desc.d = (ga_matrix){target->data, x->dtype, M, N, y_row / item,
                         target->strides[target->ndim - 1] / item, 0};
    desc.bias = bias ? bias->data : NULL;
    desc.bias_dtype = x->dtype;
    desc.activation = act;
    if (z) {
        int64_t z_rows, z_row;
        if (collapse_leading(z, 1, &z_rows, &z_row) < 0) {
            PyErr_SetString(PyExc_ValueError,
                            "linear: preactivation_out's leading dimensions must be mergeable");
            Py_DECREF(target);
            goto done;
        }
        desc.preact = (ga_matrix){z->data, x->dtype, M, N, z_row ? z_row / item : N,
                                  z->strides[z->ndim - 1] / item, 0};
    }
    ArrayObject *touched[5] = {xv, wv, bias, target, z};
    int rc = -1;
    if (x->device.type != GA_DEVICE_CUDA || prepare_all(st, touched, 5, s) == 0)
        rc = run_matmul(st, &desc, x->device, s);
    if (rc == 0 && x->device.type == GA_DEVICE_CUDA)
        rc = record_all(st, touched, 5, s);
    if (rc == 0 && target != y)
        rc = ga_copy_into(st, y, target, sobj);
    Py_DECREF(target);
    if (rc < 0)
        goto done;
    if (!save)
        result = Py_NewRef(y);
    else if (act == GA_ACT_GELU)
        result = PyTuple_Pack(2, (PyObject *)y, (PyObject *)z);
    else if (act == GA_ACT_RELU)
        result = PyTuple_Pack(2, (PyObject *)y, (PyObject *)y); /* relu'(z) = (y > 0) */
    else
        result = PyTuple_Pack(2, (PyObject *)y, Py_None);
done:
    Py_XDECREF(sobj);
    Py_XDECREF(x);
    Py_XDECREF(w);
    Py_XDECREF(bias);
    Py_XDECREF(xv);
    Py_XDECREF(wv);
    Py_XDECREF(y);
    Py_XDECREF(z);
    return result;
}

/* ------------------------------------------------------ activation grad */

/* An uninitialised array of a's shape in a's memory order when a is a
 * dense permutation (channels-last, a transpose), else C-contiguous — like
 * torch.empty_like(a): an activation gradient laid out as its grad keeps
 * the kernels that read both on their fast (NHWC) path. */
static ArrayObject *empty_like(ga_state *st, const ArrayObject *a, const ga_stream *sp)
{
    int n = a->ndim, order[GA_MAX_NDIM];
    int64_t item = (int64_t)ga_dtype_itemsize(a->dtype);
    for (int d = 0; d < n; d++)
        order[d] = d;
    /* dims by decreasing stride (stable: equal strides keep their order) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && a->strides[order[j]] > a->strides[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    int dense = 1, permuted = 0;
    int64_t expect = item;
    for (int i = n - 1; i >= 0; i--) {
        int d = order[i];
        if (a->shape[d] != 1 && a->strides[d] != expect)
            dense = 0;
        expect *= a->shape[d];
        permuted |= order[i] != i;
    }
    if (!dense || !permuted)
        return ga_array_empty(st, a->dtype, n, a->shape, a->device, 0, sp);
    /* {0}: GCC at -O1 cannot see that the loop below fills shape[0..n) */
    int64_t shape[GA_MAX_NDIM] = {0}, strides[GA_MAX_NDIM];
    for (int i = 0; i < n; i++)
        shape[i] = a->shape[order[i]];
    ArrayObject *base = ga_array_empty(st, a->dtype, n, shape, a->device, 0, sp);
    if (!base)
        return NULL;
    for (int i = 0; i < n; i++)
        strides[order[i]] = base->strides[i];
    ArrayObject *v = ga_array_view(st, base, base->data, n, a->shape, strides);
    Py_DECREF(base);
    return v;
}

/* dz = grad * act'(aux) (dz = grad itself for no activation), with the
 * bias gradient (sum over every dim but channel_dim) when bias_grad. */
static ArrayObject *activation_grad(ga_state *st, ArrayObject *grad, ArrayObject *aux,
                                    ga_activation act, ArrayObject *bias_grad, int channel_dim,
                                    ga_stream s)
{
    ArrayObject *dz = NULL;
    const ga_stream *sp = grad->device.type == GA_DEVICE_CUDA ? &s : NULL;
    if (act == GA_ACT_NONE && !bias_grad)
        return (ArrayObject *)Py_NewRef(grad);
    if (act != GA_ACT_NONE && !(dz = empty_like(st, grad, sp)))
        return NULL;
    ga_act_backward_desc d;
    memset(&d, 0, sizeof d);
    d.grad_y = ga_array_tensor(grad);
    if (aux)
        d.aux = ga_array_tensor(aux);
    if (dz)
        d.dz = ga_array_tensor(dz);
    else
        d.dz = ga_array_tensor(grad), d.dz.data = NULL; /* only the bias gradient */
    d.activation = act;
    d.bias_grad = bias_grad ? bias_grad->data : NULL;
    d.bias_grad_dtype = bias_grad ? bias_grad->dtype : GA_FLOAT32;
    d.channel_dim = channel_dim;
    ga_status status;
    if (grad->device.type == GA_DEVICE_CPU) {
        Py_BEGIN_ALLOW_THREADS status = ga_cpu_activation_backward(&d);
        Py_END_ALLOW_THREADS
    } else {
        ArrayObject *touched[4] = {grad, aux, dz, bias_grad};
        if (prepare_all(st, touched, 4, s) < 0)
            goto error;
        status = ga_cuda_activation_backward(grad->device.index, &d, s);
        if (!status.error && record_all(st, touched, 4, s) < 0)
            goto error;
    }
    if (status.error) {
        ga_raise(st, status);
        goto error;
    }
    return dz ? dz : (ArrayObject *)Py_NewRef(grad);
error:
    Py_XDECREF(dz);
    return NULL;
}

/* out=(grad_x, grad_weight, grad_bias) of the backward ops: a tuple of
 * arrays (or None, to let gpuaccel allocate that one). */
static int parse_grad_outs(PyObject *obj, PyObject *outs[3], const char *op)
{
    outs[0] = outs[1] = outs[2] = NULL;
    if (!obj || obj == Py_None)
        return 0;
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 3) {
        PyErr_Format(PyExc_TypeError,
                     "%s: out must be a tuple (grad_x, grad_weight, grad_bias) of arrays or None, "
                     "got %.200s",
                     op, ga_type_name(obj));
        return -1;
    }
    for (int k = 0; k < 3; k++)
        outs[k] = PyTuple_GET_ITEM(obj, k) == Py_None ? NULL : PyTuple_GET_ITEM(obj, k);
    return 0;
}

static int parse_flag(PyObject *obj, int default_value)
{
    return obj ? PyObject_IsTrue(obj) : default_value;
}

PyObject *ga_py_linear_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    static const char *const names[] = {"grad_y", "x", "weight", "activation", "preactivation",
                                        "needs_input_grad", "needs_weight_grad",
                                        "needs_bias_grad", "stream", "out", NULL};
    PyObject *v[10], *outs[3];
    if (ga_parse_args("linear_backward", args, nargs, kwnames, names, 3, 3, v) < 0 ||
        parse_grad_outs(v[9], outs, "linear_backward") < 0)
        return NULL;
    ga_state *st = ga_state_from_module(module);
    ArrayObject *gy = NULL, *x = NULL, *w = NULL, *aux = NULL, *dz = NULL, *gyv = NULL, *xv = NULL,
                *wv = NULL, *gx = NULL, *gw = NULL, *gb = NULL;
    PyObject *result = NULL, *sobj = NULL;
    ga_activation act;
    int need_x = parse_flag(v[5], 1), need_w = parse_flag(v[6], 1), need_b = parse_flag(v[7], 1);
    if (need_x < 0 || need_w < 0 || need_b < 0 || parse_activation(v[3], &act, "linear_backward") < 0)
        return NULL;
    if (!(gy = operand(st, v[0], "grad_y")) || !(x = operand(st, v[1], "x")) ||
        !(w = operand(st, v[2], "weight")))
        goto done;
    if (act != GA_ACT_NONE) {
        if (!v[4] || v[4] == Py_None) {
            PyErr_Format(PyExc_ValueError,
                         "linear_backward: activation=%s needs preactivation (what linear(..., "
                         "save_preactivation=True) returned)",
                         act == GA_ACT_GELU ? "'gelu'" : "'relu'");
            goto done;
        }
        if (!(aux = operand(st, v[4], "preactivation")))
            goto done;
    }
    {
        ArrayObject *all[4] = {gy, x, w, aux};
        const char *all_names[4] = {"grad_y", "x", "weight", "preactivation"};
        if (check_same_device(all, all_names, 4, "linear_backward") < 0 ||
            check_float(x, "linear_backward", "x") < 0)
            goto done;
    }
    if (w->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1] ||
        gy->ndim != x->ndim || gy->shape[gy->ndim - 1] != w->shape[0] ||
        memcmp(gy->shape, x->shape, (size_t)(x->ndim - 1) * 8) != 0 ||
        (aux && (aux->ndim != gy->ndim || memcmp(aux->shape, gy->shape, (size_t)gy->ndim * 8)))) {
        PyErr_SetString(PyExc_ValueError,
                        "linear_backward: need weight (N, K), x (..., K), and grad_y and "
                        "preactivation (..., N) with x's leading dimensions");
        goto done;
    }
    if (gy->dtype != x->dtype || w->dtype != x->dtype || (aux && aux->dtype != x->dtype)) {
        PyErr_Format(PyExc_TypeError,
                     "linear_backward: grad_y, x, weight and preactivation must share one dtype "
                     "(x is %s)",
                     ga_dtype_name(x->dtype));
        goto done;
    }
    ga_stream s;
    if (!(sobj = op_stream(st, x, v[8], &s)))
        goto done;
    const ga_stream *sp = x->device.type == GA_DEVICE_CUDA ? &s : NULL;
    int64_t N = w->shape[0], K = w->shape[1];
    int64_t n_shape[1] = {N};
    if (need_b && !(gb = result_array(st, outs[2], w->dtype, 1, n_shape, x->device, sp,
                                      "linear_backward")))
        goto done;
    if (gb && !ga_array_is_contiguous(gb)) {
        PyErr_SetString(PyExc_ValueError, "linear_backward: out grad_bias must be contiguous");
        goto done;
    }
    /* dZ with the bias gradient fused into the same pass when there is an
     * activation; without one, the dW GEMM sums it (a_row_sums) */
    int bias_in_gemm = need_b && act == GA_ACT_NONE && need_w;
    int64_t M, gy_row, x_row;
    if (!(gyv = rows_view(st, gy, &M, &gy_row, sobj)))
        goto done;
    if (!(dz = activation_grad(st, gyv, aux, act, bias_in_gemm ? NULL : gb, gyv->ndim - 1, s)))
        goto done;
    if (dz != gyv) {
        collapse_leading(dz, 1, &M, &gy_row);
        if (gy_row == 0)
            gy_row = N * (int64_t)ga_dtype_itemsize(dz->dtype);
    }
    int64_t item = (int64_t)ga_dtype_itemsize(x->dtype);
    if (!(wv = describable(st, w, sobj)) || !(xv = rows_view(st, x, &M, &x_row, sobj)))
        goto done;
    ga_matrix dz_m = {dz->data, dz->dtype, M, N, gy_row / item, dz->strides[dz->ndim - 1] / item, 0};
    if (need_x) {
        if (!(gx = result_array(st, outs[0], x->dtype, x->ndim, x->shape, x->device, sp,
                                "linear_backward")))
            goto done;
        int64_t gx_rows, gx_row;
        if (collapse_leading(gx, 1, &gx_rows, &gx_row) < 0) {
            PyErr_SetString(PyExc_ValueError,
                            "linear_backward: out grad_x's leading dimensions must be mergeable");
            goto done;
        }
        ga_matmul_desc d;
        memset(&d, 0, sizeof d);
        d.batch = 1;
        d.a = dz_m;                                                                 /* M x N */
        d.b = (ga_matrix){wv->data, w->dtype, N, K, wv->strides[0] / item, wv->strides[1] / item, 0};
        d.d = (ga_matrix){gx->data, x->dtype, M, K, gx_row ? gx_row / item : K,
                          gx->strides[gx->ndim - 1] / item, 0};
        ArrayObject *touched[3] = {dz, wv, gx};
        if ((sp && prepare_all(st, touched, 3, s) < 0) || run_matmul(st, &d, x->device, s) < 0 ||
            (sp && record_all(st, touched, 3, s) < 0))
            goto done;
    }
    if (need_w) {
        int64_t w_shape[2] = {N, K};
        if (!(gw = result_array(st, outs[1], w->dtype, 2, w_shape, x->device, sp,
                                "linear_backward")))
            goto done;
        ga_matmul_desc d;
        memset(&d, 0, sizeof d);
        d.batch = 1;
        /* dW = dZ^T @ X: A is dZ seen transposed (N x M) */
        d.a = (ga_matrix){dz->data, dz->dtype, N, M, dz_m.col_stride, dz_m.row_stride, 0};
        d.b = (ga_matrix){xv->data, x->dtype, M, K, x_row / item, xv->strides[xv->ndim - 1] / item, 0};
        d.d = (ga_matrix){gw->data, w->dtype, N, K, gw->strides[0] / item, gw->strides[1] / item, 0};
        if (bias_in_gemm) {
            d.a_row_sums = gb->data;
            d.a_row_sums_dtype = gb->dtype;
        }
        ArrayObject *touched[4] = {dz, xv, gw, gb};
        if ((sp && prepare_all(st, touched, 4, s) < 0) || run_matmul(st, &d, x->device, s) < 0 ||
            (sp && record_all(st, touched, 4, s) < 0))
            goto done;
    } else if (need_b && act == GA_ACT_NONE) {
        /* no dW GEMM to fuse it into: a reduction of its own */
        ArrayObject *sums = activation_grad(st, gyv, NULL, GA_ACT_NONE, gb, gyv->ndim - 1, s);
        if (!sums)
            goto done;
        Py_DECREF(sums);
    }
    result = PyTuple_Pack(3, gx ? (PyObject *)gx : Py_None, gw ? (PyObject *)gw : Py_None,
                          gb ? (PyObject *)gb : Py_None);
done:
    Py_XDECREF(sobj);
    Py_XDECREF(gy);
    Py_XDECREF(x);
    Py_XDECREF(w);
    Py_XDECREF(aux);
    Py_XDECREF(dz);
    Py_XDECREF(gyv);
    Py_XDECREF(xv);
    Py_XDECREF(wv);
    Py_XDECREF(gx);
    Py_XDECREF(gw);
    Py_XDECREF(gb);
    return result;
}

/* ---------------------------------------------------------------- conv2d */

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
            PyErr_Format(PyExc_ValueError, "%s: groups must be an int from 1 to the number of "
                         "input channels, got %R", op, groups);
            return -1;
        }
    }
    out->geom.groups = (int)g;
    const char *l = !layout || layout == Py_None ? "NCHW"
                                                 : ga_exact_utf8(layout);
    if (!l || (strcmp(l, "NCHW") && strcmp(l, "NHWC"))) {
        PyErr_Format(PyExc_ValueError, "%s: layout must be 'NCHW' or 'NHWC', got %R", op, layout);
        return -1;
    }
    out->nhwc = strcmp(l, "NHWC") == 0;
    out->geom.allow_tf32 = allow_tf32;
    out->geom.deterministic = deterministic;
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

/* A new array for a logical (N, C, H, W) tensor, shaped as the layout says
 * and, for NCHW, in channels-last memory when `like` is (as torch does). */
static ArrayObject *conv_result(ga_state *st, const int64_t dims[4], ga_dtype dtype,
                                ga_device device, int nhwc, const ga_tensor *like,
                                const ga_stream *s)
{
    int64_t item = (int64_t)ga_dtype_itemsize(dtype);
    int channels_last = !nhwc && like && like->shape[1] > 1 && like->strides[1] == item &&
                        like->strides[3] == like->shape[1] * item;
    if (nhwc || channels_last) {
        int64_t shape[4] = {dims[0], dims[2], dims[3], dims[1]};
        ArrayObject *a = ga_array_empty(st, dtype, 4, shape, device, 0, s);
        if (!a || nhwc)
            return a;
        /* present it as NCHW with NHWC strides */
        int64_t strides[4] = {a->strides[0], a->strides[3], a->strides[1], a->strides[2]};
        ArrayObject *v = ga_array_view(st, a, a->data, 4, dims, strides);
        Py_DECREF(a);
        return v;
    }
    return ga_array_empty(st, dtype, 4, dims, device, 0, s);
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
                         op, k ? "width" : "height", (long long)in, g->padding[k],
                         (long long)span);
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
        used += snprintf(key + used, size - (size_t)used, "|%lldx%lldx%lldx%lld:%lld,%lld,%lld,%lld",
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
static int run_cuda_conv(ga_state *st, int device, ga_stream s, const char *key, cuda_conv_fn fn,
                         void *ctx)
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
    void *ws = workspace_for(st, device, s, ws_size);
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
    count_call(&conv_counts, 1, &tuning.report);
    conv_counts.tuning_reused += reused;
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

PyObject *ga_py_conv2d(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames)
{
    static const char *const names[] = {"x", "weight", "bias", "stride", "padding", "dilation",
                                        "groups", "activation", "layout", "out",
                                        "save_preactivation", "stream", "preactivation_out", NULL};
    PyObject *v[13];
    if (ga_parse_args("conv2d", args, nargs, kwnames, names, 3, 2, v) < 0)
        return NULL;
    ga_state *st = ga_state_from_module(module);
    ArrayObject *x = NULL, *w = NULL, *bias = NULL, *xv = NULL, *wv = NULL, *y = NULL, *z = NULL;
    PyObject *result = NULL, *sobj = NULL;
    conv_args ca;
    ga_activation act;
    int save = v[10] ? PyObject_IsTrue(v[10]) : 0;
    if (save < 0 || parse_activation(v[7], &act, "conv2d") < 0 ||
        parse_conv_args(v[3], v[4], v[5], v[6], v[8], &ca, "conv2d") < 0)
        return NULL;
    if (!(x = operand(st, v[0], "x")) || !(w = operand(st, v[1], "weight")))
        goto done;
    if (v[2] && v[2] != Py_None && !(bias = operand(st, v[2], "bias")))
        goto done;
    {
        ArrayObject *all[3] = {x, w, bias};
        const char *all_names[3] = {"x", "weight", "bias"};
        if (check_same_device(all, all_names, 3, "conv2d") < 0 || check_float(x, "conv2d", "x") < 0)
            goto done;
    }
    if (w->dtype != x->dtype || (bias && bias->dtype != x->dtype)) {
        PyErr_Format(PyExc_TypeError, "conv2d: x, weight and bias must share one dtype (x is %s)",
                     ga_dtype_name(x->dtype));
        goto done;
    }
    ga_stream s;
    if (!(sobj = op_stream(st, x, v[11], &s)))
        goto done;
    if (!(xv = describable(st, x, sobj)) || !(wv = describable(st, w, sobj)))
        goto done;
    ga_tensor tx = logical(xv, ca.nhwc), tw = logical(wv, ca.nhwc);
    if (check_conv_shapes(&tx, &tw, &ca, "conv2d") < 0)
        goto done;
    if (bias && (bias->ndim != 1 || bias->shape[0] != tw.shape[0])) {
        PyErr_Format(PyExc_ValueError, "conv2d: bias must have shape (%lld,) (the output channels)",
                     (long long)tw.shape[0]);
        goto done;
    }
    if (dense_bias(st, &bias, sobj) < 0)
        goto done;
    int64_t pq[2];
    if (conv_output_size(&tx, &tw, &ca.geom, pq, "conv2d") < 0)
        goto done;
    const ga_stream *sp = x->device.type == GA_DEVICE_CUDA ? &s : NULL;
    int64_t ydims[4] = {tx.shape[0], tw.shape[0], pq[0], pq[1]};
    if (v[9] && v[9] != Py_None) {
        int64_t shape[4] = {ydims[0], ydims[2], ydims[3], ydims[1]};
        if (!(y = result_array(st, v[9], x->dtype, 4, ca.nhwc ? shape : ydims, x->device, sp,
                               "conv2d")))
            goto done;
    } else if (!(y = conv_result(st, ydims, x->dtype, x->device, ca.nhwc, &tx, sp))) {
        goto done;
    }
    if (save && act == GA_ACT_GELU) {
        if (v[12] && v[12] != Py_None) {
            int64_t shape[4] = {ydims[0], ydims[2], ydims[3], ydims[1]};
            z = result_array(st, v[12], x->dtype, 4, ca.nhwc ? shape : ydims, x->device, sp,
                             "conv2d");
        } else {
            z = conv_result(st, ydims, x->dtype, x->device, ca.nhwc, &tx, sp);
        }
        if (!z)
            goto done;
    }
    conv_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.desc.geom = ca.geom;
    ctx.desc.x = tx;
    ctx.desc.w = tw;
    ctx.desc.y = logical(y, ca.nhwc);
    ctx.desc.bias = bias ? bias->data : NULL;
    ctx.desc.activation = act;
    if (z)
        ctx.desc.preact = logical(z, ca.nhwc);
    ArrayObject *touched[5] = {xv, wv, bias, y, z};
    if (x->device.type == GA_DEVICE_CPU) {
        ga_status status;
        Py_BEGIN_ALLOW_THREADS status = ga_cpu_conv2d_forward(&ctx.desc);
        Py_END_ALLOW_THREADS
        if (status.error) {
            ga_raise(st, status);
            goto done;
        }
        ga_op_report none = {0, 0, 0, 0};
        count_call(&conv_counts, 0, &none);
    } else {
        char key[1024];
        const ga_tensor *ts[3] = {&ctx.desc.x, &ctx.desc.w, &ctx.desc.y};
        char extra[64];
        snprintf(extra, sizeof extra, "fwd bias=%d act=%d preact=%d", bias != NULL, (int)act,
                 z != NULL);
        tuning_key(key, sizeof key, "conv2d", ts, 3, &ca.geom, extra);
        ctx.device = x->device.index;
        if (prepare_all(st, touched, 5, s) < 0 ||
            run_cuda_conv(st, x->device.index, s, key, cuda_fwd, &ctx) < 0 ||
            record_all(st, touched, 5, s) < 0)
            goto done;
    }
    if (!save)
        result = Py_NewRef(y);
    else if (act == GA_ACT_GELU)
        result = PyTuple_Pack(2, (PyObject *)y, (PyObject *)z);
    else
        result = PyTuple_Pack(2, (PyObject *)y, act == GA_ACT_RELU ? (PyObject *)y : Py_None);
done:
    Py_XDECREF(sobj);
    Py_XDECREF(x);
    Py_XDECREF(w);
    Py_XDECREF(bias);
    Py_XDECREF(xv);
    Py_XDECREF(wv);
    Py_XDECREF(y);
    Py_XDECREF(z);
    return result;
}

PyObject *ga_py_conv2d_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    static const char *const names[] = {
        "grad_y", "x", "weight", "stride", "padding", "dilation", "groups", "activation", "y",
        "preactivation", "layout", "needs_input_grad", "needs_weight_grad", "needs_bias_grad",
        "stream", "out", NULL};
    PyObject *v[16], *outs[3];
    if (ga_parse_args("conv2d_backward", args, nargs, kwnames, names, 3, 3, v) < 0 ||
        parse_grad_outs(v[15], outs, "conv2d_backward") < 0)
        return NULL;
    ga_state *st = ga_state_from_module(module);
    ArrayObject *gy = NULL, *x = NULL, *w = NULL, *aux = NULL, *gyv = NULL, *xv = NULL, *wv = NULL,
                *dz = NULL, *gx = NULL, *gw = NULL, *gb = NULL;
    PyObject *result = NULL, *sobj = NULL;
    conv_args ca;
    ga_activation act;
    int need_x = parse_flag(v[11], 1), need_w = parse_flag(v[12], 1), need_b = parse_flag(v[13], 1);
    if (need_x < 0 || need_w < 0 || need_b < 0 ||
        parse_activation(v[7], &act, "conv2d_backward") < 0 ||
        parse_conv_args(v[3], v[4], v[5], v[6], v[10], &ca, "conv2d_backward") < 0)
        return NULL;
    if (!(gy = operand(st, v[0], "grad_y")) || !(x = operand(st, v[1], "x")) ||
        !(w = operand(st, v[2], "weight")))
        goto done;
    PyObject *aux_obj = v[9] && v[9] != Py_None ? v[9] : act == GA_ACT_RELU ? v[8] : NULL;
    if (act != GA_ACT_NONE) {
        if (!aux_obj || aux_obj == Py_None) {
            PyErr_SetString(PyExc_ValueError,
                            act == GA_ACT_GELU
                                ? "conv2d_backward: activation='gelu' needs preactivation (from "
                                  "conv2d(..., save_preactivation=True))"
                                : "conv2d_backward: activation='relu' needs y (the forward output) "
                                  "or preactivation");
            goto done;
        }
        if (!(aux = operand(st, aux_obj, "preactivation")))
            goto done;
    }
    {
        ArrayObject *all[4] = {gy, x, w, aux};
        const char *all_names[4] = {"grad_y", "x", "weight", "preactivation"};
        if (check_same_device(all, all_names, 4, "conv2d_backward") < 0 ||
            check_float(x, "conv2d_backward", "x") < 0)
            goto done;
    }
    if (gy->dtype != x->dtype || w->dtype != x->dtype || (aux && aux->dtype != x->dtype)) {
        PyErr_Format(PyExc_TypeError, "conv2d_backward: all arrays must share x's dtype (%s)",
                     ga_dtype_name(x->dtype));
        goto done;
    }
    ga_stream s;
    if (!(sobj = op_stream(st, x, v[14], &s)))
        goto done;
    if (!(xv = describable(st, x, sobj)) || !(wv = describable(st, w, sobj)) ||
        !(gyv = describable(st, gy, sobj)))
        goto done;
    ga_tensor tx = logical(xv, ca.nhwc), tw = logical(wv, ca.nhwc), tgy = logical(gyv, ca.nhwc);
    int64_t pq[2];
    if (check_conv_shapes(&tx, &tw, &ca, "conv2d_backward") < 0 ||
        conv_output_size(&tx, &tw, &ca.geom, pq, "conv2d_backward") < 0)
        goto done;
    if (tgy.ndim != 4 || tgy.shape[0] != tx.shape[0] || tgy.shape[1] != tw.shape[0] ||
        tgy.shape[2] != pq[0] || tgy.shape[3] != pq[1] ||
        (aux && (aux->ndim != 4 || memcmp(aux->shape, gy->shape, 32) != 0))) {
        PyErr_Format(PyExc_ValueError,
                     "conv2d_backward: grad_y (and y/preactivation) must be the forward output's "
                     "shape: %s (%lld, %lld, %lld, %lld)",
                     ca.nhwc ? "N, P, Q, K" : "N, K, P, Q", (long long)tx.shape[0],
                     (long long)(ca.nhwc ? pq[0] : tw.shape[0]), (long long)(ca.nhwc ? pq[1] : pq[0]),
                     (long long)(ca.nhwc ? tw.shape[0] : pq[1]));
        goto done;
    }
    const ga_stream *sp = x->device.type == GA_DEVICE_CUDA ? &s : NULL;
    int64_t k_shape[1] = {tw.shape[0]};
    if (need_b && !(gb = result_array(st, outs[2], w->dtype, 1, k_shape, x->device, sp,
                                      "conv2d_backward")))
        goto done;
    if (gb && !ga_array_is_contiguous(gb)) {
        PyErr_SetString(PyExc_ValueError, "conv2d_backward: out grad_bias must be contiguous");
        goto done;
    }
    /* dZ and the bias gradient in one pass; the act-backward kernel works
     * on logical dims, channel 1 */
    {
        ArrayObject *aux_view = NULL, *gy_logical = NULL;
        int64_t dims[4] = {tgy.shape[0], tgy.shape[1], tgy.shape[2], tgy.shape[3]};
        gy_logical = ga_array_view(st, gyv, gyv->data, 4, dims, tgy.strides);
        if (gy_logical && aux) {
            ga_tensor ta = logical(aux, ca.nhwc);
            aux_view = ga_array_view(st, aux, aux->data, 4, dims, ta.strides);
        }
        if (gy_logical && (!aux || aux_view))
            dz = activation_grad(st, gy_logical, aux_view, act, gb, 1, s);
        Py_XDECREF(gy_logical);
        Py_XDECREF(aux_view);
        if (!dz)
            goto done;
    }
    ga_tensor tdz = ga_array_tensor(dz);
    conv_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.desc.geom = ca.geom;
    ctx.device = x->device.type == GA_DEVICE_CUDA ? x->device.index : -1;
    ctx.dy = &tdz;
    if (need_x) {
        int64_t dims[4] = {tx.shape[0], tx.shape[1], tx.shape[2], tx.shape[3]};
        gx = outs[0] ? result_array(st, outs[0], x->dtype, 4, x->shape, x->device, sp,
                                    "conv2d_backward")
                     : conv_result(st, dims, x->dtype, x->device, ca.nhwc, &tx, sp);
        if (!gx)
            goto done;
    }
    if (need_w) {
        int64_t dims[4] = {tw.shape[0], tw.shape[1], tw.shape[2], tw.shape[3]};
        gw = outs[1] ? result_array(st, outs[1], w->dtype, 4, w->shape, x->device, sp,
                                    "conv2d_backward")
                     : conv_result(st, dims, w->dtype, x->device, ca.nhwc, &tw, sp);
        if (!gw)
            goto done;
    }
    ga_tensor tgx, tgw;
    if (gx)
        tgx = logical(gx, ca.nhwc);
    if (gw)
        tgw = logical(gw, ca.nhwc);
    ArrayObject *touched[5] = {dz, xv, wv, gx, gw};
    if (x->device.type == GA_DEVICE_CPU) {
        ga_status status = ga_ok();
        Py_BEGIN_ALLOW_THREADS
        if (gx)
            status = ga_cpu_conv2d_backward_data(&ca.geom, &tdz, &tw, &tgx);
        if (gw && !status.error)
            status = ga_cpu_conv2d_backward_filter(&ca.geom, &tx, &tdz, &tgw);
        Py_END_ALLOW_THREADS
        if (status.error) {
            ga_raise(st, status);
            goto done;
        }
        ga_op_report none = {0, 0, 0, 0};
        count_call(&conv_counts, 0, &none);
    } else {
        if (prepare_all(st, touched, 5, s) < 0)
            goto done;
        char key[1024];
        if (gx) {
            ctx.w = &tw;
            ctx.dx = &tgx;
            const ga_tensor *ts[3] = {&tdz, &tw, &tgx};
            tuning_key(key, sizeof key, "conv2d", ts, 3, &ca.geom, "bwd_data");
            if (run_cuda_conv(st, ctx.device, s, key, cuda_bwd_data, &ctx) < 0)
                goto done;
        }
        if (gw) {
            ctx.x = &tx;
            ctx.dw = &tgw;
            const ga_tensor *ts[3] = {&tx, &tdz, &tgw};
            tuning_key(key, sizeof key, "conv2d", ts, 3, &ca.geom, "bwd_filter");
            if (run_cuda_conv(st, ctx.device, s, key, cuda_bwd_filter, &ctx) < 0)
                goto done;
        }
        if (record_all(st, touched, 5, s) < 0)
            goto done;
    }
    result = PyTuple_Pack(3, gx ? (PyObject *)gx : Py_None, gw ? (PyObject *)gw : Py_None,
                          gb ? (PyObject *)gb : Py_None);
done:
    Py_XDECREF(sobj);
    Py_XDECREF(gy);
    Py_XDECREF(x);
    Py_XDECREF(w);
    Py_XDECREF(aux);
    Py_XDECREF(gyv);
    Py_XDECREF(xv);
    Py_XDECREF(wv);
    Py_XDECREF(dz);
    Py_XDECREF(gx);
    Py_XDECREF(gw);
    Py_XDECREF(gb);
    return result;
}
