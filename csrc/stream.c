/*
 * stream.c — gpuaccel.Stream, the current stream (`with stream:`, a
 * context variable) and the parsing of `stream=` arguments.
 */
#include "stream.h"

/* On failure the handle stays the caller's to release. */
static PyObject *stream_new(PyTypeObject *type, ga_stream handle, int device, int owned,
                            int priority)
{
    StreamObject *self = (StreamObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->handle = handle;
    self->device = device;
    self->tokens = PyList_New(0);
    if (!self->tokens) {
        Py_DECREF(self);
        return NULL;
    }
    self->owned = owned;
    self->priority = priority;
    return (PyObject *)self;
}

static PyObject *Stream_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"device", "priority", NULL};
    PyObject *device_obj = Py_None;
    int priority = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|Oi:Stream", kwlist, &device_obj, &priority))
        return NULL;
    ga_state *st = ga_state_from_type(type);
    int device;
    if (!st || ga_default_cuda_device(st, device_obj, &device, "Stream") < 0)
        return NULL;
    ga_stream handle;
    ga_status status = ga_cuda_stream_acquire(device, priority, &handle);
    if (status.error) {
        ga_raise(st, status);
        return NULL;
    }
    PyObject *self = stream_new(type, handle, device, 1, priority);
    if (!self)
        ga_cuda_stream_release(device, priority, handle);
    return self;
}

static int handle_from_object(PyObject *obj, ga_stream *out, const char *argname)
{
    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int (a cudaStream_t), got %.200s", argname,
                     ga_type_name(obj));
        return -1;
    }
    unsigned long long value = PyLong_AsUnsignedLongLong(obj);
    if (value == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be a non-negative stream handle, got %R", argname,
                     obj);
        return -1;
    }
    *out = (ga_stream)(uintptr_t)value;
    return 0;
}

static PyObject *Stream_from_handle(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"handle", "device", NULL};
    PyObject *handle_obj, *device_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:from_handle", kwlist, &handle_obj,
                                     &device_obj))
        return NULL;
    ga_state *st = ga_state_from_type(type);
    ga_stream handle;
    if (!st || handle_from_object(handle_obj, &handle, "handle") < 0)
        return NULL;
    int device;
    if (device_obj == Py_None) {
        if (ga_default_cuda_device(st, Py_None, &device, "Stream.from_handle") < 0)
            return NULL;
        ga_status status = ga_cuda_stream_device(handle, &device);
        if (status.error) {
            ga_raise(st, status);
            return NULL;
        }
    } else if (ga_default_cuda_device(st, device_obj, &device, "Stream.from_handle") < 0) {
        return NULL;
    }
    return stream_new(type, handle, device, 0, 0);
}

static int Stream_traverse(StreamObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->tokens);
    return 0;
}

static int Stream_clear(StreamObject *self)
{
    Py_CLEAR(self->tokens);
    return 0;
}

static void Stream_dealloc(StreamObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Stream_clear(self);
    if (self->owned) /* to the pool: arrays may still be freed on it */
        ga_cuda_stream_release(self->device, self->priority, self->handle);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *Stream_synchronize(StreamObject *self, PyObject *unused)
{
    (void)unused;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    GA_CHECK_NOGIL(st, ga_cuda_stream_synchronize(self->device, self->handle));
    Py_RETURN_NONE;
error:
    return NULL;
}

static PyObject *Stream_query(StreamObject *self, PyObject *unused)
{
    (void)unused;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    int done = 0;
    if (!st)
        return NULL;
    GA_CHECK(st, ga_cuda_stream_query(self->device, self->handle, &done));
    return PyBool_FromLong(done);
error:
    return NULL;
}

/* As torch's Stream.wait_event: Event.wait(self), which owns the rules of
 * waiting (an event never recorded is no wait at all, as in CUDA). */
static PyObject *Stream_wait_event(StreamObject *self, PyObject *event)
{
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    if (!PyObject_TypeCheck(event, st->EventType)) {
        PyErr_Format(PyExc_TypeError, "wait_event: event must be a gpuaccel.Event, got %.200s",
                     ga_type_name(event));
        return NULL;
    }
    return PyObject_CallMethod(event, "wait", "O", (PyObject *)self);
}

static PyObject *Stream_wait_stream(StreamObject *self, PyObject *other)
{
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    if (!PyObject_TypeCheck(other, st->StreamType)) {
        PyErr_Format(PyExc_TypeError, "wait_stream: stream must be a gpuaccel.Stream, got %.200s",
                     ga_type_name(other));
        return NULL;
    }
    StreamObject *producer = (StreamObject *)other;
    GA_CHECK(st, ga_cuda_stream_wait_stream(self->device, self->handle, producer->device,
                                            producer->handle));
    Py_RETURN_NONE;
error:
    return NULL;
}

/* As torch's Stream.record_event: a new Event (or the one given) recorded
 * with Event.record(self), which owns the rules of recording. */
static PyObject *Stream_record_event(StreamObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"event", NULL};
    PyObject *event = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:record_event", kwlist, &event))
        return NULL;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    if (event == Py_None) {
        event = PyObject_CallNoArgs((PyObject *)st->EventType);
        if (!event)
            return NULL;
    } else if (!PyObject_TypeCheck(event, st->EventType)) {
        PyErr_Format(PyExc_TypeError,
                     "record_event: event must be a gpuaccel.Event or None, got %.200s",
                     ga_type_name(event));
        return NULL;
    } else {
        Py_INCREF(event);
    }
    PyObject *done = PyObject_CallMethod(event, "record", "O", (PyObject *)self);
    if (!done) {
        Py_DECREF(event);
        return NULL;
    }
    Py_DECREF(done);
    return event;
}

