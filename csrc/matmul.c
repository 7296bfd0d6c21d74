/*
 * matmul.c — matmul, linear and linear_backward: their arguments checked
 * (every error names the argument, what was given and what is accepted),
 * their operands described to the backend as GEMMs, and the GEMMs run on
 * kernels/cpu or kernels/cuda on the op's stream, with a workspace from
 * workspace.c.
 */
#include "matmul.h"

#include <string.h>

#include "fallback.h"
#include "opcall.h"
#include "settings.h"
#include "workspace.h"
#include "transfer.h"

static ga_op_counters matmul_counts;

PyObject *ga_py_matmul_stats(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    uint64_t matmul_hits, matmul_misses, conv_hits, conv_misses;
    ga_cuda_plan_cache_stats(&matmul_hits, &matmul_misses, &conv_hits, &conv_misses);
    return ga_op_counters_dict(&matmul_counts, matmul_hits, matmul_misses);
}

/* Runs one GEMM descriptor where the op runs, counting it in the matmul
 * statistics. */
static int run_gemm(ga_state *st, const ga_op *op, ga_matmul_desc *desc)
{
    if ((desc->allow_tf32 = ga_allow_tf32(st, op->device, desc->a.dtype, GA_TF32_MATMUL)) < 0)
        return -1;
    desc->deterministic = ga_deterministic();
    ga_op_report report;
    memset(&report, 0, sizeof report);
    ga_status status;
    if (op->device.type == GA_DEVICE_CPU) {
        Py_BEGIN_ALLOW_THREADS
        status = ga_cpu_matmul(desc);
        Py_END_ALLOW_THREADS
    } else {
        int device = op->device.index;
        size_t ws_size = ga_cuda_matmul_workspace_size(device);
        void *ws = ga_workspace(st, device, op->stream, ws_size);
        if (!ws && ws_size)
            return -1;
        status = ga_cuda_matmul(device, desc, ws, ws_size, op->stream, &report);
    }
    if (status.error)
        return ga_raise(st, status);
    ga_op_count(&matmul_counts, op->name, op->device.type == GA_DEVICE_CUDA, &report);
    return 0;
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

/* x (..., K) as an M x K matrix (a contiguous copy when its leading dims
 * cannot be merged). */
static ArrayObject *rows_view(ga_state *st, const ga_op *op, ArrayObject *x, int64_t *M,
                              int64_t *row_stride)
{
    ArrayObject *xv = ga_op_describable(st, op, x);
    if (!xv)
        return NULL;
    if (collapse_leading(xv, 1, M, row_stride) < 0) {
        ArrayObject *c = ga_array_copy_to(st, xv, xv->device, xv->dtype, 0, op->stream_obj);
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

/* An M x N matrix of `dtype` over rows `row_stride` bytes apart (0: dense)
 * of an array whose last dim holds the columns. */
static ga_matrix rows_matrix(const ArrayObject *a, ga_dtype dtype, int64_t M, int64_t N,
                             int64_t row_stride)
{
    int64_t item = (int64_t)ga_dtype_itemsize(dtype);
    return (ga_matrix){
        a->data, dtype, M, N, row_stride ? row_stride / item : N, a->strides[a->ndim - 1] / item,
        0};
}

/* ---------------------------------------------------------------- matmul */

typedef struct {
    PyObject *a, *b, *bias, *activation, *out, *out_dtype, *stream;
} matmul_args;

static const ga_arg_field matmul_fields[] = {
    GA_ARG(matmul_args, a),      GA_ARG(matmul_args, b),
    GA_ARG(matmul_args, bias),   GA_ARG(matmul_args, activation),
    GA_ARG(matmul_args, out),    GA_ARG(matmul_args, out_dtype),
    GA_ARG(matmul_args, stream), {NULL, 0},
};

/* matmul's operands in the (batch..., M, K) x (batch..., K, N) frame,
 * NumPy's rules: a 1-D a is a row, a 1-D b a column (dropped from the
 * result), and the batch dims broadcast.  Strides in bytes. */
typedef struct {
    int a_vec, b_vec;
    int64_t M, K, N;
    int nbatch;
    int64_t batch_shape[GA_MAX_NDIM];
    int64_t a_batch_strides[GA_MAX_NDIM], b_batch_strides[GA_MAX_NDIM]; /* 0 where broadcast */
    int64_t a_row_stride, a_col_stride, b_row_stride, b_col_stride;
    int out_ndim;
    int64_t out_shape[GA_MAX_NDIM + 2];
} matmul_plan;

/* An operand's shape and strides with its vector dim made a matrix dim
 * (`as_row`: a row 1 x n, else a column n x 1); its dim count. */
static int matrix_frame(const ArrayObject *x, int as_row, int64_t *shape, int64_t *strides)
{
    if (x->ndim != 1) {
        memcpy(shape, x->shape, (size_t)x->ndim * 8);
        memcpy(strides, x->strides, (size_t)x->ndim * 8);
        return x->ndim;
    }
    int vector = as_row ? 1 : 0, unit = as_row ? 0 : 1;
    shape[vector] = x->shape[0], strides[vector] = x->strides[0];
    shape[unit] = 1, strides[unit] = 0;
    return 2;
}

static int broadcast_batch(matmul_plan *p, const int64_t *a_shape, const int64_t *a_str, int an,
                           const int64_t *b_shape, const int64_t *b_str, int bn)
{
    int nb = (an > bn ? an : bn) - 2;
    for (int k = 0; k < nb; k++) {
        int ia = k - (nb - (an - 2)), ib = k - (nb - (bn - 2));
        int64_t ea = ia >= 0 ? a_shape[ia] : 1, eb = ib >= 0 ? b_shape[ib] : 1;
        if (ea != eb && ea != 1 && eb != 1) {
            PyErr_Format(PyExc_ValueError,
                         "matmul: batch dimensions %lld (of a) and %lld (of b) do not broadcast",
                         (long long)ea, (long long)eb);
            return -1;
        }
        p->batch_shape[k] = ea > eb ? ea : eb;
        p->a_batch_strides[k] = ia >= 0 && ea != 1 ? a_str[ia] : 0;
        p->b_batch_strides[k] = ib >= 0 && eb != 1 ? b_str[ib] : 0;
    }
    p->nbatch = nb;
    return 0;
}

static int plan_matmul(const ArrayObject *a, const ArrayObject *b, matmul_plan *p)
{
    if (a->ndim < 1 || b->ndim < 1) {
        PyErr_SetString(PyExc_ValueError, "matmul: a and b must have at least one dimension");
        return -1;
    }
    int64_t a_shape[GA_MAX_NDIM + 1], a_str[GA_MAX_NDIM + 1], b_shape[GA_MAX_NDIM + 1],
        b_str[GA_MAX_NDIM + 1];
    p->a_vec = a->ndim == 1, p->b_vec = b->ndim == 1;
    int an = matrix_frame(a, 1, a_shape, a_str), bn = matrix_frame(b, 0, b_shape, b_str);
    p->M = a_shape[an - 2], p->K = a_shape[an - 1], p->N = b_shape[bn - 1];
    if (b_shape[bn - 2] != p->K) {
        PyErr_Format(PyExc_ValueError,
                     "matmul: a's last dimension (%lld) must equal b's %s dimension (%lld)",
                     (long long)p->K, p->b_vec ? "only" : "second-to-last",
                     (long long)b_shape[bn - 2]);
        return -1;
    }
    if (broadcast_batch(p, a_shape, a_str, an, b_shape, b_str, bn) < 0)
        return -1;
    p->a_row_stride = a_str[an - 2], p->a_col_stride = a_str[an - 1];
    p->b_row_stride = b_str[bn - 2], p->b_col_stride = b_str[bn - 1];
    /* the result: batch dims, then (M, N), minus the vector dims */
    p->out_ndim = 0;
    for (int k = 0; k < p->nbatch; k++)
        p->out_shape[p->out_ndim++] = p->batch_shape[k];
    if (!p->a_vec)
        p->out_shape[p->out_ndim++] = p->M;
    if (!p->b_vec)
        p->out_shape[p->out_ndim++] = p->N;
    if (p->out_ndim > GA_MAX_NDIM) {
        PyErr_SetString(PyExc_ValueError, "matmul: the result has too many dimensions");
        return -1;
    }
    return 0;
}

static int matmul_out_dtype(ga_state *st, PyObject *obj, ga_dtype in, ga_dtype *out)
{
    *out = in;
    if (!obj || obj == Py_None)
        return 0;
    if (ga_dtype_from_object(st, obj, out, "out_dtype") < 0)
        return -1;
    if (*out == in || (*out == GA_FLOAT32 && (in == GA_FLOAT16 || in == GA_BFLOAT16)))
        return 0;
    PyErr_Format(PyExc_ValueError, "matmul: out_dtype must be the inputs' dtype (%s)%s, got %s",
                 ga_dtype_name(in), in == GA_FLOAT16 || in == GA_BFLOAT16 ? " or float32" : "",
                 ga_dtype_name(*out));
    return -1;
}

/* The bias as the kernels read it: dense, and of the result's dtype where
 * cuBLASLt's fused bias needs it (a float16/bfloat16 bias with a float32
 * result would not fuse): widened, exactly, on the GPU. */
static int matmul_bias(ga_state *st, const ga_op *op, ArrayObject **bias, ga_dtype in_dtype,
                       ga_dtype out_dtype)
{
    if (ga_op_dense_bias(st, op, bias) < 0)
        return -1;
    if (!*bias || (*bias)->dtype == out_dtype ||
        ((*bias)->dtype == in_dtype && op->device.type != GA_DEVICE_CUDA))
        return 0;
    ArrayObject *cast = ga_array_copy_to(st, *bias, (*bias)->device, out_dtype, 0, op->stream_obj);
    if (!cast)
        return -1;
    Py_SETREF(*bias, cast);
    return 0;
}

/* d = act(a @ b + bias): one kernel call per outer batch index, the
 * innermost batch dim (if any) going to the kernel as its batch. */
static int run_matmul(ga_state *st, const ga_op *op, const matmul_plan *p, ArrayObject *a,
                      ArrayObject *b, ArrayObject *bias, ArrayObject *d, ga_activation act)
{
    int nb = p->nbatch;
    /* the result's strides, in the (batch..., M, N) frame */
    int64_t d_str[GA_MAX_NDIM + 2];
    int k = 0;
    for (int j = 0; j < nb; j++)
        d_str[j] = d->strides[k++];
    d_str[nb] = p->a_vec ? 0 : d->strides[k++];
    d_str[nb + 1] = p->b_vec ? 0 : d->strides[k++];
    int64_t inner = nb ? p->batch_shape[nb - 1] : 1, outer = 1;
    for (int j = 0; j < nb - 1; j++)
        outer *= p->batch_shape[j];
    int64_t item_a = (int64_t)ga_dtype_itemsize(a->dtype);
    int64_t item_d = (int64_t)ga_dtype_itemsize(d->dtype);
    ArrayObject *touched[4] = {a, b, bias, d};
    if (ga_op_prepare(st, op, touched, 4) < 0)
        return -1;
    for (int64_t o = 0; o < outer; o++) {
        int64_t rem = o, off_a = 0, off_b = 0, off_d = 0;
        for (int j = nb - 2; j >= 0; j--) {
            int64_t i = rem % p->batch_shape[j];
            rem /= p->batch_shape[j];
            off_a += i * p->a_batch_strides[j];
            off_b += i * p->b_batch_strides[j];
            off_d += i * d_str[j];
        }
        ga_matmul_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.batch = inner;
        desc.a = (ga_matrix){(char *)a->data + off_a,
                             a->dtype,
                             p->M,
                             p->K,
                             p->a_row_stride / item_a,
                             p->a_col_stride / item_a,
                             nb ? p->a_batch_strides[nb - 1] / item_a : 0};
        desc.b = (ga_matrix){(char *)b->data + off_b,
                             b->dtype,
                             p->K,
                             p->N,
                             p->b_row_stride / item_a,
                             p->b_col_stride / item_a,
                             nb ? p->b_batch_strides[nb - 1] / item_a : 0};
        desc.d = (ga_matrix){(char *)d->data + off_d,
                             d->dtype,
                             p->M,
                             p->N,
                             d_str[nb] / item_d,
                             d_str[nb + 1] / item_d,
                             nb ? d_str[nb - 1] / item_d : 0};
        if (p->a_vec)
            desc.a.row_stride = p->K, desc.d.row_stride = p->N;
        if (p->b_vec)
            desc.b.col_stride = 1, desc.d.col_stride = 1;
        desc.bias = bias ? bias->data : NULL;
        desc.bias_dtype = bias ? bias->dtype : d->dtype;
        desc.activation = act;
        if (run_gemm(st, op, &desc) < 0)
            return -1;
    }
    return ga_op_record(st, op, touched, 4);
}

static PyObject *matmul_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    ga_state *st = ga_state_from_module(module);
    matmul_args arg;
    ga_activation act;
    if (ga_parse_args_into("matmul", args, nargs, kwnames, matmul_fields, 2, 2, &arg) < 0 ||
        ga_op_activation(st, arg.activation, &act, "matmul") < 0)
        return NULL;
    ArrayObject *a, *b, *bias, *av = NULL, *bv = NULL, *d = NULL, *target = NULL;
    PyObject *result = NULL;
    const ga_operand operands[] = {
        {"a", arg.a, &a, GA_OPERAND_LEAD},
        {"b", arg.b, &b, 0},
        {"bias", arg.bias, &bias, GA_OPERAND_OPTIONAL | GA_OPERAND_ANY_DTYPE},
    };
    ga_op op;
    matmul_plan plan;
    ga_dtype out_dtype;
    if (ga_op_begin(st, &op, "matmul", operands, 3, arg.stream) < 0 ||
        plan_matmul(a, b, &plan) < 0 ||
        matmul_out_dtype(st, arg.out_dtype, a->dtype, &out_dtype) < 0)
        goto done;
    if (ga_op_check_bias("matmul", bias, plan.N, "the result's last dimension") < 0)
        goto done;
    if (!(d = ga_op_result(st, &op, arg.out, out_dtype, plan.out_ndim, plan.out_shape)) ||
        !(av = ga_op_describable(st, &op, a)) || !(bv = ga_op_describable(st, &op, b)))
        goto done;
    /* out is also an input: compute aside, copy at the end (as NumPy) */
    int aside = ga_arrays_may_overlap(d, av) || ga_arrays_may_overlap(d, bv) ||
                (bias && ga_arrays_may_overlap(d, bias));
    target = aside ? ga_op_empty(st, &op, out_dtype, plan.out_ndim, plan.out_shape)
                   : (ArrayObject *)Py_NewRef(d);
    if (!target || matmul_bias(st, &op, &bias, a->dtype, out_dtype) < 0 ||
        run_matmul(st, &op, &plan, av, bv, bias, target, act) < 0 ||
        (aside && ga_copy_into(st, d, target, op.stream_obj) < 0))
        goto done;
    result = Py_NewRef(d);
done:
    result = ga_op_settle_fallbacks(st, result);
    ga_op_end(&op);
    Py_XDECREF(av);
    Py_XDECREF(bv);
    Py_XDECREF(d);
    Py_XDECREF(target);
    return result;
}

/* ---------------------------------------------------------------- linear */

typedef struct {
    PyObject *x, *weight, *bias, *activation, *out, *save_preactivation, *stream,
        *preactivation_out;
} linear_args;

static const ga_arg_field linear_fields[] = {
    GA_ARG(linear_args, x),
    GA_ARG(linear_args, weight),
    GA_ARG(linear_args, bias),
    GA_ARG(linear_args, activation),
    GA_ARG(linear_args, out),
    GA_ARG(linear_args, save_preactivation),
    GA_ARG(linear_args, stream),
    GA_ARG(linear_args, preactivation_out),
    {NULL, 0},
};

static int check_linear_shapes(const ArrayObject *x, const ArrayObject *w, const ArrayObject *bias)
{
    if (w->ndim != 2 || x->ndim < 1) {
        PyErr_Format(PyExc_ValueError,
                     "linear: weight must be 2-D (out_features, in_features) and x at least 1-D; "
                     "got weight with %d and x with %d dimensions",
                     w->ndim, x->ndim);
        return -1;
    }
    if (x->shape[x->ndim - 1] != w->shape[1]) {
        PyErr_Format(PyExc_ValueError,
                     "linear: x's last dimension (%lld) must equal weight's in_features (%lld)",
                     (long long)x->shape[x->ndim - 1], (long long)w->shape[1]);
        return -1;
    }
    return ga_op_check_bias("linear", bias, w->shape[0], "weight's out_features");
}

/* y = act(x @ w.T + bias), z the pre-activation when wanted (`x` as
 * rows_view gives it: M rows x_row bytes apart).  y may be any strided
 * `out`: written through a contiguous temporary then. */
static int run_linear(ga_state *st, const ga_op *op, ArrayObject *x, int64_t M, int64_t x_row,
                      ArrayObject *w, ArrayObject *bias, ArrayObject *y, ArrayObject *z,
                      ga_activation act)
{
    int64_t N = w->shape[0], K = w->shape[1], y_rows, y_row, z_rows, z_row;
    int64_t item = (int64_t)ga_dtype_itemsize(x->dtype);
    ArrayObject *target = y;
    if (collapse_leading(y, 1, &y_rows, &y_row) < 0 || ga_arrays_may_overlap(y, x) ||
        ga_arrays_may_overlap(y, w) || (bias && ga_arrays_may_overlap(y, bias))) {
        if (!(target = ga_op_empty(st, op, y->dtype, y->ndim, y->shape)))
            return -1;
        collapse_leading(target, 1, &y_rows, &y_row);
    } else {
        Py_INCREF(target);
    }
    ga_matmul_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = 1;
    desc.a = rows_matrix(x, x->dtype, M, K, x_row);
    /* B = weight^T: K x N */
    desc.b = (ga_matrix){w->data, w->dtype, K, N, w->strides[1] / item, w->strides[0] / item, 0};
    desc.d = rows_matrix(target, x->dtype, M, N, y_row);
    desc.bias = bias ? bias->data : NULL;
    desc.bias_dtype = x->dtype;
    desc.activation = act;
    int rc = -1;
    if (z && collapse_leading(z, 1, &z_rows, &z_row) < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "linear: preactivation_out's leading dimensions must be mergeable");
        goto done;
    }
    if (z)
        desc.preact = rows_matrix(z, x->dtype, M, N, z_row);
    ArrayObject *touched[5] = {x, w, bias, target, z};
    if (ga_op_prepare(st, op, touched, 5) == 0 && run_gemm(st, op, &desc) == 0 &&
        ga_op_record(st, op, touched, 5) == 0)
        rc = target == y ? 0 : ga_copy_into(st, y, target, op->stream_obj);
done:
    Py_DECREF(target);
    return rc;
}

static PyObject *linear_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    ga_state *st = ga_state_from_module(module);
    linear_args arg;
    ga_forward f;
    if (ga_parse_args_into("linear", args, nargs, kwnames, linear_fields, 4, 2, &arg) < 0 ||
        ga_forward_parse(st, &f, "linear", arg.save_preactivation, arg.activation) < 0)
        return NULL;
    PyObject *result = NULL;
    const ga_op *op = &f.op;
    if (ga_forward_begin(st, &f, arg.x, arg.weight, arg.bias, arg.stream) < 0 ||
        check_linear_shapes(f.x, f.weight, f.bias) < 0 || ga_op_dense_bias(st, op, &f.bias) < 0)
        goto done;
    int64_t shape[GA_MAX_NDIM], M, x_row;
    memcpy(shape, f.x->shape, (size_t)f.x->ndim * 8);
    shape[f.x->ndim - 1] = f.weight->shape[0];
    if (!(f.y = ga_op_result(st, op, arg.out, f.x->dtype, f.x->ndim, shape)))
        goto done;
    if (f.save && f.act != GA_ACT_NONE && !ga_activation_grad_reads_output(f.act) &&
        !(f.z = ga_op_result(st, op, arg.preactivation_out, f.x->dtype, f.x->ndim, shape)))
        goto done;
    if (!(f.x_read = rows_view(st, op, f.x, &M, &x_row)) ||
        !(f.weight_read = ga_op_describable(st, op, f.weight)) ||
        run_linear(st, op, f.x_read, M, x_row, f.weight_read, f.bias, f.y, f.z, f.act) < 0)
        goto done;
    result = ga_forward_result(&f);
done:
    result = ga_op_settle_fallbacks(st, result);
    ga_forward_end(&f);
    return result;
}

