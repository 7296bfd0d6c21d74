/*
 * logger.c — the native core of gpuaccel.LossLogger (gpuaccel/logger.py
 * subclasses it and holds callbacks, history, progress bars and the
 * distributed reduce).
 *
 * log() is the training step's path and never waits for the GPU: a CUDA
 * value is read by a one-thread-per-metric kernel queued on the stream that
 * produced it, which updates the window's running stats and the per-step
 * ring in device memory (kernels/cuda/logger.cu); host values (Python
 * numbers, CPU tensors) go through the same code on the host.  Every
 * `every` steps the window is snapshotted: host state copied at once, device
 * state by an async copy into pinned memory followed by an event.  Windows
 * are delivered to Python (_deliver) in order, once their event has
 * completed — checked in every log() and poll(), waited for only by flush().
 */
#include "npy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "array.h"
#include "logger.h"
#include "torch.h"

enum { METRIC_UNUSED = 0, METRIC_HOST = 1, METRIC_CUDA = 2 };

/* A snapshot in the layout stats[max_metrics][6] | present[n] | values[n][max_metrics]. */
typedef struct {
    int64_t start, end;                  /* steps [start, end] */
    char *host;                          /* malloc'd snapshot of the host state, or NULL */
    ga_block *pinned;                    /* snapshot of the device state, or NULL */
    ga_event event;                      /* recorded after the device snapshot */
    PyObject *host_reduce, *cuda_reduce; /* pending distributed reductions (Python handles) */
    int graph;                           /* a readout of steps logged by CUDA graph replays */
} window_record;

typedef struct {
    PyObject_HEAD
    int64_t every, capacity;
    int max_metrics;
    int64_t step;         /* log() calls so far (the last step) */
    int64_t window_start; /* first step of the open window */
    PyObject *names;      /* dict: name -> index */
    PyObject *name_list;  /* list: index -> name */
    int kind[GA_LOGGER_MAX_METRICS];
    int reduce; /* snapshots are all-reduced (hooks in Python) */
    /* host state */
    char *host_state;
    /* device state */
    int device; /* -1 until the first CUDA value */
    ga_block *device_state;
    ga_stream fixed_stream; /* stream= given to the constructor */
    int has_fixed_stream;
    ga_stream last_stream; /* the stream of the previous update */
    int64_t graph_read;    /* last device step read back after graph replays */
    int graph_mode;
    /* windows */
    window_record *pending;
    int npending, cap_pending;
    ga_event *spare_events;
    int nspare, cap_spare;
    PyObject *error; /* an exception the next log() raises (non-finite values) */
    int closed;
    int follows_torch; /* CUDA torch tensors were logged: read on torch's stream */
} LoggerObject;

static size_t snapshot_bytes(LoggerObject *lg, int64_t rows)
{
    return (size_t)lg->max_metrics * GA_LOGGER_STATS * sizeof(double) + (size_t)rows * 8 +
           (size_t)rows * (size_t)lg->max_metrics * sizeof(float);
}

/* ----------------------------------------------------------- construction */

static PyObject *Logger_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    LoggerObject *lg = (LoggerObject *)type->tp_alloc(type, 0);
    if (!lg)
        return NULL;
    lg->device = -1;
    lg->names = PyDict_New();
    lg->name_list = PyList_New(0);
    if (!lg->names || !lg->name_list) {
        Py_DECREF(lg);
        return NULL;
    }
    return (PyObject *)lg;
}

static int Logger_init(LoggerObject *lg, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"every", "capacity", "max_metrics", "stream", "reduce", NULL};
    long long every, capacity;
    int max_metrics, reduce = 0;
    PyObject *stream_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LLi|Op:_LoggerCore", kwlist, &every, &capacity,
                                     &max_metrics, &stream_obj, &reduce))
        return -1;
    if (lg->host_state) {
        PyErr_SetString(PyExc_RuntimeError, "a LossLogger cannot be initialised twice");
        return -1;
    }
    if (every < 1 || capacity < every || max_metrics < 1 || max_metrics > GA_LOGGER_MAX_METRICS) {
        PyErr_Format(PyExc_ValueError,
                     "LossLogger: need every >= 1, capacity >= every and 1 <= max_metrics <= %d",
                     GA_LOGGER_MAX_METRICS);
        return -1;
    }
    lg->every = every;
    lg->capacity = capacity;
    lg->max_metrics = max_metrics;
    lg->reduce = reduce;
    lg->window_start = 1;
    lg->host_state = calloc(1, ga_logger_state_bytes(capacity, max_metrics));
    if (!lg->host_state) {
        PyErr_NoMemory();
        return -1;
    }
    ga_cpu_logger_reset_window(lg->host_state, max_metrics, capacity, 1, every);
    if (stream_obj != Py_None) {
        ga_state *st = ga_state_from_type(Py_TYPE(lg));
        int device;
        if (!st)
            return -1;
        if (PyObject_TypeCheck(stream_obj, st->StreamType)) {
            device = ((StreamObject *)stream_obj)->device;
        } else {
            PyObject *dev = PyObject_GetAttrString(stream_obj, "device");
            PyObject *index = dev ? PyObject_GetAttrString(dev, "index") : NULL;
            Py_XDECREF(dev);
            if (!index) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError,
                             "LossLogger: stream must be None, a gpuaccel.Stream or a "
                             "torch.cuda.Stream, got %.200s",
                             ga_type_name(stream_obj));
                return -1;
            }
            device = index == Py_None ? 0 : (int)PyLong_AsLong(index);
            Py_DECREF(index);
        }
        if (ga_stream_from_object(st, stream_obj, device, &lg->fixed_stream, "stream") < 0)
            return -1;
        lg->has_fixed_stream = 1;
    }
    return 0;
}

