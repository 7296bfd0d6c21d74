/*
 * error.h — the pending CUDA error of the calling host thread, shared by
 * the launcher (fiber.cpp) and the runtime API (cudart.cpp).
 */
#ifndef GPUACCEL_CUDACPU_ERROR_H
#define GPUACCEL_CUDACPU_ERROR_H

#include <cuda_runtime_api.h>

namespace cudacpu
{

/* Makes `err` the calling thread's pending error (cudaGetLastError), with
 * a description that cudaGetErrorString(err) returns until the next one. */
void set_error(cudaError_t err, const char *format, ...) __attribute__((format(printf, 2, 3)));

} // namespace cudacpu

#endif
