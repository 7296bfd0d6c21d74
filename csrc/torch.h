/*
 * torch.h — torch tensors read directly, without DLPack, and torch's
 * current stream (csrc/torch.c).  Nothing here imports torch: until the
 * user has, no object is a torch tensor.
 */
#ifndef GPUACCEL_TORCH_H
#define GPUACCEL_TORCH_H

#include "array.h"
#include "dlpack_abi.h"

/* 1 when obj is a torch.Tensor (0 while torch has not been imported). */
int ga_is_torch_tensor(ga_state *st, PyObject *obj);
/* The gpuaccel dtype of a tensor ga_is_torch_tensor accepted; TypeError
 * naming the dtype when gpuaccel has none like it. */
int ga_torch_dtype(ga_state *st, PyObject *tensor, ga_dtype *out);
/* The tensor with its values in memory: itself (a new reference), or, when
 * torch's neg bit is set, a resolved copy (*copied = 1).  NULL with an
 * exception. */
PyObject *ga_torch_resolved(ga_state *st, PyObject *tensor, int *copied);
/* The exchange table torch reads `tensor` through: torch's, for a plain
 * tensor or parameter; NULL (use __dlpack__) for subclasses, which may
 * redefine what their data is, and for torch before 2.9. */
const DLPackExchangeAPI *ga_torch_exchange_api(ga_state *st, PyObject *tensor);
/* 1 when the tensor requires grad (DLPack exports refuse it: torch's
 * rule); -1 with an exception. */
int ga_torch_requires_grad(ga_state *st, PyObject *tensor);
/* A zero-copy Array over a CPU or CUDA torch tensor (it keeps the tensor
 * alive); a tensor with the neg bit set is read through a resolved copy. */
ArrayObject *ga_from_torch(ga_state *st, PyObject *tensor);
/* torch's current stream of CUDA device `device` into *out, where torch
 * queues the work on its tensors (its 0, the legacy default stream, as
 * GA_STREAM_LEGACY): 1; 0 when torch is not imported or has no CUDA (*out
 * untouched); -1 with torch's exception when asking failed. */
int ga_torch_current_stream(ga_state *st, int device, ga_stream *out);

/* torch's own TF32 flag for float32 CUDA `op` into *out (1: TF32 allowed):
 * torch.backends.cuda.matmul.fp32_precision (what
 * torch.set_float32_matmul_precision and ...matmul.allow_tf32 set) or
 * torch.backends.cudnn.conv.fp32_precision (...cudnn.allow_tf32), read
 * through C-level getters looked up once; 1.  0 when torch is not imported
 * (*out untouched); -1 with torch's exception. */
int ga_torch_allow_tf32(ga_state *st, ga_tf32_op op, int *out);

/* A torch.profiler range named `name` (e.g. "gpuaccel::matmul") while
 * torch's profiler records: a handle for ga_torch_profile_end; Py_None
 * otherwise (torch not imported, or not profiling: one C call's cost).
 * Never fails: a range that cannot be opened is skipped. */
PyObject *ga_torch_profile_begin(ga_state *st, const char *name);
/* Closes the range (takes the reference); an exception pending from the
 * op is kept. */
void ga_torch_profile_end(ga_state *st, PyObject *handle);

#endif
