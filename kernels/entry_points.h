/*
 * entry_points.h — every ga_cuda_* function of kernels.h, listed once, for
 * the code that must write or name them all.  An X-macro: the includer
 * defines X(kind, return type, name, (parameters), body in a CPU-only
 * build) and expands a list.  kernels.h expands it into declarations too,
 * so an entry that does not match kernels.h's documented declaration is a
 * compile error.
 *
 * Written from this list:
 *   - kernels/nocuda/nocuda.c, a CPU-only build's backend: each function's
 *     body is the last column (outputs set, then GA_ERR_NO_CUDA_BUILD);
 *   - the simulator build (kernels/sim): kernels/cuda's own definitions of
 *     the KERNEL entry points are renamed ga_sim_kernel_<name>
 *     (kernels/sim/kernel_names.h), which kernels/sim/sim.c calls after its
 *     checks; it defines the others itself.
 *
 * Kinds (where the CUDA build defines the function, and what the simulator
 * does with it):
 *   RUNTIME  the CUDA runtime and NVTX (kernels/cuda/runtime.cu): the
 *            simulator stands in for it;
 *   KERNEL   launches gpuaccel's own kernels: the simulator checks the
 *            call, then runs kernels/cuda's code on the CPU (kernels/cudacpu);
 *   LIBRARY  a CUDA library (cuBLASLt, cuDNN, nvJPEG): the simulator checks
 *            the call and stands in for the library (the CUDA backend's own
 *            kernels behind them, kernels/cuda/fallback.h; libjpeg for nvJPEG).
 *
 * Adding an entry point: see the checklist at the top of kernels.h.
 */
#ifndef GPUACCEL_ENTRY_POINTS_H
#define GPUACCEL_ENTRY_POINTS_H

