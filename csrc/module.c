/*
 * module.c — gpuaccel._C: multi-phase initialisation, module state, the
 * exception hierarchy and the method table.
 */
#define GA_NUMPY_IMPORT
#include "npy.h"

#include "alloc.h"
#include "args.h"
#include "array_type.h"
#include "conv.h"
#include "create.h"
#include "event.h"
#include "dlpack.h"
#include "dtype.h"
#include "loader.h"
#include "logger.h"
#include "matmul.h"
#include "opcall.h"
#include "fallback.h"
#include "settings.h"

PyDoc_STRVAR(cuda_error_doc, "A CUDA runtime call failed.\n\n"
                             ".code is the library's status code, .name its name (e.g. "
                             "'cudaErrorIllegalAddress') and .call the call that failed.");
PyDoc_STRVAR(oom_doc, "An allocation failed: the device (or host) is out of memory, or the "
                      "limit set with gpuaccel.set_memory_limit() would be exceeded.");
PyDoc_STRVAR(cublas_error_doc, "A cuBLAS / cuBLASLt call failed (.code is a cublasStatus_t).");
PyDoc_STRVAR(cudnn_error_doc, "A cuDNN call failed (.code is a cudnnStatus_t).");
PyDoc_STRVAR(fallback_error_doc,
             "A CUDA op could not run as the library call it asked for, for a reason that may "
             "hide a bug or a broken installation, under gpuaccel.set_fallback_policy('raise').\n\n"
             ".name is the reason (see matmul_stats()['fallback_reasons']), .code the library's "
             "status, .call the op.");
PyDoc_STRVAR(gelu_changed_doc,
             "activation='gelu' was asked for: it means the exact (erf) GELU of nn.GELU(), "
             "where earlier gpuaccel versions computed the tanh approximation (now 'gelu_tanh'). "
             "Shown once per process; 'gelu_erf' and 'gelu_tanh' name the form meant and never "
             "warn.  A FutureWarning, so `warnings.filterwarnings('ignore', "
             "category=gpuaccel.GeluChangedWarning)` silences it.");
PyDoc_STRVAR(fallback_warning_doc,
             "A CUDA op fell back from the library call it asked for (see FallbackError); shown "
             "once per op and reason under gpuaccel.set_fallback_policy('warn'), the default.");

static PyObject *new_exception(PyObject *module, const char *name, const char *doc, PyObject *bases)
{
    PyObject *dict =
        Py_BuildValue("{s:O,s:O,s:O}", "code", Py_None, "name", Py_None, "call", Py_None);
    if (!dict)
        return NULL;
    char qualified[64];
    snprintf(qualified, sizeof qualified, "gpuaccel.%s", name);
    PyObject *exc = PyErr_NewExceptionWithDoc(qualified, doc, bases, dict);
    Py_DECREF(dict);
    if (exc && PyModule_AddObjectRef(module, name, exc) < 0)
        Py_CLEAR(exc);
    return exc;
}

static int add_exceptions(PyObject *module, ga_state *st)
{
    PyObject *bases = NULL;
    st->CudaError = new_exception(module, "CudaError", cuda_error_doc, PyExc_RuntimeError);
    if (!st->CudaError)
        return -1;
    bases = PyTuple_Pack(2, st->CudaError, PyExc_MemoryError);
    if (!bases)
        return -1;
    st->OutOfMemoryError = new_exception(module, "OutOfMemoryError", oom_doc, bases);
    Py_DECREF(bases);
    if (!st->OutOfMemoryError)
        return -1;
    st->CublasError = new_exception(module, "CublasError", cublas_error_doc, st->CudaError);
    st->CudnnError = new_exception(module, "CudnnError", cudnn_error_doc, st->CudaError);
    st->FallbackError =
        new_exception(module, "FallbackError", fallback_error_doc, PyExc_RuntimeError);
    st->FallbackWarning = PyErr_NewExceptionWithDoc("gpuaccel.FallbackWarning",
                                                    fallback_warning_doc, PyExc_UserWarning, NULL);
    if (st->FallbackWarning &&
        PyModule_AddObjectRef(module, "FallbackWarning", st->FallbackWarning) < 0)
        Py_CLEAR(st->FallbackWarning);
    st->GeluChangedWarning = PyErr_NewExceptionWithDoc("gpuaccel.GeluChangedWarning",
                                                       gelu_changed_doc, PyExc_FutureWarning, NULL);
    if (st->GeluChangedWarning &&
        PyModule_AddObjectRef(module, "GeluChangedWarning", st->GeluChangedWarning) < 0)
        Py_CLEAR(st->GeluChangedWarning);
    return st->CublasError && st->CudnnError && st->FallbackError && st->FallbackWarning &&
                   st->GeluChangedWarning
               ? 0
               : -1;
}