static PyObject *Stream_enter(StreamObject *self, PyObject *unused)
{
    (void)unused;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    PyObject *token = PyContextVar_Set(st->current_stream, (PyObject *)self);
    if (!token)
        return NULL;
    int rc = PyList_Append(self->tokens, token);
    Py_DECREF(token);
    if (rc < 0)
        return NULL;
    return Py_NewRef(self);
}

static PyObject *Stream_exit(StreamObject *self, PyObject *args)
{
    (void)args;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(self->tokens);
    if (n == 0) {
        PyErr_SetString(PyExc_RuntimeError, "Stream.__exit__ without a matching __enter__");
        return NULL;
    }
    PyObject *token = Py_NewRef(PyList_GET_ITEM(self->tokens, n - 1));
    if (PyList_SetSlice(self->tokens, n - 1, n, NULL) < 0) {
        Py_DECREF(token);
        return NULL;
    }
    int rc = PyContextVar_Reset(st->current_stream, token);
    Py_DECREF(token);
    if (rc < 0)
        return NULL;
    Py_RETURN_FALSE;
}

static uintptr_t normalized_handle(ga_stream s)
{
    return (uintptr_t)s == 0 ? 1 : (uintptr_t)s;
}

static PyObject *Stream_richcompare(StreamObject *self, PyObject *other, int op)
{
    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(other) != Py_TYPE(self))
        Py_RETURN_NOTIMPLEMENTED;
    StreamObject *o = (StreamObject *)other;
    int equal = normalized_handle(self->handle) == normalized_handle(o->handle) &&
                self->device == o->device;
    return PyBool_FromLong(op == Py_EQ ? equal : !equal);
}

static Py_hash_t Stream_hash(StreamObject *self)
{
    Py_hash_t h = (Py_hash_t)(normalized_handle(self->handle) ^ ((uintptr_t)self->device << 48));
    return h == -1 ? -2 : h;
}

static PyObject *Stream_repr(StreamObject *self)
{
    return PyUnicode_FromFormat("gpuaccel.Stream(device='cuda:%d', handle=%#zx%s)", self->device,
                                (size_t)(uintptr_t)self->handle,
                                normalized_handle(self->handle) == 1 ? ", legacy default" : "");
}

static PyObject *Stream_get_handle(StreamObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromVoidPtr(self->handle);
}

static PyObject *Stream_get_device(StreamObject *self, void *closure)
{
    (void)closure;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    ga_device device = {GA_DEVICE_CUDA, self->device};
    return st ? ga_device_new(st, device) : NULL;
}

