/*
 * state.h — the module state every csrc/ file reaches its types, exceptions
 * and torch lookups through, and the few facts of the interpreter they
 * share.  The ground floor of csrc/ (csrc/README.md lists the layers).
 */
#ifndef GPUACCEL_STATE_H
#define GPUACCEL_STATE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

#include "../kernels/kernels.h"

/* The ops whose float32 form may use TF32 tensor cores, each with its own
 * setting (settings.c) and torch flag (torch.c). */
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
    PyObject *FallbackError;      /* a fallback under set_fallback_policy("raise") */
    PyObject *FallbackWarning;    /* a fallback under "warn" (a UserWarning) */
    PyObject *GeluChangedWarning; /* "gelu" asked for: it is erf now (a FutureWarning) */
    int gelu_warned;              /* GeluChangedWarning given once already */
    PyObject *current_stream;     /* contextvars.ContextVar: the Stream made current by `with` */
    PyObject *default_device;     /* a Device */
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

/* Work smaller than this runs with the GIL held: releasing it costs more. */
#define GA_NOGIL_THRESHOLD_BYTES (256 * 1024)

/* True while the interpreter shuts down: deleters then leave memory alone. */
#if PY_VERSION_HEX >= 0x030D0000
#define ga_is_finalizing() Py_IsFinalizing()
#else
#define ga_is_finalizing() _Py_IsFinalizing()
#endif

#endif
