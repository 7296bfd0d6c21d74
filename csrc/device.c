/*
 * device.c — Device, Stream, Event, the current stream, and the checks that
 * say why CUDA cannot be used.
 */
#include "device.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------ CUDA availability */

/* Set once CUDA has been used; a child forked after that cannot use it
 * (the CUDA runtime does not survive fork). */
static int cuda_used = 0;
static int cuda_forked = 0;

static void mark_forked_child(void)
{
    if (cuda_used)
        cuda_forked = 1;
}

int ga_ensure_cuda_device(ga_state *st, int index)
{
    if (cuda_forked) {
        PyErr_SetString(PyExc_RuntimeError,
                        "CUDA cannot be used in a process forked after its parent used CUDA: "
                        "start workers with multiprocessing's 'spawn' or 'forkserver' method "
                        "(gpuaccel's CPU functions still work here)");
        return -1;
    }
    int count = 0;
    ga_status status = ga_cuda_device_count(&count);
    if (status.error)
        return ga_raise(st, status);
    if (count == 0) {
        PyErr_SetString(PyExc_RuntimeError, "CUDA is not available: no CUDA device was found");
        return -1;
    }
    if (index < 0 || index >= count) {
        PyErr_Format(PyExc_ValueError,
                     "device cuda:%d does not exist: this machine has %d CUDA device%s "
                     "(cuda:0%s)",
                     index, count, count == 1 ? "" : "s", count == 1 ? "" : " ...");
        return -1;
    }
    cuda_used = 1;
    return 0;
}

int ga_cuda_usable(void)
{
    int count = 0;
    if (cuda_forked)
        return 0;
    return ga_cuda_device_count(&count).error == GA_OK && count > 0;
}

/* ------------------------------------------------------------- Device */

const char *ga_device_str(ga_device device, char *buf, size_t size)
{
    if (device.type == GA_DEVICE_CPU)
        snprintf(buf, size, "cpu");
    else
        snprintf(buf, size, "cuda:%d", device.index);
    return buf;
}

static int current_cuda_index(void)
{
    int index = 0;
    if (ga_cuda_get_device(&index).error)
        index = 0;
    return index;
}

static int raise_bad_device(PyObject *obj, const char *argname)
{
    PyErr_Format(PyExc_TypeError,
                 "%s must be a device such as 'cpu', 'cuda' or 'cuda:1' (a str, "
                 "gpuaccel.Device, torch.device or int), got %.200s %R",
                 argname, ga_type_name(obj), obj);
    return -1;
}

static int device_from_parts(const char *type, PyObject *index_obj, ga_device *out, PyObject *obj,
                             const char *argname)
{
    long index = -1;
    if (index_obj && index_obj != Py_None) {
        index = PyLong_AsLong(index_obj);
        if (index == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return raise_bad_device(obj, argname);
        }
        if (index < 0 || index > 1023) {
            PyErr_Format(PyExc_ValueError, "%s: device index must be >= 0, got %ld", argname,
                         index);
            return -1;
        }
    }
    if (strcmp(type, "cpu") == 0) {
        out->type = GA_DEVICE_CPU;
        out->index = 0;
        return 0;
    }
    if (strcmp(type, "cuda") == 0) {
        out->type = GA_DEVICE_CUDA;
        out->index = index >= 0 ? (int)index : current_cuda_index();
        return 0;
    }
    PyErr_Format(PyExc_ValueError,
                 "%s: unsupported device type '%s' in %R; gpuaccel supports 'cpu' and "
                 "'cuda[:N]'",
                 argname, type, obj);
    return -1;
}

static int device_from_str(const char *text, ga_device *out, PyObject *obj, const char *argname)
{
    char type[16];
    const char *colon = strchr(text, ':');
    size_t len = colon ? (size_t)(colon - text) : strlen(text);
    if (len == 0 || len >= sizeof type) {
        PyErr_Format(PyExc_ValueError, "%s must be 'cpu', 'cuda' or 'cuda:N', got %R", argname,
                     obj);
        return -1;
    }
    memcpy(type, text, len);
    type[len] = '\0';
    PyObject *index = NULL;
    if (colon) {
        const char *digits = colon + 1;
        int ok = *digits != '\0';
        for (const char *p = digits; *p; p++)
            ok = ok && *p >= '0' && *p <= '9';
        if (!ok || strlen(digits) > 4) {
            PyErr_Format(PyExc_ValueError,
                         "%s must be 'cpu', 'cuda' or 'cuda:N' with N a device number, got %R",
                         argname, obj);
            return -1;
        }
        index = PyLong_FromString(digits, NULL, 10);
        if (!index)
            return -1;
    }
    int rc = device_from_parts(type, index, out, obj, argname);
    Py_XDECREF(index);
    return rc;
}

