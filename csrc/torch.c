/*
 * torch.c — what gpuaccel needs of torch, without importing it: its Tensor
 * type, its dtype objects, its DLPack C exchange table and its current
 * stream, looked up once the user has imported torch and kept in the
 * module state (ga_state).
 *
 * Why not __dlpack__: a Python-level DLPack round costs microseconds per
 * operand, more than a small op's whole host budget.  With torch >= 2.9 a
 * tensor is read through the exchange table (DLPack 1.3): a non-owning
 * DLTensor view and torch's current work stream, plain C calls.  Older
 * torch, and tensor subclasses (which may redefine what their data is),
 * are read through their Python attributes instead: pointer, sizes,
 * strides, dtype and device.
 */
#include "torch.h"

#include <stdlib.h>
#include <string.h>

#include "dlpack.h"

/* torch's TF32 getters (see ga_torch_allow_tf32).  The fp32_precision
 * getter is preferred: torch's kernels consult the same resolved value
 * (Context::float32Precision(CUDA, op) == TF32), and the legacy getters
 * raise once the new API has set a flag the legacy one cannot represent. */
static void load_tf32_flags(ga_state *st, PyObject *torch)
{
    static const char *const ops[GA_TF32_OPS] = {
        [GA_TF32_MATMUL] = "matmul", [GA_TF32_CONV] = "conv"};
    static const char *const legacy[GA_TF32_OPS] = {
        [GA_TF32_MATMUL] = "_get_cublas_allow_tf32", [GA_TF32_CONV] = "_get_cudnn_allow_tf32"};
    Py_CLEAR(st->torch_fp32_precision); /* load_torch may run again if it failed */
    for (int k = 0; k < GA_TF32_OPS; k++) {
        Py_CLEAR(st->torch_fp32_args[k][0]);
        Py_CLEAR(st->torch_fp32_args[k][1]);
        Py_CLEAR(st->torch_allow_tf32[k]);
    }
    PyObject *torch_c = PyObject_GetAttrString(torch, "_C");
    if (!torch_c) {
        PyErr_Clear();
        return;
    }
    st->torch_fp32_precision = PyObject_GetAttrString(torch_c, "_get_fp32_precision_getter");
    for (int k = 0; k < GA_TF32_OPS && st->torch_fp32_precision; k++)
        if (!(st->torch_fp32_args[k][0] = PyUnicode_InternFromString("cuda")) ||
            !(st->torch_fp32_args[k][1] = PyUnicode_InternFromString(ops[k])))
            Py_CLEAR(st->torch_fp32_precision);
    for (int k = 0; k < GA_TF32_OPS && !st->torch_fp32_precision; k++)
        st->torch_allow_tf32[k] = PyObject_GetAttrString(torch_c, legacy[k]);
    PyErr_Clear();
    Py_DECREF(torch_c);
}

/* 1 once torch is imported (its objects are then in the module state), 0
 * before. */
