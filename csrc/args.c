/*
 * args.c — keyword-argument parsing for METH_FASTCALL entry points.
 *
 * PyArg_ParseTupleAndKeywords builds a tuple and a dict for every call;
 * the hot paths (DLPack exchange, asarray, the ops) parse the vectorcall
 * arguments directly instead.
 */
#include "args.h"
#include "errors.h"

#include <string.h>

const char *ga_exact_utf8(PyObject *obj)
{
    if (!obj || !PyUnicode_Check(obj))
        return NULL;
    Py_ssize_t length;
    const char *text = PyUnicode_AsUTF8AndSize(obj, &length);
    if (!text || (size_t)length != strlen(text)) {
        PyErr_Clear();
        return NULL;
    }
    return text;
}

int ga_lookup_attr(PyObject *obj, PyObject *name, PyObject **result)
{
    *result = PyObject_GetAttr(obj, name);
    if (*result)
        return 1;
    if (!PyErr_ExceptionMatches(PyExc_AttributeError))
        return -1;
    PyErr_Clear();
    return 0;
}

int ga_has_attr(PyObject *obj, PyObject *name)
{
    PyObject *value;
    int rc = ga_lookup_attr(obj, name, &value);
    Py_XDECREF(value);
    return rc;
}

int ga_copy_flag_from_object(PyObject *obj, int *out)
{
    if (obj == NULL || obj == Py_None) {
        *out = -1;
        return 0;
    }
    if (PyBool_Check(obj)) {
        *out = obj == Py_True;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "copy must be None, True or False, got %.200s",
                 ga_type_name(obj));
    return -1;
}

int ga_parse_args(const char *func, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                  const char *const *names, int max_positional, int required, PyObject **values)
{
    int n = 0;
    while (names[n])
        n++;
    if (nargs > max_positional) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional argument%s (%zd given)",
                     func, max_positional, max_positional == 1 ? "" : "s", nargs);
        return -1;
    }
    for (int i = 0; i < n; i++)
        values[i] = i < nargs ? args[i] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int j = 0;
        while (j < n && PyUnicode_CompareWithASCIIString(key, names[j]) != 0)
            j++;
        if (j == n) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", func, key);
            return -1;
        }
        if (values[j]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", func,
                         names[j]);
            return -1;
        }
        values[j] = args[nargs + k];
    }
    for (int j = 0; j < required; j++) {
        if (!values[j]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' (pos %d)", func,
                         names[j], j + 1);
            return -1;
        }
    }
    return 0;
}

/* More than any gpuaccel function takes. */
#define GA_MAX_ARGS 24

int ga_parse_args_into(const char *func, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                       const ga_arg_field *fields, int max_positional, int required, void *out)
{
    const char *names[GA_MAX_ARGS + 1];
    PyObject *values[GA_MAX_ARGS];
    int n = 0;
    for (; fields[n].name; n++) {
        if (n == GA_MAX_ARGS) {
            PyErr_Format(PyExc_SystemError, "%s() has more than %d arguments", func, GA_MAX_ARGS);
            return -1;
        }
        names[n] = fields[n].name;
    }
    names[n] = NULL;
    if (ga_parse_args(func, args, nargs, kwnames, names, max_positional, required, values) < 0)
        return -1;
    for (int k = 0; k < n; k++)
        *(PyObject **)((char *)out + fields[k].offset) = values[k];
    return 0;
}

PyObject *ga_int64_tuple(int n, const int64_t *values)
{
    PyObject *t = PyTuple_New(n);
    for (int k = 0; t && k < n; k++) {
        PyObject *v = PyLong_FromLongLong(values[k]);
        if (!v) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, k, v);
    }
    return t;
}
