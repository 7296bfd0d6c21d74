/*
 * kernels.h — the only bridge between the CPython layer (csrc/) and the
 * compute backends (kernels/cpu, kernels/cuda).
 *
 * Everything here is plain C: no PyObject, no CUDA type.  Streams and events
 * travel as opaque pointers, errors as a ga_status value that csrc/errors.c
 * turns into a Python exception.  Every function may be called without the
 * GIL.
 *
 * The backends of the ga_cuda_* functions: kernels/cuda (a CUDA build),
 * kernels/nocuda (a CPU-only build: each reports GA_ERR_NO_CUDA_BUILD) and
 * kernels/sim (the simulator, a test build); kernels/entry_points.h lists
 * them once, and the last two are written from that list.  Host code both
 * backends share: convert.h (element conversions), walk.h (how strided
 * tensors are walked), check.h (argument checks), activation.h (the
 * activations' formulas).
 *
 * Adding an op (or an entry point), in this order:
 *   1. here: its descriptor struct, and ga_cpu_<op> / ga_cuda_<op>
 *      declarations that say what they compute;
 *   2. kernels/entry_points.h: one entry for ga_cuda_<op> (its kind, its
 *      signature, what a CPU-only build does) — kernels/nocuda follows;
 *   3. check.c: the argument checks, when both backends take the same ones;
 *   4. kernels/cpu/<file>.c: the CPU implementation, the oracle the CUDA
 *      one is tested against (float64 or float accumulation as convert.h);
 *   5. kernels/cuda/<file>.cu: the CUDA implementation (elem.cuh to load and
 *      store elements, GA_LAUNCH / GA_CUDA_TRY from common.cuh);
 *   6. kernels/sim/sim.c: the simulator's ga_cuda_<op> — check each
 *      operand's memory and stream order, then call ga_sim_kernel_<op>
 *      (a KERNEL entry point) or the fallback kernels (a LIBRARY one);
 *   7. csrc/: parse and check the Python arguments in the op's file through
 *      opcall.h, declare ga_py_<op> in its header, and add it to module.c's
 *      method table with a text signature (csrc/README.md);
 *   8. gpuaccel/_api.py: export it; gpuaccel/torch.py when torch modules
 *      use it;
 *   9. tests/ops.py: one registry entry (sample inputs, references, dtypes),
 *      which the suites draw from; tests/cudacpu/driver.cpp to run its CUDA
 *      kernels on the CPU (tests/test_kernels_on_cpu.py); tests/README.md
 *      maps sources to tests;
 *  10. benchmarks/: side by side with torch.
 * An activation is added in ga_activation and ga_activation_name below,
 * activation.h (formula and derivative, one source for both backends),
 * csrc/opcall.c's names, the libraries' maps (cuda/matmul.cu's
 * fused_epilogue and split_epilogue, cuda/cudnn_graph.cu's
 * activation_mode), gpuaccel/torch.py's tables (its torch function, whether
 * the backward reads the pre-activation) and the tests' activation list
 * (tests/helpers.py's ACTIVATIONS with its references).
 */
#ifndef GPUACCEL_KERNELS_H
#define GPUACCEL_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GA_MAX_NDIM 32
/* Devices a process may use; ga_cuda_device_count never reports more. */
#define GA_MAX_DEVICES 64

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
    case GA_BOOL:
    case GA_UINT8:
    case GA_INT8: return 1;
    case GA_INT16:
    case GA_FLOAT16:
    case GA_BFLOAT16: return 2;
    case GA_INT32:
    case GA_FLOAT32: return 4;
    case GA_INT64:
    case GA_FLOAT64: return 8;
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
    GA_ERR_CUDA,          /* a CUDA runtime call failed; code is its cudaError_t */
    GA_ERR_CUBLAS,        /* code is a cublasStatus_t */
    GA_ERR_CUDNN,         /* code is a cudnnStatus_t */
    GA_ERR_OUT_OF_MEMORY, /* device or pinned allocation failed */
    GA_ERR_HOST_OUT_OF_MEMORY,
    GA_ERR_NO_CUDA_BUILD, /* this build has no CUDA backend */
    GA_ERR_NO_DEVICE,     /* CUDA build, but no driver or no device */
    GA_ERR_INVALID_VALUE, /* an argument the caller should have rejected */
    GA_ERR_NOT_SUPPORTED  /* valid, but not implemented by this backend */
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

