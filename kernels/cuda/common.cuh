/*
 * common.cuh — what every file of the CUDA backend uses: the one way to
 * check a CUDA call, the device guard, and the NVTX range of an op.
 *
 * GA_CUDA_TRY(call) returns a ga_status naming the call, file and line from
 * the enclosing function when the call fails; csrc/errors.c turns that into
 * the Python exception.  Nothing here prints or exits.
 */
#ifndef GPUACCEL_CUDA_COMMON_CUH
#define GPUACCEL_CUDA_COMMON_CUH

#include <stdio.h>

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include "../kernels.h"

static inline ga_status ga_cuda_error(cudaError_t err, const char *call, const char *file, int line)
{
    if (err == cudaSuccess)
        return ga_ok();
    (void)cudaGetLastError(); /* clear a non-sticky error so it is reported once */
    ga_error kind = GA_ERR_CUDA;
    if (err == cudaErrorMemoryAllocation)
        kind = GA_ERR_OUT_OF_MEMORY;
    else if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
             err == cudaErrorCompatNotSupportedOnDevice || err == cudaErrorSystemDriverMismatch)
        kind = GA_ERR_NO_DEVICE;
    return ga_status_make(kind, (int)err, cudaGetErrorName(err), cudaGetErrorString(err), call,
                          file, line);
}

