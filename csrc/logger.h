/*
 * logger.h — the native core of gpuaccel.LossLogger (csrc/logger.c).
 */
#ifndef GPUACCEL_LOGGER_H
#define GPUACCEL_LOGGER_H

#include "args.h"
#include "errors.h"

extern PyType_Spec ga_logger_spec;

#endif
