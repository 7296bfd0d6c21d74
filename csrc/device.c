/*
 * device.c — gpuaccel.Device (parsing what users pass as a device), the
 * checks that say why CUDA cannot be used, and the module's device-level
 * functions (cuda_available, device_count, synchronize, build_info, ...).
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
    {Py_tp_doc, "Device(device, index=None)\n--\n\nWhere an Array's memory lives: Device('cpu'), "
                "Device('cuda'), Device('cuda:N') or Device('cuda', N).  "
                "Also accepts a torch.device or an int N (cuda:N)."},
    {0, NULL},
};

PyType_Spec ga_device_spec = {
    .name = "gpuaccel.Device",
    .basicsize = sizeof(DeviceObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Device_slots,
};

/* The CUDA device a `device=None` stream or event belongs to. */
int ga_default_cuda_device(ga_state *st, PyObject *device_obj, int *index, const char *what)
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
    if (ga_default_cuda_device(st, device_obj, &device, "this function") < 0)
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
