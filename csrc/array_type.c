/*
 * array_type.c — the gpuaccel.Array Python type over the core of array.c:
 * attributes, basic indexing and assignment, reshape, the NumPy and buffer
 * protocols, item/tolist, to/astype/copy, repr, and its slot tables.
 */
#include "npy.h"

#include <structmember.h>
#include <string.h>

#include "array_type.h"
#include "create.h"
#include "dlpack.h"
#include "transfer.h"

_Static_assert(sizeof(Py_ssize_t) == sizeof(int64_t), "Py_buffer shape/strides alias int64_t");
_Static_assert(sizeof(npy_intp) == sizeof(int64_t), "npy_intp aliases int64_t");

/* ----------------------------------------------------------- lifetime */

static int Array_traverse(ArrayObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->base);
    return 0;
}

static int Array_clear(ArrayObject *self)
{
    Py_CLEAR(self->base);
    return 0;
}

static void Array_dealloc(ArrayObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)self);
    if (self->owns_block)
        ga_block_free(self->block);
    if (self->dlpack)
        ga_dlpack_release(self->dlpack, self->dlpack_versioned);
    free(self->dl_strides);
    Array_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* --------------------------------------------------------- attributes */

static PyObject *Array_get_shape(ArrayObject *self, void *c)
{
    (void)c;
    return ga_int64_tuple(self->ndim, self->shape);
}

static PyObject *Array_get_strides(ArrayObject *self, void *c)
{
    (void)c;
    return ga_int64_tuple(self->ndim, self->strides);
}

static PyObject *Array_get_dtype(ArrayObject *self, void *c)
{
    (void)c;
    return PyUnicode_FromString(ga_dtype_name(self->dtype));
}

static PyObject *Array_get_device(ArrayObject *self, void *c)
{
    (void)c;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    return st ? ga_device_new(st, self->device) : NULL;
}

static PyObject *Array_get_ndim(ArrayObject *self, void *c)
{
    (void)c;
    return PyLong_FromLong(self->ndim);
}

static PyObject *Array_get_size(ArrayObject *self, void *c)
{
    (void)c;
    return PyLong_FromLongLong(ga_array_size(self));
}

static PyObject *Array_get_itemsize(ArrayObject *self, void *c)
{
    (void)c;
    return PyLong_FromSize_t(ga_dtype_itemsize(self->dtype));
}

static PyObject *Array_get_nbytes(ArrayObject *self, void *c)
{
    (void)c;
    return PyLong_FromLongLong(ga_array_size(self) * (int64_t)ga_dtype_itemsize(self->dtype));
}

static PyObject *Array_get_data_ptr(ArrayObject *self, void *c)
{
    (void)c;
    return PyLong_FromVoidPtr(self->data);
}

static PyObject *Array_get_is_contiguous(ArrayObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(ga_array_is_contiguous(self));
}

static PyObject *Array_get_pinned(ArrayObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->flags & GA_ARRAY_PINNED);
}

static PyObject *Array_get_readonly(ArrayObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->flags & GA_ARRAY_READONLY);
}

static PyObject *Array_get_T(ArrayObject *self, void *c)
{
    (void)c;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    int64_t shape[GA_MAX_NDIM], strides[GA_MAX_NDIM];
    for (int d = 0; d < self->ndim; d++) {
        shape[d] = self->shape[self->ndim - 1 - d];
        strides[d] = self->strides[self->ndim - 1 - d];
    }
    return (PyObject *)ga_array_view(st, self, self->data, self->ndim, shape, strides);
}

/* ----------------------------------------------------------- indexing */

static int raise_bad_index(PyObject *item)
{
    PyErr_Format(PyExc_IndexError,
                 "only integers, slices (`:`), ellipsis (`...`) and None are valid indices "
                 "(advanced indexing with arrays, lists or bools is not supported), got %.200s",
                 ga_type_name(item));
    return -1;
}