/* ------------------------------------------------------------ values */

static long long call_long(PyObject *obj, const char *method)
{
    PyObject *r = PyObject_CallMethod(obj, method, NULL);
    if (!r)
        return -1;
    long long v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return v;
}

static int raise_bad_value(PyObject *name, PyObject *value)
{
    PyErr_Format(PyExc_TypeError,
                 "LossLogger.log: metric '%U' must be a 0-d or one-element torch tensor or "
                 "gpuaccel Array, or a Python number; got %.200s",
                 name, ga_type_name(value));
    return -1;
}

/* A metric value: host values in host_value, CUDA ones as ptr, dtype, device. */
static int classify(ga_state *st, LoggerObject *lg, PyObject *name, PyObject *value, int *is_cuda,
                    double *host_value, const void **ptr, ga_dtype *dtype, int *device)
{
    *is_cuda = 0;
    if (PyFloat_Check(value) || (PyLong_Check(value) && !PyBool_Check(value)) ||
        PyArray_IsScalar(value, Integer) || PyArray_IsScalar(value, Floating)) {
        *host_value = PyFloat_AsDouble(value);
        return *host_value == -1.0 && PyErr_Occurred() ? -1 : 0;
    }
    if (ga_is_array(st, value)) {
        ArrayObject *a = (ArrayObject *)value;
        if (ga_array_size(a) != 1) {
            PyErr_Format(PyExc_ValueError,
                         "LossLogger.log: metric '%U' must have exactly one element, it has %lld",
                         name, (long long)ga_array_size(a));
            return -1;
        }
        if (a->device.type == GA_DEVICE_CPU) {
            ga_tensor src = {a->data, a->dtype, 0, {0}, {0}};
            ga_tensor dst = {host_value, GA_FLOAT64, 0, {0}, {0}};
            GA_CHECK(st, ga_cpu_copy(&dst, &src));
            return 0;
        }
        *is_cuda = 1;
        *ptr = a->data;
        *dtype = a->dtype;
        *device = a->device.index;
        return 0;
    }
    if (ga_is_torch_tensor(st, value)) {
        long long numel = call_long(value, "numel");
        if (numel != 1) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError,
                             "LossLogger.log: metric '%U' must have exactly one element, it has "
                             "%lld",
                             name, numel);
            return -1;
        }
        PyObject *cuda = PyObject_GetAttrString(value, "is_cuda");
        int on_cuda = cuda ? PyObject_IsTrue(cuda) : -1;
        Py_XDECREF(cuda);
        if (on_cuda < 0)
            return -1;
        if (!on_cuda) {
            /* CPU tensors are read now: no GPU is involved */
            PyObject *item = PyObject_CallMethod(value, "item", NULL);
            if (!item)
                return -1;
            *host_value = PyFloat_AsDouble(item);
            Py_DECREF(item);
            return PyErr_Occurred() ? -1 : 0;
        }
        long long address = call_long(value, "data_ptr");
        long long index = address == -1 && PyErr_Occurred() ? -1 : call_long(value, "get_device");
        if (PyErr_Occurred() || ga_torch_dtype(st, value, dtype) < 0)
            return -1;
        lg->follows_torch = 1;
        *is_cuda = 1;
        *ptr = (const void *)(uintptr_t)address;
        *device = (int)index;
        return 0;
    }
    return raise_bad_value(name, value);
error:
    return -1;
}

static int metric_index(LoggerObject *lg, PyObject *name)
{
    PyObject *found = PyDict_GetItemWithError(lg->names, name);
    if (found)
        return (int)PyLong_AsLong(found);
    if (PyErr_Occurred())
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(lg->name_list);
    if (n >= lg->max_metrics) {
        PyErr_Format(PyExc_ValueError,
                     "LossLogger: metric '%U' would be metric number %zd, but this logger was made "
                     "for max_metrics=%d",
                     name, n + 1, lg->max_metrics);
        return -1;
    }
    PyObject *index = PyLong_FromSsize_t(n);
    int rc = index ? PyDict_SetItem(lg->names, name, index) : -1;
    Py_XDECREF(index);
    if (rc < 0 || PyList_Append(lg->name_list, name) < 0)
        return -1;
    return (int)n;
}

/* The stream a CUDA value was produced on: stream= of the constructor,
 * else torch's current stream of that device once torch's CUDA tensors are
 * logged, else gpuaccel's current stream. */
static int value_stream(ga_state *st, LoggerObject *lg, int device, ga_stream *out)
{
    if (lg->has_fixed_stream) {
        *out = lg->fixed_stream;
        return 0;
    }
    int from_torch = lg->follows_torch ? ga_torch_current_stream(st, device, out) : 0;
    if (from_torch != 0)
        return from_torch < 0 ? -1 : 0;
    return ga_current_stream(st, device, out);
}

/* --------------------------------------------------------------- windows */

