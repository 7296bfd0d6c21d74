/*
 * image.h — the image loader's Python side (csrc/image.c): transform
 * specs from gpuaccel/images.py, and single-image decoding for users and
 * tests.
 */
#ifndef GPUACCEL_IMAGE_H
#define GPUACCEL_IMAGE_H

#include "args.h"
#include "errors.h"

/* A transform spec tuple (gpuaccel/images.py's _Pipeline.spec) for `epoch`
 * into *t; -1 with an exception set. */
int ga_image_transform_from_object(PyObject *spec, int64_t epoch, ga_image_transform *t);

/* _LoaderIter.image_size(data) -> (width, height) from a JPEG's header */
PyObject *ga_image_size_method(PyObject *unused, PyObject *arg);
/* _LoaderIter.image_geometry(width, height, spec, index, epoch=0) -> dict */
PyObject *ga_image_geometry_method(PyObject *unused, PyObject *args, PyObject *kwargs);
/* _LoaderIter.decode_image(data, spec, index, epoch=0) -> (uint8 ndarray, dict) */
PyObject *ga_image_decode_method(PyObject *unused, PyObject *args, PyObject *kwargs);

#endif
