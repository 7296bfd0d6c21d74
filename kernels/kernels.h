/*
 * kernels.h — the only bridge between the CPython layer (csrc/) and the
 * compute backends (kernels/cpu, kernels/cuda).
 *
 * Everything here is plain C: no PyObject, no CUDA type.  Streams and events
 * travel as opaque pointers, errors as a ga_status value that csrc/errors.c
 * turns into a Python exception.  Every function may be called without the
 * GIL.
 *
 * A CPU-only build links kernels/nocuda.c in place of the kernels/cuda sources: the
 * ga_cuda_* functions then exist and report GA_ERR_NO_CUDA_BUILD.
 */
#ifndef GPUACCEL_KERNELS_H
#define GPUACCEL_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GA_MAX_NDIM 32

/* ---------------------------------------------------------------- dtypes */

typedef enum {
    GA_BOOL = 0,
    GA_UINT8,
    GA_INT8,
    GA_INT16,
    GA_INT32,
    GA_INT64,
    GA_FLOAT16,
    GA_BFLOAT16,
    GA_FLOAT32,
    GA_FLOAT64,
    GA_NUM_DTYPES
} ga_dtype;

/* Functions that both the C compiler and nvcc (host and device) compile. */
#ifdef __CUDACC__
#define GA_HD static inline __host__ __device__
#else
#define GA_HD static inline
#endif

GA_HD size_t ga_dtype_itemsize(ga_dtype dtype)
{
    switch (dtype) {
    case GA_BOOL: case GA_UINT8: case GA_INT8: return 1;
    case GA_INT16: case GA_FLOAT16: case GA_BFLOAT16: return 2;
    case GA_INT32: case GA_FLOAT32: return 4;
    case GA_INT64: case GA_FLOAT64: return 8;
    default: return 0;
    }
}

GA_HD int ga_dtype_is_float(ga_dtype dtype)
{
    return dtype >= GA_FLOAT16 && dtype < GA_NUM_DTYPES;
}

/* ---------------------------------------------------------------- status */

typedef enum {
    GA_OK = 0,
    GA_ERR_CUDA,           /* a CUDA runtime call failed; code is its cudaError_t */
    GA_ERR_CUBLAS,         /* code is a cublasStatus_t */
    GA_ERR_CUDNN,          /* code is a cudnnStatus_t */
    GA_ERR_OUT_OF_MEMORY,  /* device or pinned allocation failed */
    GA_ERR_HOST_OUT_OF_MEMORY,
    GA_ERR_NO_CUDA_BUILD,  /* this build has no CUDA backend */
    GA_ERR_NO_DEVICE,      /* CUDA build, but no driver or no device */
    GA_ERR_INVALID_VALUE,  /* an argument the caller should have rejected */
    GA_ERR_NOT_SUPPORTED   /* valid, but not implemented by this backend */
} ga_error;

/* All strings are static (or thread-local for library messages) and stay
 * valid until the next failing call on the same thread. */
typedef struct {
    ga_error error;
    int code;            /* the library's own status code */
    const char *name;    /* the library's name for code, e.g. "cudaErrorInvalidValue" */
    const char *message; /* the library's description of code */
    const char *call;    /* the failing call as written in the source */
    const char *file;
    int line;
} ga_status;

static inline ga_status ga_ok(void)
{
    ga_status st = {GA_OK, 0, 0, 0, 0, 0, 0};
    return st;
}

#define GA_STATUS(err, msg)                                                     \
    ga_status_make((err), 0, 0, (msg), __func__, __FILE__, __LINE__)

static inline ga_status ga_status_make(ga_error error, int code, const char *name,
                                       const char *message, const char *call,
                                       const char *file, int line)
{
    ga_status st = {error, code, name, message, call, file, line};
    return st;
}

/* Propagates a failed ga_status to the caller. */
#define GA_TRY_STATUS(expr)                                                      \
    do {                                                                        \
        ga_status ga_st_ = (expr);                                              \
        if (ga_st_.error)                                                       \
            return ga_st_;                                                      \
    } while (0)

/* ------------------------------------------------------- strided tensors */

/* A strided view handed to a kernel.  Strides are in bytes (as NumPy), may
 * be zero (broadcast) or negative; data points at element [0, ..., 0]. */
typedef struct {
    void *data;
    ga_dtype dtype;
    int ndim;
    int64_t shape[GA_MAX_NDIM];
    int64_t strides[GA_MAX_NDIM];
} ga_tensor;

/* The bytes of `value` converted to `dtype` with the cast rules of
 * kernels/convert.h (so a fill writes exactly what a cast would). */
typedef struct {
    int is_integer;  /* 1: use i, 0: use f */
    int64_t i;
    double f;
} ga_scalar;

void ga_scalar_to_bytes(ga_scalar value, ga_dtype dtype, unsigned char out[8]);

/* ------------------------------------------------------------ CPU kernels */

/* dst[...] = cast(src[...]); shapes must be equal (broadcast src by giving
 * it zero strides).  dst must not partially overlap src. */
