/*
 * opcall.h — what every compute op call goes through (opcall.c): the opening
 * (operands loaded and checked together, the stream picked), arguments,
 * operands and results, the activation gradient, profiling.
 */
#ifndef GPUACCEL_OPCALL_H
#define GPUACCEL_OPCALL_H

#include "array.h"

/* ---- the opening */
#define GA_OP_MAX_OPERANDS 4

enum {
    GA_OPERAND_LEAD = 1 << 0,      /* floating; its device and dtype are the op's */
    GA_OPERAND_OPTIONAL = 1 << 1,  /* absent when its value is NULL or None */
    GA_OPERAND_ANY_DTYPE = 1 << 2, /* need not have the lead's dtype */
};

/* An array operand as the op was given it. */
typedef struct {
    const char *name;    /* the argument's name, for messages */
    PyObject *value;     /* what was passed */
    ArrayObject **array; /* where the loaded Array goes (NULL when absent) */
    int flags;           /* GA_OPERAND_... */
} ga_operand;

/* An op under way: its operands (owned through their `array` pointers) and
 * the stream it runs on. */
typedef struct {
    const char *name; /* "matmul", ...: names the op in messages */
    ga_operand operands[GA_OP_MAX_OPERANDS];
    int noperands;
    ga_device device;             /* where it runs: its lead operand's device */
    ga_stream stream;             /* CUDA: the stream it runs on */
    const ga_stream *cuda_stream; /* &stream for a CUDA op, NULL for a CPU op */
    PyObject *stream_obj;         /* the stream as an object for copies (None on the CPU) */
} ga_op;

/* Loads an op's operands without copying (Arrays, torch tensors, anything
 * that exports DLPack or __cuda_array_interface__), checks that they are on
 * one device and share the lead's floating dtype, and picks the stream:
 * `stream=` when given, else gpuaccel's current stream when one is set
 * (`with stream:`), else torch's current stream for torch tensors, else
 * the legacy default stream.  Call ga_op_end afterwards, on failure too. */
int ga_op_begin(ga_state *st, ga_op *op, const char *name, const ga_operand *operands, int n,
                PyObject *stream_obj);
/* Releases the operands (what their `array` pointers hold then) and the
 * stream object. */
void ga_op_end(ga_op *op);

/* ---- the opening of the ops with weights */
/* linear or conv2d: what it is asked for, its operands and results. */
typedef struct {
    ga_op op;
    ga_activation act;
    int save; /* save_preactivation */
    ArrayObject *x, *weight, *bias;
    ArrayObject *x_read, *weight_read; /* x and weight as the kernels read them */
    ArrayObject *y, *z;                /* the output, and the pre-activation when kept (gelu) */
} ga_forward;

/* Reads save_preactivation (False when absent) and the activation.  On
 * failure nothing is held. */
int ga_forward_parse(ga_state *st, ga_forward *f, const char *name, PyObject *save_preactivation,
                     PyObject *activation);
/* ga_op_begin with x (the lead), weight and bias (optional). */
int ga_forward_begin(ga_state *st, ga_forward *f, PyObject *x, PyObject *weight, PyObject *bias,
                     PyObject *stream_obj);
/* y, or with save_preactivation (y, aux), aux being the pre-activation z
 * for gelu, y itself for relu (relu'(z) is y > 0) and None without an
 * activation. */
PyObject *ga_forward_result(const ga_forward *f);
/* Releases the operands, the results and the op. */
void ga_forward_end(ga_forward *f);

/* linear_backward or conv2d_backward: the same. */
typedef struct {
    ga_op op;
    ga_activation act;
    int need_x, need_w, need_b; /* needs_input_grad, needs_weight_grad, needs_bias_grad */
    PyObject *outs[3];          /* out=(grad_x, grad_weight, grad_bias); NULL: allocate */
    ArrayObject *grad_y, *x, *weight, *aux; /* aux: what act's derivative reads, or NULL */
    ArrayObject *grad_x, *grad_weight, *grad_bias;
} ga_backward;

/* Reads out= (a tuple of arrays, or of None to let gpuaccel allocate that
 * one), the needs_*_grad flags (True when absent) and the activation.  On
 * failure nothing is held. */
int ga_backward_parse(ga_state *st, ga_backward *b, const char *name, PyObject *out,
                      PyObject *needs_input_grad, PyObject *needs_weight_grad,
                      PyObject *needs_bias_grad, PyObject *activation);