static void copy_rows_host(LoggerObject *lg, char *dst, const char *state, int64_t start,
                           int64_t rows)
{
    size_t stats = (size_t)lg->max_metrics * GA_LOGGER_STATS * sizeof(double);
    memcpy(dst, state + ga_logger_stats_offset(), stats);
    uint64_t *present = (uint64_t *)(dst + stats);
    float *values = (float *)(dst + stats + (size_t)rows * 8);
    const uint64_t *sp = (const uint64_t *)(state + ga_logger_present_offset(lg->max_metrics));
    const float *sv =
        (const float *)(state + ga_logger_values_offset(lg->capacity, lg->max_metrics));
    for (int64_t k = 0; k < rows; k++) {
        int64_t row = (start - 1 + k) % lg->capacity;
        present[k] = sp[row];
        memcpy(values + k * lg->max_metrics, sv + row * lg->max_metrics,
               (size_t)lg->max_metrics * sizeof(float));
    }
}

/* The same, queued on the GPU: at most two copies per part (the ring may
 * wrap). */
static ga_status copy_rows_device(LoggerObject *lg, char *dst, const char *state, int64_t start,
                                  int64_t rows, ga_stream s)
{
    size_t stats = (size_t)lg->max_metrics * GA_LOGGER_STATS * sizeof(double);
    size_t row_values = (size_t)lg->max_metrics * sizeof(float);
    GA_TRY_STATUS(
        ga_cuda_memcpy_async(lg->device, dst, state + ga_logger_stats_offset(), stats, s));
    const char *sp = state + ga_logger_present_offset(lg->max_metrics);
    const char *sv = state + ga_logger_values_offset(lg->capacity, lg->max_metrics);
    char *dp = dst + stats, *dv = dst + stats + (size_t)rows * 8;
    int64_t first = (start - 1) % lg->capacity;
    int64_t part = rows < lg->capacity - first ? rows : lg->capacity - first;
    GA_TRY_STATUS(ga_cuda_memcpy_async(lg->device, dp, sp + first * 8, (size_t)part * 8, s));
    GA_TRY_STATUS(ga_cuda_memcpy_async(lg->device, dv, sv + first * row_values,
                                       (size_t)part * row_values, s));
    if (part < rows) {
        GA_TRY_STATUS(
            ga_cuda_memcpy_async(lg->device, dp + part * 8, sp, (size_t)(rows - part) * 8, s));
        GA_TRY_STATUS(ga_cuda_memcpy_async(lg->device, dv + part * row_values, sv,
                                           (size_t)(rows - part) * row_values, s));
    }
    return ga_ok();
}

static ga_status get_event(LoggerObject *lg, ga_event *out)
{
    if (lg->nspare > 0) {
        *out = lg->spare_events[--lg->nspare];
        return ga_ok();
    }
    return ga_cuda_event_create(lg->device, 0, out);
}

static void put_event(LoggerObject *lg, ga_event ev)
{
    if (lg->nspare == lg->cap_spare) {
        int cap = lg->cap_spare ? 2 * lg->cap_spare : 8;
        ga_event *more = realloc(lg->spare_events, (size_t)cap * sizeof *more);
        if (!more) {
            ga_cuda_event_destroy(lg->device, ev);
            return;
        }
        lg->spare_events = more;
        lg->cap_spare = cap;
    }
    lg->spare_events[lg->nspare++] = ev;
}

static window_record *push_record(LoggerObject *lg)
{
    if (lg->npending == lg->cap_pending) {
        int cap = lg->cap_pending ? 2 * lg->cap_pending : 8;
        window_record *more = realloc(lg->pending, (size_t)cap * sizeof *more);
        if (!more) {
            PyErr_NoMemory();
            return NULL;
        }
        lg->pending = more;
        lg->cap_pending = cap;
    }
    window_record *r = &lg->pending[lg->npending++];
    memset(r, 0, sizeof *r);
    return r;
}

static void free_record(LoggerObject *lg, window_record *r)
{
    free(r->host);
    if (r->pinned)
        ga_block_free(r->pinned);
    if (r->event)
        put_event(lg, r->event);
    Py_CLEAR(r->host_reduce);
    Py_CLEAR(r->cuda_reduce);
}

/* Calls a method of the Python subclass with one argument. */
static PyObject *call_hook(LoggerObject *lg, const char *name, PyObject *arg)
{
    PyObject *method = PyUnicode_FromString(name);
    if (!method)
        return NULL;
    PyObject *result = PyObject_CallMethodOneArg((PyObject *)lg, method, arg);
    Py_DECREF(method);
    return result;
}

/* NumPy view of a snapshot's stats (max_metrics x 6 float64), owned by
 * nobody: the caller keeps the record alive. */
static PyObject *stats_view(LoggerObject *lg, void *snapshot)
{
    npy_intp dims[2] = {lg->max_metrics, GA_LOGGER_STATS};
    return PyArray_SimpleNewFromData(2, dims, NPY_FLOAT64, snapshot);
}

/* Closes the open window [window_start, step]: snapshots (and, with
 * reduce, starts the all-reduce of) both states and resets them. */