/* ------------------------------------------------------- linear_backward */

typedef struct {
    PyObject *grad_y, *x, *weight, *activation, *preactivation, *needs_input_grad,
        *needs_weight_grad, *needs_bias_grad, *stream, *out;
} linear_backward_args;

static const ga_arg_field linear_backward_fields[] = {
    GA_ARG(linear_backward_args, grad_y),
    GA_ARG(linear_backward_args, x),
    GA_ARG(linear_backward_args, weight),
    GA_ARG(linear_backward_args, activation),
    GA_ARG(linear_backward_args, preactivation),
    GA_ARG(linear_backward_args, needs_input_grad),
    GA_ARG(linear_backward_args, needs_weight_grad),
    GA_ARG(linear_backward_args, needs_bias_grad),
    GA_ARG(linear_backward_args, stream),
    GA_ARG(linear_backward_args, out),
    {NULL, 0},
};

static int check_linear_grad_shapes(const ArrayObject *gy, const ArrayObject *x,
                                    const ArrayObject *w, const ArrayObject *aux)
{
    if (w->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1] ||
        gy->ndim != x->ndim || gy->shape[gy->ndim - 1] != w->shape[0] ||
        memcmp(gy->shape, x->shape, (size_t)(x->ndim - 1) * 8) != 0 ||
        (aux && (aux->ndim != gy->ndim || memcmp(aux->shape, gy->shape, (size_t)gy->ndim * 8)))) {
        PyErr_SetString(PyExc_ValueError,
                        "linear_backward: need weight (N, K), x (..., K), and grad_y and "
                        "preactivation (..., N) with x's leading dimensions");
        return -1;
    }
    return 0;
}