/* ga_op_begin with grad_y, x (the lead), weight and aux (NULL: none). */
int ga_backward_begin(ga_state *st, ga_backward *b, PyObject *grad_y, PyObject *x, PyObject *weight,
                      PyObject *aux, PyObject *stream_obj);
/* (grad_x, grad_weight, grad_bias), None for those not asked for. */
PyObject *ga_backward_result(const ga_backward *b);
/* Releases the operands, the results and the op. */
void ga_backward_end(ga_backward *b);

/* ---- profiling */
/* An op's Python entry point (METH_FASTCALL | METH_KEYWORDS). */
typedef PyObject *(*ga_op_entry)(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames);
/* Calls `entry` inside a torch.profiler range `name` ("gpuaccel::<op>")
 * while torch's profiler records (and without one otherwise, at the cost of
 * one check), so a profiled training step names gpuaccel's ops on the CPU
 * too; and inside an NVTX range of the same name (ga_cuda_range_push), for
 * Nsight Systems. */
PyObject *ga_op_profiled(const char *name, ga_op_entry entry, PyObject *module,
                         PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* ---- arguments */
/* An activation by name: None or "none", "relu", "gelu" (the exact erf
 * GELU; the first "gelu" of a process warns that it once meant the tanh
 * form), "gelu_erf" (the same, never warning), "gelu_tanh", "silu",
 * "hardswish", "sigmoid"; a ValueError naming `op` otherwise. */
int ga_op_activation(ga_state *st, PyObject *obj, ga_activation *out, const char *op);
/* gpuaccel._C._activation_name(activation, caller, stacklevel): the
 * activation's own name ("none" for None) as the ops parse it, warning at
 * `stacklevel` (warnings.warn's) for "gelu" — the one parser and one
 * warning for gpuaccel.torch too. */
PyObject *ga_py_activation_name(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* A truth value, `default_value` when absent; -1 with an exception. */
int ga_op_flag(PyObject *obj, int default_value);

/* ---- operands and results */
/* A bias, if given, must be a vector of length `n` (`what` says what n
 * counts); otherwise a ValueError that names the shape given. */
int ga_op_check_bias(const char *op, const ArrayObject *bias, int64_t n, const char *what);
/* An operand the backend can describe: element strides (a copy, on the
 * op's stream, otherwise). */
ArrayObject *ga_op_describable(ga_state *st, const ga_op *op, ArrayObject *a);
/* The kernels read a bias as a dense vector: a strided one (a view with a
 * step, reversed, broadcast) is replaced by a copy. */
int ga_op_dense_bias(ga_state *st, const ga_op *op, ArrayObject **bias);
/* A new contiguous array on the op's device and stream. */
ArrayObject *ga_op_empty(ga_state *st, const ga_op *op, ga_dtype dtype, int ndim,
                         const int64_t *shape);
/* A new contiguous array, or `out_obj` (NULL/None: none) checked against
 * what the op writes. */
ArrayObject *ga_op_result(ga_state *st, const ga_op *op, PyObject *out_obj, ga_dtype dtype,
                          int ndim, const int64_t *shape);
/* A backward op's grad_bias (`channels` long): new, or `out_obj` checked,
 * which must be contiguous too (the kernels write it densely). */
ArrayObject *ga_op_bias_grad_result(ga_state *st, const ga_op *op, PyObject *out_obj,
                                    ga_dtype dtype, int64_t channels);
/* Around the op's CUDA work on arrays (NULL entries skipped; nothing on the
 * CPU): the first use of gpuaccel memory on a new stream waits for its
 * allocation, and the uses are recorded for frees and reuses to wait on. */
int ga_op_prepare(ga_state *st, const ga_op *op, ArrayObject *const *arrays, int n);
int ga_op_record(ga_state *st, const ga_op *op, ArrayObject *const *arrays, int n);
/* dz = grad * act'(aux) (grad itself without an activation), with the
 * bias gradient (the sum over every dim but channel_dim) into bias_grad
 * when given, in one pass. */
ArrayObject *ga_op_activation_grad(ga_state *st, const ga_op *op, ArrayObject *grad,
                                   ArrayObject *aux, ga_activation act, ArrayObject *bias_grad,
                                   int channel_dim);

#endif
