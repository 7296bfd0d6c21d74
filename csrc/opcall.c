/*
 * opcall.c — what every compute op call goes through, from its arguments to
 * its results: the opening (operands loaded and checked together, the
 * device and stream picked), argument readers, operands the backends can
 * describe, results (new or out=), stream bookkeeping around the CUDA work,
 * the activation gradient, and the profiler ranges around the call.  The
 * ops themselves are in matmul.c and conv.c.
 */
#include "npy.h"

#include <string.h>

#include "create.h"
#include "opcall.h"
#include "torch.h"
#include "transfer.h"

/* --------------------------------------------------------- the opening */

/* An operand as an Array (a new reference), without copying. */
static ArrayObject *load_operand(ga_state *st, PyObject *obj, const char *name)
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

static int load_operands(ga_state *st, ga_op *op)
{
    for (int k = 0; k < op->noperands; k++) {
        const ga_operand *o = &op->operands[k];
        int absent = !o->value || ((o->flags & GA_OPERAND_OPTIONAL) && o->value == Py_None);
        if (!absent && !(*o->array = load_operand(st, o->value, o->name)))
            return -1;
    }
    return 0;
}

static int check_same_device(const ga_op *op)
{
    const ga_operand *first = &op->operands[0];
    for (int k = 1; k < op->noperands; k++) {
        const ga_operand *o = &op->operands[k];
        if (*o->array && !ga_device_equal((*o->array)->device, (*first->array)->device)) {
            char a[32], b[32];
            PyErr_Format(PyExc_ValueError,
                         "%s: all inputs must be on one device, but %s is on %s and %s is on %s",
                         op->name, first->name, ga_device_str((*first->array)->device, a, sizeof a),
                         o->name, ga_device_str((*o->array)->device, b, sizeof b));
            return -1;
        }
    }
    return 0;
}

/* Appends "x", ", weight" or " and bias" to a list of `n` items so far. */
static void list_item(char *list, size_t size, const char *item, int n, int last)
{
    size_t used = strlen(list);
    snprintf(list + used, size - used, "%s%s", n == 0 ? "" : last ? " and " : ", ", item);
}

