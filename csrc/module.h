/*
 * module.h — module state and the helpers every csrc/ file uses.
 *
 * csrc/ in layers, each .c file with its own header; a file calls only
 * the files on its own line of this list or above it:
 *
 *   module.h, errors.c, args.c   state, the error translator, arguments
 *   device.c                     devices, streams, events, current stream
 *   alloc.c                      one allocator per memory kind
 *   dtype.c                      dtype names and NumPy/torch/PEP 3118 forms
 *   array.c                      the Array object's core: struct, makers,
 *                                views, geometry, stream bookkeeping
 *   transfer.c                   copies, casts, fills, conversions
 *   dlpack.c                     DLPack and __cuda_array_interface__
 *   torch.c                      torch tensors without DLPack, torch's stream
 *   create.c                     asarray, empty / zeros / ones / full
 *   array_type.c                 the gpuaccel.Array type's methods and slots
 *   ops.c                        what the ops share: settings, statistics,
 *                                workspaces, operands, results, streams
 *   matmul.c, conv.c             the ops: matmul, linear, conv2d, backward
 *   image.c, loader.c, logger.c  image specs; PinnedLoader and LossLogger
 *   module.c                     the module: types, method table
 */
#ifndef GPUACCEL_MODULE_H
#define GPUACCEL_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

#include "../kernels/kernels.h"

/* The ops whose float32 form may use TF32 tensor cores, each with its own
 * setting (ops.c) and torch flag (torch.c). */
typedef enum { GA_TF32_MATMUL, GA_TF32_CONV, GA_TF32_OPS } ga_tf32_op;

/* Everything the module owns; reached from a type with
 * ga_state_from_type() or from the module with ga_state_from_module(). */
typedef struct {
    PyTypeObject *ArrayType;
    PyTypeObject *DeviceType;
    PyTypeObject *StreamType;
    PyTypeObject *EventType;
    PyTypeObject *LoaderIterType;
    PyTypeObject *LoggerType;
    PyObject *CudaError;
    PyObject *OutOfMemoryError;
    PyObject *CublasError;
    PyObject *CudnnError;
    PyObject *FallbackError;   /* a fallback under set_fallback_policy("raise") */
    PyObject *FallbackWarning; /* a fallback under "warn" (a UserWarning) */
    PyObject *current_stream;  /* contextvars.ContextVar: the Stream made current by `with` */
    PyObject *default_device;  /* a Device */
    /* ml_dtypes' bfloat16 NumPy dtype, or Py_None if unavailable; NULL before first use */
    PyObject *bfloat16_descr;
    /* torch, looked up by torch.c once the user has imported it: its Tensor
     * type, its dtype objects by gpuaccel dtype and its stream lookup */
    PyObject *torch_tensor_type;
    PyObject *torch_dtypes[GA_NUM_DTYPES];
    PyObject *torch_raw_stream; /* torch._C._cuda_getCurrentRawStream, or NULL */
    /* torch >= 2.9's DLPack C exchange table (NULL for older torch), and the
     * tensor types it is used for: torch.Tensor and nn.Parameter exactly
     * (subclasses may override what their data is: they take the Python
     * path) */
    const struct DLPackExchangeAPI *torch_exchange_api;
    PyObject *torch_parameter_type;
    PyObject *torch_is_neg; /* torch.Tensor.is_neg, the unbound method */
    /* torch's profiler: whether it records (torch._C._autograd._profiler_enabled),
     * and, looked up at the first recorded range, the ops that open and close
     * one (torch.ops.profiler._record_function_enter_new / _exit) */
    PyObject *torch_profiler_enabled;
    PyObject *torch_record_enter;
    PyObject *torch_record_exit;
    /* torch's TF32 flags for float32 CUDA ops (torch.c), indexed by
     * ga_tf32_op: torch._C._get_fp32_precision_getter with its arguments
     * ("cuda", "matmul" | "conv"), or, for a torch without that API, the
     * no-argument getters _get_cublas_allow_tf32 / _get_cudnn_allow_tf32 */
    PyObject *torch_fp32_precision;
    PyObject *torch_fp32_args[GA_TF32_OPS][2];
    PyObject *torch_allow_tf32[GA_TF32_OPS];
    PyObject *str_requires_grad; /* "requires_grad" */
    /* interned names and constants of the DLPack exchange (a hot path) */
    PyObject *str_dlpack;                /* "__dlpack__" */
    PyObject *str_dlpack_device;         /* "__dlpack_device__" */
    PyObject *str_dlpack_c_exchange_api; /* "__dlpack_c_exchange_api__" */
    PyObject *str_cuda_array_interface;
    PyObject *kw_max_version;        /* ("max_version",) */
    PyObject *kw_max_version_stream; /* ("max_version", "stream") */
    PyObject *kw_stream;             /* ("stream",) */
    PyObject *dlpack_max_version;    /* (1, 1) */
} ga_state;