/* Basic indexing: the view's geometry for self[key]. */
static int index_view(ArrayObject *self, PyObject *key, char **data, int *ndim, int64_t *shape,
                      int64_t *strides)
{
    PyObject *items = PyTuple_Check(key) ? Py_NewRef(key) : PyTuple_Pack(1, key);
    if (!items)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    int consumed = 0, ellipses = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PyTuple_GET_ITEM(items, k);
        if (item == Py_Ellipsis)
            ellipses++;
        else if (item != Py_None)
            consumed++;
    }
    int rc = -1;
    if (ellipses > 1) {
        PyErr_SetString(PyExc_IndexError, "an index can only have a single ellipsis ('...')");
        goto done;
    }
    if (consumed > self->ndim) {
        PyErr_Format(PyExc_IndexError,
                     "too many indices: the array is %d-dimensional, but %d were indexed",
                     self->ndim, consumed);
        goto done;
    }
    int64_t offset = 0; /* bytes from self->data (which is NULL for some empty arrays) */
    int src = 0, out = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PyTuple_GET_ITEM(items, k);
        if (out >= GA_MAX_NDIM && (item == Py_None || PySlice_Check(item))) {
            PyErr_Format(PyExc_IndexError, "the result would have more than %d dimensions",
                         GA_MAX_NDIM);
            goto done;
        }
        if (item == Py_None) {
            shape[out] = 1;
            strides[out] = 0;
            out++;
        } else if (item == Py_Ellipsis) {
            int span = self->ndim - consumed;
            if (out + span > GA_MAX_NDIM) {
                PyErr_Format(PyExc_IndexError, "the result would have more than %d dimensions",
                             GA_MAX_NDIM);
                goto done;
            }
            for (int j = 0; j < span; j++, src++, out++) {
                shape[out] = self->shape[src];
                strides[out] = self->strides[src];
            }
        } else if (PySlice_Check(item)) {
            Py_ssize_t start, stop, step;
            if (PySlice_Unpack(item, &start, &stop, &step) < 0)
                goto done;
            Py_ssize_t len =
                PySlice_AdjustIndices((Py_ssize_t)self->shape[src], &start, &stop, step);
            if (len > 0)
                offset += start * self->strides[src];
            shape[out] = len;
            strides[out] = self->strides[src] * step;
            src++, out++;
        } else if (PyIndex_Check(item) && !PyBool_Check(item) &&
                   !(PyArray_Check(item) && PyArray_NDIM((PyArrayObject *)item) > 0) &&
                   !PyArray_IsScalar(item, Bool)) {
            Py_ssize_t i = PyNumber_AsSsize_t(item, PyExc_IndexError);
            if (i == -1 && PyErr_Occurred())
                goto done;
            int64_t size = self->shape[src];
            if (i < -size || i >= size) {
                PyErr_Format(PyExc_IndexError,
                             "index %zd is out of bounds for axis %d with size %lld", i, src,
                             (long long)size);
                goto done;
            }
            if (i < 0)
                i += size;
            offset += i * self->strides[src];
            src++;
        } else {
            raise_bad_index(item);
            goto done;
        }
    }
    for (; src < self->ndim; src++, out++) {
        if (out >= GA_MAX_NDIM) {
            PyErr_Format(PyExc_IndexError, "the result would have more than %d dimensions",
                         GA_MAX_NDIM);
            goto done;
        }
        shape[out] = self->shape[src];
        strides[out] = self->strides[src];
    }
    *data = self->data ? (char *)self->data + offset : NULL;
    *ndim = out;
    rc = 0;
done:
    Py_DECREF(items);
    return rc;
}

static PyObject *Array_getitem(ArrayObject *self, PyObject *key)
{
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    char *data;
    int ndim;
    int64_t shape[GA_MAX_NDIM], strides[GA_MAX_NDIM];
    if (index_view(self, key, &data, &ndim, shape, strides) < 0)
        return NULL;
    return (PyObject *)ga_array_view(st, self, data, ndim, shape, strides);
}

static PyObject *Array_item_at(ArrayObject *self, Py_ssize_t i)
{
    PyObject *key = PyLong_FromSsize_t(i);
    if (!key)
        return NULL;
    PyObject *result = Array_getitem(self, key);
    Py_DECREF(key);
    return result;
}

