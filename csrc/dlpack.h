/*
 * dlpack.h — DLPack (producer and consumer) and __cuda_array_interface__
 * v3 (csrc/dlpack.c).
 */
#ifndef GPUACCEL_DLPACK_H
#define GPUACCEL_DLPACK_H

#include "array.h"
#include "dlpack_abi.h"

/* Calls the deleter of a consumed DLPack tensor. */
void ga_dlpack_release(void *managed, int versioned);
/* Array.__dlpack__, __dlpack_device__ and __cuda_array_interface__. */
PyObject *ga_array_dlpack(ArrayObject *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames);
PyObject *ga_array_dlpack_device(ArrayObject *self, PyObject *unused);
PyObject *ga_array_cuda_array_interface(ArrayObject *self, void *closure);
/* The memory of an object with __dlpack__, or of a DLPack capsule, as an
 * Array (no conversion: ga_asarray does those); NULL + exception. */
ArrayObject *ga_from_dlpack_object(ga_state *st, PyObject *obj);
/* The same through a known exchange table (NULL: through __dlpack__). */
ArrayObject *ga_from_dlpack_via(ga_state *st, PyObject *obj, const DLPackExchangeAPI *api);
/* With an exception pending from reading `obj`: when obj is a torch
 * tensor of a layout with no strided memory (sparse, mkldnn), replaces it
 * with `exc_type` saying so in one line (torch's own error about the data
 * pointer carries a C++ backtrace); else leaves it as it is. */
void ga_dlpack_explain_layout(PyObject *obj, PyObject *exc_type);
/* from an object with __cuda_array_interface__ */
ArrayObject *ga_from_cuda_array_interface(ga_state *st, PyObject *obj, PyObject *cai);
/* Sets Array.__dlpack_c_exchange_api__ (the module's exec), and forgets
 * the module's state again (its free). */
int ga_dlpack_publish_exchange_api(ga_state *st);
void ga_dlpack_unpublish_exchange_api(ga_state *st);
/* The C exchange API table (DLPack 1.3) a type publishes in its
 * __dlpack_c_exchange_api__, or NULL (no exception) when it has none of a
 * major version gpuaccel reads. */
const DLPackExchangeAPI *ga_dlpack_exchange_api(ga_state *st, PyTypeObject *type);
/* A non-owning Array over a DLTensor view (the exchange API's
 * dltensor_from_py_object_no_sync), keeping `owner`, the object the view
 * came from, alive; BufferError naming `who` when gpuaccel cannot hold it. */
ArrayObject *ga_array_from_dltensor_view(ga_state *st, const DLTensor *t, PyObject *owner,
                                         const char *who);

#endif
