/*
 * torch.h — torch tensors read directly, without DLPack (csrc/torch.c).
 */
#ifndef GPUACCEL_TORCH_H
#define GPUACCEL_TORCH_H

#include "array.h"

/* 1 when obj is a torch.Tensor (0 while torch has not been imported). */
int ga_is_torch_tensor(ga_state *st, PyObject *obj);
/* A zero-copy Array over a CPU or CUDA torch tensor (it keeps the tensor
 * alive).  torch's __dlpack__ costs microseconds of Python per call; this
 * reads the pointer, sizes, strides, dtype and device directly. */
ArrayObject *ga_from_torch(ga_state *st, PyObject *tensor);

#endif