static int load_torch(ga_state *st)
{
    if (st->torch_tensor_type)
        return 1;
    PyObject *modules = PyImport_GetModuleDict();
    PyObject *torch = modules ? PyDict_GetItemString(modules, "torch") : NULL;
    if (!torch)
        return 0;
    PyObject *tensor = PyObject_GetAttrString(torch, "Tensor");
    if (!tensor || !PyType_Check(tensor)) {
        Py_XDECREF(tensor);
        PyErr_Clear();
        return 0;
    }
    for (int d = 0; d < GA_NUM_DTYPES; d++) {
        st->torch_dtypes[d] = PyObject_GetAttrString(torch, ga_dtype_name((ga_dtype)d));
        if (!st->torch_dtypes[d])
            PyErr_Clear();
    }
    /* absent from a CPU-only torch build: then no tensor is a CUDA one */
    PyObject *torch_c = PyObject_GetAttrString(torch, "_C");
    st->torch_raw_stream =
        torch_c ? PyObject_GetAttrString(torch_c, "_cuda_getCurrentRawStream") : NULL;
    Py_XDECREF(torch_c);
    PyErr_Clear();
    st->torch_parameter_type = PyObject_GetAttrString(torch, "nn");
    if (st->torch_parameter_type)
        Py_SETREF(st->torch_parameter_type,
                  PyObject_GetAttrString(st->torch_parameter_type, "Parameter"));
    PyErr_Clear();
    /* GPUACCEL_NO_DLPACK_EXCHANGE=1: torch's Python-level interfaces only
     * (its tensor attributes, __dlpack__, torch._C's stream lookup), e.g. to
     * rule the C table out when looking for a bug */
    const char *no_exchange = getenv("GPUACCEL_NO_DLPACK_EXCHANGE");
    st->torch_exchange_api = no_exchange && strcmp(no_exchange, "1") == 0
                                 ? NULL
                                 : ga_dlpack_exchange_api(st, (PyTypeObject *)tensor);
    PyObject *c_module = PyObject_GetAttrString(torch, "_C");
    PyObject *c_autograd = c_module ? PyObject_GetAttrString(c_module, "_autograd") : NULL;
    st->torch_profiler_enabled =
        c_autograd ? PyObject_GetAttrString(c_autograd, "_profiler_enabled") : NULL;
    Py_XDECREF(c_autograd);
    Py_XDECREF(c_module);
    PyErr_Clear();
    load_tf32_flags(st, torch);
    st->torch_is_neg = PyObject_GetAttrString(tensor, "is_neg");
    if (!st->torch_is_neg) { /* not the torch gpuaccel knows: no tensor is one */
        PyErr_Clear();
        Py_DECREF(tensor);
        return 0;
    }
    st->torch_tensor_type = tensor;
    return 1;
}

int ga_is_torch_tensor(ga_state *st, PyObject *obj)
{
    return load_torch(st) && PyObject_TypeCheck(obj, (PyTypeObject *)st->torch_tensor_type);
}

int ga_torch_dtype(ga_state *st, PyObject *tensor, ga_dtype *out)
{
    PyObject *dtype = PyObject_GetAttrString(tensor, "dtype");
    if (!dtype)
        return -1;
    int found = -1;
    for (int d = 0; d < GA_NUM_DTYPES && found < 0; d++)
        if (st->torch_dtypes[d] == dtype)
            found = d;
    if (found < 0)
        PyErr_Format(PyExc_TypeError,
                     "torch tensors of dtype %R are not supported; gpuaccel supports bool, uint8, "
                     "int8, int16, int32, int64, float16, bfloat16, float32 and float64",
                     dtype);
    Py_DECREF(dtype);
    if (found < 0)
        return -1;
    *out = (ga_dtype)found;
    return 0;
}

int ga_torch_current_stream(ga_state *st, int device, ga_stream *out)
{
    if (!load_torch(st))
        return 0;
    if (st->torch_exchange_api) {
        void *handle = NULL;
        if (st->torch_exchange_api->current_work_stream(kDLCUDA, device, &handle) < 0)
            return -1;
        *out = handle ? (ga_stream)handle : GA_STREAM_LEGACY;
        return 1;
    }
    if (!st->torch_raw_stream)
        return 0;
    PyObject *r = PyObject_CallFunction(st->torch_raw_stream, "i", device);
    if (!r)
        return -1;
    void *handle = PyLong_AsVoidPtr(r);
    Py_DECREF(r);
    if (PyErr_Occurred())
        return -1;
    /* torch's 0 is the legacy default stream, which gpuaccel names 1 */
    *out = handle ? (ga_stream)handle : GA_STREAM_LEGACY;
    return 1;
}

/* The tensor's device: CPU, or a usable CUDA device. */
static int torch_device(ga_state *st, PyObject *t, ga_device *out)
{
    PyObject *flag = PyObject_GetAttrString(t, "is_cuda");
    if (!flag)
        return -1;
    int is_cuda = flag == Py_True;
    Py_DECREF(flag);
    if (is_cuda) {
        PyObject *r = PyObject_CallMethod(t, "get_device", NULL);
        long long index = r ? PyLong_AsLongLong(r) : -1;
        Py_XDECREF(r);
        if (index < 0 || PyErr_Occurred())
            return -1;
        out->type = GA_DEVICE_CUDA;
        out->index = (int)index;
        return ga_ensure_cuda_device(st, out->index);
    }
    if (!(flag = PyObject_GetAttrString(t, "is_cpu")))
        return -1;
    int is_cpu = flag == Py_True;
    Py_DECREF(flag);
    if (!is_cpu) {
        PyErr_SetString(PyExc_TypeError,
                        "only CPU and CUDA torch tensors can be used (this one is on another "
                        "device, e.g. 'meta')");
        return -1;
    }
    out->type = GA_DEVICE_CPU;
    out->index = 0;
    return 0;
}