static int close_window(ga_state *st, LoggerObject *lg)
{
    int64_t start = lg->window_start, end = lg->step, rows = end - start + 1;
    if (rows <= 0)
        return 0;
    window_record *r = push_record(lg);
    if (!r)
        return -1;
    r->start = start;
    r->end = end;
    r->host = malloc(snapshot_bytes(lg, rows));
    if (!r->host) {
        lg->npending--;
        PyErr_NoMemory();
        return -1;
    }
    copy_rows_host(lg, r->host, lg->host_state, start, rows);
    ga_cpu_logger_reset_window(lg->host_state, lg->max_metrics, lg->capacity, end + 1, lg->every);
    lg->window_start = end + 1;
    if (lg->reduce) {
        PyObject *view = stats_view(lg, r->host);
        r->host_reduce = view ? call_hook(lg, "_reduce_host", view) : NULL;
        Py_XDECREF(view);
        if (!r->host_reduce)
            return -1;
    }
    if (!lg->device_state || lg->graph_mode)
        return 0;
    ga_stream s = lg->last_stream;
    if (lg->reduce) {
        /* all-reduce the device stats in place, on the logging stream */
        int64_t shape[2] = {lg->max_metrics, GA_LOGGER_STATS};
        ga_device dev = {GA_DEVICE_CUDA, lg->device};
        ArrayObject *stats =
            ga_array_wrap(st, (char *)lg->device_state->ptr + ga_logger_stats_offset(), GA_FLOAT64,
                          2, shape, NULL, dev, 0, (PyObject *)lg);
        r->cuda_reduce = stats ? call_hook(lg, "_reduce_device", (PyObject *)stats) : NULL;
        Py_XDECREF(stats);
        if (!r->cuda_reduce)
            return -1;
    }
    r->pinned = ga_block_alloc(st, GA_MEM_PINNED, -1, snapshot_bytes(lg, rows), NULL);
    if (!r->pinned)
        return -1;
    GA_CHECK(st, copy_rows_device(lg, r->pinned->ptr, lg->device_state->ptr, start, rows, s));
    GA_CHECK(st, get_event(lg, &r->event));
    GA_CHECK(st, ga_cuda_event_record(lg->device, r->event, s));
    if (ga_block_record_use(st, r->pinned, lg->device, s) < 0)
        return -1;
    GA_CHECK(st, ga_cuda_logger_reset_window(lg->device, lg->device_state->ptr, lg->max_metrics,
                                             lg->capacity, end + 1, lg->every, s));
    /* the state is not freed before the copy and the reset ran */
    return ga_block_record_use(st, lg->device_state, lg->device, s);
error:
    return -1;
}

/* 1 when the oldest window can be delivered now (0: not yet). */
static int record_ready(LoggerObject *lg, window_record *r)
{
    if (r->event) {
        int done = 0;
        ga_status status = ga_cuda_event_query(lg->device, r->event, &done);
        if (status.error) {
            ga_state *st = ga_state_from_type(Py_TYPE(lg));
            return st ? ga_raise(st, status) : -1;
        }
        if (!done)
            return 0;
    }
    for (int k = 0; k < 2; k++) {
        PyObject *handle = k == 0 ? r->host_reduce : r->cuda_reduce;
        if (!handle)
            continue;
        PyObject *done = call_hook(lg, "_reduce_done", handle);
        if (!done)
            return -1;
        int ok = PyObject_IsTrue(done);
        Py_DECREF(done);
        if (ok <= 0)
            return ok;
    }
    return 1;
}

/* The window as Python data: {"start", "end", "metrics": {name: (stats,
 * steps, values)}} with stats a 6-tuple and steps/values NumPy arrays. */
static PyObject *window_dict(LoggerObject *lg, window_record *r)
{
    int64_t rows = r->end - r->start + 1;
    PyObject *metrics = PyDict_New(), *result = NULL;
    if (!metrics)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(lg->name_list);
    for (Py_ssize_t m = 0; m < n; m++) {
        const char *snap =
            lg->kind[m] == METRIC_CUDA ? (r->pinned ? r->pinned->ptr : NULL) : r->host;
        if (!snap || lg->kind[m] == METRIC_UNUSED)
            continue;
        const double *stats = (const double *)snap + m * GA_LOGGER_STATS;
        size_t off = (size_t)lg->max_metrics * GA_LOGGER_STATS * sizeof(double);
        const uint64_t *present = (const uint64_t *)(snap + off);
        const float *values = (const float *)(snap + off + (size_t)rows * 8);
        npy_intp count = 0;
        for (int64_t k = 0; k < rows; k++)
            count += (present[k] >> m) & 1;
        if (count == 0 && stats[GA_LOGGER_COUNT] == 0 && stats[GA_LOGGER_NONFINITE] == 0)
            continue;
        PyObject *steps = PyArray_SimpleNew(1, &count, NPY_INT64);
        PyObject *vals = PyArray_SimpleNew(1, &count, NPY_FLOAT64);
        if (!steps || !vals) {
            Py_XDECREF(steps);
            Py_XDECREF(vals);
            goto done;
        }
        int64_t *sp = PyArray_DATA((PyArrayObject *)steps);
        double *vp = PyArray_DATA((PyArrayObject *)vals);
        for (int64_t k = 0, j = 0; k < rows; k++) {
            if ((present[k] >> m) & 1) {
                sp[j] = r->start + k;
                vp[j++] = values[k * lg->max_metrics + m];
            }
        }
        PyObject *entry = r->graph ? Py_BuildValue("(ONN)", Py_None, steps, vals)
                                   : Py_BuildValue("((dddddd)NN)", stats[0], stats[1], stats[2],
                                                   stats[3], stats[4], stats[5], steps, vals);
        if (!entry || PyDict_SetItem(metrics, PyList_GET_ITEM(lg->name_list, m), entry) < 0) {
            Py_XDECREF(entry);
            goto done;
        }
        Py_DECREF(entry);
    }
    result = Py_BuildValue("{s:L,s:L,s:O}", "start", (long long)r->start, "end", (long long)r->end,
                           "metrics", metrics);
done:
    Py_DECREF(metrics);
    return result;
}