#define GA_STATUS(err, msg) ga_status_make((err), 0, 0, (msg), __func__, __FILE__, __LINE__)

static inline ga_status ga_status_make(ga_error error, int code, const char *name,
                                       const char *message, const char *call, const char *file,
                                       int line)
{
    ga_status st = {error, code, name, message, call, file, line};
    return st;
}

/* Propagates a failed ga_status to the caller. */
#define GA_TRY_STATUS(expr)        \
    do {                           \
        ga_status ga_st_ = (expr); \
        if (ga_st_.error)          \
            return ga_st_;         \
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
    int is_integer; /* 1: use i, 0: use f */
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
    int runtime_built;  /* CUDART_VERSION this build was compiled against */
    int runtime_loaded; /* cudaRuntimeGetVersion (static runtime: = built) */
    int driver;         /* cudaDriverGetVersion: newest CUDA the driver supports, 0 if none */
    int cublaslt_built, cublaslt_loaded;
    int cudnn_built, cudnn_loaded;
    const char *archs; /* the architectures compiled in, e.g. "80;86;89;90" */
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
/* For a background thread that works for `device` (loader workers): makes
 * it current, and relaxes the thread's stream-capture mode so that its
 * event queries do not invalidate a graph another thread captures. */
ga_status ga_cuda_thread_init(int device);
/* Path of the shared library that defines the cuBLASLt / cuDNN symbols we
 * call (empty when not known). */
void ga_cuda_library_paths(const char **cublaslt, const char **cudnn);

/* A non-blocking stream of this priority: a released one when there is one,
 * else a new one.  Streams are released, never destroyed (blocks refer to
 * the stream they were allocated on after its owner is gone). */
ga_status ga_cuda_stream_acquire(int device, int priority, ga_stream *out);
void ga_cuda_stream_release(int device, int priority, ga_stream stream);
ga_status ga_cuda_stream_synchronize(int device, ga_stream stream);
ga_status ga_cuda_stream_query(int device, ga_stream stream, int *done);
ga_status ga_cuda_stream_device(ga_stream stream, int *device);
ga_status ga_cuda_stream_wait_event(int device, ga_stream stream, ga_event event);
/* Make `consumer` (a stream of `consumer_device`) wait for the work queued
 * so far on `producer` (of `producer_device`): an event recorded on one,
 * waited on by the other; never blocks the host.  `device` of
 * ga_cuda_stream_wait_event is the stream's; its event may be any
 * device's. */
ga_status ga_cuda_stream_wait_stream(int consumer_device, ga_stream consumer, int producer_device,
                                     ga_stream producer);

/* 1 when work queued on `stream` is being captured into a CUDA graph. */
ga_status ga_cuda_stream_capturing(ga_stream stream, int *capturing);

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
/* The host is about to read (write 0) or write (write 1) `size` bytes of
 * pinned memory at `ptr`, having waited for the GPU work that uses them.
 * Nothing to do for the CUDA runtime; the simulator (kernels/sim/sim.c) checks
 * that the wait happened and fails the call when it did not. */
ga_status ga_cuda_host_access(const void *ptr, size_t size, int write);
/* Where a pointer lives: *kind 0 unregistered host, 1 pinned host, 2 device,
 * 3 managed; *device its ordinal (or -1). */
ga_status ga_cuda_pointer_info(const void *ptr, int *kind, int *device);

/* ------------------------------------------------------------ CUDA kernels */

ga_status ga_cuda_copy(int device, const ga_tensor *dst, const ga_tensor *src, ga_stream stream);
ga_status ga_cuda_fill(int device, const ga_tensor *dst, ga_scalar value, ga_stream stream);

/* ======================================================== matmul / linear */

/* The activations a fused op applies (kernels/activation.h has their
 * formulas).  GA_ACT_GELU is the exact (erf) GELU of nn.GELU();
 * GA_ACT_GELU_TANH its tanh approximation, the only GELU cuBLASLt's
 * epilogues know. */
typedef enum {
    GA_ACT_NONE = 0,
    GA_ACT_RELU,
    GA_ACT_GELU,
    GA_ACT_GELU_TANH,
    GA_ACT_SILU,
    GA_ACT_HARDSWISH,
    GA_ACT_SIGMOID,
    GA_ACT_COUNT
} ga_activation;

/* The name the Python API takes for an activation ("none" for
 * GA_ACT_NONE, "?" for a value out of range). */
static inline const char *ga_activation_name(ga_activation act)
{
    static const char *const names[GA_ACT_COUNT] = {"none", "relu",      "gelu",   "gelu_tanh",
                                                    "silu", "hardswish", "sigmoid"};
    return act >= GA_ACT_NONE && act < GA_ACT_COUNT ? names[act] : "?";
}

GA_HD int ga_activation_is_valid(ga_activation act)
{
    return act >= GA_ACT_NONE && act < GA_ACT_COUNT;
}

/* Whether the derivative can be taken from the activation's output y
 * (relu: y > 0 exactly when z > 0), so that a layer keeps y instead of
 * saving the pre-activation z as well; every other activation's
 * derivative reads z. */
GA_HD int ga_activation_grad_reads_output(ga_activation act)
{
    return act == GA_ACT_RELU;
}

/* A batch of matrices: element (b, i, j) lives at
 *   data + (b * batch_stride + i * row_stride + j * col_stride) * itemsize
 * (strides in elements; a transposed operand simply has row_stride 1;
 * batch_stride 0 uses one matrix for every batch entry). */
typedef struct {
    void *data;
    ga_dtype dtype;
    int64_t rows, cols;
    int64_t row_stride, col_stride, batch_stride;
} ga_matrix;

/* D[b] = epilogue(A[b] @ B[b]) for b < batch.
 *
 * dtypes: A and B alike, one of float16, bfloat16 (accumulated in float32),
 * float32 (accumulated in float32; TF32 tensor cores on CUDA when
 * allow_tf32), float64.  D: A's dtype, or float32 for 16-bit inputs.
 *
 * Forward epilogue (any of): z = A@B + bias (bias broadcast over rows);
 * preact <- z; D <- act(z).
 * Backward epilogue (instead of the forward one): D <- (A@B) * act'(dact_aux),
 * the gradient through the activation of the layer whose input gradient
 * this GEMM computes; col_sums <- sum of D over rows (and batch), its bias
 * gradient.
 * a_row_sums (with no epilogue, batch 1): s[i] = sum_k A[i, k] — the bias
 * gradient fused into the weight-gradient GEMM dW = dZ^T @ X.
 * Sums accumulate in float32 (float64 for float64). */
typedef struct {
    int64_t batch;
    ga_matrix a;         /* M x K */
    ga_matrix b;         /* K x N */
    ga_matrix d;         /* M x N, written */
    const void *bias;    /* N values, or NULL */
    ga_dtype bias_dtype; /* A's or D's dtype */
    ga_activation activation;
    ga_matrix preact;          /* written when .data is set; D's dtype */
    ga_activation dact;        /* GA_ACT_NONE: no backward epilogue */
    ga_matrix dact_aux;        /* M x N: z, or y = relu(z) for relu */
    void *col_sums;            /* N values, or NULL */
    ga_dtype col_sums_dtype;   /* float32 or D's dtype */
    void *a_row_sums;          /* M values, or NULL */
    ga_dtype a_row_sums_dtype; /* float32 or D's dtype */
    int allow_tf32;
    int deterministic; /* same bits every run: no split-K/atomic reductions */
} ga_matmul_desc;

/* Why a CUDA op did not run as the one library call it asked for, most
 * severe last: a report keeps the most severe reason met on its way.  The
 * first four are limits the library documents (or gpuaccel's own rules)
 * and are only counted; from GA_FALLBACK_NO_ENGINE on, something that
 * should have run did not — a possible bug, a broken installation, or a
 * far slower kernel — and csrc/fallback.c applies the fallback policy (allow,
 * warn, raise) to them. */
typedef enum {
    GA_FALLBACK_NONE = 0,
    GA_FALLBACK_LAYOUT,        /* strides, offsets or alignment the library cannot describe */
    GA_FALLBACK_EPILOGUE,      /* an epilogue (or its dtypes) the library cannot express */
    GA_FALLBACK_DETERMINISTIC, /* a fused reduction not documented as deterministic */
    GA_FALLBACK_NOT_SUPPORTED, /* the library has no engine / algorithm for the fused form */
    GA_FALLBACK_NO_ENGINE,     /* not even for the plain GEMM / conv: gpuaccel's own kernels ran */
    GA_FALLBACK_BAD_PARAM,     /* cuDNN's BAD_PARAM family, cuBLASLt's INVALID_VALUE */
    GA_FALLBACK_SUBLIBRARY,    /* cuDNN could not load an engine sub-library */
    GA_FALLBACK_COMPILATION,   /* cuDNN's runtime compilation of a fused kernel failed */
    GA_FALLBACK_EXECUTION,     /* plans finalized, but none ran */
    GA_FALLBACK_REASON_COUNT
} ga_fallback_reason;

/* What a CUDA op did, for gpuaccel.matmul_stats() / conv_stats(). */
typedef struct {
    int fused;     /* 1: the epilogue ran inside the library call */
    int fallback;  /* 1: an unfused path (plain GEMM/conv + gpuaccel's own kernel) ran */
    int cache_hit; /* 1: the plan came from the per-process cache */
    int tuned;     /* 1: candidate plans were timed on this call */
    ga_fallback_reason reason; /* why not the fused library call (NONE when it ran) */
    int library_status;        /* the cudnnStatus_t / cublasStatus_t behind `reason`, or 0 */
    char detail[256];          /* the library's own message and the call that gave it */
} ga_op_report;

ga_status ga_cpu_matmul(const ga_matmul_desc *desc);
ga_status ga_cuda_matmul(int device, const ga_matmul_desc *desc, void *workspace,
                         size_t workspace_size, ga_stream stream, ga_op_report *report);
/* The cuBLASLt workspace gpuaccel gives each (device, stream): 32 MiB on
 * Hopper and newer, 4 MiB below. */
size_t ga_cuda_matmul_workspace_size(int device);

/* ----------------------------------------------- elementwise epilogues */

/* y = act(x + bias[c]) with c the index along channel_dim (bias may be NULL);
 * preact <- x + bias when preact.data is set.  x, y, preact: one shape, any
 * strides, any float dtypes; y may be x itself. */
typedef struct {
    ga_tensor x;
    ga_tensor y;
    ga_tensor preact;
    const void *bias;
    ga_dtype bias_dtype;
    int channel_dim;
    ga_activation activation;
} ga_bias_act_desc;

/* dz = grad_y * act'(aux) (dz = grad_y for GA_ACT_NONE; dz may be grad_y
 * itself, and with dz.data NULL only bias_grad is computed); bias_grad[c]
 * <- sum of dz over every dim but channel_dim, in a fixed order
 * (deterministic whatever the thread count), accumulated in float32
 * (float64 for float64).  For relu, aux may be z or y = relu(z) (their
 * signs agree). */
typedef struct {
    ga_tensor grad_y;
    ga_tensor aux;
    ga_tensor dz;
    ga_activation activation;
    void *bias_grad;
    ga_dtype bias_grad_dtype;
    int channel_dim;
} ga_act_backward_desc;

ga_status ga_cpu_bias_activation(const ga_bias_act_desc *desc);
ga_status ga_cpu_activation_backward(const ga_act_backward_desc *desc);
ga_status ga_cuda_bias_activation(int device, const ga_bias_act_desc *desc, ga_stream stream);
ga_status ga_cuda_activation_backward(int device, const ga_act_backward_desc *desc,
                                      ga_stream stream);

/* ================================================================ conv2d */

typedef struct {
    int stride[2], padding[2], dilation[2]; /* (height, width) */
    int groups;
    int allow_tf32;
    int deterministic;
} ga_conv_geometry;

/* Tensors are described in logical NCHW order — x: (N, C, H, W), w: (K,
 * C/groups, R, S), y: (N, K, P, Q) — and their strides give the memory
 * layout: NCHW, or channels-last NHWC (C has stride 1), or anything else.
 * P = (H + 2*pad_h - dil_h*(R-1) - 1) / stride_h + 1, likewise Q.
 * Forward: z = conv(x, w) + bias[k]; preact <- z; y <- act(z).  The same
 * float dtype throughout (float16/bfloat16 accumulate in float32). */
typedef struct {
    ga_conv_geometry geom;
    ga_tensor x, w, y;
    const void *bias; /* K values of x's dtype, or NULL */
    ga_activation activation;
    ga_tensor preact; /* written when .data is set */
} ga_conv_desc;

/* The per-shape engine choice of cuDNN, persisted by gpuaccel between
 * processes: `preferred` (in) is a choice read back from the tuning file,
 * `chosen` (out) the one used, to be written there. */
typedef struct {
    const char *preferred;
    char chosen[256];
    ga_op_report report;
} ga_conv_tuning;

ga_status ga_cpu_conv2d_forward(const ga_conv_desc *desc);
/* dx = conv_transpose(dy, w) */
ga_status ga_cpu_conv2d_backward_data(const ga_conv_geometry *geom, const ga_tensor *dy,
                                      const ga_tensor *w, const ga_tensor *dx);
/* dw = correlation of x with dy */
ga_status ga_cpu_conv2d_backward_filter(const ga_conv_geometry *geom, const ga_tensor *x,
                                        const ga_tensor *dy, const ga_tensor *dw);

ga_status ga_cuda_conv2d_forward(int device, const ga_conv_desc *desc, void *workspace,
                                 size_t workspace_size, ga_stream stream, ga_conv_tuning *tuning);
ga_status ga_cuda_conv2d_backward_data(int device, const ga_conv_geometry *geom,
                                       const ga_tensor *dy, const ga_tensor *w, const ga_tensor *dx,
                                       void *workspace, size_t workspace_size, ga_stream stream,
                                       ga_conv_tuning *tuning);
ga_status ga_cuda_conv2d_backward_filter(int device, const ga_conv_geometry *geom,
                                         const ga_tensor *x, const ga_tensor *dy,
                                         const ga_tensor *dw, void *workspace,
                                         size_t workspace_size, ga_stream stream,
                                         ga_conv_tuning *tuning);

/* Hits and misses of the per-process plan caches (cuBLASLt and cuDNN). */
void ga_cuda_plan_cache_stats(uint64_t *matmul_hits, uint64_t *matmul_misses, uint64_t *conv_hits,
                              uint64_t *conv_misses);

/* ================================================================ loader */

#define GA_NORMALIZE_MAX_CHANNELS 64

/* The loader's image transform: src is n images of h x w x c uint8 (dense,
 * channels last; c x h x w when src_chw); out = fma(x, scale[ch],
 * shift[ch]) — in float (in double for a float64 output) — converted to
 * `dtype`, written dense as n x c x h x w (nchw) or n x h x w x c.
 * (scale = factor/std, shift = -mean/std: (x*factor - mean)/std.) */
typedef struct {
    const uint8_t *src;
    void *dst;
    ga_dtype dtype;
    int64_t n, h, w, c;
    int nchw;
    int src_chw; /* the source is channels first (torchvision's tensors) */
    /* CPU: run on the calling thread only (its caller, the loader, already
     * splits the work between threads); otherwise the CPU worker pool */
    int in_caller;
    double scale[GA_NORMALIZE_MAX_CHANNELS];
    double shift[GA_NORMALIZE_MAX_CHANNELS];
} ga_normalize_desc;

/* The one formula both backends use.  (kernels/cudacpu, which runs
 * kernels/cuda on the CPU, compiles it without __CUDA_ARCH__: there the
 * host branch runs, fma as the device's __fma_rn: one rounding.) */
GA_HD double ga_normalize_value(const ga_normalize_desc *d, uint8_t x, int64_t ch)
{
#ifdef __CUDA_ARCH__
    if (d->dtype == GA_FLOAT64)
        return __fma_rn((double)x, d->scale[ch], d->shift[ch]);
    return (double)__fmaf_rn((float)x, (float)d->scale[ch], (float)d->shift[ch]);
#else
    if (d->dtype == GA_FLOAT64)
        return fma((double)x, d->scale[ch], d->shift[ch]);
    return (double)fmaf((float)x, (float)d->scale[ch], (float)d->shift[ch]);
#endif
}

ga_status ga_cpu_normalize_images(const ga_normalize_desc *desc);
ga_status ga_cuda_normalize_images(int device, const ga_normalize_desc *desc, ga_stream stream);

/* ================================================================ images */

/* One axis of a resize: output pixel k has its center at input coordinate
 * origin + (k + 0.5) * scale (input pixel i spans [i, i + 1)); only input
 * pixels [lo, hi) exist for it (the crop).  kernels/image.h has the filter. */
typedef struct {
    double origin, scale;
    int64_t lo, hi;
} ga_resize_axis;

/* What a sample's image becomes: an out_h x out_w x 3 uint8 image whose
 * rows [y0, y0 + ny) and columns [x0, x0 + nx) are the resize (ry, rx) of
 * the source, mirrored left to right when `flip`, and zero elsewhere
 * (a center crop larger than the image pads, as torchvision's does). */
typedef struct {
    int64_t out_h, out_w;
    int64_t y0, x0, ny, nx;
    ga_resize_axis ry, rx;
    int flip;
    /* in source pixels, for the caller: the crop (RandomResizedCrop's top,
     * left, height, width) or, after a Resize, the resized size in h, w */
    int64_t crop_top, crop_left, crop_h, crop_w;
} ga_image_geometry;

/* A training or evaluation pipeline, drawn per sample from (seed, epoch,
 * sample index): torchvision's RandomResizedCrop, or Resize then
 * CenterCrop, then RandomHorizontalFlip. */
typedef struct {
    int64_t out_h, out_w;
    int random_crop; /* RandomResizedCrop(out, scale, ratio) */
    double scale_lo, scale_hi, log_ratio_lo, log_ratio_hi;
    /* otherwise: resize_short > 0 makes the shorter side that long (the
     * longer int(resize_short * long / short)), resize_h/resize_w > 0 that
     * size, neither keeps the size; then out_h x out_w from the center */
    int64_t resize_short, resize_h, resize_w;
    double flip_p;
    uint64_t seed;
    int64_t epoch;
    /* the CPU decoder may decode at 1/2, 1/4 or 1/8 scale (libjpeg's DCT
     * scaling) when the crop stays at least the output size */
    int dct_scaling;
} ga_image_transform;

/* The geometry of sample `index` (its drawing depends on nothing else)
 * for a source image of width x height. */
void ga_image_plan(const ga_image_transform *t, int64_t index, int64_t width, int64_t height,
                   ga_image_geometry *g);

typedef enum { GA_IMAGE_UNKNOWN = 0, GA_IMAGE_JPEG, GA_IMAGE_PNG } ga_image_format;

/* What a file's first bytes say it is. */
ga_image_format ga_image_format_of(const uint8_t *data, size_t size);

/* A decoder's buffers, grown as images need and kept between images (one
 * per worker thread). */
typedef struct ga_image_workspace ga_image_workspace;
ga_image_workspace *ga_cpu_image_workspace_new(void);
void ga_cpu_image_workspace_free(ga_image_workspace *ws);

/* 1 when this build decodes JPEG on the CPU (libjpeg-turbo was found). */
int ga_cpu_jpeg_available(void);
/* libjpeg-turbo's version as "2.1.5" (empty without it). */
const char *ga_cpu_jpeg_version(void);

/* Width and height of an encoded JPEG image, from its header. */
ga_status ga_cpu_image_size(const uint8_t *data, size_t size, int64_t *width, int64_t *height,
                            ga_image_workspace *ws);

/* Decodes the image in data[0, size) into dst (t->out_h x t->out_w x 3
 * uint8, dense) as sample `index` of the transform: only the crop's rows
 * and columns, at libjpeg's smallest DCT scale still at least the output
 * size where t allows it, one antialiased resize, the flip.  Grayscale
 * becomes three equal channels; CMYK and YCCK become RGB.  A damaged file
 * is an error (GA_ERR_INVALID_VALUE, with libjpeg's message), never a
 * partly gray image; a file of another format is GA_ERR_NOT_SUPPORTED.
 * `geometry` (may be NULL) receives the sample's geometry. */
ga_status ga_cpu_decode_image(const uint8_t *data, size_t size, const ga_image_transform *t,
                              int64_t index, uint8_t *dst, ga_image_workspace *ws,
                              ga_image_geometry *geometry);

/* The resize of a decoded image on the CPU (the twin of the GPU's): src
 * is the whole src_h x src_w x 3 uint8 image, rows src_pitch bytes apart,
 * dst as ga_cpu_decode_image's. */
ga_status ga_cpu_resize_image(const uint8_t *src, int64_t src_h, int64_t src_w, int64_t src_pitch,
                              const ga_image_geometry *g, uint8_t *dst, ga_image_workspace *ws);

/* ------------------------------------------------------ images on the GPU */

/* One image resized on the device: src is src_h x src_w x 3 uint8 (rows
 * src_pitch bytes apart), the whole decoded image (the geometry's
 * coordinates are its pixels); dst is g.out_h x g.out_w x 3, dense. */
typedef struct {
    const uint8_t *src;
    int64_t src_h, src_w, src_pitch;
    uint8_t *dst;
    ga_image_geometry g;
} ga_resize_job;

/* Queues the resizes of n images on `stream` (the CPU twin: ga_cpu_resize_image,
 * which rounds to uint8 between its two passes: the two agree within a
 * unit or two). */
ga_status ga_cuda_resize_images(int device, const ga_resize_job *jobs, int n, ga_stream stream);

/* nvJPEG: JPEG decoding on the device, with the A100/H100 hardware
 * decoder where there is one.  A decoder is used by one thread at a time. */
typedef struct ga_jpeg_decoder ga_jpeg_decoder;

/* 1 when this build decodes JPEG on the GPU (nvJPEG was found). */
int ga_cuda_nvjpeg_available(void);
/* nvJPEG's version "13.3.2" (empty without it). */
const char *ga_cuda_nvjpeg_version(void);
/* *hardware: 1 when the hardware decoder backs it. */
ga_status ga_cuda_jpeg_decoder_create(int device, ga_jpeg_decoder **out, int *hardware);
void ga_cuda_jpeg_decoder_destroy(ga_jpeg_decoder *decoder);
/* Width and height from a JPEG's header (nvJPEG's parser). */
ga_status ga_cuda_jpeg_image_size(ga_jpeg_decoder *decoder, const uint8_t *data, size_t size,
                                  int64_t *width, int64_t *height);
/* Decodes n JPEGs (data[i]: sizes[i] bytes of host memory that stays
 * untouched until the stream has passed this work) into dst[i]: widths[i]
 * x heights[i] interleaved RGB on the device, pitch widths[i] * 3, queued
 * on `stream`.  An image nvJPEG cannot decode sets bad[i] = 1 (its dst
 * left unwritten) and the others still decode; the status reports only
 * failures of the device or the library. */
ga_status ga_cuda_decode_jpegs(ga_jpeg_decoder *decoder, int n, const uint8_t *const *data,
                               const size_t *sizes, uint8_t *const *dst, const int64_t *widths,
                               const int64_t *heights, int *bad, ga_stream stream);

/* ================================================================ logger */

/* A LossLogger's accumulation state, one allocation in device (CUDA
 * values) or host memory (Python numbers, CPU tensors), laid out as
 *   int64  step                         the device-side step counter
 *   double stats[max_metrics][GA_LOGGER_STATS]   the current window
 *   uint64 present[capacity]            which metrics each step logged
 *   float  values[capacity][max_metrics] every step's values (a ring)
 * Steps count from 1; step s lives in ring row (s - 1) % capacity.  The
 * window stats are all combinable by SUM (sum, count, nonfinite) or MAX
 * (max, -min, -first non-finite step), so ranks can all-reduce them. */
#define GA_LOGGER_MAX_METRICS 64
#define GA_LOGGER_MAX_PER_CALL 16
enum {
    GA_LOGGER_SUM = 0,       /* of the finite values */
    GA_LOGGER_COUNT,         /* finite values */
    GA_LOGGER_NONFINITE,     /* NaN/inf values */
    GA_LOGGER_MAX,           /* of the finite values; -inf when none */
    GA_LOGGER_NEG_MIN,       /* -(min of the finite values); -inf when none */
    GA_LOGGER_NEG_FIRST_BAD, /* -(first step with a non-finite value); -inf when none */
    GA_LOGGER_STATS
};

typedef struct {
    void *state;
    int64_t capacity;
    int max_metrics;
    int n;                                     /* metrics in this call */
    int metric[GA_LOGGER_MAX_PER_CALL];        /* their indices */
    const void *value[GA_LOGGER_MAX_PER_CALL]; /* one element each */
    ga_dtype dtype[GA_LOGGER_MAX_PER_CALL];
    uint64_t present; /* bit per metric in this call */
    int64_t step;     /* this call's step, or 0: take and advance the state's counter (graphs) */
} ga_logger_update;

GA_HD size_t ga_logger_stats_offset(void)
{
    return sizeof(int64_t);
}
GA_HD size_t ga_logger_present_offset(int max_metrics)
{
    return sizeof(int64_t) + (size_t)max_metrics * GA_LOGGER_STATS * sizeof(double);
}
GA_HD size_t ga_logger_values_offset(int64_t capacity, int max_metrics)
{
    return ga_logger_present_offset(max_metrics) + (size_t)capacity * sizeof(uint64_t);
}
GA_HD size_t ga_logger_state_bytes(int64_t capacity, int max_metrics)
{
    return ga_logger_values_offset(capacity, max_metrics) +
           (size_t)capacity * (size_t)max_metrics * sizeof(float);
}

/* Records one log() call.  A window reset empties the window stats (sums
 * 0, maxima -inf) and clears the presence rows of the `nsteps` steps from
 * `first_step` on, so steps that log nothing into this state read as such. */
ga_status ga_cpu_logger_update(const ga_logger_update *u);
void ga_cpu_logger_reset_window(void *state, int max_metrics, int64_t capacity, int64_t first_step,
                                int64_t nsteps);
ga_status ga_cuda_logger_update(int device, const ga_logger_update *u, ga_stream stream);
ga_status ga_cuda_logger_reset_window(int device, void *state, int max_metrics, int64_t capacity,
                                      int64_t first_step, int64_t nsteps, ga_stream stream);

/* ======================================================= profiler ranges */

/* An NVTX range named `name` (e.g. "gpuaccel::linear", a string that
 * outlives the call) on the calling thread, closed by ga_cuda_range_pop on
 * the same thread, so that Nsight Systems names which gpuaccel call queued
 * which work; ranges nest.  For every op, CPU ones included; nothing in a
 * CPU-only build.  Costs an indirect call when no tool listens. */
void ga_cuda_range_push(const char *name);
void ga_cuda_range_pop(void);

/* Every ga_cuda_* function above, listed once (the CPU-only and simulator
 * backends are written from the list); declared again from the list, so
 * that an entry that does not match its declaration above does not
 * compile. */
#include "entry_points.h"
#define GA_DECLARE_CUDA_ENTRY_POINT(kind, ret, name, params, ...) ret ga_cuda_##name params;
GA_CUDA_ENTRY_POINTS(GA_DECLARE_CUDA_ENTRY_POINT)
#undef GA_DECLARE_CUDA_ENTRY_POINT

#ifdef __cplusplus
}
#endif

#endif /* GPUACCEL_KERNELS_H */