static int64_t tuple_int(PyObject *t, Py_ssize_t k)
{
    return PyLong_AsLongLong(PyTuple_GET_ITEM(t, k));
}

/* An Array over the tensor's memory as it lies (no neg bit to resolve). */
static ArrayObject *wrap_tensor(ga_state *st, PyObject *t, ga_dtype dtype, ga_device device)
{
    PyObject *ptr = NULL, *shape = NULL, *stride = NULL;
    ArrayObject *arr = NULL;
    if (!(ptr = PyObject_CallMethod(t, "data_ptr", NULL)) ||
        !(shape = PyObject_GetAttrString(t, "shape")) ||
        !(stride = PyObject_CallMethod(t, "stride", NULL)))
        goto done;
    if (!PyTuple_Check(shape) || !PyTuple_Check(stride) ||
        PyTuple_GET_SIZE(shape) != PyTuple_GET_SIZE(stride) ||
        PyTuple_GET_SIZE(shape) > GA_MAX_NDIM) {
        PyErr_SetString(PyExc_TypeError, "unexpected torch tensor geometry");
        goto done;
    }
    int ndim = (int)PyTuple_GET_SIZE(shape);
    int64_t dims[GA_MAX_NDIM], strides[GA_MAX_NDIM];
    int64_t item = (int64_t)ga_dtype_itemsize(dtype);
    for (int d = 0; d < ndim; d++) {
        dims[d] = tuple_int(shape, d);
        strides[d] = tuple_int(stride, d) * item;
    }
    void *data = PyLong_AsVoidPtr(ptr);
    if (PyErr_Occurred())
        goto done;
    arr = ga_array_wrap(st, data, dtype, ndim, dims, strides, device, 0, t);
done:
    Py_XDECREF(ptr);
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    return arr;
}

/* The tensor with its values in memory: itself (a new reference), or, when
 * torch's neg bit is set (its values are its memory's negated, which no
 * pointer can say, and which torch's own DLPack export ignores), a
 * resolved copy; *copied says which.  NULL with an exception. */
PyObject *ga_torch_resolved(ga_state *st, PyObject *t, int *copied)
{
    PyObject *negated = PyObject_Vectorcall(st->torch_is_neg, &t, 1, NULL);
    if (!negated)
        return NULL;
    *copied = negated == Py_True;
    Py_DECREF(negated);
    return *copied ? PyObject_CallMethod(t, "resolve_neg", NULL) : Py_NewRef(t);
}

const DLPackExchangeAPI *ga_torch_exchange_api(ga_state *st, PyObject *tensor)
{
    PyTypeObject *type = Py_TYPE(tensor);
    if (type == (PyTypeObject *)st->torch_tensor_type ||
        type == (PyTypeObject *)st->torch_parameter_type)
        return st->torch_exchange_api;
    return NULL;
}

int ga_torch_requires_grad(ga_state *st, PyObject *tensor)
{
    PyObject *flag = PyObject_GetAttr(tensor, st->str_requires_grad);
    if (!flag)
        return -1;
    int requires_grad = flag == Py_True;
    Py_DECREF(flag);
    return requires_grad;
}

/* The exchange table's view of a plain tensor as an Array: NULL with no
 * exception when it cannot serve (then the attribute path below does, and
 * raises the errors users are shown). */
static ArrayObject *view_through_exchange(ga_state *st, PyObject *t)
{
    const DLPackExchangeAPI *api = ga_torch_exchange_api(st, t);
    if (!api || !api->dltensor_from_py_object_no_sync)
        return NULL;
    DLTensor view;
    ArrayObject *arr = NULL;
    if (api->dltensor_from_py_object_no_sync(t, &view) == 0)
        arr = ga_array_from_dltensor_view(st, &view, t, "torch tensor");
    if (!arr)
        PyErr_Clear();
    return arr;
}