int ga_device_from_object(ga_state *st, PyObject *obj, ga_device *out, const char *argname)
{
    if (obj == NULL || obj == Py_None)
        obj = st->default_device;
    if (PyObject_TypeCheck(obj, st->DeviceType)) {
        *out = ((DeviceObject *)obj)->device;
        return 0;
    }
    if (PyUnicode_Check(obj)) {
        const char *text = ga_exact_utf8(obj);
        return text ? device_from_str(text, out, obj, argname) : raise_bad_device(obj, argname);
    }
    if (PyLong_Check(obj) && !PyBool_Check(obj)) {
        long index = PyLong_AsLong(obj);
        if (index == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return raise_bad_device(obj, argname);
        }
        if (index < 0) {
            PyErr_Format(PyExc_ValueError, "%s: device index must be >= 0, got %ld", argname,
                         index);
            return -1;
        }
        return device_from_parts("cuda", obj, out, obj, argname);
    }
    if (strcmp(Py_TYPE(obj)->tp_name, "torch.device") == 0) {
        PyObject *type = PyObject_GetAttrString(obj, "type");
        PyObject *index = type ? PyObject_GetAttrString(obj, "index") : NULL;
        int rc = -1;
        if (type && index && PyUnicode_Check(type))
            rc = device_from_parts(PyUnicode_AsUTF8(type), index, out, obj, argname);
        Py_XDECREF(type);
        Py_XDECREF(index);
        return rc;
    }
    return raise_bad_device(obj, argname);
}

PyObject *ga_device_new(ga_state *st, ga_device device)
{
    DeviceObject *self = PyObject_New(DeviceObject, st->DeviceType);
    if (self)
        self->device = device;
    return (PyObject *)self;
}

static PyObject *Device_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"device", "index", NULL};
    PyObject *spec, *index = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:Device", kwlist, &spec, &index))
        return NULL;
    ga_state *st = ga_state_from_type(type);
    if (!st)
        return NULL;
    ga_device device;
    if (index != Py_None) {
        if (!PyUnicode_Check(spec)) {
            PyErr_Format(PyExc_TypeError,
                         "Device(type, index): type must be 'cpu' or 'cuda', got %R", spec);
            return NULL;
        }
        if (device_from_parts(PyUnicode_AsUTF8(spec), index, &device, spec, "device") < 0)
            return NULL;
    } else if (spec == Py_None) {
        PyErr_SetString(PyExc_TypeError,
                        "Device() needs a device such as 'cpu', 'cuda' or 'cuda:1'");
        return NULL;
    } else if (ga_device_from_object(st, spec, &device, "device") < 0) {
        return NULL;
    }
    DeviceObject *self = (DeviceObject *)type->tp_alloc(type, 0);
    if (self)
        self->device = device;
    return (PyObject *)self;
}