/* grad_x = dz @ w (dz: M x N). */
static ArrayObject *linear_grad_input(ga_state *st, const ga_op *op, PyObject *out,
                                      const ArrayObject *x, const ga_matrix *dz_m, ArrayObject *dz,
                                      ArrayObject *w)
{
    ArrayObject *gx = ga_op_result(st, op, out, x->dtype, x->ndim, x->shape);
    int64_t gx_rows, gx_row, item = (int64_t)ga_dtype_itemsize(x->dtype);
    if (gx && collapse_leading(gx, 1, &gx_rows, &gx_row) < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "linear_backward: out grad_x's leading dimensions must be mergeable");
        Py_CLEAR(gx);
    }
    if (!gx)
        return NULL;
    ga_matmul_desc d;
    memset(&d, 0, sizeof d);
    d.batch = 1;
    d.a = *dz_m;
    d.b = (ga_matrix){
        w->data, w->dtype, w->shape[0], w->shape[1], w->strides[0] / item, w->strides[1] / item, 0};
    d.d = rows_matrix(gx, x->dtype, dz_m->rows, w->shape[1], gx_row);
    ArrayObject *touched[3] = {dz, w, gx};
    if (ga_op_prepare(st, op, touched, 3) < 0 || run_gemm(st, op, &d) < 0 ||
        ga_op_record(st, op, touched, 3) < 0)
        Py_CLEAR(gx);
    return gx;
}

