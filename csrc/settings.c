/*
 * settings.c — the process-wide settings that steer the backends: TF32 for
 * float32 matmuls and convolutions (following torch's own flags until
 * gpuaccel's setter is called), and determinism.
 */
#include "settings.h"

#include <string.h>

#include "torch.h"

/* TF32 for float32 CUDA matmuls and convolutions: two settings, with
 * torch's defaults — matmuls off (torch.get_float32_matmul_precision() is
 * "highest"), convolutions on (torch.backends.cudnn.allow_tf32 is True;
 * every cuDNN runtime-fusion engine uses tensor cores, so without TF32 a
 * fused float32 conv never fuses).  Until gpuaccel's setter is called, or
 * after it is called with None, a setting follows torch's own current flag
 * while torch is imported, so a script that configures torch configures
 * gpuaccel's layers alike. */
static const int tf32_default[GA_TF32_OPS] = {[GA_TF32_MATMUL] = 0, [GA_TF32_CONV] = 1};
static int tf32_set[GA_TF32_OPS] = {-1, -1}; /* gpuaccel's setter: 0 or 1; -1 follow torch */
static const char *matmul_precision_set;     /* "highest", "high", "medium" as given */
static int deterministic = 0;                /* set_deterministic(True) */

/* The TF32 setting of `op` and where it comes from. */
static int tf32_resolve(ga_state *st, ga_tf32_op op, int *allowed, const char **source)
{
    if (tf32_set[op] >= 0) {
        *allowed = tf32_set[op];
        *source = "gpuaccel";
        return 0;
    }
    int found = ga_torch_allow_tf32(st, op, allowed);
    if (found < 0)
        return -1;
    if (!found)
        *allowed = tf32_default[op];
    *source = found ? "torch" : "default";
    return 0;
}

int ga_allow_tf32(ga_state *st, ga_device device, ga_dtype dtype, ga_tf32_op which)
{
    /* TF32 only changes float32 math on CUDA: nothing else pays for the read */
    if (dtype != GA_FLOAT32 || device.type != GA_DEVICE_CUDA)
        return 0;
    if (tf32_set[which] >= 0)
        return tf32_set[which];
    int allowed;
    const char *source;
    return tf32_resolve(st, which, &allowed, &source) < 0 ? -1 : allowed;
}

int ga_deterministic(void)
{
    return deterministic;
}

PyObject *ga_py_set_matmul_precision(PyObject *module, PyObject *arg)
{
    (void)module;
    static const char *const names[] = {"highest", "high", "medium"};
    if (arg == Py_None) {
        tf32_set[GA_TF32_MATMUL] = -1;
        matmul_precision_set = NULL;
        Py_RETURN_NONE;
    }
    const char *p = ga_exact_utf8(arg);
    for (int k = 0; p && k < 3; k++)
        if (strcmp(p, names[k]) == 0) {
            /* "medium" is torch's bfloat16-internal matmul; gpuaccel has
             * none, and torch itself runs CUDA matmuls as "high" then */
            tf32_set[GA_TF32_MATMUL] = k > 0;
            matmul_precision_set = names[k];
            Py_RETURN_NONE;
        }
    PyErr_Format(PyUnicode_Check(arg) ? PyExc_ValueError : PyExc_TypeError,
                 "set_matmul_precision: precision must be 'highest' (full float32), 'high' or "
                 "'medium' (float32 matmuls may use TF32 tensor cores; 'medium' means 'high' "
                 "here), or None (follow torch.get_float32_matmul_precision()), got %R",
                 arg);
    return NULL;
}

PyObject *ga_py_get_matmul_precision(PyObject *module, PyObject *unused)
{
    (void)unused;
    if (matmul_precision_set)
        return PyUnicode_FromString(matmul_precision_set);
    int allowed;
    const char *source;
    if (tf32_resolve(ga_state_from_module(module), GA_TF32_MATMUL, &allowed, &source) < 0)
        return NULL;
    return PyUnicode_FromString(allowed ? "high" : "highest");
}

PyObject *ga_py_set_conv_allow_tf32(PyObject *module, PyObject *arg)
{
    (void)module;
    if (arg != Py_None && !PyBool_Check(arg)) {
        PyErr_Format(PyExc_TypeError,
                     "set_conv_allow_tf32: allow must be True (float32 convolutions may use TF32 "
                     "tensor cores), False (full float32) or None (follow "
                     "torch.backends.cudnn.allow_tf32), got %.200R",
                     arg);
        return NULL;
    }
    tf32_set[GA_TF32_CONV] = arg == Py_None ? -1 : arg == Py_True;
    Py_RETURN_NONE;
}

PyObject *ga_py_get_conv_allow_tf32(PyObject *module, PyObject *unused)
{
    (void)unused;
    int allowed;
    const char *source;
    if (tf32_resolve(ga_state_from_module(module), GA_TF32_CONV, &allowed, &source) < 0)
        return NULL;
    return PyBool_FromLong(allowed);
}

PyObject *ga_py_tf32_state(PyObject *module, PyObject *arg)
{
    const char *name = ga_exact_utf8(arg);
    ga_tf32_op op = GA_TF32_OPS;
    if (name && strcmp(name, "matmul") == 0)
        op = GA_TF32_MATMUL;
    else if (name && strcmp(name, "conv") == 0)
        op = GA_TF32_CONV;
    if (op == GA_TF32_OPS) {
        PyErr_Format(PyExc_ValueError, "_tf32_state: op must be 'matmul' or 'conv', got %R", arg);
        return NULL;
    }
    int allowed;
    const char *source;
    if (tf32_resolve(ga_state_from_module(module), op, &allowed, &source) < 0)
        return NULL;
    return Py_BuildValue("(Ns)", PyBool_FromLong(allowed), source);
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