static void Device_dealloc(DeviceObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *Device_str(DeviceObject *self)
{
    char buf[32];
    return PyUnicode_FromString(ga_device_str(self->device, buf, sizeof buf));
}

static PyObject *Device_repr(DeviceObject *self)
{
    char buf[32];
    return PyUnicode_FromFormat("gpuaccel.Device('%s')",
                                ga_device_str(self->device, buf, sizeof buf));
}

static PyObject *Device_richcompare(DeviceObject *self, PyObject *other, int op)
{
    if (op != Py_EQ && op != Py_NE)
        Py_RETURN_NOTIMPLEMENTED;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    ga_device theirs;
    if (!(PyObject_TypeCheck(other, st->DeviceType) || PyUnicode_Check(other) ||
          strcmp(Py_TYPE(other)->tp_name, "torch.device") == 0))
        Py_RETURN_NOTIMPLEMENTED;
    if (ga_device_from_object(st, other, &theirs, "other") < 0) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    int equal = ga_device_equal(self->device, theirs);
    return PyBool_FromLong(op == Py_EQ ? equal : !equal);
}

static Py_hash_t Device_hash(DeviceObject *self)
{
    Py_hash_t h = self->device.type == GA_DEVICE_CPU ? 1 : 1000 + self->device.index;
    return h;
}

static PyObject *Device_get_type(DeviceObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(self->device.type == GA_DEVICE_CPU ? "cpu" : "cuda");
}

static PyObject *Device_get_index(DeviceObject *self, void *closure)
{
    (void)closure;
    if (self->device.type == GA_DEVICE_CPU)
        Py_RETURN_NONE;
    return PyLong_FromLong(self->device.index);
}

static PyObject *Device_reduce(DeviceObject *self, PyObject *unused)
{
    (void)unused;
    PyObject *text = Device_str(self);
    if (!text)
        return NULL;
    PyObject *result = Py_BuildValue("O(N)", (PyObject *)Py_TYPE(self), text);
    return result;
}

static PyGetSetDef Device_getset[] = {
    {"type", (getter)Device_get_type, NULL, "'cpu' or 'cuda'", NULL},
    {"index", (getter)Device_get_index, NULL, "CUDA device ordinal (None for the CPU)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Device_methods[] = {
    {"__reduce__", (PyCFunction)Device_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Device_slots[] = {
    {Py_tp_new, Device_new},
    {Py_tp_dealloc, Device_dealloc},
    {Py_tp_str, Device_str},
    {Py_tp_repr, Device_repr},
    {Py_tp_richcompare, Device_richcompare},
    {Py_tp_hash, Device_hash},
    {Py_tp_getset, Device_getset},
    {Py_tp_methods, Device_methods},
    {Py_tp_doc, "Device('cpu' | 'cuda' | 'cuda:N') — where an Array's memory lives.\n\n"
                "Also accepts a torch.device, an int N (cuda:N) or Device('cuda', N)."},
    {0, NULL},
};

PyType_Spec ga_device_spec = {
    .name = "gpuaccel.Device",
    .basicsize = sizeof(DeviceObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Device_slots,
};

/* ------------------------------------------------------------- Stream */

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

/* The CUDA device a `device=None` stream or event belongs to. */
static int default_cuda_device(ga_state *st, PyObject *device_obj, int *index, const char *what)
{
    ga_device device;
    if (device_obj == Py_None) {
        device = ((DeviceObject *)st->default_device)->device;
        if (device.type != GA_DEVICE_CUDA) {
            device.type = GA_DEVICE_CUDA;
            device.index = current_cuda_index();
        }
    } else if (ga_device_from_object(st, device_obj, &device, "device") < 0) {
        return -1;
    }
    if (device.type != GA_DEVICE_CUDA) {
        PyErr_Format(PyExc_ValueError, "%s needs a CUDA device, got device='cpu'", what);
        return -1;
    }
    if (ga_ensure_cuda_device(st, device.index) < 0)
        return -1;
    *index = device.index;
    return 0;
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
    if (!st || default_cuda_device(st, device_obj, &device, "Stream") < 0)
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
        if (default_cuda_device(st, Py_None, &device, "Stream.from_handle") < 0)
            return NULL;
        ga_status status = ga_cuda_stream_device(handle, &device);
        if (status.error) {
            ga_raise(st, status);
            return NULL;
        }
    } else if (default_cuda_device(st, device_obj, &device, "Stream.from_handle") < 0) {
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

static int event_ensure_created(ga_state *st, EventObject *ev, int device);

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
    EventObject *ev = (EventObject *)event;
    if (!ev->recorded)
        Py_RETURN_NONE; /* like CUDA: waiting on a never-recorded event is a no-op */
    GA_CHECK(st, ga_cuda_stream_wait_event(self->device, self->handle, ev->handle));
    Py_RETURN_NONE;
error:
    return NULL;
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

static PyObject *Event_new_impl(ga_state *st, int timing);

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
        event = Event_new_impl(st, 0);
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
    EventObject *ev = (EventObject *)event;
    if (event_ensure_created(st, ev, self->device) < 0)
        goto error;
    GA_CHECK(st, ga_cuda_event_record(self->device, ev->handle, self->handle));
    ev->recorded = 1;
    return event;
error:
    Py_DECREF(event);
    return NULL;
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
     "Stream.from_handle(handle, device=None) -> Stream\n\nWraps an existing cudaStream_t "
     "(e.g. torch.cuda.current_stream().cuda_stream) without taking ownership."},
    {"synchronize", (PyCFunction)Stream_synchronize, METH_NOARGS,
     "Waits until all work queued on the stream is done (releases the GIL)."},
    {"query", (PyCFunction)Stream_query, METH_NOARGS, "True when all queued work is done."},
    {"wait_event", (PyCFunction)Stream_wait_event, METH_O,
     "Makes future work on this stream wait for the event (never blocks the host)."},
    {"wait_stream", (PyCFunction)Stream_wait_stream, METH_O,
     "Makes future work on this stream wait for the work queued so far on another."},
    {"record_event", (PyCFunction)(void (*)(void))Stream_record_event, METH_VARARGS | METH_KEYWORDS,
     "record_event(event=None) -> Event"},
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
    {Py_tp_doc, "Stream(device=None, priority=0) — a CUDA stream.\n\n`with stream:` makes it "
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

/* -------------------------------------------------------------- Event */

static PyObject *Event_new_impl(ga_state *st, int timing)
{
    EventObject *self = PyObject_New(EventObject, st->EventType);
    if (!self)
        return NULL;
    self->handle = NULL;
    self->device = -1;
    self->timing = timing;
    self->recorded = 0;
    return (PyObject *)self;
}

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
    else if (default_cuda_device(st, Py_None, &device, "Event.record") < 0)
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
     "record(stream=None)\n\nRecords the event after the work queued so far on the stream "
     "(the current stream by default)."},
    {"query", (PyCFunction)Event_query, METH_NOARGS,
     "True when the recorded work is done (or the event was never recorded)."},
    {"synchronize", (PyCFunction)Event_synchronize, METH_NOARGS,
     "Waits for the recorded work (releases the GIL)."},
    {"wait", (PyCFunction)(void (*)(void))Event_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(stream=None)\n\nMakes future work on the stream wait for this event."},
    {"elapsed_ms", (PyCFunction)Event_elapsed_ms, METH_O,
     "elapsed_ms(end) -> float\n\nMilliseconds between this event and `end`."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Event_slots[] = {
    {Py_tp_new, Event_new},
    {Py_tp_dealloc, Event_dealloc},
    {Py_tp_repr, Event_repr},
    {Py_tp_getset, Event_getset},
    {Py_tp_methods, Event_methods},
    {Py_tp_doc, "Event(timing=False) — a CUDA event, created on the device of the first "
                "stream it is recorded on."},
    {0, NULL},
};

PyType_Spec ga_event_spec = {
    .name = "gpuaccel.Event",
    .basicsize = sizeof(EventObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Event_slots,
};

/* ------------------------------------------------- module-level functions */

PyObject *ga_py_cuda_available(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    return PyBool_FromLong(ga_cuda_usable());
}

PyObject *ga_py_built_with_cuda(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    int count;
    return PyBool_FromLong(ga_cuda_device_count(&count).error != GA_ERR_NO_CUDA_BUILD);
}

PyObject *ga_py_device_count(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    int count = 0;
    if (cuda_forked || ga_cuda_device_count(&count).error)
        count = 0;
    return PyLong_FromLong(count);
}

PyObject *ga_py_default_device(PyObject *module, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(ga_state_from_module(module)->default_device);
}

PyObject *ga_py_set_default_device(PyObject *module, PyObject *device_obj)
{
    ga_state *st = ga_state_from_module(module);
    ga_device device;
    if (device_obj == Py_None) {
        device.type = GA_DEVICE_CPU;
        device.index = 0;
    } else if (ga_device_from_object(st, device_obj, &device, "device") < 0) {
        return NULL;
    }
    PyObject *obj = ga_device_new(st, device);
    if (!obj)
        return NULL;
    Py_SETREF(st->default_device, obj);
    Py_RETURN_NONE;
}

/* The CUDA device a module function's `device=None` means. */
static int cuda_index_for(ga_state *st, PyObject *device_obj, int *index)
{
    return default_cuda_device(st, device_obj, index, "this function");
}

PyObject *ga_py_current_stream(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"device", NULL};
    PyObject *device_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:current_stream", kwlist, &device_obj))
        return NULL;
    ga_state *st = ga_state_from_module(module);
    int device;
    if (cuda_index_for(st, device_obj, &device) < 0)
        return NULL;
    PyObject *value = NULL;
    if (PyContextVar_Get(st->current_stream, NULL, &value) < 0)
        return NULL;
    if (value && ((StreamObject *)value)->device == device)
        return value;
    Py_XDECREF(value);
    return stream_new(st->StreamType, (ga_stream)0, device, 0, 0);
}

PyObject *ga_py_synchronize(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"device", NULL};
    PyObject *device_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:synchronize", kwlist, &device_obj))
        return NULL;
    ga_state *st = ga_state_from_module(module);
    ga_device device;
    if (device_obj == Py_None) {
        if (!ga_cuda_usable())
            Py_RETURN_NONE; /* nothing can be pending */
        device.type = GA_DEVICE_CUDA;
        device.index = current_cuda_index();
    } else if (ga_device_from_object(st, device_obj, &device, "device") < 0) {
        return NULL;
    }
    if (device.type == GA_DEVICE_CPU)
        Py_RETURN_NONE;
    if (ga_ensure_cuda_device(st, device.index) < 0)
        return NULL;
    GA_CHECK_NOGIL(st, ga_cuda_device_synchronize(device.index));
    Py_RETURN_NONE;
error:
    return NULL;
}

PyObject *ga_py_device_properties(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"device", NULL};
    PyObject *device_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:device_properties", kwlist, &device_obj))
        return NULL;
    ga_state *st = ga_state_from_module(module);
    int device;
    if (cuda_index_for(st, device_obj, &device) < 0)
        return NULL;
    ga_device_props p;
    GA_CHECK(st, ga_cuda_device_props(device, &p));
    char pci[32];
    snprintf(pci, sizeof pci, "%04x:%02x:%02x.0", p.pci_domain, p.pci_bus, p.pci_device);
    return Py_BuildValue(
        "{s:s,s:(ii),s:K,s:i,s:i,s:s,s:O,s:O}", "name", p.name, "compute_capability", p.major,
        p.minor, "total_memory", (unsigned long long)p.total_memory, "multiprocessors",
        p.multiprocessors, "l2_cache_bytes", p.l2_cache_bytes, "pci_bus_id", pci, "integrated",
        p.integrated ? Py_True : Py_False, "managed_memory", p.managed_memory ? Py_True : Py_False);
error:
    return NULL;
}

static PyObject *version_or_none(int v)
{
    if (v <= 0)
        Py_RETURN_NONE;
    return PyLong_FromLong(v);
}

PyObject *ga_py_build_info(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    ga_cuda_versions_info v;
    int with_cuda = ga_cuda_versions(&v).error != GA_ERR_NO_CUDA_BUILD;
    const char *cublaslt_path, *cudnn_path;
    ga_cuda_library_paths(&cublaslt_path, &cudnn_path);
    PyObject *archs = PyList_New(0);
    if (!archs)
        return NULL;
    /* "80;86;89;90" -> [80, 86, 89, 90] */
    for (const char *p = v.archs ? v.archs : ""; *p;) {
        char *end;
        long arch = strtol(p, &end, 10);
        if (end == p)
            break;
        PyObject *item = PyLong_FromLong(arch);
        if (!item || PyList_Append(archs, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(archs);
            return NULL;
        }
        Py_DECREF(item);
        p = *end == ';' ? end + 1 : end;
    }
    return Py_BuildValue(
        "{s:O,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:s,s:s,s:i,s:i}", "built_with_cuda",
        with_cuda ? Py_True : Py_False, "cuda_archs", archs, "cuda_runtime_built",
        version_or_none(v.runtime_built), "cuda_runtime_loaded", version_or_none(v.runtime_loaded),
        "driver_cuda_version", version_or_none(v.driver), "cublaslt_built",
        version_or_none(v.cublaslt_built), "cublaslt_loaded", version_or_none(v.cublaslt_loaded),
        "cudnn_built", version_or_none(v.cudnn_built), "cudnn_loaded",
        version_or_none(v.cudnn_loaded), "cublaslt_library", cublaslt_path, "cudnn_library",
        cudnn_path, "cpu_threads", ga_cpu_num_threads(), "max_ndim", GA_MAX_NDIM);
}

int ga_device_module_init(PyObject *module, ga_state *st)
{
    (void)module;
    static int atfork_registered = 0;
    if (!atfork_registered) {
        if (pthread_atfork(NULL, NULL, mark_forked_child) != 0) {
            PyErr_SetString(PyExc_RuntimeError, "gpuaccel: pthread_atfork failed");
            return -1;
        }
        atfork_registered = 1;
    }
    ga_device cpu = {GA_DEVICE_CPU, 0};
    st->default_device = ga_device_new(st, cpu);
    return st->default_device ? 0 : -1;
}
