/*
 * graph.c — gpuaccel.Graph: CUDA graph capture and replay on any stream
 * but the legacy default one (a gpuaccel Stream, torch's, an int handle),
 * as torch.cuda.CUDAGraph does on torch's streams.
 *
 * Between capture_begin and capture_end the work queued on the stream is
 * recorded, not run; replay() runs it again, with the same pointers.  So
 * what the captured work reads and writes must stay allocated while the
 * graph may be replayed, and what it allocates (the arrays the captured ops
 * return) is the graph's memory: each replay frees what the last one
 * left and allocates it again at the same address.  A warm-up step before
 * the capture, on any stream of the same thread, prepares what a capture
 * cannot (cuDNN plans, the LossLogger's state): see README.md.
 */
#include "graph.h"

#include <string.h>

typedef struct {
    PyObject_HEAD
    ga_graph graph; /* instantiated by capture_end */
    int device;
    int capturing;
    ga_stream stream; /* the capturing stream */
} GraphObject;

static PyObject *Graph_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, ":Graph", kwlist))
        return NULL;
    GraphObject *self = (GraphObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->graph = NULL;
    self->device = -1;
    self->capturing = 0;
    self->stream = NULL;
    return (PyObject *)self;
}

static int parse_mode(PyObject *obj, int *mode)
{
    static const char *const names[] = {"global", "thread_local", "relaxed"};
    const char *name = obj == NULL ? "global" : ga_exact_utf8(obj);
    for (int k = 0; name && k < 3; k++)
        if (strcmp(name, names[k]) == 0) {
            *mode = k; /* GA_CAPTURE_GLOBAL, _THREAD_LOCAL, _RELAXED */
            return 0;
        }
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError,
                 "capture_begin: mode must be 'global', 'thread_local' or 'relaxed' (as "
                 "torch.cuda.graph's capture_error_mode), got %R",
                 obj);
    return -1;
}

/* Ends a capture in progress and drops its graph; 0, or -1 with the
 * error (the capture is over either way). */
static ga_status discard_capture(GraphObject *self)
{
    ga_graph graph = NULL;
    self->capturing = 0;
    ga_status status = ga_cuda_stream_end_capture(self->device, self->stream, &graph);
    if (graph)
        ga_cuda_graph_destroy(self->device, graph);
    return status;
}

static ga_status destroy_graph(GraphObject *self)
{
    ga_graph graph = self->graph;
    self->graph = NULL;
    return graph ? ga_cuda_graph_destroy(self->device, graph) : ga_ok();
}

static PyObject *Graph_capture_begin(GraphObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"stream", "mode", NULL};
    PyObject *stream_obj = Py_None, *mode_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O$O:capture_begin", kwlist, &stream_obj,
                                     &mode_obj))
        return NULL;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    if (self->capturing || self->graph) {
        PyErr_SetString(PyExc_RuntimeError,
                        self->capturing ? "capture_begin: this Graph is capturing already"
                                        : "capture_begin: this Graph holds a captured graph; "
                                          "reset() it, or use a new Graph");
        return NULL;
    }
    int mode, device;
    if (parse_mode(mode_obj, &mode) < 0)
        return NULL;
    if (PyObject_TypeCheck(stream_obj, st->StreamType))
        device = ((StreamObject *)stream_obj)->device;
    else if (ga_default_cuda_device(st, Py_None, &device, "Graph.capture_begin") < 0)
        return NULL;
    if (ga_ensure_cuda_device(st, device) < 0)
        return NULL;
    ga_stream stream;
    if (ga_stream_from_object(st, stream_obj, device, &stream, "stream") < 0)
        return NULL;
    if ((uintptr_t)stream <= 1) {
        PyErr_SetString(PyExc_ValueError,
                        "capture_begin: the legacy default stream cannot be captured; pass "
                        "stream=gpuaccel.Stream() (or a torch stream), or make one current with "
                        "`with stream:`");
        return NULL;
    }
    GA_CHECK(st, ga_cuda_stream_begin_capture(device, stream, mode));
    self->device = device;
    self->stream = stream;
    self->capturing = 1;
    Py_RETURN_NONE;
error:
    return NULL;
}

static PyObject *Graph_capture_end(GraphObject *self, PyObject *unused)
{
    (void)unused;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    if (!self->capturing) {
        PyErr_SetString(PyExc_RuntimeError, "capture_end: this Graph is not capturing");
        return NULL;
    }
    self->capturing = 0;
    GA_CHECK(st, ga_cuda_stream_end_capture(self->device, self->stream, &self->graph));
    /* memory freed on the stream while it was captured goes now */
    GA_CHECK(st, ga_block_free_deferred());
    Py_RETURN_NONE;
error:
    return NULL;
}

