/*
 * errors.c — the one place where a backend status becomes a Python
 * exception.
 */
#include "errors.h"

#include <stdio.h>
#include <string.h>

/* Strips the build's directory from __FILE__, keeping "kernels/cuda/x.cu". */
static const char *short_path(const char *file)
{
    if (!file)
        return "?";
    const char *k = strstr(file, "kernels/");
    if (k)
        return k;
    const char *c = strstr(file, "csrc/");
    return c ? c : file;
}

/* Raises `type` with the message, and .code / .name / .call attributes. */
static void raise_library_error(PyObject *type, const char *msg, ga_status status)
{
    PyObject *exc = PyObject_CallFunction(type, "s", msg);
    if (!exc)
        return;
    PyObject *code = PyLong_FromLong(status.code);
    PyObject *name = PyUnicode_FromString(status.name ? status.name : "");
    PyObject *call = PyUnicode_FromString(status.call ? status.call : "");
    if (code && name && call && PyObject_SetAttrString(exc, "code", code) == 0 &&
        PyObject_SetAttrString(exc, "name", name) == 0 &&
        PyObject_SetAttrString(exc, "call", call) == 0)
        PyErr_SetObject(type, exc);
    Py_XDECREF(code);
    Py_XDECREF(name);
    Py_XDECREF(call);
    Py_DECREF(exc);
}

const char *ga_status_text(ga_status status, char *buf, size_t size)
{
    const char *call = status.call ? status.call : "?";
    const char *message = status.message ? status.message : "";
    if (status.name)
        snprintf(buf, size, "%s failed: %s (%d): %s [%s:%d]", call, status.name, status.code,
                 message, short_path(status.file), status.line);
    else
        snprintf(buf, size, "%s: %s", call, message);
    return buf;
}

int ga_raise(ga_state *st, ga_status status)
{
    char msg[1024];
    const char *call = status.call ? status.call : "?";
    const char *message = status.message ? status.message : "";
    const char *name = status.name ? status.name : "";
    switch (status.error) {
    case GA_OK:
        PyErr_SetString(PyExc_SystemError, "gpuaccel: ga_raise called with a success status");
        break;
    case GA_ERR_NO_CUDA_BUILD:
        PyErr_SetString(PyExc_RuntimeError,
                        "gpuaccel was built without CUDA (no nvcc was found when it was "
                        "installed, or GPUACCEL_NO_CUDA=1 was set); reinstall it with the CUDA "
                        "toolkit on PATH or CUDA_HOME set to use a GPU");
        break;
    case GA_ERR_NO_DEVICE:
        PyErr_Format(PyExc_RuntimeError,
                     "CUDA is not available: %s failed with %s: %s (is an NVIDIA driver "
                     "installed, and a GPU visible to this process?)",
                     call, name, message);
        break;
    case GA_ERR_HOST_OUT_OF_MEMORY:
    case GA_ERR_OUT_OF_MEMORY:
        /* Our allocator's own messages (limits) come whole, without a
         * library name; a failed CUDA allocation is reported like any call. */
        if (status.name)
            ga_status_text(status, msg, sizeof msg);
        else
            snprintf(msg, sizeof msg, "%s", message);
        raise_library_error(st->OutOfMemoryError, msg, status);
        break;
    case GA_ERR_CUDA:
    case GA_ERR_CUBLAS:
    case GA_ERR_CUDNN: {
        PyObject *type = status.error == GA_ERR_CUDA     ? st->CudaError
                         : status.error == GA_ERR_CUBLAS ? st->CublasError
                                                         : st->CudnnError;
        raise_library_error(type, ga_status_text(status, msg, sizeof msg), status);
        break;
    }
    case GA_ERR_INVALID_VALUE:
        PyErr_SetString(PyExc_ValueError, ga_status_text(status, msg, sizeof msg));
        break;
    case GA_ERR_NOT_SUPPORTED:
        PyErr_Format(PyExc_ValueError, "%s: not supported: %s", call, message);
        break;
    default:
        PyErr_Format(PyExc_SystemError, "gpuaccel: unknown status %d from %s", (int)status.error,
                     call);
        break;
    }
    return -1;
}

const char *ga_type_name(PyObject *obj)
{
    return Py_TYPE(obj)->tp_name;
}

const char *ga_format_bytes(uint64_t bytes, char *buf, size_t size)
{
    static const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, size, "%llu bytes", (unsigned long long)bytes);
    else
        snprintf(buf, size, "%.2f %s", v, units[u]);
    return buf;
}
