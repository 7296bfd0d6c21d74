/*
 * event.c — gpuaccel.Event: created on the device of the first stream it
 * is recorded on.
 */
#include "event.h"

static PyObject *Event_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"timing", NULL};
    int timing = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p:Event", kwlist, &timing))
        return NULL;
    EventObject *self = (EventObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->handle = NULL;
    self->device = -1;
    self->timing = timing;
    self->recorded = 0;
    return (PyObject *)self;
}

static int event_ensure_created(ga_state *st, EventObject *ev, int device)
{
    if (ev->handle) {
        if (ev->device != device) {
            PyErr_Format(PyExc_ValueError,
                         "this Event belongs to cuda:%d and cannot be recorded on a stream of "
                         "cuda:%d",
                         ev->device, device);
            return -1;
        }
        return 0;
    }
    ga_status status = ga_cuda_event_create(device, ev->timing, &ev->handle);
    if (status.error)
        return ga_raise(st, status);
    ev->device = device;
    return 0;
}

static void Event_dealloc(EventObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    if (self->handle)
        ga_cuda_event_destroy(self->device, self->handle);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *Event_record(EventObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"stream", NULL};
    PyObject *stream_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:record", kwlist, &stream_obj))
        return NULL;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    int device;
    if (PyObject_TypeCheck(stream_obj, st->StreamType))
        device = ((StreamObject *)stream_obj)->device;
    else if (self->handle)
        device = self->device;
    else if (ga_default_cuda_device(st, Py_None, &device, "Event.record") < 0)
        return NULL;
    if (ga_ensure_cuda_device(st, device) < 0)
        return NULL;
    ga_stream stream;
    if (ga_stream_from_object(st, stream_obj, device, &stream, "stream") < 0)
        return NULL;
    if (event_ensure_created(st, self, device) < 0)
        return NULL;
    GA_CHECK(st, ga_cuda_event_record(device, self->handle, stream));
    self->recorded = 1;
    Py_RETURN_NONE;
error:
    return NULL;
}

static PyObject *Event_query(EventObject *self, PyObject *unused)
{
    (void)unused;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    int done = 1;
    if (!st)
        return NULL;
    if (self->recorded)
        GA_CHECK(st, ga_cuda_event_query(self->device, self->handle, &done));
    return PyBool_FromLong(done);
error:
    return NULL;
}

static PyObject *Event_synchronize(EventObject *self, PyObject *unused)
{
    (void)unused;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    if (self->recorded)
        GA_CHECK_NOGIL(st, ga_cuda_event_synchronize(self->device, self->handle));
    Py_RETURN_NONE;
error:
    return NULL;
}

static PyObject *Event_wait(EventObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"stream", NULL};
    PyObject *stream_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:wait", kwlist, &stream_obj))
        return NULL;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    if (!self->recorded)
        Py_RETURN_NONE;
    int device = PyObject_TypeCheck(stream_obj, st->StreamType)
                     ? ((StreamObject *)stream_obj)->device
                     : self->device;
    ga_stream stream;
    if (ga_stream_from_object(st, stream_obj, device, &stream, "stream") < 0)
        return NULL;
    GA_CHECK(st, ga_cuda_stream_wait_event(device, stream, self->handle));
    Py_RETURN_NONE;
error:
    return NULL;
}

static PyObject *Event_elapsed_ms(EventObject *self, PyObject *end)
{
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    if (!PyObject_TypeCheck(end, st->EventType)) {
        PyErr_Format(PyExc_TypeError, "elapsed_ms: end must be a gpuaccel.Event, got %.200s",
                     ga_type_name(end));
        return NULL;
    }
    EventObject *e = (EventObject *)end;
    if (!self->timing || !e->timing) {
        PyErr_SetString(PyExc_ValueError,
                        "elapsed_ms needs two events created with Event(timing=True)");
        return NULL;
    }
    if (!self->recorded || !e->recorded) {
        PyErr_SetString(PyExc_ValueError,
                        "elapsed_ms needs both events recorded (call .record() first)");
        return NULL;
    }
    float ms = 0;
    GA_CHECK(st, ga_cuda_event_elapsed_ms(self->device, self->handle, e->handle, &ms));
    return PyFloat_FromDouble(ms);
error:
    return NULL;
}

static PyObject *Event_repr(EventObject *self)
{
    if (!self->handle)
        return PyUnicode_FromFormat("gpuaccel.Event(timing=%s, not recorded)",
                                    self->timing ? "True" : "False");
    return PyUnicode_FromFormat("gpuaccel.Event(timing=%s, device='cuda:%d')",
                                self->timing ? "True" : "False", self->device);
}

static PyObject *Event_get_timing(EventObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->timing);
}

static PyGetSetDef Event_getset[] = {
    {"timing", (getter)Event_get_timing, NULL, "whether elapsed_ms() can be used", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Event_methods[] = {
    {"record", (PyCFunction)(void (*)(void))Event_record, METH_VARARGS | METH_KEYWORDS,
     "record($self, /, stream=None)\n--\n\nRecords the event after the work queued so far on the "
     "stream (the current stream by default)."},
    {"query", (PyCFunction)Event_query, METH_NOARGS,
     "query($self, /)\n--\n\nTrue when the recorded work is done (or the event was never "
     "recorded)."},
    {"synchronize", (PyCFunction)Event_synchronize, METH_NOARGS,
     "synchronize($self, /)\n--\n\nWaits for the recorded work (releases the GIL)."},
    {"wait", (PyCFunction)(void (*)(void))Event_wait, METH_VARARGS | METH_KEYWORDS,
     "wait($self, /, stream=None)\n--\n\nMakes future work on the stream wait for this event."},
    {"elapsed_ms", (PyCFunction)Event_elapsed_ms, METH_O,
     "elapsed_ms($self, end, /)\n--\n\nReturns float.  Milliseconds between this event and `end`."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Event_slots[] = {
    {Py_tp_new, Event_new},
    {Py_tp_dealloc, Event_dealloc},
    {Py_tp_repr, Event_repr},
    {Py_tp_getset, Event_getset},
    {Py_tp_methods, Event_methods},
    {Py_tp_doc, "Event(timing=False)\n--\n\nA CUDA event, created on the device of the first "
                "stream it is recorded on."},
    {0, NULL},
};

PyType_Spec ga_event_spec = {
    .name = "gpuaccel.Event",
    .basicsize = sizeof(EventObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Event_slots,
};