static PyTypeObject *add_type(PyObject *module, PyType_Spec *spec)
{
    PyTypeObject *type = (PyTypeObject *)PyType_FromModuleAndSpec(module, spec, NULL);
    if (type && PyModule_AddType(module, type) < 0)
        Py_CLEAR(type);
    return type;
}

static int add_dtype_names(PyObject *module)
{
    /* gpuaccel.float32 == "float32", etc.: dtypes are plain strings. */
    for (int d = 0; d < GA_NUM_DTYPES; d++) {
        const char *name = ga_dtype_name((ga_dtype)d);
        const char *attr = strcmp(name, "bool") == 0 ? "bool_" : name;
        if (PyModule_AddStringConstant(module, attr, name) < 0)
            return -1;
    }
    return 0;
}

static int module_exec(PyObject *module)
{
    ga_state *st = ga_state_from_module(module);
    if (PyArray_ImportNumPyAPI() < 0)
        return -1;
    if (add_exceptions(module, st) < 0)
        return -1;
    if (!(st->DeviceType = add_type(module, &ga_device_spec)) ||
        !(st->StreamType = add_type(module, &ga_stream_spec)) ||
        !(st->EventType = add_type(module, &ga_event_spec)) ||
        !(st->ArrayType = add_type(module, &ga_array_spec)) ||
        !(st->LoaderIterType = add_type(module, &ga_loader_iter_spec)) ||
        !(st->LoggerType = add_type(module, &ga_logger_spec)))
        return -1;
    st->current_stream = PyContextVar_New("gpuaccel.current_stream", NULL);
    if (!st->current_stream)
        return -1;
    if (ga_device_module_init(module, st) < 0)
        return -1;
    if (!(st->str_dlpack = PyUnicode_InternFromString("__dlpack__")) ||
        !(st->str_dlpack_device = PyUnicode_InternFromString("__dlpack_device__")) ||
        !(st->str_dlpack_c_exchange_api =
              PyUnicode_InternFromString("__dlpack_c_exchange_api__")) ||
        !(st->str_requires_grad = PyUnicode_InternFromString("requires_grad")) ||
        !(st->str_cuda_array_interface = PyUnicode_InternFromString("__cuda_array_interface__")) ||
        !(st->kw_max_version = Py_BuildValue("(s)", "max_version")) ||
        !(st->kw_max_version_stream = Py_BuildValue("(ss)", "max_version", "stream")) ||
        !(st->kw_stream = Py_BuildValue("(s)", "stream")) ||
        !(st->dlpack_max_version = Py_BuildValue("(ii)", 1, 1)))
        return -1;
    if (ga_dlpack_publish_exchange_api(st) < 0)
        return -1;
    if (add_dtype_names(module) < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "MAX_NDIM", GA_MAX_NDIM) < 0)
        return -1;
    PyObject *reasons = ga_fallback_reason_names();
    int added = reasons ? PyModule_AddObjectRef(module, "_fallback_reasons", reasons) : -1;
    Py_XDECREF(reasons);
    if (added < 0)
        return -1;
    return ga_fallback_policy_init();
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    ga_state *st = ga_state_from_module(module);
    Py_VISIT(st->ArrayType);
    Py_VISIT(st->DeviceType);
    Py_VISIT(st->StreamType);
    Py_VISIT(st->EventType);
    Py_VISIT(st->LoaderIterType);
    Py_VISIT(st->LoggerType);
    Py_VISIT(st->CudaError);
    Py_VISIT(st->OutOfMemoryError);
    Py_VISIT(st->CublasError);
    Py_VISIT(st->CudnnError);
    Py_VISIT(st->FallbackError);
    Py_VISIT(st->FallbackWarning);
    Py_VISIT(st->GeluChangedWarning);
    Py_VISIT(st->current_stream);
    Py_VISIT(st->default_device);
    Py_VISIT(st->bfloat16_descr);
    Py_VISIT(st->torch_tensor_type);
    Py_VISIT(st->torch_raw_stream);
    Py_VISIT(st->torch_parameter_type);
    Py_VISIT(st->torch_is_neg);
    Py_VISIT(st->torch_profiler_enabled);
    Py_VISIT(st->torch_record_enter);
    Py_VISIT(st->torch_record_exit);
    Py_VISIT(st->torch_fp32_precision);
    for (int k = 0; k < GA_TF32_OPS; k++) {
        Py_VISIT(st->torch_fp32_args[k][0]);
        Py_VISIT(st->torch_fp32_args[k][1]);
        Py_VISIT(st->torch_allow_tf32[k]);
    }
    Py_VISIT(st->str_requires_grad);
    for (int d = 0; d < GA_NUM_DTYPES; d++)
        Py_VISIT(st->torch_dtypes[d]);
    Py_VISIT(st->str_dlpack);
    Py_VISIT(st->str_dlpack_device);
    Py_VISIT(st->str_dlpack_c_exchange_api);
    Py_VISIT(st->str_cuda_array_interface);
    Py_VISIT(st->kw_max_version);
    Py_VISIT(st->kw_max_version_stream);
    Py_VISIT(st->kw_stream);
    Py_VISIT(st->dlpack_max_version);
    return 0;
}