/* Delivers every window that is ready, in order; with `wait`, waits for
 * each (GIL released).  Returns the number delivered, -1 on error. */
static int deliver(ga_state *st, LoggerObject *lg, int wait)
{
    int delivered = 0;
    while (lg->npending > 0) {
        window_record *r = &lg->pending[0];
        if (wait && r->event)
            GA_CHECK_NOGIL(st, ga_cuda_event_synchronize(lg->device, r->event));
        int ready;
        while ((ready = record_ready(lg, r)) == 0 && wait) {
            /* a distributed reduction still in flight */
            Py_BEGIN_ALLOW_THREADS
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
            Py_END_ALLOW_THREADS
            if (PyErr_CheckSignals() < 0)
                return -1;
        }
        if (ready < 0)
            return -1;
        if (!ready)
            break;
        if (r->pinned)
            GA_CHECK(st, ga_cuda_host_access(r->pinned->ptr, r->pinned->size, 0));
        PyObject *data = window_dict(lg, r);
        window_record done = *r;
        memmove(&lg->pending[0], &lg->pending[1], (size_t)(lg->npending - 1) * sizeof *r);
        lg->npending--;
        free_record(lg, &done);
        if (!data)
            return -1;
        PyObject *rv = call_hook(lg, "_deliver", data);
        Py_DECREF(data);
        if (!rv)
            return -1;
        Py_DECREF(rv);
        delivered++;
    }
    return delivered;
error:
    return -1;
}

/* ------------------------------------------------------------------ log */

static int ensure_device_state(ga_state *st, LoggerObject *lg, int device, ga_stream s,
                               PyObject *name)
{
    if (lg->device_state) {
        if (device != lg->device) {
            PyErr_Format(PyExc_ValueError,
                         "LossLogger.log: metric '%U' is on cuda:%d, but this logger already "
                         "reads values on cuda:%d; use one logger per device",
                         name, device, lg->device);
            return -1;
        }
        return 0;
    }
    if (ga_ensure_cuda_device(st, device) < 0)
        return -1;
    lg->device = device;
    lg->device_state = ga_block_alloc(st, GA_MEM_DEVICE, device,
                                      ga_logger_state_bytes(lg->capacity, lg->max_metrics), s);
    if (!lg->device_state)
        return -1;
    /* zero the counter and ring, then empty the stats (all on s, in order) */
    ga_tensor t;
    memset(&t, 0, sizeof t);
    t.data = lg->device_state->ptr;
    t.dtype = GA_UINT8;
    t.ndim = 1;
    t.shape[0] = (int64_t)lg->device_state->size;
    t.strides[0] = 1;
    ga_scalar zero = {1, 0, 0.0};
    GA_CHECK(st, ga_cuda_fill(device, &t, zero, s));
    GA_CHECK(st, ga_cuda_logger_reset_window(device, lg->device_state->ptr, lg->max_metrics,
                                             lg->capacity, lg->window_start, lg->every, s));
    lg->last_stream = s;
    return 0;
error:
    return -1;
}

static int has_host_metrics(const LoggerObject *lg)
{
    for (int m = 0; m < lg->max_metrics; m++)
        if (lg->kind[m] == METRIC_HOST)
            return 1;
    return 0;
}

/* The update kernel on stream s: eagerly, it waits for the gpuaccel Arrays
 * it reads (made on other streams), and they and the logger's state are
 * not freed or reused before it ran.  Not while capturing: an event
 * recorded in a capture cannot be waited on outside it (the graph's
 * inputs must outlive its replays anyway). */
static int update_on_device(ga_state *st, LoggerObject *lg, const ga_logger_update *u, ga_stream s,
                            int capturing, ArrayObject *const *arrays, int narrays)
{
    for (int k = 0; k < narrays && !capturing; k++)
        if (ga_array_prepare_stream(st, arrays[k], s) < 0)
            return -1;
    GA_CHECK(st, ga_cuda_logger_update(lg->device, u, s));
    if (capturing)
        return 0;
    for (int k = 0; k < narrays; k++)
        if (ga_array_record_stream(st, arrays[k], s) < 0)
            return -1;
    return ga_block_record_use(st, lg->device_state, lg->device, s);
error:
    return -1;
}