static int is_python_scalar(PyObject *v)
{
    return PyLong_Check(v) || PyFloat_Check(v) || PyBool_Check(v) || PyArray_IsScalar(v, Number) ||
           PyArray_IsScalar(v, Bool);
}

/* Strides that broadcast `src` to `ndim`/`shape` (NumPy's rules). */
static int broadcast_strides(const ArrayObject *src, int ndim, const int64_t *shape,
                             int64_t *strides, const char *argname)
{
    if (src->ndim > ndim) {
        for (int d = 0; d < src->ndim - ndim; d++) {
            if (src->shape[d] != 1)
                goto mismatch;
        }
    }
    for (int d = 0; d < ndim; d++) {
        int s = src->ndim - ndim + d;
        if (s < 0) {
            strides[d] = 0;
        } else if (src->shape[s] == shape[d]) {
            strides[d] = src->strides[s];
        } else if (src->shape[s] == 1) {
            strides[d] = 0;
        } else {
            goto mismatch;
        }
    }
    return 0;
mismatch : {
    PyObject *have = ga_int64_tuple(src->ndim, src->shape);
    PyObject *want = ga_int64_tuple(ndim, shape);
    if (have && want)
        PyErr_Format(PyExc_ValueError, "%s: could not broadcast shape %R into shape %R", argname,
                     have, want);
    Py_XDECREF(have);
    Py_XDECREF(want);
    return -1;
}
}

static int assign(ga_state *st, ArrayObject *dst, PyObject *value)
{
    if (dst->flags & GA_ARRAY_READONLY) {
        PyErr_SetString(PyExc_ValueError, "assignment destination is read-only");
        return -1;
    }
    if (is_python_scalar(value))
        return ga_array_fill(st, dst, value);
    ArrayObject *src = ga_asarray(st, value, NULL, &dst->device, -1, NULL);
    ArrayObject *view = NULL;
    int rc = -1;
    if (!src)
        return -1;
    int64_t strides[GA_MAX_NDIM];
    if (broadcast_strides(src, dst->ndim, dst->shape, strides, "value") < 0)
        goto done;
    if (ga_arrays_may_overlap(dst, src)) {
        /* read all of src before writing any of dst */
        ArrayObject *tmp = ga_array_copy_to(st, src, src->device, src->dtype, 0, NULL);
        if (!tmp)
            goto done;
        Py_SETREF(src, tmp);
        if (broadcast_strides(src, dst->ndim, dst->shape, strides, "value") < 0)
            goto done;
    }
    view = ga_array_view(st, src, src->data, dst->ndim, dst->shape, strides);
    if (!view)
        goto done;
    rc = ga_copy_into(st, dst, view, NULL);
done:
    Py_XDECREF(view);
    Py_DECREF(src);
    return rc;
}

static int Array_setitem(ArrayObject *self, PyObject *key, PyObject *value)
{
    if (!value) {
        PyErr_SetString(PyExc_TypeError, "gpuaccel.Array does not support item deletion");
        return -1;
    }
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return -1;
    ArrayObject *view = (ArrayObject *)Array_getitem(self, key);
    if (!view)
        return -1;
    int rc = assign(st, view, value);
    Py_DECREF(view);
    return rc;
}

static Py_ssize_t Array_length(ArrayObject *self)
{
    if (self->ndim == 0) {
        PyErr_SetString(PyExc_TypeError, "len() of a 0-d array");
        return -1;
    }
    return (Py_ssize_t)self->shape[0];
}

/* ------------------------------------------------------------ reshape */

/* NumPy's no-copy reshape: new strides for `self` seen with `shape`, or
 * 0 when the memory layout does not allow a view. */
