/*
 * dtype.c — gpuaccel's dtypes and their names in NumPy, torch, PEP 3118.
 */
#include "npy.h"

#include "dtype.h"

static const char *const dtype_names[GA_NUM_DTYPES] = {
    "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
};

#define ACCEPTED_DTYPES \
    "bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64"

const char *ga_dtype_name(ga_dtype dtype)
{
    return (unsigned)dtype < GA_NUM_DTYPES ? dtype_names[dtype] : "unknown";
}

static int dtype_from_name(const char *name, ga_dtype *out)
{
    for (int d = 0; d < GA_NUM_DTYPES; d++) {
        if (strcmp(name, dtype_names[d]) == 0) {
            *out = (ga_dtype)d;
            return 0;
        }
    }
    /* torch's spellings that mean the same in NumPy ("int" and "float" do not:
     * they are left to NumPy, which reads them as int64 and float64) */
    static const struct {
        const char *alias;
        ga_dtype dtype;
    } aliases[] = {
        {"half", GA_FLOAT16}, {"bf16", GA_BFLOAT16}, {"double", GA_FLOAT64},
        {"long", GA_INT64},   {"short", GA_INT16},
    };
    for (size_t k = 0; k < sizeof aliases / sizeof aliases[0]; k++) {
        if (strcmp(name, aliases[k].alias) == 0) {
            *out = aliases[k].dtype;
            return 0;
        }
    }
    return -1;
}

static int raise_bad_dtype(PyObject *obj, const char *argname)
{
    PyErr_Format(PyExc_TypeError,
                 "%s must be one of " ACCEPTED_DTYPES
                 " (a str, NumPy dtype or torch.dtype), got %R",
                 argname, obj);
    return -1;
}

int ga_dtype_from_numpy_descr(ga_state *st, PyObject *descr_obj, ga_dtype *out)
{
    (void)st;
    PyArray_Descr *descr = (PyArray_Descr *)descr_obj;
    if (!PyDataType_ISNOTSWAPPED(descr))
        return -1;
    Py_ssize_t size = PyDataType_ELSIZE(descr);
    switch (descr->kind) {
    case 'b': *out = GA_BOOL; return 0;
    case 'u':
        if (size == 1) {
            *out = GA_UINT8;
            return 0;
        }
        return -1;
    case 'i':
        switch (size) {
        case 1: *out = GA_INT8; return 0;
        case 2: *out = GA_INT16; return 0;
        case 4: *out = GA_INT32; return 0;
        case 8: *out = GA_INT64; return 0;
        }
        return -1;
    case 'f':
        switch (size) {
        case 2: *out = GA_FLOAT16; return 0;
        case 4: *out = GA_FLOAT32; return 0;
        case 8: *out = GA_FLOAT64; return 0;
        }
        return -1;
    default: break;
    }
    /* ml_dtypes.bfloat16 is a user-defined NumPy type */
    const char *type_name = descr->typeobj ? ((PyTypeObject *)descr->typeobj)->tp_name : "";
    const char *dot = strrchr(type_name, '.');
    if (size == 2 && strcmp(dot ? dot + 1 : type_name, "bfloat16") == 0) {
        *out = GA_BFLOAT16;
        return 0;
    }
    return -1;
}

int ga_dtype_from_object(ga_state *st, PyObject *obj, ga_dtype *out, const char *argname)
{
    if (PyUnicode_Check(obj)) {
        Py_ssize_t length;
        const char *name = PyUnicode_AsUTF8AndSize(obj, &length);
        if (!name || (size_t)length != strlen(name)) { /* unencodable, or an embedded NUL */
            PyErr_Clear();
            return raise_bad_dtype(obj, argname);
        }
        if (strncmp(name, "torch.", 6) == 0)
            name += 6;
        if (dtype_from_name(name, out) == 0)
            return 0;
        /* fall through to NumPy for spellings like "f4" or "<i8" */
    }
    /* torch.dtype: its str() is "torch.float32" */
    PyTypeObject *type = Py_TYPE(obj);
    if (strcmp(type->tp_name, "torch.dtype") == 0) {
        PyObject *text = PyObject_Str(obj);
        if (!text)
            return -1;
        const char *name = PyUnicode_AsUTF8(text);
        int rc = name && strncmp(name, "torch.", 6) == 0 ? dtype_from_name(name + 6, out) : -1;
        Py_DECREF(text);
        if (rc == 0)
            return 0;
        return raise_bad_dtype(obj, argname);
    }
    PyArray_Descr *descr = NULL;
    if (!PyArray_DescrConverter2(obj, &descr) || !descr) {
        PyErr_Clear();
        return raise_bad_dtype(obj, argname);
    }
    int rc = ga_dtype_from_numpy_descr(st, (PyObject *)descr, out);
    if (rc < 0 && !PyDataType_ISNOTSWAPPED(descr)) {
        PyErr_Format(PyExc_TypeError,
                     "%s %R has non-native byte order; gpuaccel arrays are native-endian: give "
                     "the dtype without '>' or '<'",
                     argname, obj);
        Py_DECREF(descr);
        return -1;
    }
    Py_DECREF(descr);
    if (rc < 0)
        return raise_bad_dtype(obj, argname);
    return 0;
}

/* ml_dtypes' bfloat16 dtype, looked up once; Py_None when not installed. */
static PyObject *bfloat16_descr(ga_state *st)
{
    if (!st->bfloat16_descr) {
        PyObject *mod = PyImport_ImportModule("ml_dtypes");
        PyObject *descr = NULL;
        if (mod) {
            PyObject *type = PyObject_GetAttrString(mod, "bfloat16");
            if (type) {
                PyArray_DescrConverter(type, (PyArray_Descr **)&descr);
                Py_DECREF(type);
            }
            Py_DECREF(mod);
        }
        PyErr_Clear();
        st->bfloat16_descr = descr ? descr : Py_NewRef(Py_None);
    }
    return st->bfloat16_descr;
}

int ga_numpy_has_bfloat16(ga_state *st)
{
    return bfloat16_descr(st) != Py_None;
}

PyObject *ga_dtype_to_numpy(ga_state *st, ga_dtype dtype)
{
    static const int typenums[GA_NUM_DTYPES] = {
        NPY_BOOL,  NPY_UINT8, NPY_INT8, NPY_INT16, NPY_INT32,
        NPY_INT64, NPY_HALF,  -1,       NPY_FLOAT, NPY_DOUBLE,
    };
    if (dtype == GA_BFLOAT16) {
        PyObject *descr = bfloat16_descr(st);
        if (descr == Py_None) {
            PyErr_SetString(PyExc_TypeError,
                            "NumPy has no bfloat16 dtype: install ml_dtypes (pip install "
                            "ml_dtypes) to get bfloat16 NumPy arrays, or convert first with "
                            ".astype('float32')");
            return NULL;
        }
        return Py_NewRef(descr);
    }
    if ((unsigned)dtype >= GA_NUM_DTYPES) {
        PyErr_SetString(PyExc_SystemError, "gpuaccel: unknown dtype");
        return NULL;
    }
    return (PyObject *)PyArray_DescrFromType(typenums[dtype]);
}

const char *ga_dtype_buffer_format(ga_dtype dtype)
{
    static const char *const formats[GA_NUM_DTYPES] = {
        "?", "B", "b", "h", "i", "q", "e", NULL, "f", "d",
    };
    return (unsigned)dtype < GA_NUM_DTYPES ? formats[dtype] : NULL;
}