static int module_clear(PyObject *module)
{
    ga_state *st = ga_state_from_module(module);
    Py_CLEAR(st->ArrayType);
    Py_CLEAR(st->DeviceType);
    Py_CLEAR(st->StreamType);
    Py_CLEAR(st->EventType);
    Py_CLEAR(st->LoaderIterType);
    Py_CLEAR(st->LoggerType);
    Py_CLEAR(st->CudaError);
    Py_CLEAR(st->OutOfMemoryError);
    Py_CLEAR(st->CublasError);
    Py_CLEAR(st->CudnnError);
    Py_CLEAR(st->FallbackError);
    Py_CLEAR(st->FallbackWarning);
    Py_CLEAR(st->GeluChangedWarning);
    Py_CLEAR(st->current_stream);
    Py_CLEAR(st->default_device);
    Py_CLEAR(st->bfloat16_descr);
    Py_CLEAR(st->torch_tensor_type);
    Py_CLEAR(st->torch_raw_stream);
    Py_CLEAR(st->torch_parameter_type);
    Py_CLEAR(st->torch_is_neg);
    Py_CLEAR(st->torch_profiler_enabled);
    Py_CLEAR(st->torch_record_enter);
    Py_CLEAR(st->torch_record_exit);
    Py_CLEAR(st->torch_fp32_precision);
    for (int k = 0; k < GA_TF32_OPS; k++) {
        Py_CLEAR(st->torch_fp32_args[k][0]);
        Py_CLEAR(st->torch_fp32_args[k][1]);
        Py_CLEAR(st->torch_allow_tf32[k]);
    }
    Py_CLEAR(st->str_requires_grad);
    st->torch_exchange_api = NULL;
    for (int d = 0; d < GA_NUM_DTYPES; d++)
        Py_CLEAR(st->torch_dtypes[d]);
    Py_CLEAR(st->str_dlpack);
    Py_CLEAR(st->str_dlpack_device);
    Py_CLEAR(st->str_dlpack_c_exchange_api);
    Py_CLEAR(st->str_cuda_array_interface);
    Py_CLEAR(st->kw_max_version);
    Py_CLEAR(st->kw_max_version_stream);
    Py_CLEAR(st->kw_stream);
    Py_CLEAR(st->dlpack_max_version);
    return 0;
}

static void module_free(void *module)
{
    ga_state *st = ga_state_from_module((PyObject *)module);
    if (st)
        ga_dlpack_unpublish_exchange_api(st);
    module_clear((PyObject *)module);
}

#define KW (PyCFunction)(void (*)(void))

