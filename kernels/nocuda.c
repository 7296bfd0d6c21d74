/*
 * nocuda.c — the CUDA entry points of a CPU-only build.
 *
 * Linked in place of the kernels/cuda sources when the build found no nvcc (or was
 * asked for none with GPUACCEL_NO_CUDA=1): every call reports
 * GA_ERR_NO_CUDA_BUILD, which csrc/errors.c turns into a RuntimeError that
 * says how to get a CUDA build.  A simulator build (GPUACCEL_SIM) links
 * kernels/sim.c instead.
 */
#include <string.h>

#include "kernels.h"

#define GA_NO_CUDA GA_STATUS(GA_ERR_NO_CUDA_BUILD, "gpuaccel was built without CUDA")

ga_status ga_cuda_device_count(int *count)
{
    *count = 0;
    return GA_NO_CUDA;
}

ga_status ga_cuda_device_props(int device, ga_device_props *props)
{
    (void)device;
    memset(props, 0, sizeof *props);
    return GA_NO_CUDA;
}

ga_status ga_cuda_get_device(int *device)
{
    *device = -1;
    return GA_NO_CUDA;
}

ga_status ga_cuda_versions(ga_cuda_versions_info *info)
{
    memset(info, 0, sizeof *info);
    info->archs = "";
    return GA_NO_CUDA;
}

void ga_cuda_library_paths(const char **cublaslt, const char **cudnn)
{
    *cublaslt = "";
    *cudnn = "";
}

ga_status ga_cuda_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes)
{
    (void)device;
    *free_bytes = *total_bytes = 0;
    return GA_NO_CUDA;
}

ga_status ga_cuda_device_synchronize(int device)
{
    (void)device;
    return GA_NO_CUDA;
}
ga_status ga_cuda_thread_init(int device)
{
    (void)device;
    return GA_NO_CUDA;
}

ga_status ga_cuda_stream_acquire(int device, int priority, ga_stream *out)
{
    (void)device, (void)priority;
    *out = NULL;
    return GA_NO_CUDA;
}

void ga_cuda_stream_release(int device, int priority, ga_stream s)
{
    (void)device, (void)priority, (void)s;
}
ga_status ga_cuda_stream_synchronize(int device, ga_stream s)
{
    (void)device, (void)s;
    return GA_NO_CUDA;
}

ga_status ga_cuda_stream_query(int device, ga_stream s, int *done)
{
    (void)device, (void)s;
    *done = 1;
    return GA_NO_CUDA;
}

ga_status ga_cuda_stream_device(ga_stream s, int *device)
{
    (void)s;
    *device = -1;
    return GA_NO_CUDA;
}

ga_status ga_cuda_stream_wait_event(int device, ga_stream s, ga_event e)
{
    (void)device, (void)s, (void)e;
    return GA_NO_CUDA;
}

ga_status ga_cuda_stream_wait_stream(int consumer_device, ga_stream consumer, int producer_device,
                                     ga_stream producer)
{
    (void)consumer_device, (void)consumer, (void)producer_device, (void)producer;
    return GA_NO_CUDA;
}

ga_status ga_cuda_event_create(int device, int timing, ga_event *out)
{
    (void)device, (void)timing;
    *out = NULL;
    return GA_NO_CUDA;
}

ga_status ga_cuda_event_destroy(int device, ga_event e)
{
    (void)device, (void)e;
    return GA_NO_CUDA;
}

ga_status ga_cuda_event_record(int device, ga_event e, ga_stream s)
{
    (void)device, (void)e, (void)s;
    return GA_NO_CUDA;
}

ga_status ga_cuda_event_query(int device, ga_event e, int *done)
{
    (void)device, (void)e;
    *done = 1;
    return GA_NO_CUDA;
}

ga_status ga_cuda_event_synchronize(int device, ga_event e)
{
    (void)device, (void)e;
    return GA_NO_CUDA;
}

ga_status ga_cuda_event_elapsed_ms(int device, ga_event start, ga_event end, float *ms)
{
    (void)device, (void)start, (void)end;
    *ms = 0;
    return GA_NO_CUDA;
}

ga_status ga_cuda_malloc_async(int device, size_t size, ga_stream s, void **out)
{
    (void)device, (void)size, (void)s;
    *out = NULL;
    return GA_NO_CUDA;
}

ga_status ga_cuda_free_async(int device, void *ptr, ga_stream s)
{
    (void)device, (void)ptr, (void)s;
    return GA_NO_CUDA;
}

ga_status ga_cuda_pool_set_release_threshold(int device, uint64_t bytes)
{
    (void)device, (void)bytes;
    return GA_NO_CUDA;
}

ga_status ga_cuda_pool_trim(int device)
{
    (void)device;
    return GA_NO_CUDA;
}

ga_status ga_cuda_pool_reserved(int device, uint64_t *current, uint64_t *peak)
{
    (void)device;
    *current = *peak = 0;
    return GA_NO_CUDA;
}

ga_status ga_cuda_host_alloc(size_t size, void **out)
{
    (void)size;
    *out = NULL;
    return GA_NO_CUDA;
}

ga_status ga_cuda_host_free(void *ptr)
{
    (void)ptr;
    return GA_NO_CUDA;
}

ga_status ga_cuda_memcpy_async(int device, void *dst, const void *src, size_t size, ga_stream s)
{
    (void)device, (void)dst, (void)src, (void)size, (void)s;
    return GA_NO_CUDA;
}

ga_status ga_cuda_host_access(const void *ptr, size_t size, int write)
{
    (void)ptr, (void)size, (void)write;
    return ga_ok();
}