static int reshape_strides(const ArrayObject *self, int new_ndim, const int64_t *new_shape,
                           int64_t *new_strides)
{
    int64_t old_shape[GA_MAX_NDIM], old_strides[GA_MAX_NDIM];
    int old_ndim = 0;
    for (int d = 0; d < self->ndim; d++) {
        if (self->shape[d] != 1) {
            old_shape[old_ndim] = self->shape[d];
            old_strides[old_ndim] = self->strides[d];
            old_ndim++;
        }
    }
    int oi = 0, oj = 1, ni = 0, nj = 1;
    while (ni < new_ndim && oi < old_ndim) {
        int64_t np_ = new_shape[ni], op = old_shape[oi];
        while (np_ != op) {
            if (np_ < op) {
                if (nj >= new_ndim)
                    return 0;
                np_ *= new_shape[nj++];
            } else {
                if (oj >= old_ndim)
                    return 0;
                op *= old_shape[oj++];
            }
        }
        for (int ok = oi; ok < oj - 1; ok++)
            if (old_strides[ok] != old_shape[ok + 1] * old_strides[ok + 1])
                return 0;
        new_strides[nj - 1] = old_strides[oj - 1];
        for (int nk = nj - 1; nk > ni; nk--)
            new_strides[nk - 1] = new_strides[nk] * new_shape[nk];
        ni = nj++;
        oi = oj++;
    }
    int64_t last = ni > 0 ? new_strides[ni - 1] : (int64_t)ga_dtype_itemsize(self->dtype);
    for (int nk = ni; nk < new_ndim; nk++)
        new_strides[nk] = last;
    return 1;
}

static PyObject *Array_reshape(ArrayObject *self, PyObject *args, PyObject *kwargs)
{
    if (kwargs && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "reshape() takes the new shape only");
        return NULL;
    }
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    PyObject *shape_obj = PyTuple_GET_SIZE(args) == 1 ? PyTuple_GET_ITEM(args, 0) : args;
    int64_t shape[GA_MAX_NDIM];
    int ndim;
    if (ga_shape_from_object(shape_obj, shape, &ndim, "shape") < 0)
        return NULL;
    int64_t size = ga_array_size(self), known = 1;
    int infer = -1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == -1) {
            if (infer >= 0) {
                PyErr_SetString(PyExc_ValueError,
                                "reshape: can only specify one unknown dimension");
                return NULL;
            }
            infer = d;
        } else if (shape[d] < 0) {
            PyErr_Format(PyExc_ValueError, "reshape: negative dimension %lld in shape",
                         (long long)shape[d]);
            return NULL;
        } else {
            known *= shape[d];
        }
    }
    if (infer >= 0) {
        if (known == 0 || size % known) {
            PyObject *t = ga_int64_tuple(ndim, shape);
            if (t)
                PyErr_Format(PyExc_ValueError, "cannot reshape array of size %lld into shape %R",
                             (long long)size, t);
            Py_XDECREF(t);
            return NULL;
        }
        shape[infer] = size / known;
        known = size;
    }
    if (known != size) {
        PyObject *t = ga_int64_tuple(ndim, shape);
        if (t)
            PyErr_Format(PyExc_ValueError, "cannot reshape array of size %lld into shape %R",
                         (long long)size, t);
        Py_XDECREF(t);
        return NULL;
    }
    int64_t strides[GA_MAX_NDIM];
    if (size == 0) {
        ga_contiguous_strides(ndim, shape, (int64_t)ga_dtype_itemsize(self->dtype), strides);
        return (PyObject *)ga_array_view(st, self, self->data, ndim, shape, strides);
    }
    if (reshape_strides(self, ndim, shape, strides))
        return (PyObject *)ga_array_view(st, self, self->data, ndim, shape, strides);
    /* the layout needs a copy (e.g. reshaping a transposed array) */
    ArrayObject *copy =
        ga_array_copy_to(st, self, self->device, self->dtype, self->flags & GA_ARRAY_PINNED, NULL);
    if (!copy)
        return NULL;
    ga_contiguous_strides(ndim, shape, (int64_t)ga_dtype_itemsize(self->dtype), strides);
    PyObject *result = (PyObject *)ga_array_view(st, copy, copy->data, ndim, shape, strides);
    Py_DECREF(copy);
    return result;
}

/* -------------------------------------------------------------- NumPy */

