/*
 * image.c — what the image loader needs from Python: its transform spec
 * parsed into the kernels' ga_image_transform, and one image decoded with
 * it (gpuaccel.decode_image, and the tests' window into the geometry each
 * sample draws).
 */
#include "npy.h"

#include <string.h>

#include "image.h"

int ga_image_transform_from_object(PyObject *spec, int64_t epoch, ga_image_transform *t)
{
    /* (out_h, out_w, random_crop, scale_lo, scale_hi, log_ratio_lo,
     *  log_ratio_hi, resize_short, resize_h, resize_w, flip_p, seed,
     *  dct_scaling) */
    long long out_h, out_w, resize_short, resize_h, resize_w;
    unsigned long long seed;
    int random_crop, dct_scaling;
    memset(t, 0, sizeof *t);
    if (!PyTuple_Check(spec) ||
        !PyArg_ParseTuple(spec, "LLpddddLLLdKp;transform spec", &out_h, &out_w, &random_crop,
                          &t->scale_lo, &t->scale_hi, &t->log_ratio_lo, &t->log_ratio_hi,
                          &resize_short, &resize_h, &resize_w, &t->flip_p, &seed, &dct_scaling)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "transform spec must be a tuple (from gpuaccel's "
                                             "image transforms)");
        return -1;
    }
    if (out_h < 1 || out_w < 1 || out_h > (1 << 16) || out_w > (1 << 16) || resize_short < 0 ||
        resize_h < 0 || resize_w < 0 || !(t->flip_p >= 0 && t->flip_p <= 1) || epoch < 0 ||
        (random_crop &&
         !(t->scale_lo > 0 && t->scale_lo <= t->scale_hi && t->log_ratio_lo <= t->log_ratio_hi))) {
        PyErr_SetString(PyExc_ValueError, "transform spec out of range");
        return -1;
    }
    t->out_h = out_h, t->out_w = out_w;
    t->random_crop = random_crop;
    t->resize_short = resize_short, t->resize_h = resize_h, t->resize_w = resize_w;
    t->seed = seed;
    t->epoch = epoch;
    t->dct_scaling = dct_scaling;
    return 0;
}

static PyObject *geometry_dict(const ga_image_geometry *g)
{
    return Py_BuildValue(
        "{s:(LL),s:(LLLL),s:O,s:(LLLL),s:(dd),s:(dd),s:(LL),s:(LL)}", "size", (long long)g->out_h,
        (long long)g->out_w, "placed", (long long)g->y0, (long long)g->x0, (long long)g->ny,
        (long long)g->nx, "flip", g->flip ? Py_True : Py_False, "crop", (long long)g->crop_top,
        (long long)g->crop_left, (long long)g->crop_h, (long long)g->crop_w, "origin", g->ry.origin,
        g->rx.origin, "scale", g->ry.scale, g->rx.scale, "rows", (long long)g->ry.lo,
        (long long)g->ry.hi, "cols", (long long)g->rx.lo, (long long)g->rx.hi);
}

PyObject *ga_image_size_method(PyObject *unused, PyObject *arg)
{
    (void)unused;
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0)
        return NULL;
    int64_t width = 0, height = 0;
    ga_image_workspace *ws = ga_cpu_image_workspace_new();
    ga_status status =
        ws ? ga_cpu_image_size((const uint8_t *)data.buf, (size_t)data.len, &width, &height, ws)
           : GA_STATUS(GA_ERR_HOST_OUT_OF_MEMORY, "no memory");
    PyBuffer_Release(&data);
    PyObject *result = NULL;
    if (status.error == GA_ERR_HOST_OUT_OF_MEMORY)
        PyErr_NoMemory();
    else if (status.error)
        PyErr_Format(ga_cpu_jpeg_available() ? PyExc_OSError : PyExc_RuntimeError, "image_size: %s",
                     status.message);
    else
        result = Py_BuildValue("(LL)", (long long)width, (long long)height);
    ga_cpu_image_workspace_free(ws);
    return result;
}

PyObject *ga_image_geometry_method(PyObject *unused, PyObject *args, PyObject *kwargs)
{
    (void)unused;
    static char *kwlist[] = {"width", "height", "spec", "index", "epoch", NULL};
    long long width, height, index, epoch = 0;
    PyObject *spec;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LLOL|L:image_geometry", kwlist, &width, &height,
                                     &spec, &index, &epoch))
        return NULL;
    if (width < 1 || height < 1) {
        PyErr_Format(PyExc_ValueError,
                     "image_geometry: the image must be at least 1 x 1, got "
                     "width=%lld height=%lld",
                     width, height);
        return NULL;
    }
    ga_image_transform t;
    if (ga_image_transform_from_object(spec, epoch, &t) < 0)
        return NULL;
    ga_image_geometry g;
    ga_image_plan(&t, index, width, height, &g);
    return geometry_dict(&g);
}

PyObject *ga_image_decode_method(PyObject *unused, PyObject *args, PyObject *kwargs)
{
    (void)unused;
    static char *kwlist[] = {"data", "spec", "index", "epoch", NULL};
    Py_buffer data;
    long long index, epoch = 0;
    PyObject *spec, *image = NULL, *result = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*OL|L:decode_image", kwlist, &data, &spec,
                                     &index, &epoch))
        return NULL;
    ga_image_transform t;
    ga_image_workspace *ws = NULL;
    if (ga_image_transform_from_object(spec, epoch, &t) < 0)
        goto done;
    npy_intp dims[3] = {(npy_intp)t.out_h, (npy_intp)t.out_w, 3};
    image = PyArray_SimpleNew(3, dims, NPY_UINT8);
    ws = ga_cpu_image_workspace_new();
    if (!image || !ws) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    ga_image_geometry g;
    ga_status status;
    Py_BEGIN_ALLOW_THREADS
    status = ga_cpu_decode_image((const uint8_t *)data.buf, (size_t)data.len, &t, index,
                                 (uint8_t *)PyArray_DATA((PyArrayObject *)image), ws, &g);
    Py_END_ALLOW_THREADS
    if (status.error == GA_ERR_HOST_OUT_OF_MEMORY) {
        PyErr_NoMemory();
        goto done;
    }
    if (status.error && !ga_cpu_jpeg_available()) {
        PyErr_Format(PyExc_RuntimeError, "decode_image: %s", status.message);
        goto done;
    }
    if (status.error) {
        /* what PIL raises for damaged or unknown files, so existing except
         * clauses apply */
        PyErr_Format(PyExc_OSError, "decode_image: %s", status.message);
        goto done;
    }
    PyObject *geometry = geometry_dict(&g);
    if (geometry)
        result = Py_BuildValue("(ON)", image, geometry);
done:
    ga_cpu_image_workspace_free(ws);
    Py_XDECREF(image);
    PyBuffer_Release(&data);
    return result;
}