static PyGetSetDef Stream_getset[] = {
    {"handle", (getter)Stream_get_handle, NULL, "the cudaStream_t as an int", NULL},
    {"cuda_stream", (getter)Stream_get_handle, NULL, "alias of handle (as torch.cuda.Stream)",
     NULL},
    {"device", (getter)Stream_get_device, NULL, "the CUDA device of the stream", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Stream_methods[] = {
    {"from_handle", (PyCFunction)(void (*)(void))Stream_from_handle,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "from_handle($type, /, handle, device=None)\n--\n\nStream.from_handle(handle, device=None) "
     "-> Stream\n\nWraps an existing cudaStream_t (e.g. torch.cuda.current_stream().cuda_stream) "
     "without taking ownership."},
    {"synchronize", (PyCFunction)Stream_synchronize, METH_NOARGS,
     "synchronize($self, /)\n--\n\nWaits until all work queued on the stream is done (releases "
     "the GIL)."},
    {"query", (PyCFunction)Stream_query, METH_NOARGS,
     "query($self, /)\n--\n\nTrue when all queued work is done."},
    {"wait_event", (PyCFunction)Stream_wait_event, METH_O,
     "wait_event($self, event, /)\n--\n\nMakes future work on this stream wait for the event "
     "(never blocks the host)."},
    {"wait_stream", (PyCFunction)Stream_wait_stream, METH_O,
     "wait_stream($self, stream, /)\n--\n\nMakes future work on this stream wait for the work "
     "queued so far on another."},
    {"record_event", (PyCFunction)(void (*)(void))Stream_record_event, METH_VARARGS | METH_KEYWORDS,
     "record_event($self, /, event=None)\n--\n\nReturns Event."},
    {"__enter__", (PyCFunction)Stream_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Stream_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Stream_slots[] = {
    {Py_tp_new, Stream_new},
    {Py_tp_dealloc, Stream_dealloc},
    {Py_tp_traverse, Stream_traverse},
    {Py_tp_clear, Stream_clear},
    {Py_tp_repr, Stream_repr},
    {Py_tp_richcompare, Stream_richcompare},
    {Py_tp_hash, Stream_hash},
    {Py_tp_getset, Stream_getset},
    {Py_tp_methods, Stream_methods},
    {Py_tp_doc, "Stream(device=None, priority=0)\n--\n\nA CUDA stream.  `with stream:` makes it "
                "the current stream of its device for gpuaccel work in this thread/context."},
    {0, NULL},
};

PyType_Spec ga_stream_spec = {
    .name = "gpuaccel.Stream",
    .basicsize = sizeof(StreamObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Stream_slots,
};

int ga_stream_made_current(ga_state *st, int device, ga_stream *out)
{
    PyObject *value = NULL;
    if (PyContextVar_Get(st->current_stream, NULL, &value) < 0)
        return -1;
    *out = GA_STREAM_LEGACY;
    int set = value && ((StreamObject *)value)->device == device;
    if (set)
        *out = ((StreamObject *)value)->handle;
    Py_XDECREF(value);
    return set;
}

int ga_current_stream(ga_state *st, int device, ga_stream *out)
{
    return ga_stream_made_current(st, device, out) < 0 ? -1 : 0;
}

int ga_stream_from_object(ga_state *st, PyObject *obj, int device, ga_stream *out,
                          const char *argname)
{
    if (obj == NULL || obj == Py_None)
        return ga_current_stream(st, device, out);
    if (PyObject_TypeCheck(obj, st->StreamType)) {
        StreamObject *s = (StreamObject *)obj;
        if (s->device != device) {
            PyErr_Format(PyExc_ValueError,
                         "%s is a stream of cuda:%d, but the work runs on cuda:%d", argname,
                         s->device, device);
            return -1;
        }
        *out = s->handle;
        return 0;
    }
    if (PyLong_Check(obj) && !PyBool_Check(obj))
        return handle_from_object(obj, out, argname);
    /* torch.cuda.Stream and friends */
    PyObject *handle = PyObject_GetAttrString(obj, "cuda_stream");
    if (handle) {
        int rc = handle_from_object(handle, out, argname);
        Py_DECREF(handle);
        return rc;
    }
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError,
                 "%s must be None, a gpuaccel.Stream, a torch.cuda.Stream or an int handle, got "
                 "%.200s",
                 argname, ga_type_name(obj));
    return -1;
}

PyObject *ga_py_current_stream(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"device", NULL};
    PyObject *device_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:current_stream", kwlist, &device_obj))
        return NULL;
    ga_state *st = ga_state_from_module(module);
    int device;
    if (ga_default_cuda_device(st, device_obj, &device, "this function") < 0)
        return NULL;
    PyObject *value = NULL;
    if (PyContextVar_Get(st->current_stream, NULL, &value) < 0)
        return NULL;
    if (value && ((StreamObject *)value)->device == device)
        return value;
    Py_XDECREF(value);
    return stream_new(st->StreamType, (ga_stream)0, device, 0, 0);
}