/* grad_w = dz^T @ x, with the bias gradient (dz's column sums) into gb
 * when `sum_bias`. */
static ArrayObject *linear_grad_weight(ga_state *st, const ga_op *op, PyObject *out,
                                       const ArrayObject *w, const ga_matrix *dz_m, ArrayObject *dz,
                                       ArrayObject *x, int64_t x_row, ArrayObject *gb, int sum_bias)
{
    int64_t w_shape[2] = {w->shape[0], w->shape[1]}, item = (int64_t)ga_dtype_itemsize(w->dtype);
    ArrayObject *gw = ga_op_result(st, op, out, w->dtype, 2, w_shape);
    if (!gw)
        return NULL;
    ga_matmul_desc d;
    memset(&d, 0, sizeof d);
    d.batch = 1;
    /* A is dZ seen transposed (N x M) */
    d.a = (ga_matrix){dz->data,         dz->dtype,        dz_m->cols, dz_m->rows,
                      dz_m->col_stride, dz_m->row_stride, 0};
    d.b = rows_matrix(x, x->dtype, dz_m->rows, w->shape[1], x_row);
    d.d = (ga_matrix){
        gw->data, w->dtype, w->shape[0], w->shape[1], gw->strides[0] / item, gw->strides[1] / item,
        0};
    if (sum_bias) {
        d.a_row_sums = gb->data;
        d.a_row_sums_dtype = gb->dtype;
    }
    ArrayObject *touched[4] = {dz, x, gw, gb};
    if (ga_op_prepare(st, op, touched, 4) < 0 || run_gemm(st, op, &d) < 0 ||
        ga_op_record(st, op, touched, 4) < 0)
        Py_CLEAR(gw);
    return gw;
}