/* The lead operand is floating, and those that must share its dtype do. */
static int check_dtypes(const ga_op *op, const ArrayObject *lead, const char *lead_name)
{
    if (!ga_dtype_is_float(lead->dtype)) {
        PyErr_Format(PyExc_TypeError,
                     "%s: %s must be float16, bfloat16, float32 or float64, got %s", op->name,
                     lead_name, ga_dtype_name(lead->dtype));
        return -1;
    }
    int shared[GA_OP_MAX_OPERANDS], n = 0, mismatch = 0;
    for (int k = 0; k < op->noperands; k++) {
        const ArrayObject *a = *op->operands[k].array;
        if (a && !(op->operands[k].flags & GA_OPERAND_ANY_DTYPE)) {
            shared[n++] = k;
            mismatch |= a->dtype != lead->dtype;
        }
    }
    if (!mismatch)
        return 0;
    char names[128] = "", dtypes[128] = "";
    for (int j = 0; j < n; j++) {
        const ga_operand *o = &op->operands[shared[j]];
        list_item(names, sizeof names, o->name, j, j == n - 1);
        list_item(dtypes, sizeof dtypes, ga_dtype_name((*o->array)->dtype), j, j == n - 1);
    }
    PyErr_Format(PyExc_TypeError,
                 "%s: %s must share one dtype, got %s; cast them to the same dtype first", op->name,
                 names, dtypes);
    return -1;
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

/* stream="torch": torch's current stream whatever gpuaccel's is (what
 * gpuaccel.torch's layers ask, as torch's own ops would run there). */
static int is_torch_stream_request(PyObject *stream_obj)
{
    return PyUnicode_Check(stream_obj) &&
           PyUnicode_CompareWithASCIIString(stream_obj, "torch") == 0;
}

static int torch_stream(ga_state *st, int device, ga_stream *out)
{
    int found = ga_torch_current_stream(st, device, out);
    if (found == 0)
        *out = GA_STREAM_LEGACY; /* no torch CUDA: its ops would use no stream at all */
    return found < 0 ? -1 : 0;
}

/* The stream the op runs on, also as an object (None for a CPU op) for the
 * helpers that take one (ga_copy_into, ga_array_copy_to), so that their
 * copies queue on the very stream the op runs on. */
static int pick_stream(ga_state *st, ga_op *op, const ArrayObject *lead, PyObject *stream_obj)
{
    if (op->device.type != GA_DEVICE_CUDA) {
        op->stream_obj = Py_NewRef(Py_None);
        return 0;
    }
    int device = op->device.index;
    int on_torch_tensors = lead->base && ga_is_torch_tensor(st, lead->base);
    int rc;
    if (ga_ensure_cuda_device(st, device) < 0)
        return -1;
    if (stream_obj == NULL || stream_obj == Py_None)
        rc = default_stream(st, device, on_torch_tensors, &op->stream);
    else if (is_torch_stream_request(stream_obj))
        rc = torch_stream(st, device, &op->stream);
    else
        rc = ga_stream_from_object(st, stream_obj, device, &op->stream, "stream");
    if (rc < 0)
        return -1;
    op->cuda_stream = &op->stream;
    op->stream_obj = PyLong_FromVoidPtr((void *)op->stream);
    return op->stream_obj ? 0 : -1;
}

int ga_op_begin(ga_state *st, ga_op *op, const char *name, const ga_operand *operands, int n,
                PyObject *stream_obj)
{
    memset(op, 0, sizeof *op);
    op->name = name;
    op->noperands = n;
    const ga_operand *lead = &operands[0];
    for (int k = 0; k < n; k++) {
        op->operands[k] = operands[k];
        *operands[k].array = NULL;
        if (operands[k].flags & GA_OPERAND_LEAD)
            lead = &operands[k];
    }
    if (load_operands(st, op) < 0 || check_same_device(op) < 0 ||
        check_dtypes(op, *lead->array, lead->name) < 0)
        return -1;
    op->device = (*lead->array)->device;
    return pick_stream(st, op, *lead->array, stream_obj);
}

void ga_op_end(ga_op *op)
{
    for (int k = 0; k < op->noperands; k++)
        Py_CLEAR(*op->operands[k].array);
    Py_CLEAR(op->stream_obj);
}

/* ----------------------------------------------------------- arguments */

/* The names the ops take: every activation's own (kernels.h's
 * ga_activation_name), and "gelu_erf", the exact GELU by a name that never
 * warns. */
static const struct {
    const char *name;
    ga_activation act;
} activation_names[] = {
    {"none", GA_ACT_NONE},           {"relu", GA_ACT_RELU},           {"gelu", GA_ACT_GELU},
    {"gelu_erf", GA_ACT_GELU},       {"gelu_tanh", GA_ACT_GELU_TANH}, {"silu", GA_ACT_SILU},
    {"hardswish", GA_ACT_HARDSWISH}, {"sigmoid", GA_ACT_SIGMOID},
};

/* "gelu" meant the tanh approximation before it meant nn.GELU()'s exact
 * form: an old script that asks for it would change its numerics without
 * a word, so the first request in a process says so (a FutureWarning that
 * a filter silences; "gelu_erf" and "gelu_tanh" say which is meant and
 * never warn). */
static int warn_gelu_changed(ga_state *st, int stacklevel)
{
    if (st->gelu_warned)
        return 0;
    if (PyErr_WarnEx(st->GeluChangedWarning,
                     "gpuaccel: activation='gelu' now means the exact (erf) GELU of nn.GELU(); "
                     "earlier gpuaccel versions computed its tanh approximation, now spelled "
                     "'gelu_tanh'. Pass 'gelu_tanh' to keep the old numerics, or 'gelu_erf' to "
                     "say you mean the exact form (neither warns).",
                     stacklevel) < 0)
        return -1;
    st->gelu_warned = 1;
    return 0;
}

static int parse_activation(ga_state *st, PyObject *obj, ga_activation *out, const char *op,
                            int stacklevel)
{
    const char *name = obj == NULL || obj == Py_None ? "none" : ga_exact_utf8(obj);
    for (size_t k = 0; name && k < sizeof activation_names / sizeof activation_names[0]; k++) {
        if (strcmp(name, activation_names[k].name) != 0)
            continue;
        *out = activation_names[k].act;
        return strcmp(name, "gelu") == 0 ? warn_gelu_changed(st, stacklevel) : 0;
    }
    PyErr_Format(PyExc_ValueError,
                 "%s: activation must be None, 'relu', 'gelu' (exact, as nn.GELU()), "
                 "'gelu_tanh' (its tanh approximation), 'silu', 'hardswish' or 'sigmoid', got %R",
                 op, obj);
    return -1;
}

int ga_op_activation(ga_state *st, PyObject *obj, ga_activation *out, const char *op)
{
    /* a C function has no frame of its own: 1 is the op's caller */
    return parse_activation(st, obj, out, op, 1);
}

PyObject *ga_py_activation_name(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "_activation_name() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    const char *caller = ga_exact_utf8(args[1]);
    long stacklevel = PyLong_Check(args[2]) ? PyLong_AsLong(args[2]) : -1;
    if (!caller || stacklevel < 1 || stacklevel > 100) {
        if (!PyErr_Occurred())
            PyErr_SetString(
                PyExc_TypeError,
                "_activation_name(): caller must be a str and stacklevel an int in [1, 100]");
        return NULL;
    }
    ga_activation act;
    if (parse_activation(ga_state_from_module(module), args[0], &act, caller, (int)stacklevel) < 0)
        return NULL;
    return PyUnicode_FromString(ga_activation_name(act));
}

int ga_op_flag(PyObject *obj, int default_value)
{
    return obj ? PyObject_IsTrue(obj) : default_value;
}

static int grad_outs(PyObject *obj, PyObject *outs[3], const char *op)
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

/* ------------------------------------ the opening of the ops with weights */

int ga_forward_parse(ga_state *st, ga_forward *f, const char *name, PyObject *save_preactivation,
                     PyObject *activation)
{
    memset(f, 0, sizeof *f);
    f->op.name = name;
    f->save = ga_op_flag(save_preactivation, 0);
    if (f->save < 0)
        return -1;
    return ga_op_activation(st, activation, &f->act, name);
}

int ga_forward_begin(ga_state *st, ga_forward *f, PyObject *x, PyObject *weight, PyObject *bias,
                     PyObject *stream_obj)
{
    const ga_operand operands[] = {
        {"x", x, &f->x, GA_OPERAND_LEAD},
        {"weight", weight, &f->weight, 0},
        {"bias", bias, &f->bias, GA_OPERAND_OPTIONAL},
    };
    return ga_op_begin(st, &f->op, f->op.name, operands, 3, stream_obj);
}

PyObject *ga_forward_result(const ga_forward *f)
{
    if (!f->save)
        return Py_NewRef(f->y);
    PyObject *aux = f->act == GA_ACT_NONE                     ? Py_None
                    : ga_activation_grad_reads_output(f->act) ? (PyObject *)f->y
                                                              : (PyObject *)f->z;
    return PyTuple_Pack(2, (PyObject *)f->y, aux);
}

void ga_forward_end(ga_forward *f)
{
    ga_op_end(&f->op);
    Py_CLEAR(f->x_read);
    Py_CLEAR(f->weight_read);
    Py_CLEAR(f->y);
    Py_CLEAR(f->z);
}

int ga_backward_parse(ga_state *st, ga_backward *b, const char *name, PyObject *out,
                      PyObject *needs_input_grad, PyObject *needs_weight_grad,
                      PyObject *needs_bias_grad, PyObject *activation)
{
    memset(b, 0, sizeof *b);
    b->op.name = name;
    if (grad_outs(out, b->outs, name) < 0)
        return -1;
    b->need_x = ga_op_flag(needs_input_grad, 1);
    b->need_w = ga_op_flag(needs_weight_grad, 1);
    b->need_b = ga_op_flag(needs_bias_grad, 1);
    if (b->need_x < 0 || b->need_w < 0 || b->need_b < 0)
        return -1;
    return ga_op_activation(st, activation, &b->act, name);
}

int ga_backward_begin(ga_state *st, ga_backward *b, PyObject *grad_y, PyObject *x, PyObject *weight,
                      PyObject *aux, PyObject *stream_obj)
{
    const ga_operand operands[] = {
        {"grad_y", grad_y, &b->grad_y, 0},
        {"x", x, &b->x, GA_OPERAND_LEAD},
        {"weight", weight, &b->weight, 0},
        {"preactivation", aux, &b->aux, GA_OPERAND_OPTIONAL},
    };
    return ga_op_begin(st, &b->op, b->op.name, operands, 4, stream_obj);
}

PyObject *ga_backward_result(const ga_backward *b)
{
    PyObject *gx = b->grad_x ? (PyObject *)b->grad_x : Py_None;
    PyObject *gw = b->grad_weight ? (PyObject *)b->grad_weight : Py_None;
    PyObject *gb = b->grad_bias ? (PyObject *)b->grad_bias : Py_None;
    return PyTuple_Pack(3, gx, gw, gb);
}

void ga_backward_end(ga_backward *b)
{
    ga_op_end(&b->op);
    Py_CLEAR(b->grad_x);
    Py_CLEAR(b->grad_weight);
    Py_CLEAR(b->grad_bias);
}

/* ------------------------------------------------ operands and results */

static int element_strides_ok(ArrayObject *a)
{
    int64_t itemsize = (int64_t)ga_dtype_itemsize(a->dtype);
    for (int d = 0; d < a->ndim; d++)
        if (a->strides[d] % itemsize)
            return 0;
    return 1;
}

ArrayObject *ga_op_describable(ga_state *st, const ga_op *op, ArrayObject *a)
{
    if (element_strides_ok(a))
        return (ArrayObject *)Py_NewRef(a);
    return ga_array_copy_to(st, a, a->device, a->dtype, 0, op->stream_obj);
}

int ga_op_dense_bias(ga_state *st, const ga_op *op, ArrayObject **bias)
{
    if (!*bias || ga_array_is_contiguous(*bias))
        return 0;
    ArrayObject *c =
        ga_array_copy_to(st, *bias, (*bias)->device, (*bias)->dtype, 0, op->stream_obj);
    if (!c)
        return -1;
    Py_SETREF(*bias, c);
    return 0;
}

ArrayObject *ga_op_empty(ga_state *st, const ga_op *op, ga_dtype dtype, int ndim,
                         const int64_t *shape)
{
    return ga_array_empty(st, dtype, ndim, shape, op->device, 0, op->cuda_stream);
}

int ga_op_check_bias(const char *op, const ArrayObject *bias, int64_t n, const char *what)
{
    if (!bias || (bias->ndim == 1 && bias->shape[0] == n))
        return 0;
    PyObject *given = ga_int64_tuple(bias->ndim, bias->shape);
    if (given)
        PyErr_Format(PyExc_ValueError, "%s: bias must have shape (%lld,) (%s), got shape %R", op,
                     (long long)n, what, given);
    Py_XDECREF(given);
    return -1;
}

ArrayObject *ga_op_result(ga_state *st, const ga_op *op, PyObject *out_obj, ga_dtype dtype,
                          int ndim, const int64_t *shape)
{
    if (!out_obj || out_obj == Py_None)
        return ga_op_empty(st, op, dtype, ndim, shape);
    ArrayObject *out = load_operand(st, out_obj, "out");
    if (!out)
        return NULL;
    int ok = out->ndim == ndim && memcmp(out->shape, shape, (size_t)ndim * 8) == 0;
    if (!ok || out->dtype != dtype || !ga_device_equal(out->device, op->device) ||
        (out->flags & GA_ARRAY_READONLY) || !element_strides_ok(out)) {
        PyObject *want = ga_int64_tuple(ndim, shape);
        PyObject *given = want ? ga_int64_tuple(out->ndim, out->shape) : NULL;
        char dev[32], out_dev[32];
        if (given)
            PyErr_Format(PyExc_ValueError,
                         "%s: out must be a writable %s array of shape %R on %s; got one of shape "
                         "%R, dtype %s on %s%s%s",
                         op->name, ga_dtype_name(dtype), want,
                         ga_device_str(op->device, dev, sizeof dev), given,
                         ga_dtype_name(out->dtype),
                         ga_device_str(out->device, out_dev, sizeof out_dev),
                         (out->flags & GA_ARRAY_READONLY) ? ", read-only" : "",
                         element_strides_ok(out) ? ""
                                                 : ", with strides that are not a whole number "
                                                   "of elements");
        Py_XDECREF(want);
        Py_XDECREF(given);
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

ArrayObject *ga_op_bias_grad_result(ga_state *st, const ga_op *op, PyObject *out_obj,
                                    ga_dtype dtype, int64_t channels)
{
    ArrayObject *gb = ga_op_result(st, op, out_obj, dtype, 1, &channels);
    if (gb && !ga_array_is_contiguous(gb)) {
        PyErr_Format(PyExc_ValueError, "%s: out grad_bias must be contiguous", op->name);
        Py_CLEAR(gb);
    }
    return gb;
}

int ga_op_prepare(ga_state *st, const ga_op *op, ArrayObject *const *arrays, int n)
{
    for (int k = 0; op->cuda_stream && k < n; k++)
        if (arrays[k] && ga_array_prepare_stream(st, arrays[k], op->stream) < 0)
            return -1;
    return 0;
}

int ga_op_record(ga_state *st, const ga_op *op, ArrayObject *const *arrays, int n)
{
    for (int k = 0; op->cuda_stream && k < n; k++)
        if (arrays[k] && ga_array_record_stream(st, arrays[k], op->stream) < 0)
            return -1;
    return 0;
}

/* ------------------------------------------------- activation gradient */

/* An uninitialised array of a's shape in a's memory order when a is a
 * dense permutation (channels-last, a transpose), else C-contiguous — like
 * torch.empty_like(a): an activation gradient laid out as its grad keeps
 * the kernels that read both on their fast (NHWC) path. */
static ArrayObject *empty_like(ga_state *st, const ga_op *op, const ArrayObject *a)
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
        return ga_op_empty(st, op, a->dtype, n, a->shape);
    /* {0}: GCC at -O1 cannot see that the loop below fills shape[0..n) */
    int64_t shape[GA_MAX_NDIM] = {0}, strides[GA_MAX_NDIM];
    for (int i = 0; i < n; i++)
        shape[i] = a->shape[order[i]];
    ArrayObject *base = ga_op_empty(st, op, a->dtype, n, shape);
    if (!base)
        return NULL;
    for (int i = 0; i < n; i++)
        strides[order[i]] = base->strides[i];
    ArrayObject *v = ga_array_view(st, base, base->data, n, a->shape, strides);
    Py_DECREF(base);
    return v;
}

ArrayObject *ga_op_activation_grad(ga_state *st, const ga_op *op, ArrayObject *grad,
                                   ArrayObject *aux, ga_activation act, ArrayObject *bias_grad,
                                   int channel_dim)
{
    ArrayObject *dz = NULL;
    if (act == GA_ACT_NONE && !bias_grad)
        return (ArrayObject *)Py_NewRef(grad);
    if (act != GA_ACT_NONE && !(dz = empty_like(st, op, grad)))
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
        Py_BEGIN_ALLOW_THREADS
        status = ga_cpu_activation_backward(&d);
        Py_END_ALLOW_THREADS
    } else {
        ArrayObject *touched[4] = {grad, aux, dz, bias_grad};
        if (ga_op_prepare(st, op, touched, 4) < 0)
            goto error;
        status = ga_cuda_activation_backward(grad->device.index, &d, op->stream);
        if (!status.error && ga_op_record(st, op, touched, 4) < 0)
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

/* ------------------------------------------------------------ profiling */

PyObject *ga_op_profiled(const char *name, ga_op_entry entry, PyObject *module,
                         PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    ga_state *st = ga_state_from_module(module);
    PyObject *range = ga_torch_profile_begin(st, name);
    ga_cuda_range_push(name);
    PyObject *result = entry(module, args, nargs, kwnames);
    ga_cuda_range_pop();
    ga_torch_profile_end(st, range);
    return result;
}