extern PyModuleDef ga_module_def;

static inline ga_state *ga_state_from_module(PyObject *module)
{
    return (ga_state *)PyModule_GetState(module);
}

/* For methods of gpuaccel's heap types (and their subclasses). */
static inline ga_state *ga_state_from_type(PyTypeObject *type)
{
    PyObject *module = PyType_GetModuleByDef(type, &ga_module_def);
    return module ? ga_state_from_module(module) : NULL;
}

/* errors.c — the one translator from a backend status to a Python
 * exception.  Always returns -1, so `return ga_raise(st, status);` works in
 * int-returning functions. */
int ga_raise(ga_state *st, ga_status status);
/* The message ga_raise gives a status (call, library name and code, text,
 * source line), for the places that cannot raise. */
const char *ga_status_text(ga_status status, char *buf, size_t size);

/* Runs `expr` (a ga_status); on failure raises and jumps to `error`. */
#define GA_CHECK(st, expr)              \
    do {                                \
        ga_status ga_status_ = (expr);  \
        if (ga_status_.error) {         \
            ga_raise((st), ga_status_); \
            goto error;                 \
        }                               \
    } while (0)

/* The same, releasing the GIL around the call (which must touch no Python
 * object). */
#define GA_CHECK_NOGIL(st, expr)        \
    do {                                \
        ga_status ga_status_;           \
        Py_BEGIN_ALLOW_THREADS          \
        ga_status_ = (expr);            \
        Py_END_ALLOW_THREADS            \
        if (ga_status_.error) {         \
            ga_raise((st), ga_status_); \
            goto error;                 \
        }                               \
    } while (0)

/* ---- args.c */
/* A tuple of Python ints (a shape, strides) for attributes and messages;
 * NULL with an exception. */
PyObject *ga_int64_tuple(int n, const int64_t *values);
/* The UTF-8 text of a str argument, or NULL (no exception set) when obj is
 * not a str, is not encodable or holds a NUL ("gelu\0x" must not pass for
 * "gelu").  Valid while obj lives. */
const char *ga_exact_utf8(PyObject *obj);
/* getattr that tells a missing attribute (0, *result NULL) from one whose
 * lookup raised something else (-1, exception set: a property that fails
 * must not pass for "no such interface"); 1 with a new reference. */
int ga_lookup_attr(PyObject *obj, PyObject *name, PyObject **result);
int ga_has_attr(PyObject *obj, PyObject *name);
/* Parses METH_FASTCALL arguments by name: `names` is NULL-terminated; the
 * first `max_positional` may come positionally and the first `required`
 * must come.  values[i] is a borrowed reference, or NULL when absent. */
int ga_parse_args(const char *func, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                  const char *const *names, int max_positional, int required, PyObject **values);
/* An argument read into a field of a struct of PyObject pointers: its
 * name, which GA_ARG makes the field's name too, and the field's offset. */
typedef struct {
    const char *name;
    size_t offset;
} ga_arg_field;
/* a brace initializer in a macro, which clang-format 14 splits apart */
/* clang-format off */
#define GA_ARG(type, field) {#field, offsetof(type, field)}
/* clang-format on */
/* ga_parse_args into the fields of *out that `fields` lists, in their
 * positional order and ended by {NULL, 0}. */
int ga_parse_args_into(const char *func, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                       const ga_arg_field *fields, int max_positional, int required, void *out);
/* Parses copy=None/True/False (NULL: None) into -1/1/0. */
int ga_copy_flag_from_object(PyObject *obj, int *out);

/* Work smaller than this runs with the GIL held: releasing it costs more. */
#define GA_NOGIL_THRESHOLD_BYTES (256 * 1024)

/* True while the interpreter shuts down: deleters then leave memory alone. */
#if PY_VERSION_HEX >= 0x030D0000
#define ga_is_finalizing() Py_IsFinalizing()
#else
#define ga_is_finalizing() _Py_IsFinalizing()
#endif

/* The type's name, for error messages. */
const char *ga_type_name(PyObject *obj);

/* Formats a byte count as "1.50 GiB" into buf. */
const char *ga_format_bytes(uint64_t bytes, char *buf, size_t size);

#endif