/* clang-format off */
#define GA_CUDA_RUNTIME_ENTRY_POINTS(X)                                                            \
    X(RUNTIME, ga_status, device_count, (int *count), *count = 0; return GA_NO_CUDA)               \
    X(RUNTIME, ga_status, device_props, (int device, ga_device_props *props),                      \
      memset(props, 0, sizeof *props); return GA_NO_CUDA)                                          \
    X(RUNTIME, ga_status, get_device, (int *device), *device = -1; return GA_NO_CUDA)              \
    X(RUNTIME, ga_status, versions, (ga_cuda_versions_info *info),                                 \
      memset(info, 0, sizeof *info); info->archs = ""; return GA_NO_CUDA)                          \
    X(RUNTIME, ga_status, mem_info, (int device, uint64_t *free_bytes, uint64_t *total_bytes),     \
      *free_bytes = *total_bytes = 0; return GA_NO_CUDA)                                           \
    X(RUNTIME, ga_status, device_synchronize, (int device), return GA_NO_CUDA)                     \
    X(RUNTIME, ga_status, thread_init, (int device), return GA_NO_CUDA)                            \
    X(RUNTIME, void, library_paths, (const char **cublaslt, const char **cudnn),                   \
      *cublaslt = *cudnn = "")                                                                     \
    X(RUNTIME, ga_status, stream_acquire, (int device, int priority, ga_stream *out),              \
      *out = NULL; return GA_NO_CUDA)                                                              \
    X(RUNTIME, void, stream_release, (int device, int priority, ga_stream stream), )               \
    X(RUNTIME, ga_status, stream_synchronize, (int device, ga_stream stream), return GA_NO_CUDA)   \
    X(RUNTIME, ga_status, stream_query, (int device, ga_stream stream, int *done),                 \
      *done = 1; return GA_NO_CUDA)                                                                \
    X(RUNTIME, ga_status, stream_device, (ga_stream stream, int *device),                          \
      *device = -1; return GA_NO_CUDA)                                                             \
    X(RUNTIME, ga_status, stream_wait_event, (int device, ga_stream stream, ga_event event),       \
      return GA_NO_CUDA)                                                                           \
    X(RUNTIME, ga_status, stream_wait_stream,                                                      \
      (int consumer_device, ga_stream consumer, int producer_device, ga_stream producer),          \
      return GA_NO_CUDA)                                                                           \
    X(RUNTIME, ga_status, stream_capturing, (ga_stream stream, int *capturing),                    \
      *capturing = 0; return GA_NO_CUDA)                                                           \
    X(RUNTIME, ga_status, event_create, (int device, int timing, ga_event *out),                   \
      *out = NULL; return GA_NO_CUDA)                                                              \
    X(RUNTIME, ga_status, event_destroy, (int device, ga_event event), return GA_NO_CUDA)          \
    X(RUNTIME, ga_status, event_record, (int device, ga_event event, ga_stream stream),            \
      return GA_NO_CUDA)                                                                           \
    X(RUNTIME, ga_status, event_query, (int device, ga_event event, int *done),                    \
      *done = 1; return GA_NO_CUDA)                                                                \
    X(RUNTIME, ga_status, event_synchronize, (int device, ga_event event), return GA_NO_CUDA)      \
    X(RUNTIME, ga_status, event_elapsed_ms,                                                        \
      (int device, ga_event start, ga_event end, float *ms),                                       \
      *ms = 0; return GA_NO_CUDA)                                                                  \
    X(RUNTIME, ga_status, malloc_async, (int device, size_t size, ga_stream stream, void **out),   \
      *out = NULL; return GA_NO_CUDA)                                                              \
    X(RUNTIME, ga_status, free_async, (int device, void *ptr, ga_stream stream),                   \
      return GA_NO_CUDA)                                                                           \
    X(RUNTIME, ga_status, pool_set_release_threshold, (int device, uint64_t bytes),                \
      return GA_NO_CUDA)                                                                           \
    X(RUNTIME, ga_status, pool_trim, (int device), return GA_NO_CUDA)                              \
    X(RUNTIME, ga_status, pool_reserved, (int device, uint64_t *current, uint64_t *peak),          \
      *current = *peak = 0; return GA_NO_CUDA)                                                     \
    X(RUNTIME, ga_status, host_alloc, (size_t size, void **out), *out = NULL; return GA_NO_CUDA)   \
    X(RUNTIME, ga_status, host_free, (void *ptr), return GA_NO_CUDA)                               \
    X(RUNTIME, ga_status, memcpy_async,                                                            \
      (int device, void *dst, const void *src, size_t size, ga_stream stream),                     \
      return GA_NO_CUDA)                                                                           \
    X(RUNTIME, ga_status, host_access, (const void *ptr, size_t size, int write),                  \
      return ga_ok())                                                                              \
    X(RUNTIME, ga_status, pointer_info, (const void *ptr, int *kind, int *device),                 \
      *kind = 0; *device = -1; return GA_NO_CUDA)                                                  \
    X(RUNTIME, void, range_push, (const char *name), )                                             \
    X(RUNTIME, void, range_pop, (void), )

#define GA_CUDA_KERNEL_ENTRY_POINTS(X)                                                             \
    X(KERNEL, ga_status, copy,                                                                     \
      (int device, const ga_tensor *dst, const ga_tensor *src, ga_stream stream),                  \
      return GA_NO_CUDA)                                                                           \
    X(KERNEL, ga_status, fill,                                                                     \
      (int device, const ga_tensor *dst, ga_scalar value, ga_stream stream),                       \
      return GA_NO_CUDA)                                                                           \
    X(KERNEL, ga_status, bias_activation,                                                          \
      (int device, const ga_bias_act_desc *desc, ga_stream stream),                                \
      return GA_NO_CUDA)                                                                           \
    X(KERNEL, ga_status, activation_backward,                                                      \
      (int device, const ga_act_backward_desc *desc, ga_stream stream),                            \
      return GA_NO_CUDA)                                                                           \
    X(KERNEL, ga_status, normalize_images,                                                         \
      (int device, const ga_normalize_desc *desc, ga_stream stream),                               \
      return GA_NO_CUDA)                                                                           \
    X(KERNEL, ga_status, resize_images,                                                            \
      (int device, const ga_resize_job *jobs, int n, ga_stream stream),                            \
      return GA_NO_CUDA)                                                                           \
    X(KERNEL, ga_status, logger_update,                                                            \
      (int device, const ga_logger_update *u, ga_stream stream),                                   \
      return GA_NO_CUDA)                                                                           \
    X(KERNEL, ga_status, logger_reset_window,                                                      \
      (int device, void *state, int max_metrics, int64_t capacity, int64_t first_step,             \
       int64_t nsteps, ga_stream stream),                                                          \
      return GA_NO_CUDA)

