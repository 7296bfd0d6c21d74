/*
 * event.h — gpuaccel.Event (event.c).
 */
#ifndef GPUACCEL_EVENT_H
#define GPUACCEL_EVENT_H

#include "stream.h"

typedef struct {
    PyObject_HEAD
    ga_event handle; /* created at the first record() */
    int device;
    int timing;
    int recorded;
} EventObject;

extern PyType_Spec ga_event_spec;

#endif
