/*
 * loader.h — the engine of gpuaccel.PinnedLoader (csrc/loader.c).
 */
#ifndef GPUACCEL_LOADER_H
#define GPUACCEL_LOADER_H

#include "args.h"
#include "errors.h"

extern PyType_Spec ga_loader_iter_spec;

#endif