/* An Array over a tensor without the neg bit. */
static ArrayObject *wrap_resolved(ga_state *st, PyObject *t)
{
    ArrayObject *fast = view_through_exchange(st, t);
    if (fast)
        return fast;
    ga_dtype dtype;
    if (ga_torch_dtype(st, t, &dtype) < 0)
        return NULL;
    ga_device device;
    ArrayObject *arr = NULL;
    if (torch_device(st, t, &device) == 0)
        arr = wrap_tensor(st, t, dtype, device);
    if (!arr)
        ga_dlpack_explain_layout(t, PyExc_TypeError);
    return arr;
}

ArrayObject *ga_from_torch(ga_state *st, PyObject *t)
{
    int copied;
    PyObject *resolved = ga_torch_resolved(st, t, &copied);
    if (!resolved)
        return NULL;
    ArrayObject *arr = wrap_resolved(st, resolved);
    Py_DECREF(resolved);
    return arr;
}

/* ----------------------------------------------------------- TF32 flags */

int ga_torch_allow_tf32(ga_state *st, ga_tf32_op op, int *out)
{
    if (!load_torch(st))
        return 0;
    PyObject *r;
    if (st->torch_fp32_precision) {
        /* "tf32", "ieee" or "none" (nothing set anywhere: not TF32) */
        r = PyObject_Vectorcall(st->torch_fp32_precision, st->torch_fp32_args[op], 2, NULL);
        if (!r)
            return -1;
        *out = PyUnicode_Check(r) && PyUnicode_CompareWithASCIIString(r, "tf32") == 0;
    } else if (st->torch_allow_tf32[op]) {
        if (!(r = PyObject_CallNoArgs(st->torch_allow_tf32[op])))
            return -1;
        *out = r == Py_True;
    } else {
        return 0;
    }
    Py_DECREF(r);
    return 1;
}

/* ------------------------------------------------------ profiler ranges */

static int profiler_ops(ga_state *st)
{
    if (st->torch_record_enter && st->torch_record_exit)
        return 1;
    PyObject *modules = PyImport_GetModuleDict();
    PyObject *torch = modules ? PyDict_GetItemString(modules, "torch") : NULL;
    PyObject *ops = torch ? PyObject_GetAttrString(torch, "ops") : NULL;
    PyObject *profiler = ops ? PyObject_GetAttrString(ops, "profiler") : NULL;
    if (profiler) {
        st->torch_record_enter = PyObject_GetAttrString(profiler, "_record_function_enter_new");
        st->torch_record_exit = PyObject_GetAttrString(profiler, "_record_function_exit");
    }
    Py_XDECREF(profiler);
    Py_XDECREF(ops);
    if (!st->torch_record_enter || !st->torch_record_exit) {
        Py_CLEAR(st->torch_record_enter);
        Py_CLEAR(st->torch_record_exit);
        PyErr_Clear();
        return 0;
    }
    return 1;
}

PyObject *ga_torch_profile_begin(ga_state *st, const char *name)
{
    if (!load_torch(st) || !st->torch_profiler_enabled)
        return Py_NewRef(Py_None);
    PyObject *on = PyObject_CallNoArgs(st->torch_profiler_enabled);
    int recording = on == Py_True;
    Py_XDECREF(on);
    if (!recording || !profiler_ops(st)) {
        PyErr_Clear();
        return Py_NewRef(Py_None);
    }
    PyObject *handle = PyObject_CallFunction(st->torch_record_enter, "sO", name, Py_None);
    if (!handle) {
        PyErr_Clear();
        return Py_NewRef(Py_None);
    }
    return handle;
}

void ga_torch_profile_end(ga_state *st, PyObject *handle)
{
    if (handle == Py_None || !handle) {
        Py_XDECREF(handle);
        return;
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *r = PyObject_CallOneArg(st->torch_record_exit, handle);
    Py_XDECREF(r);
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
    Py_DECREF(handle);
}
