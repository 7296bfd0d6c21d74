/*
 * errors.h — the one translator from a backend status to a Python exception
 * (errors.c), the macros that check a backend call with it, and the
 * formatting helpers error messages share.
 */
#ifndef GPUACCEL_ERRORS_H
#define GPUACCEL_ERRORS_H

#include "state.h"

/* Raises the Python exception for a failed backend status.  Always returns -1, so `return
 * ga_raise(st, status);` works in int-returning functions. */
int ga_raise(ga_state *st, ga_status status);
/* The message ga_raise gives a status (call, library name and code, text,
 * source line), for the places that cannot raise. */
const char *ga_status_text(ga_status status, char *buf, size_t size);

/* Runs `expr` (a ga_status); on failure raises and jumps to `error`. */
#define GA_CHECK(st, expr)              \
    do {                                \
        ga_status ga_status_ = (expr);  \
        if (ga_status_.error) {         \
            ga_raise((st), ga_status_); \
            goto error;                 \
        }                               \
    } while (0)

/* The same, releasing the GIL around the call (which must touch no Python
 * object). */
#define GA_CHECK_NOGIL(st, expr)        \
    do {                                \
        ga_status ga_status_;           \
        Py_BEGIN_ALLOW_THREADS          \
        ga_status_ = (expr);            \
        Py_END_ALLOW_THREADS            \
        if (ga_status_.error) {         \
            ga_raise((st), ga_status_); \
            goto error;                 \
        }                               \
    } while (0)

/* The type's name, for error messages. */
const char *ga_type_name(PyObject *obj);

/* Formats a byte count as "1.50 GiB" into buf. */
const char *ga_format_bytes(uint64_t bytes, char *buf, size_t size);

#endif