ga_status ga_cuda_pointer_info(const void *ptr, int *kind, int *device)
{
    (void)ptr;
    *kind = 0;
    *device = -1;
    return GA_NO_CUDA;
}

ga_status ga_cuda_copy(int device, const ga_tensor *dst, const ga_tensor *src, ga_stream s)
{
    (void)device, (void)dst, (void)src, (void)s;
    return GA_NO_CUDA;
}

ga_status ga_cuda_fill(int device, const ga_tensor *dst, ga_scalar value, ga_stream s)
{
    (void)device, (void)dst, (void)value, (void)s;
    return GA_NO_CUDA;
}

ga_status ga_cuda_matmul(int device, const ga_matmul_desc *desc, void *workspace,
                         size_t workspace_size, ga_stream stream, ga_op_report *report)
{
    (void)device, (void)desc, (void)workspace, (void)workspace_size, (void)stream;
    memset(report, 0, sizeof *report);
    return GA_NO_CUDA;
}

size_t ga_cuda_matmul_workspace_size(int device)
{
    (void)device;
    return 0;
}

ga_status ga_cuda_bias_activation(int device, const ga_bias_act_desc *desc, ga_stream stream)
{
    (void)device, (void)desc, (void)stream;
    return GA_NO_CUDA;
}

ga_status ga_cuda_activation_backward(int device, const ga_act_backward_desc *desc,
                                      ga_stream stream)
{
    (void)device, (void)desc, (void)stream;
    return GA_NO_CUDA;
}

ga_status ga_cuda_conv2d_forward(int device, const ga_conv_desc *desc, void *workspace,
                                 size_t workspace_size, ga_stream stream, ga_conv_tuning *tuning)
{
    (void)device, (void)desc, (void)workspace, (void)workspace_size, (void)stream, (void)tuning;
    return GA_NO_CUDA;
}

ga_status ga_cuda_conv2d_backward_data(int device, const ga_conv_geometry *geom,
                                       const ga_tensor *dy, const ga_tensor *w, const ga_tensor *dx,
                                       void *workspace, size_t workspace_size, ga_stream stream,
                                       ga_conv_tuning *tuning)
{
    (void)device, (void)geom, (void)dy, (void)w, (void)dx, (void)workspace, (void)workspace_size,
        (void)stream, (void)tuning;
    return GA_NO_CUDA;
}

ga_status ga_cuda_conv2d_backward_filter(int device, const ga_conv_geometry *geom,
                                         const ga_tensor *x, const ga_tensor *dy,
                                         const ga_tensor *dw, void *workspace,
                                         size_t workspace_size, ga_stream stream,
                                         ga_conv_tuning *tuning)
{
    (void)device, (void)geom, (void)x, (void)dy, (void)dw, (void)workspace, (void)workspace_size,
        (void)stream, (void)tuning;
    return GA_NO_CUDA;
}

void ga_cuda_plan_cache_stats(uint64_t *matmul_hits, uint64_t *matmul_misses, uint64_t *conv_hits,
                              uint64_t *conv_misses)
{
    *matmul_hits = *matmul_misses = *conv_hits = *conv_misses = 0;
}

ga_status ga_cuda_normalize_images(int device, const ga_normalize_desc *desc, ga_stream stream)
{
    (void)device, (void)desc, (void)stream;
    return GA_NO_CUDA;
}

ga_status ga_cuda_logger_update(int device, const ga_logger_update *u, ga_stream stream)
{
    (void)device, (void)u, (void)stream;
    return GA_NO_CUDA;
}

ga_status ga_cuda_logger_reset_window(int device, void *state, int max_metrics, int64_t capacity,
                                      int64_t first_step, int64_t nsteps, ga_stream stream)
{
    (void)device, (void)state, (void)max_metrics, (void)capacity, (void)first_step, (void)nsteps,
        (void)stream;
    return GA_NO_CUDA;
}

ga_status ga_cuda_stream_capturing(ga_stream stream, int *capturing)
{
    (void)stream;
    *capturing = 0;
    return GA_NO_CUDA;
}

/* No NVTX without the CUDA toolkit: the ranges are not opened. */
void ga_cuda_range_push(const char *name)
{
    (void)name;
}

void ga_cuda_range_pop(void) {}

ga_status ga_cuda_resize_images(int device, const ga_resize_job *jobs, int n, ga_stream stream)
{
    (void)device, (void)jobs, (void)n, (void)stream;
    return GA_NO_CUDA;
}

int ga_cuda_nvjpeg_available(void)
{
    return 0;
}

const char *ga_cuda_nvjpeg_version(void)
{
    return "";
}

ga_status ga_cuda_jpeg_decoder_create(int device, ga_jpeg_decoder **out, int *hardware)
{
    (void)device, (void)out, (void)hardware;
    return GA_NO_CUDA;
}

void ga_cuda_jpeg_decoder_destroy(ga_jpeg_decoder *decoder)
{
    (void)decoder;
}

ga_status ga_cuda_jpeg_image_size(ga_jpeg_decoder *decoder, const uint8_t *data, size_t size,
                                  int64_t *width, int64_t *height)
{
    (void)decoder, (void)data, (void)size, (void)width, (void)height;
    return GA_NO_CUDA;
}

ga_status ga_cuda_decode_jpegs(ga_jpeg_decoder *decoder, int n, const uint8_t *const *data,
                               const size_t *sizes, uint8_t *const *dst, const int64_t *widths,
                               const int64_t *heights, int *bad, ga_stream stream)
{
    (void)decoder, (void)n, (void)data, (void)sizes, (void)dst, (void)widths, (void)heights,
        (void)bad, (void)stream;
    return GA_NO_CUDA;
}