/* Zero-copy NumPy view of a host array. */
static PyObject *numpy_view(ga_state *st, ArrayObject *a)
{
    PyArray_Descr *descr = (PyArray_Descr *)ga_dtype_to_numpy(st, a->dtype);
    if (!descr)
        return NULL;
    int flags = a->flags & GA_ARRAY_READONLY ? 0 : NPY_ARRAY_WRITEABLE;
    if (flags && ga_array_before_host_write(st, a) < 0) {
        Py_DECREF(descr);
        return NULL;
    }
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descr, a->ndim, (npy_intp *)a->shape,
                                         (npy_intp *)a->strides, a->data, flags, NULL);
    if (!arr)
        return NULL;
    if (PyArray_SetBaseObject((PyArrayObject *)arr, Py_NewRef(a)) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

/* Host arrays: a view.  CUDA arrays: a copy made after the work queued on
 * the stream (None: the current stream), which this waits for. */
static PyObject *to_numpy(ga_state *st, ArrayObject *self, PyObject *stream_obj)
{
    if (self->device.type == GA_DEVICE_CPU)
        return numpy_view(st, self);
    PyArray_Descr *descr = (PyArray_Descr *)ga_dtype_to_numpy(st, self->dtype);
    if (!descr)
        return NULL;
    PyObject *arr = PyArray_Empty(self->ndim, (npy_intp *)self->shape, descr, 0);
    if (!arr)
        return NULL;
    ga_device cpu = {GA_DEVICE_CPU, 0};
    ArrayObject *host = ga_array_wrap(st, PyArray_DATA((PyArrayObject *)arr), self->dtype,
                                      self->ndim, self->shape, NULL, cpu, 0, arr);
    int rc = host ? ga_copy_into(st, host, self, stream_obj) : -1;
    Py_XDECREF(host);
    if (rc < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyObject *Array_numpy(ArrayObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"stream", NULL};
    PyObject *stream_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$O:numpy", kwlist, &stream_obj))
        return NULL;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    return st ? to_numpy(st, self, stream_obj) : NULL;
}

static PyObject *Array_array(ArrayObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"dtype", "copy", NULL};
    PyObject *dtype = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:__array__", kwlist, &dtype, &copy))
        return NULL;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    if (self->device.type != GA_DEVICE_CPU) {
        PyErr_SetString(PyExc_TypeError,
                        "a CUDA gpuaccel.Array cannot be turned into a NumPy array implicitly; "
                        "call .numpy() (which copies to the host) or .to('cpu')");
        return NULL;
    }
    PyObject *view = numpy_view(st, self);
    if (!view)
        return NULL;
    if (dtype == Py_None && copy != Py_True)
        return view;
    PyArray_Descr *want = NULL;
    if (dtype != Py_None && !PyArray_DescrConverter(dtype, &want)) {
        Py_DECREF(view);
        return NULL;
    }
    if (!want)
        want = (PyArray_Descr *)Py_NewRef(PyArray_DESCR((PyArrayObject *)view));
    if (copy == Py_False && !PyArray_EquivTypes(want, PyArray_DESCR((PyArrayObject *)view))) {
        Py_DECREF(want);
        Py_DECREF(view);
        PyErr_SetString(PyExc_ValueError,
                        "__array__: converting to another dtype needs a copy, but copy=False");
        return NULL;
    }
    /* steals `want` */
    PyObject *result = PyArray_CastToType((PyArrayObject *)view, want, 0);
    Py_DECREF(view);
    return result;
}

/* Host values (as NumPy) for item()/tolist()/repr; bfloat16 goes through
 * float32 when ml_dtypes is not there. */
static PyObject *host_values(ga_state *st, ArrayObject *self)
{
    if (self->dtype != GA_BFLOAT16 || ga_numpy_has_bfloat16(st))
        return to_numpy(st, self, Py_None);
    ArrayObject *f = ga_array_copy_to(st, self, self->device, GA_FLOAT32, 0, NULL);
    if (!f)
        return NULL;
    PyObject *result = to_numpy(st, f, Py_None);
    Py_DECREF(f);
    return result;
}

static PyObject *Array_item(ArrayObject *self, PyObject *unused)
{
    (void)unused;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    if (ga_array_size(self) != 1) {
        PyErr_Format(PyExc_ValueError,
                     "item() needs an array with exactly one element, this one has %lld",
                     (long long)ga_array_size(self));
        return NULL;
    }
    PyObject *values = host_values(st, self);
    if (!values)
        return NULL;
    PyObject *result = PyObject_CallMethod(values, "item", NULL);
    Py_DECREF(values);
    return result;
}

static PyObject *Array_tolist(ArrayObject *self, PyObject *unused)
{
    (void)unused;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    PyObject *values = host_values(st, self);
    if (!values)
        return NULL;
    PyObject *result = PyObject_CallMethod(values, "tolist", NULL);
    Py_DECREF(values);
    return result;
}

static PyObject *Array_float(ArrayObject *self)
{
    PyObject *item = Array_item(self, NULL);
    if (!item)
        return NULL;
    PyObject *result = PyNumber_Float(item);
    Py_DECREF(item);
    return result;
}

static PyObject *Array_int(ArrayObject *self)
{
    PyObject *item = Array_item(self, NULL);
    if (!item)
        return NULL;
    PyObject *result = PyNumber_Long(item);
    Py_DECREF(item);
    return result;
}

static int Array_bool(ArrayObject *self)
{
    if (ga_array_size(self) != 1) {
        PyErr_SetString(PyExc_ValueError,
                        "the truth value of an array with more than one element is ambiguous");
        return -1;
    }
    PyObject *item = Array_item(self, NULL);
    if (!item)
        return -1;
    int result = PyObject_IsTrue(item);
    Py_DECREF(item);
    return result;
}

/* --------------------------------------------------------------- moves */

static PyObject *Array_to(ArrayObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"device", "stream", "copy", NULL};
    PyObject *device_obj, *stream_obj = Py_None;
    int copy = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$Op:to", kwlist, &device_obj, &stream_obj,
                                     &copy))
        return NULL;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    ga_device device;
    if (!st || ga_device_from_object(st, device_obj, &device, "device") < 0)
        return NULL;
    if (ga_device_equal(device, self->device) && !copy)
        return Py_NewRef(self);
    return (PyObject *)ga_array_copy_to(st, self, device, self->dtype, 0, stream_obj);
}