static PyObject *log_entry(LoggerObject *lg, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    ga_state *st = ga_state_from_type(Py_TYPE(lg));
    if (!st)
        return NULL;
    if (nargs) {
        PyErr_SetString(PyExc_TypeError,
                        "LossLogger.log takes metrics as keywords: log(loss=loss)");
        return NULL;
    }
    if (lg->closed) {
        PyErr_SetString(PyExc_RuntimeError, "LossLogger.log: the logger is closed");
        return NULL;
    }
    if (lg->error) {
        PyObject *error = lg->error;
        lg->error = NULL;
        PyErr_SetObject((PyObject *)Py_TYPE(error), error);
        Py_DECREF(error);
        return NULL;
    }
    Py_ssize_t n = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (n > GA_LOGGER_MAX_PER_CALL) {
        PyErr_Format(PyExc_ValueError, "LossLogger.log: at most %d metrics per call",
                     GA_LOGGER_MAX_PER_CALL);
        return NULL;
    }
    ga_logger_update host = {0}, cuda = {0};
    double host_values[GA_LOGGER_MAX_PER_CALL];
    int cuda_device = -1;
    PyObject *cuda_name = NULL;
    ArrayObject *cuda_arrays[GA_LOGGER_MAX_PER_CALL]; /* gpuaccel Arrays the update reads */
    int narrays = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k), *value = args[k];
        int is_cuda, device = -1;
        double hv = 0;
        const void *ptr = NULL;
        ga_dtype dtype = GA_FLOAT32;
        if (classify(st, lg, name, value, &is_cuda, &hv, &ptr, &dtype, &device) < 0)
            return NULL;
        int m = metric_index(lg, name);
        if (m < 0)
            return NULL;
        int want = is_cuda ? METRIC_CUDA : METRIC_HOST;
        if (lg->kind[m] != METRIC_UNUSED && lg->kind[m] != want) {
            PyErr_Format(PyExc_ValueError,
                         "LossLogger.log: metric '%U' was logged from %s before and now from %s; "
                         "a metric must keep its device",
                         name, lg->kind[m] == METRIC_CUDA ? "a GPU" : "the host",
                         is_cuda ? "a GPU" : "the host");
            return NULL;
        }
        if (is_cuda && cuda_device >= 0 && device != cuda_device) {
            PyErr_Format(PyExc_ValueError,
                         "LossLogger.log: metrics '%U' and '%U' are on different GPUs", cuda_name,
                         name);
            return NULL;
        }
        lg->kind[m] = want;
        ga_logger_update *u = is_cuda ? &cuda : &host;
        u->metric[u->n] = m;
        u->present |= (uint64_t)1 << m;
        if (is_cuda) {
            if (ga_is_array(st, value))
                cuda_arrays[narrays++] = (ArrayObject *)value;
            u->value[u->n] = ptr;
            u->dtype[u->n] = dtype;
            cuda_device = device;
            cuda_name = name;
        } else {
            host_values[host.n] = hv;
            u->value[u->n] = &host_values[host.n];
            u->dtype[u->n] = GA_FLOAT64;
        }
        u->n++;
    }
    int capturing = 0;
    ga_stream s = NULL;
    if (cuda.n || lg->device_state) {
        /* also for host values alone: refused below while the stream is
         * capturing (and pending windows are not queried then) */
        if (value_stream(st, lg, cuda.n ? cuda_device : lg->device, &s) < 0)
            return NULL;
        GA_CHECK(st, ga_cuda_stream_capturing(s, &capturing));
    }
    if (cuda.n) {
        if (capturing && !lg->device_state) {
            /* allocated now, the logger's counters would be memory of the
             * graph, zeroed again by every replay */
            PyErr_SetString(PyExc_RuntimeError,
                            "LossLogger.log: the first log() of a CUDA value must come before "
                            "CUDA graph capture: log in the warm-up steps that capture needs "
                            "anyway, then capture");
            return NULL;
        }
        if (ensure_device_state(st, lg, cuda_device, s, cuda_name) < 0)
            return NULL;
        if (s != lg->last_stream && !capturing) {
            /* the state was last updated on another stream: keep updates in order */
            GA_CHECK(st, ga_cuda_stream_wait_stream(lg->device, s, lg->device, lg->last_stream));
            lg->last_stream = s;
        }
    }
    /* windows that completed are handed to on_log; not while capturing,
     * where querying their events would invalidate the capture */
    if (!capturing && lg->npending && deliver(st, lg, 0) < 0)
        return NULL;
    if (capturing) {
        /* inside a CUDA graph: the device counter numbers the steps, and the
         * steps are read back by flush() (host values cannot be captured) */
        if (host.n) {
            PyErr_SetString(PyExc_ValueError,
                            "LossLogger.log: during CUDA graph capture only CUDA tensors can be "
                            "logged (a Python number would be recorded once, not per replay)");
            return NULL;
        }
        if (!lg->graph_mode && lg->window_start <= lg->step && has_host_metrics(lg)) {
            /* graph steps are read back from the device alone, where the open
             * window's host values are not */
            PyErr_SetString(PyExc_RuntimeError,
                            "LossLogger.log: steps logged before this CUDA graph capture hold "
                            "Python numbers that are not delivered yet; call flush() after the "
                            "warm-up steps, then capture");
            return NULL;
        }
        cuda.state = lg->device_state->ptr;
        cuda.capacity = lg->capacity;
        cuda.max_metrics = lg->max_metrics;
        cuda.step = 0;
        if (update_on_device(st, lg, &cuda, s, 1, cuda_arrays, narrays) < 0)
            return NULL;
        if (!lg->graph_mode) /* graph steps are read back from the open eager window on */
            lg->graph_read = lg->window_start - 1;
        lg->graph_mode = 1;
        Py_RETURN_NONE;
    }
    if (lg->graph_mode) {
        PyErr_SetString(PyExc_RuntimeError,
                        "LossLogger.log: this logger recorded steps in a CUDA graph; call flush() "
                        "to read them before logging outside the graph");
        return NULL;
    }
    int64_t step = ++lg->step;
    host.state = lg->host_state;
    host.capacity = lg->capacity;
    host.max_metrics = lg->max_metrics;
    host.step = step;
    GA_CHECK(st, ga_cpu_logger_update(&host));
    if (cuda.n) {
        cuda.state = lg->device_state->ptr;
        cuda.capacity = lg->capacity;
        cuda.max_metrics = lg->max_metrics;
        cuda.step = step;
        if (update_on_device(st, lg, &cuda, s, 0, cuda_arrays, narrays) < 0)
            return NULL;
    }
    if (step - lg->window_start + 1 >= lg->every) {
        /* a window of host values is complete at once: deliver it now */
        if (close_window(st, lg) < 0 || deliver(st, lg, 0) < 0)
            return NULL;
    }
    Py_RETURN_NONE;
