/*
 * torch.c — torch tensors without DLPack: what gpuaccel needs of torch,
 * looked up once torch has been imported and kept in the module state.
 */
#include "torch.h"
#include "dlpack.h"

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
    st->torch_raw_stream = torch_c ? PyObject_GetAttrString(torch_c, "_cuda_getCurrentRawStream")
                                   : NULL;
    Py_XDECREF(torch_c);
    PyErr_Clear();
    st->torch_tensor_type = tensor;
    return 1;
}

int ga_is_torch_tensor(ga_state *st, PyObject *obj)
{
    return load_torch(st) && PyObject_TypeCheck(obj, (PyTypeObject *)st->torch_tensor_type);
}

static int64_t tuple_int(PyObject *t, Py_ssize_t k)
{
    return PyLong_AsLongLong(PyTuple_GET_ITEM(t, k));
}

ArrayObject *ga_from_torch(ga_state *st, PyObject *t)
{
    PyObject *dtype = NULL, *shape = NULL, *stride = NULL, *flag = NULL, *r = NULL;
    ArrayObject *arr = NULL;
    int dt = -1;
    if (!(dtype = PyObject_GetAttrString(t, "dtype")))
        goto done;
    for (int d = 0; d < GA_NUM_DTYPES && dt < 0; d++)
        if (st->torch_dtypes[d] == dtype)
            dt = d;
    if (dt < 0) {
        PyErr_Format(PyExc_TypeError,
                     "torch tensors of dtype %R are not supported; gpuaccel supports bool, uint8, "
                     "int8, int16, int32, int64, float16, bfloat16, float32 and float64",
                     dtype);
        goto done;
    }
    /* lazily negated views (torch's neg bit) hold other values than their
     * memory: let torch's own DLPack export resolve them */
    if (!(r = PyObject_CallMethod(t, "is_neg", NULL)))
        goto done;
    if (r == Py_True) {
        arr = ga_from_dlpack_object(st, t);
        goto done;
    }
    Py_CLEAR(r);
    ga_device device = {GA_DEVICE_CPU, 0};
    if (!(flag = PyObject_GetAttrString(t, "is_cuda")))
        goto done;
    if (flag == Py_True) {
        long long index = -1;
        if ((r = PyObject_CallMethod(t, "get_device", NULL)))
            index = PyLong_AsLongLong(r);
        if (index < 0 || PyErr_Occurred())
            goto done;
        device.type = GA_DEVICE_CUDA;
        device.index = (int)index;
        if (ga_ensure_cuda_device(st, device.index) < 0)
            goto done;
    } else {
        Py_DECREF(flag);
        if (!(flag = PyObject_GetAttrString(t, "is_cpu")))
            goto done;
        if (flag != Py_True) {
            PyErr_SetString(PyExc_TypeError,
                            "only CPU and CUDA torch tensors can be used (this one is on another "
                            "device, e.g. 'meta')");
            goto done;
        }
    }
    Py_CLEAR(r);
    if (!(r = PyObject_CallMethod(t, "data_ptr", NULL)) || !(shape = PyObject_GetAttrString(t, "shape")) ||
        !(stride = PyObject_CallMethod(t, "stride", NULL)))
        goto done;
    if (!PyTuple_Check(shape) || !PyTuple_Check(stride) ||
        PyTuple_GET_SIZE(shape) != PyTuple_GET_SIZE(stride) || PyTuple_GET_SIZE(shape) > GA_MAX_NDIM) {
        PyErr_SetString(PyExc_TypeError, "unexpected torch tensor geometry");
        goto done;
    }
    int ndim = (int)PyTuple_GET_SIZE(shape);
    int64_t dims[GA_MAX_NDIM], strides[GA_MAX_NDIM];
    int64_t item = (int64_t)ga_dtype_itemsize((ga_dtype)dt);
    for (int d = 0; d < ndim; d++) {
        dims[d] = tuple_int(shape, d);
        strides[d] = tuple_int(stride, d) * item;
    }
    void *data = PyLong_AsVoidPtr(r);
    if (PyErr_Occurred())
        goto done;
    arr = ga_array_wrap(st, data, (ga_dtype)dt, ndim, dims, strides, device, 0, t);
done:
    Py_XDECREF(dtype);
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    Py_XDECREF(flag);
    Py_XDECREF(r);
    return arr;
}