static PyObject *Array_astype(ArrayObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"dtype", "copy", NULL};
    PyObject *dtype_obj;
    int copy = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$p:astype", kwlist, &dtype_obj, &copy))
        return NULL;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    ga_dtype dtype;
    if (!st || ga_dtype_from_object(st, dtype_obj, &dtype, "dtype") < 0)
        return NULL;
    if (dtype == self->dtype && !copy)
        return Py_NewRef(self);
    return (PyObject *)ga_array_copy_to(st, self, self->device, dtype, 0, NULL);
}

static PyObject *Array_copy(ArrayObject *self, PyObject *unused)
{
    (void)unused;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    return (PyObject *)ga_array_copy_to(st, self, self->device, self->dtype,
                                        self->flags & GA_ARRAY_PINNED, NULL);
}

/* ---------------------------------------------------------------- repr */

static PyObject *Array_repr(ArrayObject *self)
{
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    char dev[32];
    ga_device_str(self->device, dev, sizeof dev);
    const char *pinned = self->flags & GA_ARRAY_PINNED ? ", pinned=True" : "";
    if (self->device.type == GA_DEVICE_CUDA) {
        /* metadata only: showing values would synchronize with the GPU */
        PyObject *shape = ga_int64_tuple(self->ndim, self->shape);
        if (!shape)
            return NULL;
        PyObject *r = PyUnicode_FromFormat("gpuaccel.Array(shape=%R, dtype=%s, device='%s')", shape,
                                           ga_dtype_name(self->dtype), dev);
        Py_DECREF(shape);
        return r;
    }
    PyObject *values = host_values(st, self);
    PyObject *text = NULL, *numpy = NULL, *fn = NULL, *args = NULL, *kwargs = NULL;
    if (values && (numpy = PyImport_ImportModule("numpy")) &&
        (fn = PyObject_GetAttrString(numpy, "array2string")) && (args = PyTuple_Pack(1, values)) &&
        (kwargs = Py_BuildValue("{s:s,s:s}", "separator", ", ", "prefix", "gpuaccel.Array(")))
        text = PyObject_Call(fn, args, kwargs);
    Py_XDECREF(kwargs);
    Py_XDECREF(args);
    Py_XDECREF(fn);
    Py_XDECREF(numpy);
    Py_XDECREF(values);
    if (!text)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("gpuaccel.Array(%U, dtype=%s, device='%s'%s)", text,
                                       ga_dtype_name(self->dtype), dev, pinned);
    Py_DECREF(text);
    return r;
}