#define GA_CUDA_LIBRARY_ENTRY_POINTS(X)                                                            \
    X(LIBRARY, ga_status, matmul,                                                                  \
      (int device, const ga_matmul_desc *desc, void *workspace, size_t workspace_size,             \
       ga_stream stream, ga_op_report *report),                                                    \
      memset(report, 0, sizeof *report); return GA_NO_CUDA)                                        \
    X(LIBRARY, size_t, matmul_workspace_size, (int device), return 0)                              \
    X(LIBRARY, ga_status, conv2d_forward,                                                          \
      (int device, const ga_conv_desc *desc, void *workspace, size_t workspace_size,               \
       ga_stream stream, ga_conv_tuning *tuning),                                                  \
      return GA_NO_CUDA)                                                                           \
    X(LIBRARY, ga_status, conv2d_backward_data,                                                    \
      (int device, const ga_conv_geometry *geom, const ga_tensor *dy, const ga_tensor *w,          \
       const ga_tensor *dx, void *workspace, size_t workspace_size, ga_stream stream,              \
       ga_conv_tuning *tuning),                                                                    \
      return GA_NO_CUDA)                                                                           \
    X(LIBRARY, ga_status, conv2d_backward_filter,                                                  \
      (int device, const ga_conv_geometry *geom, const ga_tensor *x, const ga_tensor *dy,          \
       const ga_tensor *dw, void *workspace, size_t workspace_size, ga_stream stream,              \
       ga_conv_tuning *tuning),                                                                    \
      return GA_NO_CUDA)                                                                           \
    X(LIBRARY, void, plan_cache_stats,                                                             \
      (uint64_t *matmul_hits, uint64_t *matmul_misses, uint64_t *conv_hits,                        \
       uint64_t *conv_misses),                                                                     \
      *matmul_hits = *matmul_misses = *conv_hits = *conv_misses = 0)                               \
    X(LIBRARY, int, nvjpeg_available, (void), return 0)                                            \
    X(LIBRARY, const char *, nvjpeg_version, (void), return "")                                    \
    X(LIBRARY, ga_status, jpeg_decoder_create,                                                     \
      (int device, ga_jpeg_decoder **out, int *hardware),                                          \
      *out = NULL; *hardware = 0; return GA_NO_CUDA)                                               \
    X(LIBRARY, void, jpeg_decoder_destroy, (ga_jpeg_decoder *decoder), )                           \
    X(LIBRARY, ga_status, jpeg_image_size,                                                         \
      (ga_jpeg_decoder *decoder, const uint8_t *data, size_t size, int64_t *width,                 \
       int64_t *height),                                                                           \
      *width = *height = 0; return GA_NO_CUDA)                                                     \
    X(LIBRARY, ga_status, decode_jpegs,                                                            \
      (ga_jpeg_decoder *decoder, int n, const uint8_t *const *data, const size_t *sizes,           \
       uint8_t *const *dst, const int64_t *widths, const int64_t *heights, int *bad,               \
       ga_stream stream),                                                                          \
      return GA_NO_CUDA)
/* clang-format on */

#define GA_CUDA_ENTRY_POINTS(X)     \
    GA_CUDA_RUNTIME_ENTRY_POINTS(X) \
    GA_CUDA_KERNEL_ENTRY_POINTS(X)  \
    GA_CUDA_LIBRARY_ENTRY_POINTS(X)

#endif