error:
    return NULL;
}

/* log() inside a torch.profiler range "gpuaccel::logger_update" while
 * torch's profiler records, and an NVTX range of that name (see
 * ga_op_profiled). */
static PyObject *Logger_log(LoggerObject *lg, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    ga_state *st = ga_state_from_type(Py_TYPE(lg));
    if (!st)
        return NULL;
    PyObject *range = ga_torch_profile_begin(st, "gpuaccel::logger_update");
    ga_cuda_range_push("gpuaccel::logger_update");
    PyObject *result = log_entry(lg, args, nargs, kwnames);
    ga_cuda_range_pop();
    ga_torch_profile_end(st, range);
    return result;
}

/* ------------------------------------------------------ poll and flush */

static PyObject *Logger_poll(LoggerObject *lg, PyObject *unused)
{
    (void)unused;
    ga_state *st = ga_state_from_type(Py_TYPE(lg));
    int n = st ? deliver(st, lg, 0) : -1;
    return n < 0 ? NULL : PyLong_FromLong(n);
}

/* Reads back the steps CUDA graph replays logged (they bypass the host's
 * step count): the device counter, then the ring rows since the last
 * read, delivered as windows of `every` steps. */
static int read_graph_steps(ga_state *st, LoggerObject *lg)
{
    int64_t device_step = 0;
    /* replays run on whatever stream the user launched them on: wait for
     * all of them (flush() may block) before reading the counter */
    GA_CHECK_NOGIL(st, ga_cuda_device_synchronize(lg->device));
    GA_CHECK(st, ga_cuda_memcpy_async(lg->device, &device_step, lg->device_state->ptr,
                                      sizeof device_step, lg->last_stream));
    GA_CHECK_NOGIL(st, ga_cuda_stream_synchronize(lg->device, lg->last_stream));
    if (device_step - lg->graph_read > lg->capacity) {
        PyErr_Format(PyExc_RuntimeError,
                     "LossLogger: %lld steps were logged in CUDA graphs since the last flush(), "
                     "more than capacity=%lld; the oldest were overwritten (flush more often or "
                     "raise capacity)",
                     (long long)(device_step - lg->graph_read), (long long)lg->capacity);
        lg->graph_read = device_step;
        return -1;
    }
    for (int64_t start = lg->graph_read + 1; start <= device_step; start += lg->every) {
        int64_t end = start + lg->every - 1 < device_step ? start + lg->every - 1 : device_step;
        window_record *r = push_record(lg);
        if (!r)
            return -1;
        r->start = start;
        r->end = end;
        r->graph = 1;
        r->pinned =
            ga_block_alloc(st, GA_MEM_PINNED, -1, snapshot_bytes(lg, end - start + 1), NULL);
        if (!r->pinned)
            return -1;
        GA_CHECK(st, copy_rows_device(lg, r->pinned->ptr, lg->device_state->ptr, start,
                                      end - start + 1, lg->last_stream));
        GA_CHECK(st, get_event(lg, &r->event));
        GA_CHECK(st, ga_cuda_event_record(lg->device, r->event, lg->last_stream));
        if (ga_block_record_use(st, r->pinned, lg->device, lg->last_stream) < 0)
            return -1;
    }
    lg->graph_read = device_step;
    lg->step = device_step > lg->step ? device_step : lg->step;
    lg->window_start = lg->step + 1;
    lg->graph_mode = 0;
    /* replays accumulated stats and rows on the device: start afresh */
    GA_CHECK(st, ga_cuda_logger_reset_window(lg->device, lg->device_state->ptr, lg->max_metrics,
                                             lg->capacity, lg->window_start, lg->every,
                                             lg->last_stream));
    return ga_block_record_use(st, lg->device_state, lg->device, lg->last_stream);
error:
    return -1;
}

static PyObject *Logger_flush_core(LoggerObject *lg, PyObject *unused)
{
    (void)unused;
    ga_state *st = ga_state_from_type(Py_TYPE(lg));
    if (!st)
        return NULL;
    if (lg->graph_mode && read_graph_steps(st, lg) < 0)
        return NULL;
    if (lg->window_start <= lg->step && close_window(st, lg) < 0)
        return NULL;
    int n = deliver(st, lg, 1);
    return n < 0 ? NULL : PyLong_FromLong(n);
}