/* ------------------------------------------------------ buffer protocol */

static int Array_getbuffer(ArrayObject *self, Py_buffer *view, int flags)
{
    if (self->device.type != GA_DEVICE_CPU) {
        PyErr_SetString(PyExc_BufferError,
                        "a CUDA array has no host buffer; use .numpy() or DLPack");
        return -1;
    }
    const char *format = ga_dtype_buffer_format(self->dtype);
    if (!format) {
        PyErr_SetString(PyExc_BufferError,
                        "bfloat16 has no buffer-protocol format; use .numpy() (with ml_dtypes) "
                        "or DLPack");
        return -1;
    }
    if ((flags & PyBUF_WRITABLE) && (self->flags & GA_ARRAY_READONLY)) {
        PyErr_SetString(PyExc_BufferError, "the array is read-only");
        return -1;
    }
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st || (!(self->flags & GA_ARRAY_READONLY) && ga_array_before_host_write(st, self) < 0))
        return -1;
    int contiguous = ga_array_is_contiguous(self);
    if (!(flags & PyBUF_STRIDES) || (flags & PyBUF_C_CONTIGUOUS) == PyBUF_C_CONTIGUOUS ||
        (flags & PyBUF_ANY_CONTIGUOUS) == PyBUF_ANY_CONTIGUOUS) {
        if (!contiguous) {
            PyErr_SetString(PyExc_BufferError,
                            "the array is not C-contiguous; ask for a strided buffer or copy()");
            return -1;
        }
    }
    if ((flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS && self->ndim > 1 &&
        (flags & PyBUF_ANY_CONTIGUOUS) != PyBUF_ANY_CONTIGUOUS) {
        PyErr_SetString(PyExc_BufferError, "the array is not Fortran-contiguous");
        return -1;
    }
    view->buf = self->data;
    view->obj = Py_NewRef(self);
    view->len = (Py_ssize_t)(ga_array_size(self) * (int64_t)ga_dtype_itemsize(self->dtype));
    view->readonly = (self->flags & GA_ARRAY_READONLY) != 0;
    view->itemsize = (Py_ssize_t)ga_dtype_itemsize(self->dtype);
    view->format = (flags & PyBUF_FORMAT) ? (char *)format : NULL;
    view->ndim = self->ndim;
    view->shape = (flags & PyBUF_ND) ? (Py_ssize_t *)self->shape : NULL;
    view->strides = (flags & PyBUF_STRIDES) ? (Py_ssize_t *)self->strides : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

/* --------------------------------------------------------------- tables */

static PyGetSetDef Array_getset[] = {
    {"shape", (getter)Array_get_shape, NULL, "tuple of dimension sizes", NULL},
    {"strides", (getter)Array_get_strides, NULL, "tuple of strides in bytes (as NumPy)", NULL},
    {"dtype", (getter)Array_get_dtype, NULL, "element type name, e.g. 'bfloat16'", NULL},
    {"device", (getter)Array_get_device, NULL, "the Device the memory lives on", NULL},
    {"ndim", (getter)Array_get_ndim, NULL, "number of dimensions", NULL},
    {"size", (getter)Array_get_size, NULL, "number of elements", NULL},
    {"itemsize", (getter)Array_get_itemsize, NULL, "bytes per element", NULL},
    {"nbytes", (getter)Array_get_nbytes, NULL, "size * itemsize", NULL},
    {"data_ptr", (getter)Array_get_data_ptr, NULL, "address of the first element", NULL},
    {"is_contiguous", (getter)Array_get_is_contiguous, NULL, "C-contiguous (NumPy's rule)", NULL},
    {"pinned", (getter)Array_get_pinned, NULL, "host memory that is page-locked", NULL},
    {"readonly", (getter)Array_get_readonly, NULL, "writes through this array are refused", NULL},
    {"T", (getter)Array_get_T, NULL, "view with the dimensions reversed", NULL},
    {"__cuda_array_interface__", (getter)ga_array_cuda_array_interface, NULL,
     "CUDA Array Interface v3 (CUDA arrays only)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#define KW (PyCFunction)(void (*)(void))

static PyMethodDef Array_methods[] = {
    {"numpy", KW Array_numpy, METH_VARARGS | METH_KEYWORDS,
     "numpy($self, /, *, stream=None)\n--\n\nReturns numpy.ndarray.  Host arrays: a zero-copy "
     "view.  CUDA arrays: a copy, made after the work queued on `stream`."},
    {"to", KW Array_to, METH_VARARGS | METH_KEYWORDS,
     "to($self, device, /, *, stream=None, copy=False)\n--\n\nReturns Array.  The array on "
     "another device (self when already there and copy is False)."},
    {"astype", KW Array_astype, METH_VARARGS | METH_KEYWORDS,
     "astype($self, dtype, /, *, copy=True)\n--\n\nReturns Array."},
    {"reshape", KW Array_reshape, METH_VARARGS | METH_KEYWORDS,
     "reshape($self, /, *shape)\n--\n\nReturns Array.  A view when the layout allows, else a "
     "copy; one dimension may be -1."},
    {"copy", (PyCFunction)Array_copy, METH_NOARGS,
     "copy($self, /)\n--\n\nA C-contiguous copy on the same device."},
    {"item", (PyCFunction)Array_item, METH_NOARGS,
     "item($self, /)\n--\n\nThe single element as a Python number (waits for the GPU)."},
    {"tolist", (PyCFunction)Array_tolist, METH_NOARGS,
     "tolist($self, /)\n--\n\nNested lists of Python numbers."},
    {"__dlpack__", KW ga_array_dlpack, METH_FASTCALL | METH_KEYWORDS,
     "__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
     "A DLPack capsule of the array (DLPack 1.x: versioned when max_version asks for it); "
     "`stream` is the consumer's, which waits for gpuaccel's on the GPU."},
    {"__dlpack_device__", (PyCFunction)ga_array_dlpack_device, METH_NOARGS,
     "__dlpack_device__($self, /)\n--\n\n(device type, device index) as DLPack codes."},
    {"__array__", KW Array_array, METH_VARARGS | METH_KEYWORDS,
     "__array__($self, /, dtype=None, copy=None)\n--\n\nNumPy's array protocol: a view of a host "
     "array, a copy of a CUDA one."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Array_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(ArrayObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot Array_slots[] = {
    {Py_tp_dealloc, Array_dealloc},
    {Py_tp_traverse, Array_traverse},
    {Py_tp_clear, Array_clear},
    {Py_tp_repr, Array_repr},
    {Py_tp_getset, Array_getset},
    {Py_tp_methods, Array_methods},
    {Py_tp_members, Array_members},
    {Py_mp_subscript, Array_getitem},
    {Py_mp_ass_subscript, Array_setitem},
    {Py_mp_length, Array_length},
    {Py_sq_length, Array_length},
    {Py_sq_item, Array_item_at},
    {Py_nb_float, Array_float},
    {Py_nb_int, Array_int},
    {Py_nb_bool, Array_bool},
    {Py_bf_getbuffer, Array_getbuffer},
    {Py_tp_doc, "Array — an n-dimensional array in host (pageable or pinned) or CUDA memory.\n\n"
                "Make one with empty/zeros/ones/full/asarray/from_dlpack.  It exchanges "
                "memory with torch, NumPy, CuPy and JAX through DLPack without copying."},
    {0, NULL},
};

PyType_Spec ga_array_spec = {
    .name = "gpuaccel.Array",
    .basicsize = sizeof(ArrayObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = Array_slots,
};