static PyObject *linear_backward_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                       PyObject *kwnames)
{
    ga_state *st = ga_state_from_module(module);
    linear_backward_args arg;
    ga_backward g;
    if (ga_parse_args_into("linear_backward", args, nargs, kwnames, linear_backward_fields, 3, 3,
                           &arg) < 0 ||
        ga_backward_parse(st, &g, "linear_backward", arg.out, arg.needs_input_grad,
                          arg.needs_weight_grad, arg.needs_bias_grad, arg.activation) < 0)
        return NULL;
    if (g.act != GA_ACT_NONE && (!arg.preactivation || arg.preactivation == Py_None)) {
        PyErr_Format(PyExc_ValueError,
                     "linear_backward: activation='%s' needs preactivation (what linear(..., "
                     "save_preactivation=True) returned)",
                     ga_activation_name(g.act));
        return NULL;
    }
    ArrayObject *dz = NULL, *gyv = NULL, *xv = NULL, *wv = NULL;
    PyObject *result = NULL;
    PyObject *aux = g.act != GA_ACT_NONE ? arg.preactivation : NULL;
    if (ga_backward_begin(st, &g, arg.grad_y, arg.x, arg.weight, aux, arg.stream) < 0 ||
        check_linear_grad_shapes(g.grad_y, g.x, g.weight, g.aux) < 0)
        goto done;
    const ga_op *op = &g.op;
    int64_t N = g.weight->shape[0];
    if (g.need_b && !(g.grad_bias = ga_op_bias_grad_result(st, op, g.outs[2], g.weight->dtype, N)))
        goto done;
    /* dZ with the bias gradient fused into the same pass when there is an
     * activation; without one, the dW GEMM sums it (a_row_sums) */
    int bias_in_gemm = g.need_b && g.act == GA_ACT_NONE && g.need_w;
    int64_t M, gy_row, x_row;
    if (!(gyv = rows_view(st, op, g.grad_y, &M, &gy_row)) ||
        !(dz = ga_op_activation_grad(st, op, gyv, g.aux, g.act, bias_in_gemm ? NULL : g.grad_bias,
                                     gyv->ndim - 1)))
        goto done;
    if (dz != gyv)
        collapse_leading(dz, 1, &M, &gy_row);
    ga_matrix dz_m = rows_matrix(dz, dz->dtype, M, N, gy_row);
    if (!(wv = ga_op_describable(st, op, g.weight)) || !(xv = rows_view(st, op, g.x, &M, &x_row)))
        goto done;
    if (g.need_x && !(g.grad_x = linear_grad_input(st, op, g.outs[0], g.x, &dz_m, dz, wv)))
        goto done;
    if (g.need_w && !(g.grad_weight = linear_grad_weight(st, op, g.outs[1], g.weight, &dz_m, dz, xv,
                                                         x_row, g.grad_bias, bias_in_gemm)))
        goto done;
    if (!g.need_w && g.need_b && g.act == GA_ACT_NONE) {
        /* no dW GEMM to fuse it into: a reduction of its own */
        ArrayObject *sums =
            ga_op_activation_grad(st, op, gyv, NULL, GA_ACT_NONE, g.grad_bias, gyv->ndim - 1);
        if (!sums)
            goto done;
        Py_DECREF(sums);
    }
    result = ga_backward_result(&g);
done:
    result = ga_op_settle_fallbacks(st, result);
    ga_backward_end(&g);
    Py_XDECREF(dz);
    Py_XDECREF(gyv);
    Py_XDECREF(xv);
    Py_XDECREF(wv);
    return result;
}

PyObject *ga_py_matmul(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return ga_op_profiled("gpuaccel::matmul", matmul_entry, module, args, nargs, kwnames);
}

PyObject *ga_py_linear(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return ga_op_profiled("gpuaccel::linear", linear_entry, module, args, nargs, kwnames);
}

PyObject *ga_py_linear_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    return ga_op_profiled("gpuaccel::linear_backward", linear_backward_entry, module, args, nargs,
                          kwnames);
}