static PyObject *Logger_set_error(LoggerObject *lg, PyObject *error)
{
    if (!PyExceptionInstance_Check(error)) {
        PyErr_SetString(PyExc_TypeError, "_set_error takes an exception instance");
        return NULL;
    }
    Py_XSETREF(lg->error, Py_NewRef(error));
    Py_RETURN_NONE;
}

/* The exception the next log() would raise, cleared: flush() and close()
 * raise it, so that a non-finite value of the last window is not lost. */
static PyObject *Logger_take_error(LoggerObject *lg, PyObject *Py_UNUSED(ignored))
{
    PyObject *error = lg->error;
    lg->error = NULL;
    return error ? error : Py_NewRef(Py_None);
}

static void release_resources(LoggerObject *lg)
{
    for (int k = 0; k < lg->npending; k++)
        free_record(lg, &lg->pending[k]);
    lg->npending = 0;
    if (lg->device_state) {
        ga_block_free(lg->device_state);
        lg->device_state = NULL;
    }
    for (int k = 0; k < lg->nspare; k++)
        ga_cuda_event_destroy(lg->device, lg->spare_events[k]);
    lg->nspare = 0;
}

static PyObject *Logger_close_core(LoggerObject *lg, PyObject *unused)
{
    (void)unused;
    lg->closed = 1;
    release_resources(lg);
    Py_RETURN_NONE;
}

static PyObject *Logger_get_step(LoggerObject *lg, void *c)
{
    (void)c;
    return PyLong_FromLongLong(lg->step);
}

static PyObject *Logger_get_pending(LoggerObject *lg, void *c)
{
    (void)c;
    return PyLong_FromLong(lg->npending);
}

static PyObject *Logger_get_names(LoggerObject *lg, void *c)
{
    (void)c;
    return PyList_GetSlice(lg->name_list, 0, PyList_GET_SIZE(lg->name_list));
}

static PyObject *Logger_get_every(LoggerObject *lg, void *c)
{
    (void)c;
    return PyLong_FromLongLong(lg->every);
}

static PyObject *Logger_get_capacity(LoggerObject *lg, void *c)
{
    (void)c;
    return PyLong_FromLongLong(lg->capacity);
}

static int Logger_traverse(LoggerObject *lg, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(lg));
    Py_VISIT(lg->names);
    Py_VISIT(lg->name_list);
    Py_VISIT(lg->error);
    for (int k = 0; k < lg->npending; k++) {
        Py_VISIT(lg->pending[k].host_reduce);
        Py_VISIT(lg->pending[k].cuda_reduce);
    }
    return 0;
}

static int Logger_clear(LoggerObject *lg)
{
    Py_CLEAR(lg->names);
    Py_CLEAR(lg->name_list);
    Py_CLEAR(lg->error);
    for (int k = 0; k < lg->npending; k++) {
        Py_CLEAR(lg->pending[k].host_reduce);
        Py_CLEAR(lg->pending[k].cuda_reduce);
    }
    return 0;
}

static void Logger_dealloc(LoggerObject *lg)
{
    PyTypeObject *type = Py_TYPE(lg);
    PyObject_GC_UnTrack(lg);
    release_resources(lg);
    Logger_clear(lg);
    free(lg->pending);
    free(lg->spare_events);
    free(lg->host_state);
    type->tp_free((PyObject *)lg);
    Py_DECREF(type);
}

static PyMethodDef Logger_methods[] = {
    {"log", (PyCFunction)(void (*)(void))Logger_log, METH_FASTCALL | METH_KEYWORDS,
     "log($self, /, **metrics)\n--\n\nRecords one step's values (0-d/one-element torch tensors or"
     " gpuaccel Arrays, on a GPU or the CPU, or Python numbers).  Never waits for the GPU."},
    {"poll", (PyCFunction)Logger_poll, METH_NOARGS,
     "poll($self, /)\n--\n\nDelivers every window whose values have arrived; returns how many."},
    {"_flush_core", (PyCFunction)Logger_flush_core, METH_NOARGS, NULL},
    {"_close_core", (PyCFunction)Logger_close_core, METH_NOARGS, NULL},
    {"_set_error", (PyCFunction)Logger_set_error, METH_O, NULL},
    {"_take_error", (PyCFunction)Logger_take_error, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Logger_getset[] = {
    {"step", (getter)Logger_get_step, NULL, "log() calls so far", NULL},
    {"pending_windows", (getter)Logger_get_pending, NULL, "windows whose values are in flight",
     NULL},
    {"metric_names", (getter)Logger_get_names, NULL, "names logged so far, in order", NULL},
    {"every", (getter)Logger_get_every, NULL, "steps per window", NULL},
    {"capacity", (getter)Logger_get_capacity, NULL, "steps the device ring holds", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Logger_slots[] = {
    {Py_tp_new, Logger_new},
    {Py_tp_init, Logger_init},
    {Py_tp_dealloc, Logger_dealloc},
    {Py_tp_traverse, Logger_traverse},
    {Py_tp_clear, Logger_clear},
    {Py_tp_methods, Logger_methods},
    {Py_tp_getset, Logger_getset},
    {Py_tp_doc, "The native core of gpuaccel.LossLogger."},
    {0, NULL},
};

PyType_Spec ga_logger_spec = {
    .name = "gpuaccel._LoggerCore",
    .basicsize = sizeof(LoggerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = Logger_slots,
};
