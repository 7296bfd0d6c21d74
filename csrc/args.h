/*
 * args.h — reading Python arguments (args.c): by name from METH_FASTCALL
 * vectors, exact strings, attributes that may be missing, int64 tuples.
 */
#ifndef GPUACCEL_ARGS_H
#define GPUACCEL_ARGS_H

#include "state.h"

/* A tuple of Python ints (a shape, strides) for attributes and messages;
 * NULL with an exception. */
PyObject *ga_int64_tuple(int n, const int64_t *values);
/* The UTF-8 text of a str argument, or NULL (no exception set) when obj is
 * not a str, is not encodable or holds a NUL ("gelu\0x" must not pass for
 * "gelu").  Valid while obj lives. */
const char *ga_exact_utf8(PyObject *obj);
/* getattr that tells a missing attribute (0, *result NULL) from one whose
 * lookup raised something else (-1, exception set: a property that fails
 * must not pass for "no such interface"); 1 with a new reference. */
int ga_lookup_attr(PyObject *obj, PyObject *name, PyObject **result);
int ga_has_attr(PyObject *obj, PyObject *name);
/* Parses METH_FASTCALL arguments by name: `names` is NULL-terminated; the
 * first `max_positional` may come positionally and the first `required`
 * must come.  values[i] is a borrowed reference, or NULL when absent. */
int ga_parse_args(const char *func, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                  const char *const *names, int max_positional, int required, PyObject **values);
/* An argument read into a field of a struct of PyObject pointers: its
 * name, which GA_ARG makes the field's name too, and the field's offset. */
typedef struct {
    const char *name;
    size_t offset;
} ga_arg_field;
/* a brace initializer in a macro, which clang-format 14 splits apart */
/* clang-format off */
#define GA_ARG(type, field) {#field, offsetof(type, field)}
/* clang-format on */
/* ga_parse_args into the fields of *out that `fields` lists, in their
 * positional order and ended by {NULL, 0}. */
int ga_parse_args_into(const char *func, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                       const ga_arg_field *fields, int max_positional, int required, void *out);
/* Parses copy=None/True/False (NULL: None) into -1/1/0. */
int ga_copy_flag_from_object(PyObject *obj, int *out);

#endif