static PyMethodDef module_methods[] = {
    {"cuda_available", ga_py_cuda_available, METH_NOARGS,
     "cuda_available($module, /)\n--\n\nReturns bool.  True when this build has CUDA and a driver"
     " and GPU are usable."},
    {"built_with_cuda", ga_py_built_with_cuda, METH_NOARGS,
     "built_with_cuda($module, /)\n--\n\nReturns bool.  True when the extension was compiled with"
     " its CUDA backend."},
    {"device_count", ga_py_device_count, METH_NOARGS,
     "device_count($module, /)\n--\n\nReturns int.  Number of usable CUDA devices (0 without "
     "CUDA)."},
    {"default_device", ga_py_default_device, METH_NOARGS,
     "default_device($module, /)\n--\n\nReturns Device.  Where empty()/zeros()/... allocate when "
     "no device is given (CPU unless changed)."},
    {"set_default_device", ga_py_set_default_device, METH_O,
     "set_default_device($module, device, /)\n--\n\nSets the device used when none is given."},
    {"current_stream", KW ga_py_current_stream, METH_VARARGS | METH_KEYWORDS,
     "current_stream($module, device=None)\n--\n\nReturns Stream.  The stream gpuaccel queues "
     "work on for `device`: the one made current with `with stream:`, else the legacy default "
     "stream."},
    {"synchronize", KW ga_py_synchronize, METH_VARARGS | METH_KEYWORDS,
     "synchronize($module, device=None)\n--\n\nWaits until all work queued on the device is done."},
    {"device_properties", KW ga_py_device_properties, METH_VARARGS | METH_KEYWORDS,
     "device_properties($module, device=None)\n--\n\nReturns dict.  Name, compute capability, "
     "memory, multiprocessors and L2 size of a CUDA device."},
    {"build_info", ga_py_build_info, METH_NOARGS,
     "build_info($module, /)\n--\n\nReturns dict.  How this extension was built and which CUDA "
     "libraries it loaded."},
    {"empty", KW ga_py_empty, METH_VARARGS | METH_KEYWORDS,
     "empty($module, shape, dtype='float32', device=None, *, pinned=False)\n--\n\nReturns Array. "
     " An uninitialised array."},
    {"zeros", KW ga_py_zeros, METH_VARARGS | METH_KEYWORDS,
     "zeros($module, shape, dtype='float32', device=None, *, pinned=False)\n--\n\nReturns Array."},
    {"ones", KW ga_py_ones, METH_VARARGS | METH_KEYWORDS,
     "ones($module, shape, dtype='float32', device=None, *, pinned=False)\n--\n\nReturns Array."},
    {"full", KW ga_py_full, METH_VARARGS | METH_KEYWORDS,
     "full($module, shape, fill_value, dtype=None, device=None, *, pinned=False)\n--\n\nReturns "
     "Array.  dtype defaults to bool, int64 or float32 after fill_value."},
    {"asarray", KW ga_py_asarray, METH_FASTCALL | METH_KEYWORDS,
     "asarray($module, obj, dtype=None, device=None, copy=None, stream=None)\n--\n\nReturns "
     "Array.  An Array from an Array, anything with __dlpack__ or __cuda_array_interface__, a "
     "buffer, or nested sequences of numbers.  Shares memory when it can; copy=True always copies"
     " and copy=False never does (raising ValueError when a copy would be needed)."},
    {"from_dlpack", KW ga_py_from_dlpack, METH_FASTCALL | METH_KEYWORDS,
     "from_dlpack($module, x, /, *, device=None, copy=None)\n--\n\nReturns Array.  An Array "
     "sharing memory with a DLPack producer (an object with __dlpack__, or a DLPack capsule)."},
    {"memory_stats", KW ga_py_memory_stats, METH_VARARGS | METH_KEYWORDS,
     "memory_stats($module, device=None)\n--\n\nReturns dict.  Bytes allocated, peak, reserved, "
     "limit and counts for a device ('cpu' includes the pinned pool).  device=None: the current "
     "CUDA device when CUDA is usable, else the CPU."},
    {"empty_cache", ga_py_empty_cache, METH_NOARGS,
     "empty_cache($module, /)\n--\n\nReturns cached device, pinned and pageable host memory that "
     "no array uses."},
    {"set_memory_limit", KW ga_py_set_memory_limit, METH_VARARGS | METH_KEYWORDS,
     "set_memory_limit($module, limit, device=None)\n--\n\nCaps what gpuaccel may allocate on a "
     "device: bytes (int), a fraction of the device's memory (float in (0, 1]), or None for no "
     "limit."},
    {"matmul", KW ga_py_matmul, METH_FASTCALL | METH_KEYWORDS,
     "matmul($module, a, b, *, bias=None, activation=None, out=None, out_dtype=None, "
     "stream=None)\n--\n\nact(a @ b + bias) in one call: a (..., M, K), b (K, N) or (..., K, N) "
     "with broadcast batch dimensions (NumPy's rules, 1-D operands included); bias (N,); "
     "activation None, 'relu', 'gelu' (exact, erf, as nn.GELU()), 'gelu_tanh' (its tanh "
     "approximation), 'silu', 'hardswish' or 'sigmoid'; float16/bfloat16 accumulate in "
     "float32 (out_dtype='float32' keeps the result in float32).  stream: None (gpuaccel's "
     "current stream, else torch's for torch tensors), a Stream, a torch.cuda.Stream, an int "
     "handle, or 'torch' (torch's current stream whatever gpuaccel's is); the same for every op."},
    {"linear", KW ga_py_linear, METH_FASTCALL | METH_KEYWORDS,
     "linear($module, x, weight, bias=None, activation=None, *, out=None, "
     "save_preactivation=False, stream=None)\n--\n\ny = act(x @ weight.T + bias) with weight "
     "(out_features, in_features) as nn.Linear.  With save_preactivation=True returns (y, aux), "
     "aux being what linear_backward needs: y itself for relu, the pre-activation for the other "
     "activations, None without one."},
    {"linear_backward", KW ga_py_linear_backward, METH_FASTCALL | METH_KEYWORDS,
     "linear_backward($module, grad_y, x, weight, *, activation=None, preactivation=None, "
     "needs_input_grad=True, needs_weight_grad=True, needs_bias_grad=True, stream=None, "
     "out=None)\n--\n\n(grad_x, grad_weight, grad_bias), None for those not needed.  The "
     "activation's derivative and the bias gradient are computed in one pass."},
    {"conv2d", KW ga_py_conv2d, METH_FASTCALL | METH_KEYWORDS,
     "conv2d($module, x, weight, bias=None, *, stride=1, padding=0, dilation=1, groups=1, "
     "activation=None, layout='NCHW', out=None, save_preactivation=False, "
     "stream=None)\n--\n\nact(conv(x, weight) + bias).  layout='NCHW': x (N, C, H, W), weight (K,"
     " C/groups, R, S) — a channels-last tensor is used as it is, and the result follows its "
     "memory format; layout='NHWC': x (N, H, W, C), weight (K, R, S, C/groups), result (N, P, Q, "
     "K)."},
    {"conv2d_backward", KW ga_py_conv2d_backward, METH_FASTCALL | METH_KEYWORDS,
     "conv2d_backward($module, grad_y, x, weight, *, stride=1, padding=0, dilation=1, groups=1, "
     "activation=None, y=None, preactivation=None, layout='NCHW', needs_input_grad=True, "
     "needs_weight_grad=True, needs_bias_grad=True, stream=None, out=None)\n--\n\n(grad_x, "
     "grad_weight, grad_bias); relu needs y (or the pre-activation), the other activations the "
     "pre-activation."},
    {"_activation_name", (PyCFunction)(void (*)(void))ga_py_activation_name, METH_FASTCALL,
     "_activation_name($module, activation, caller, stacklevel, /)\n--\n\nReturns str.  The "
     "activation's own name ('none' for None) as the ops parse it, with their ValueError "
     "(naming caller) and their one-time GeluChangedWarning for 'gelu' (at warnings.warn's "
     "stacklevel): gpuaccel.torch's parser."},
    {"set_matmul_precision", ga_py_set_matmul_precision, METH_O,
     "set_matmul_precision($module, precision, /)\n--\n\n'high' (and 'medium', the same here) "
     "lets float32 matmuls and linears use TF32 tensor cores, as "
     "torch.set_float32_matmul_precision does; None (the initial state) follows torch's setting "
     "while torch is imported, else 'highest' (torch's default)."},
    {"get_matmul_precision", ga_py_get_matmul_precision, METH_NOARGS,
     "get_matmul_precision($module, /)\n--\n\nReturns str.  the value set, or, following torch, "
     "'high' or 'highest'."},
    {"set_conv_allow_tf32", ga_py_set_conv_allow_tf32, METH_O,
     "set_conv_allow_tf32($module, allow, /)\n--\n\nTrue lets float32 convolutions use TF32 "
     "tensor cores (as torch.backends.cudnn.allow_tf32); None (the initial state) follows torch's"
     " flag while torch is imported, else True (torch's default)."},
    {"get_conv_allow_tf32", ga_py_get_conv_allow_tf32, METH_NOARGS,
     "get_conv_allow_tf32($module, /)\n--\n\nReturns bool.  whether float32 convolutions may use "
     "TF32 now."},
    {"_tf32_state", ga_py_tf32_state, METH_O,
     "_tf32_state($module, op, /)\n--\n\nReturns (allowed, source).  TF32 for float32 CUDA ops "
     "and where the setting comes from: 'gpuaccel', 'torch' or 'default'."},
    {"set_deterministic", ga_py_set_deterministic, METH_O,
     "set_deterministic($module, deterministic, /)\n--\n\nThe same bits for the same inputs "
     "(shapes, strides, pointer alignments), run after run and process after process, on the same"
     " GPU model with the same cuBLASLt and cuDNN: cuBLASLt without split-K reductions and "
     "without its bias-gradient epilogues (gpuaccel's fixed-order sums instead), cuDNN engines "
     "without the NONDETERMINISTIC note, chosen in the heuristic's order rather than by timing.  "
     "gpuaccel's own kernels and the CPU are deterministic either way.  Not promised: the same "
     "bits on another GPU model or library version, or GPU equal to CPU."},
    {"get_deterministic", ga_py_get_deterministic, METH_NOARGS,
     "get_deterministic($module, /)\n--\n\nWhether set_deterministic(True) is in force."},
    {"set_fallback_policy", ga_py_set_fallback_policy, METH_O,
     "set_fallback_policy($module, policy, /)\n--\n\nWhat a CUDA matmul or conv does when the "
     "library call it asked for fell back for a reason that may hide a bug or a broken "
     "installation (no algorithm even for the plain op, a rejected parameter, a sub-library that "
     "did not load, a failed runtime compilation, plans that did not run): 'warn' (default) shows"
     " a FallbackWarning once per op and reason with the library's message, 'raise' raises "
     "FallbackError, 'allow' only counts them (matmul_stats()/conv_stats()['fallback_reasons']). "
     "Documented library limits (layouts, epilogues, set_deterministic) are counted, never warned"
     " about.  The environment variable GPUACCEL_FALLBACK sets it at import."},
    {"get_fallback_policy", ga_py_get_fallback_policy, METH_NOARGS,
     "get_fallback_policy($module, /)\n--\n\n'allow', 'warn' or 'raise': see set_fallback_policy."},
    {"matmul_stats", ga_py_matmul_stats, METH_NOARGS,
     "matmul_stats($module, /)\n--\n\nReturns dict.  calls, CPU/CUDA calls, fused and fallback "
     "(unfused) CUDA calls, plan-cache hits and misses."},
    {"conv_stats", ga_py_conv_stats, METH_NOARGS,
     "conv_stats($module, /)\n--\n\nReturns dict.  calls, fused, fallback, tuned (shapes timed), "
     "tuning_reused (choices read back from the tuning file), plan-cache hits and misses."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#if PY_VERSION_HEX >= 0x030C0000
    /* process-wide pools and streams: one interpreter at a time */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL},
};

PyModuleDef ga_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gpuaccel._C",
    .m_doc = "gpuaccel's C extension: arrays, DLPack, streams, memory pools and kernels.",
    .m_size = sizeof(ga_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__C(void)
{
    return PyModuleDef_Init(&ga_module_def);
}