static PyObject *Graph_replay(GraphObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"stream", NULL};
    PyObject *stream_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:replay", kwlist, &stream_obj))
        return NULL;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    if (!self->graph) {
        PyErr_SetString(PyExc_RuntimeError,
                        self->capturing
                            ? "replay: this Graph is still capturing; call capture_end() first"
                            : "replay: this Graph holds no captured graph; capture_begin() and "
                              "capture_end() make one");
        return NULL;
    }
    ga_stream stream;
    if (ga_stream_from_object(st, stream_obj, self->device, &stream, "stream") < 0)
        return NULL;
    GA_CHECK(st, ga_cuda_graph_launch(self->device, self->graph, stream));
    Py_RETURN_NONE;
error:
    return NULL;
}

static PyObject *Graph_reset(GraphObject *self, PyObject *unused)
{
    (void)unused;
    ga_state *st = ga_state_from_type(Py_TYPE(self));
    if (!st)
        return NULL;
    if (self->capturing)
        GA_CHECK(st, discard_capture(self));
    GA_CHECK(st, destroy_graph(self));
    Py_RETURN_NONE;
error:
    return NULL;
}

static void Graph_dealloc(GraphObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    ga_status status = self->capturing ? discard_capture(self) : ga_ok();
    ga_status destroyed = destroy_graph(self);
    if (!status.error)
        status = destroyed;
    if (status.error && !ga_is_finalizing()) {
        char text[1024];
        PyErr_Format(PyExc_RuntimeWarning, "gpuaccel: releasing a Graph failed: %s",
                     ga_status_text(status, text, sizeof text));
        PyErr_WriteUnraisable(NULL);
    }
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *Graph_repr(GraphObject *self)
{
    if (self->capturing)
        return PyUnicode_FromFormat("gpuaccel.Graph(capturing on cuda:%d)", self->device);
    if (self->graph)
        return PyUnicode_FromFormat("gpuaccel.Graph(captured on cuda:%d)", self->device);
    return PyUnicode_FromString("gpuaccel.Graph(empty)");
}

static PyObject *Graph_get_capturing(GraphObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->capturing);
}

static PyGetSetDef Graph_getset[] = {
    {"capturing", (getter)Graph_get_capturing, NULL,
     "whether capture_begin() was called and capture_end() not yet", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Graph_methods[] = {
    {"capture_begin", (PyCFunction)(void (*)(void))Graph_capture_begin,
     METH_VARARGS | METH_KEYWORDS,
     "capture_begin($self, /, stream=None, *, mode='global')\n--\n\nFrom now on, work queued on "
     "`stream` (a gpuaccel.Stream, a torch stream or an int handle; None: the current gpuaccel "
     "stream, which must not be the legacy default one) is captured into this graph, not run.  "
     "`mode` ('global', 'thread_local', 'relaxed') is CUDA's stream-capture mode, as "
     "torch.cuda.graph's capture_error_mode."},
    {"capture_end", (PyCFunction)Graph_capture_end, METH_NOARGS,
     "capture_end($self, /)\n--\n\nEnds the capture and makes the graph ready to replay.  An "
     "illegal call during the capture (a synchronization, say) fails here too."},
    {"replay", (PyCFunction)(void (*)(void))Graph_replay, METH_VARARGS | METH_KEYWORDS,
     "replay($self, /, stream=None)\n--\n\nRuns the captured work again on `stream` (None: the "
     "current gpuaccel stream), after the work queued there before and after the graph's "
     "previous replay; never blocks the host."},
    {"reset", (PyCFunction)Graph_reset, METH_NOARGS,
     "reset($self, /)\n--\n\nDrops the captured graph (ending a capture in progress), so that "
     "capture_begin() can start another."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Graph_slots[] = {
    {Py_tp_new, Graph_new},
    {Py_tp_dealloc, Graph_dealloc},
    {Py_tp_repr, Graph_repr},
    {Py_tp_getset, Graph_getset},
    {Py_tp_methods, Graph_methods},
    {Py_tp_doc, "Graph()\n--\n\nA CUDA graph: the work queued on a stream between "
                "capture_begin() and capture_end(), replayed by replay() with the same "
                "pointers (as torch.cuda.CUDAGraph)."},
    {0, NULL},
};

PyType_Spec ga_graph_spec = {
    .name = "gpuaccel.Graph",
    .basicsize = sizeof(GraphObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Graph_slots,
};