#define GA_CUDA_TRY(call)                                             \
    do {                                                              \
        cudaError_t ga_err_ = (call);                                 \
        if (ga_err_ != cudaSuccess)                                   \
            return ga_cuda_error(ga_err_, #call, __FILE__, __LINE__); \
    } while (0)

/* cuBLASLt and cuDNN statuses become ga_status the same way.  These are
 * macros over the library headers, so a file that uses them includes
 * <cublasLt.h> / <cudnn.h> before this header. */
#ifdef CUBLAS_VER_MAJOR
static inline ga_status ga_cublas_error(cublasStatus_t status, const char *call, const char *file,
                                        int line)
{
    if (status == CUBLAS_STATUS_SUCCESS)
        return ga_ok();
    ga_error kind = status == CUBLAS_STATUS_ALLOC_FAILED ? GA_ERR_OUT_OF_MEMORY : GA_ERR_CUBLAS;
    return ga_status_make(kind, (int)status, cublasLtGetStatusName(status),
                          cublasLtGetStatusString(status), call, file, line);
}

#define GA_CUBLAS_TRY(call)                                                \
    do {                                                                   \
        cublasStatus_t ga_cublas_ = (call);                                \
        if (ga_cublas_ != CUBLAS_STATUS_SUCCESS)                           \
            return ga_cublas_error(ga_cublas_, #call, __FILE__, __LINE__); \
    } while (0)
#endif

#ifdef CUDNN_MAJOR
/* cuDNN explains most failures in its last-error string, but the string is
 * per thread, it keeps text from earlier calls — successful ones leave
 * warnings there too (heuristics, plan finalization) — and reading it
 * clears it.  So it is cleared before each call whose failure is reported,
 * and read right after that call fails: the text is then that call's own. */
static inline void ga_cudnn_discard_last_error(void)
{
    char stale[1];
    cudnnGetLastErrorString(stale, sizeof stale);
}

/* The failing call's explanation (empty when it gave none), in a per-thread
 * buffer that the next failure overwrites. */
static inline const char *ga_cudnn_last_error_text(void)
{
    static thread_local char detail[512];
    detail[0] = '\0';
    cudnnGetLastErrorString(detail, sizeof detail);
    return detail;
}

static inline ga_status ga_cudnn_error(cudnnStatus_t status, const char *call, const char *file,
                                       int line)
{
    if (status == CUDNN_STATUS_SUCCESS)
        return ga_ok();
    const char *detail = ga_cudnn_last_error_text();
    const char *message = detail[0] ? detail : cudnnGetErrorString(status);
    ga_error kind = status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                            status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
                        ? GA_ERR_OUT_OF_MEMORY
                        : GA_ERR_CUDNN;
    return ga_status_make(kind, (int)status, cudnnGetErrorString(status), message, call, file,
                          line);
}

#define GA_CUDNN_TRY(call)                                               \
    do {                                                                 \
        ga_cudnn_discard_last_error();                                   \
        cudnnStatus_t ga_cudnn_ = (call);                                \
        if (ga_cudnn_ != CUDNN_STATUS_SUCCESS)                           \
            return ga_cudnn_error(ga_cudnn_, #call, __FILE__, __LINE__); \
    } while (0)
#endif

/* Records `reason` in `report` unless it already holds a more severe one;
 * `status` and `detail` (may be NULL) are what the library answered. */
static inline void ga_op_report_fallback(ga_op_report *report, ga_fallback_reason reason,
                                         int status, const char *detail)
{
    if (!report || reason <= report->reason)
        return;
    report->reason = reason;
    report->library_status = status;
    snprintf(report->detail, sizeof report->detail, "%s", detail ? detail : "");
}

/* After a kernel launch: launch-configuration errors surface here. */
#define GA_CUDA_LAUNCH_CHECK(kernel_name)                                                \
    do {                                                                                 \
        cudaError_t ga_err_ = cudaGetLastError();                                        \
        if (ga_err_ != cudaSuccess)                                                      \
            return ga_cuda_error(ga_err_, "launch of " kernel_name, __FILE__, __LINE__); \
    } while (0)

/* Makes `device` current for a scope and restores the caller's device. */
class GaDeviceGuard
{
  public:
    explicit GaDeviceGuard(int device) : prev_(-1), error_(cudaSuccess)
    {
        error_ = cudaGetDevice(&prev_);
        if (error_ == cudaSuccess && prev_ != device)
            error_ = cudaSetDevice(device);
        else
            prev_ = -1; /* nothing to restore */
    }
    ~GaDeviceGuard()
    {
        if (prev_ >= 0 && error_ == cudaSuccess)
            cudaSetDevice(prev_);
    }
    cudaError_t error() const
    {
        return error_;
    }
    GaDeviceGuard(const GaDeviceGuard &) = delete;
    GaDeviceGuard &operator=(const GaDeviceGuard &) = delete;

  private:
    int prev_;
    cudaError_t error_;
};

#define GA_WITH_DEVICE(device)                   \
    GaDeviceGuard ga_device_guard_(device);      \
    if (ga_device_guard_.error() != cudaSuccess) \
    return ga_cuda_error(ga_device_guard_.error(), "cudaSetDevice(" #device ")", __FILE__, __LINE__)

/* Every launch is written GA_LAUNCH(grid, block, shared_bytes, stream,
 * kernel)(args...) rather than kernel<<<grid, block, shared_bytes,
 * stream>>>(args...): nvcc gets exactly that <<<>>> launch, and the host
 * C++ compiler, which cannot parse <<<>>>, gets kernels/cudacpu's launcher,
 * which runs the kernel's own source on the CPU (the simulator build and
 * tests/test_kernels_on_cpu.py).  A macro at each launch rather than a
 * rewrite of the source at build time, so that both compilers read the
 * file that is in the tree and their messages point at its lines. */
#ifdef __CUDACC__
#define GA_LAUNCH(grid, block, shared_bytes, stream, ...) \
    __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#else
#define GA_LAUNCH(grid, block, shared_bytes, stream, ...) \
    CUDACPU_LAUNCH(grid, block, shared_bytes, stream, __VA_ARGS__)
#endif

/* Marks one iteration of a loop whose trip count grows with the problem
 * (a grid-stride loop, a reduction's walk, a convolution's sums): nothing
 * on a GPU; under kernels/cudacpu it counts the iteration for the CUDA
 * thread that makes it, so that a test sees each kernel's serial work per
 * thread at a given launch shape (tests/test_launch_shapes.py, which also
 * checks that every such loop carries the mark). */
#ifdef GPUACCEL_CUDACPU_H
#define GA_TRIP() ::cudacpu::count_trip()
#else
#define GA_TRIP() ((void)0)
#endif

/* One digit of a row-major index walk: idx's position along a dim of
 * `extent` elements, the rest of idx left in *rest.  32-bit division where
 * both fit: several times cheaper than 64-bit on a GPU. */
__host__ __device__ __forceinline__ int64_t ga_split_index(int64_t idx, int64_t extent,
                                                           int64_t *rest)
{
    if ((uint64_t)idx <= UINT32_MAX && (uint64_t)extent <= UINT32_MAX) {
        uint32_t q = (uint32_t)idx / (uint32_t)extent;
        *rest = q;
        return (int64_t)((uint32_t)idx - q * (uint32_t)extent);
    }
    *rest = idx / extent;
    return idx - *rest * extent;
}

static inline cudaStream_t ga_cu_stream(ga_stream s)
{
    return (cudaStream_t)s;
}

/* An NVTX range around the host side of an op, so that Nsight Systems shows
 * which gpuaccel call queued which kernels. */
class GaNvtxRange
{
  public:
    explicit GaNvtxRange(const char *name)
    {
        nvtxRangePushA(name);
    }
    ~GaNvtxRange()
    {
        nvtxRangePop();
    }
    GaNvtxRange(const GaNvtxRange &) = delete;
    GaNvtxRange &operator=(const GaNvtxRange &) = delete;
};

/* Opens the range "gpuaccel::<op>" until the end of the scope; `op` is a
 * string literal, e.g. GA_NVTX_RANGE("matmul"). */
#define GA_NVTX_RANGE(op) GaNvtxRange ga_nvtx_range_("gpuaccel::" op)

#endif
