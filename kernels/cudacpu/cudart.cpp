/*
 * cudart.cpp — the part of the CUDA runtime API that kernels/cuda's host
 * code calls around its launches, on host memory: "device" pointers are
 * host pointers, and work runs when it is queued (launches too), so streams
 * order nothing here; the simulator (kernels/sim/sim.c) checks stream order
 * before it calls into kernels/cuda.  The host plays every device: any
 * ordinal below GA_MAX_DEVICES can be made current.
 */
#include "cudacpu.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../kernels.h"
#include "error.h"

namespace
{

thread_local cudaError_t pending = cudaSuccess;
thread_local cudaError_t described = cudaSuccess; /* the error `description` belongs to */
thread_local char description[1024];
thread_local int current_device = 0;

cudaError_t take_pending()
{
    cudaError_t err = pending;
    pending = cudaSuccess;
    return err;
}

/* An error of a call: pending too, as the real runtime keeps it. */
cudaError_t fail(cudaError_t err, const char *what)
{
    cudacpu::set_error(err, "cudacpu: %s", what);
    return err;
}

} // namespace

namespace cudacpu
{

void set_error(cudaError_t err, const char *format, ...)
{
    va_list ap;
    va_start(ap, format);
    vsnprintf(description, sizeof description, format, ap);
    va_end(ap);
    described = err;
    pending = err;
}

} // namespace cudacpu

extern "C" {

cudaError_t CUDARTAPI cudaGetLastError(void)
{
    return take_pending();
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void)
{
    return pending;
}

const char *CUDARTAPI cudaGetErrorName(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidPitchValue: return "cudaErrorInvalidPitchValue";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorAssert: return "cudaErrorAssert";
    default: return "cudaErrorUnknown";
    }
}

const char *CUDARTAPI cudaGetErrorString(cudaError_t error)
{
    if (error != cudaSuccess && error == described)
        return description;
    return error == cudaSuccess ? "no error" : "unrecognized error code";
}

cudaError_t CUDARTAPI cudaSetDevice(int device)
{
    if (device < 0 || device >= GA_MAX_DEVICES)
        return fail(cudaErrorInvalidDevice, "cudaSetDevice: ordinal out of range");
    current_device = device;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDevice(int *device)
{
    *device = current_device;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                      enum cudaMemcpyKind kind, cudaStream_t stream)
{
    (void)kind, (void)stream;
    if (count)
        memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                        size_t width, size_t height, enum cudaMemcpyKind kind,
                                        cudaStream_t stream)
{
    (void)kind, (void)stream;
    if (height > 1 && (width > dpitch || width > spitch))
        return fail(cudaErrorInvalidPitchValue, "cudaMemcpy2DAsync: width exceeds a pitch");
    for (size_t row = 0; row < height && width; row++)
        memmove((char *)dst + row * dpitch, (const char *)src + row * spitch, width);
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream)
{
    (void)stream;
    if (count)
        memset(ptr, value, count);
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t stream,
                                            enum cudaStreamCaptureStatus *status)
{
    (void)stream;
    *status = cudaStreamCaptureStatusNone; /* no graphs here */
    return cudaSuccess;
}

} // extern "C"