ga_status ga_cpu_copy(const ga_tensor *dst, const ga_tensor *src);
/* Every element of dst = value converted to dst's dtype. */
ga_status ga_cpu_fill(const ga_tensor *dst, ga_scalar value);

/* Number of worker threads the CPU kernels use (GPUACCEL_NUM_THREADS, else
 * the cores this process may run on). */
int ga_cpu_num_threads(void);

/* --------------------------------------------------------- CUDA runtime */

typedef void *ga_stream; /* a cudaStream_t */
typedef void *ga_event;  /* a cudaEvent_t */

/* The special stream handles of CUDA (and of DLPack's `stream` argument). */
#define GA_STREAM_LEGACY ((ga_stream)(uintptr_t)1)
#define GA_STREAM_PER_THREAD ((ga_stream)(uintptr_t)2)

typedef struct {
    char name[256];
    int major, minor;
    uint64_t total_memory;
    int multiprocessors;
    int l2_cache_bytes;
    int pci_bus, pci_device, pci_domain;
    int integrated;
    int managed_memory;
} ga_device_props;

typedef struct {
    int runtime_built;    /* CUDART_VERSION this build was compiled against */
    int runtime_loaded;   /* cudaRuntimeGetVersion (static runtime: = built) */
    int driver;           /* cudaDriverGetVersion: newest CUDA the driver supports, 0 if none */
    int cublaslt_built, cublaslt_loaded;
    int cudnn_built, cudnn_loaded;
    const char *archs;    /* the architectures compiled in, e.g. "80;86;89;90" */
} ga_cuda_versions_info;

/* Number of devices; GA_ERR_NO_DEVICE (with the CUDA error) when there is no
 * driver or no device.  Cheap after the first call. */
ga_status ga_cuda_device_count(int *count);
ga_status ga_cuda_device_props(int device, ga_device_props *props);
/* The calling thread's current device (what "cuda" without an index means). */
ga_status ga_cuda_get_device(int *device);
ga_status ga_cuda_versions(ga_cuda_versions_info *info);
ga_status ga_cuda_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes);
ga_status ga_cuda_device_synchronize(int device);
/* Path of the shared library that defines the cuBLASLt / cuDNN symbols we
 * call (empty when not known). */
void ga_cuda_library_paths(const char **cublaslt, const char **cudnn);

ga_status ga_cuda_stream_create(int device, int priority, ga_stream *out);
ga_status ga_cuda_stream_destroy(int device, ga_stream stream);
ga_status ga_cuda_stream_synchronize(int device, ga_stream stream);
ga_status ga_cuda_stream_query(int device, ga_stream stream, int *done);
ga_status ga_cuda_stream_device(ga_stream stream, int *device);
ga_status ga_cuda_stream_wait_event(int device, ga_stream stream, ga_event event);
/* Make `consumer` wait for the work queued so far on `producer` (an event
 * recorded on one, waited on by the other); never blocks the host. */
ga_status ga_cuda_stream_wait_stream(int device, ga_stream consumer, ga_stream producer);

ga_status ga_cuda_event_create(int device, int timing, ga_event *out);
ga_status ga_cuda_event_destroy(int device, ga_event event);
ga_status ga_cuda_event_record(int device, ga_event event, ga_stream stream);
ga_status ga_cuda_event_query(int device, ga_event event, int *done);
ga_status ga_cuda_event_synchronize(int device, ga_event event);
ga_status ga_cuda_event_elapsed_ms(int device, ga_event start, ga_event end, float *ms);

/* Stream-ordered device memory from gpuaccel's own pool on each device. */
ga_status ga_cuda_malloc_async(int device, size_t size, ga_stream stream, void **out);
ga_status ga_cuda_free_async(int device, void *ptr, ga_stream stream);
ga_status ga_cuda_pool_set_release_threshold(int device, uint64_t bytes);
ga_status ga_cuda_pool_trim(int device);
ga_status ga_cuda_pool_reserved(int device, uint64_t *current, uint64_t *peak);

/* Page-locked host memory. */
ga_status ga_cuda_host_alloc(size_t size, void **out);
ga_status ga_cuda_host_free(void *ptr);

/* Copies between any two of host, pinned and device memory (unified
 * addressing decides the direction), queued on `stream`. */
ga_status ga_cuda_memcpy_async(int device, void *dst, const void *src, size_t size,
                               ga_stream stream);
/* Where a pointer lives: *kind 0 unregistered host, 1 pinned host, 2 device,
 * 3 managed; *device its ordinal (or -1). */
ga_status ga_cuda_pointer_info(const void *ptr, int *kind, int *device);

/* ------------------------------------------------------------ CUDA kernels */

ga_status ga_cuda_copy(int device, const ga_tensor *dst, const ga_tensor *src, ga_stream stream);
ga_status ga_cuda_fill(int device, const ga_tensor *dst, ga_scalar value, ga_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* GPUACCEL_KERNELS_H */
