/*
 * runtime.cu — thin, checked wrappers over the CUDA runtime: devices,
 * streams, events, gpuaccel's stream-ordered device pool, pinned memory and
 * copies.  The pooling policy (size classes, limits, statistics) lives in
 * csrc/alloc.c; this file only talks to CUDA.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cudnn.h>

#include <mutex>

#include "common.cuh"

#ifndef GPUACCEL_CUDA_ARCHS
#define GPUACCEL_CUDA_ARCHS "unknown"
#endif

/* ------------------------------------------------------------- devices */

extern "C" ga_status ga_cuda_device_count(int *count)
{
    /* The runtime caches the driver's answer; asking again is cheap and
     * stays right in a forked child. */
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        *count = 0;
        return ga_cuda_error(err, "cudaGetDeviceCount(&n)", __FILE__, __LINE__);
    }
    if (n > GA_MAX_DEVICES)
        n = GA_MAX_DEVICES;
    *count = n;
    return ga_ok();
}

extern "C" ga_status ga_cuda_device_props(int device, ga_device_props *props)
{
    cudaDeviceProp p;
    GA_CUDA_TRY(cudaGetDeviceProperties(&p, device));
    memset(props, 0, sizeof *props);
    strncpy(props->name, p.name, sizeof props->name - 1);
    props->major = p.major;
    props->minor = p.minor;
    props->total_memory = p.totalGlobalMem;
    props->multiprocessors = p.multiProcessorCount;
    props->l2_cache_bytes = p.l2CacheSize;
    props->pci_bus = p.pciBusID;
    props->pci_device = p.pciDeviceID;
    props->pci_domain = p.pciDomainID;
    props->integrated = p.integrated;
    props->managed_memory = p.managedMemory;
    return ga_ok();
}

extern "C" ga_status ga_cuda_get_device(int *device)
{
    GA_CUDA_TRY(cudaGetDevice(device));
    return ga_ok();
}

extern "C" ga_status ga_cuda_versions(ga_cuda_versions_info *info)
{
    memset(info, 0, sizeof *info);
    info->runtime_built = CUDART_VERSION;
    info->cublaslt_built = CUBLAS_VERSION;
    info->cudnn_built = CUDNN_VERSION;
    info->archs = GPUACCEL_CUDA_ARCHS;
    /* Neither needs a driver: they answer 0 / the library's own version. */
    cudaDriverGetVersion(&info->driver);
    cudaRuntimeGetVersion(&info->runtime_loaded);
    info->cublaslt_loaded = (int)cublasLtGetVersion();
    info->cudnn_loaded = (int)cudnnGetVersion();
    return ga_ok();
}

static const char *library_of(const void *symbol)
{
    Dl_info dl;
    if (dladdr(symbol, &dl) && dl.dli_fname)
        return dl.dli_fname;
    return "";
}

extern "C" void ga_cuda_library_paths(const char **cublaslt, const char **cudnn)
{
    *cublaslt = library_of((const void *)&cublasLtGetVersion);
    *cudnn = library_of((const void *)&cudnnGetVersion);
}

extern "C" ga_status ga_cuda_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes)
{
    GA_WITH_DEVICE(device);
    size_t f = 0, t = 0;
    GA_CUDA_TRY(cudaMemGetInfo(&f, &t));
    *free_bytes = f;
    *total_bytes = t;
    return ga_ok();
}

extern "C" ga_status ga_cuda_device_synchronize(int device)
{
    GA_WITH_DEVICE(device);
    GA_CUDA_TRY(cudaDeviceSynchronize());
    return ga_ok();
}

extern "C" ga_status ga_cuda_thread_init(int device)
{
    /* the device now, so that device guards in this thread find it current
     * and never make (and restore) device 0 current: that would create a
     * context on GPU 0 for a loader of cuda:3 */
    GA_CUDA_TRY(cudaSetDevice(device));
    /* this thread's event queries and pinned allocations must not
     * invalidate a CUDA graph the training thread captures meanwhile */
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    GA_CUDA_TRY(cudaThreadExchangeStreamCaptureMode(&mode));
    return ga_ok();
}

/* ------------------------------------------------------------- streams */

/* Streams gpuaccel creates are never destroyed: a memory block remembers the
 * stream it was allocated on and is freed (cudaFreeAsync) or waited on there
 * long after the Stream object that made it is gone, and a destroyed handle
 * would be an invalid one, or worse, the handle of a newer stream.  Released
 * streams go back to a per-device free list and are handed out again (as
 * torch's stream pool does); work a reused stream inherits only orders
 * later work after it. */
namespace
{
struct pooled_stream {
    cudaStream_t stream;
    int priority;
};
std::mutex stream_pool_lock;
pooled_stream *stream_pool[GA_MAX_DEVICES];
int stream_pool_count[GA_MAX_DEVICES], stream_pool_capacity[GA_MAX_DEVICES];
} // namespace

extern "C" ga_status ga_cuda_stream_acquire(int device, int priority, ga_stream *out)
{
    if (device >= 0 && device < GA_MAX_DEVICES) {
        std::lock_guard<std::mutex> hold(stream_pool_lock);
        for (int k = stream_pool_count[device] - 1; k >= 0; k--) {
            if (stream_pool[device][k].priority == priority) {
                *out = (ga_stream)stream_pool[device][k].stream;
                stream_pool[device][k] = stream_pool[device][--stream_pool_count[device]];
                return ga_ok();
            }
        }
    }
    GA_WITH_DEVICE(device);
    cudaStream_t s;
    GA_CUDA_TRY(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
    *out = (ga_stream)s;
    return ga_ok();
}

extern "C" void ga_cuda_stream_release(int device, int priority, ga_stream stream)
{
    if (!stream || device < 0 || device >= GA_MAX_DEVICES)
        return;
    std::lock_guard<std::mutex> hold(stream_pool_lock);
    int n = stream_pool_count[device];
    if (n == stream_pool_capacity[device]) {
        int capacity = n ? 2 * n : 8;
        void *grown = realloc(stream_pool[device], capacity * sizeof(pooled_stream));
        if (!grown)
            return; /* kept out of the pool: it stays valid, just not reused */
        stream_pool[device] = (pooled_stream *)grown;
        stream_pool_capacity[device] = capacity;
    }
    stream_pool[device][n] = pooled_stream{ga_cu_stream(stream), priority};
    stream_pool_count[device] = n + 1;
}

extern "C" ga_status ga_cuda_stream_synchronize(int device, ga_stream stream)
{
    GA_WITH_DEVICE(device);
    GA_CUDA_TRY(cudaStreamSynchronize(ga_cu_stream(stream)));
    return ga_ok();
}

extern "C" ga_status ga_cuda_stream_query(int device, ga_stream stream, int *done)
{
    GA_WITH_DEVICE(device);
    cudaError_t err = cudaStreamQuery(ga_cu_stream(stream));
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        *done = 0;
        return ga_ok();
    }
    GA_CUDA_TRY(err);
    *done = 1;
    return ga_ok();
}

static int is_special_stream(ga_stream s)
{
    return (uintptr_t)s <= (uintptr_t)GA_STREAM_PER_THREAD;
}

extern "C" ga_status ga_cuda_stream_capturing(ga_stream stream, int *capturing)
{
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    GA_CUDA_TRY(cudaStreamIsCapturing(ga_cu_stream(stream), &status));
    *capturing = status == cudaStreamCaptureStatusActive;
    return ga_ok();
}

/* ----------------------------------------------------------- graphs */

namespace
{
/* What ga_graph points to: the captured graph and its instantiation. */
struct captured_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};
} // namespace

extern "C" ga_status ga_cuda_stream_begin_capture(int device, ga_stream stream, int mode)
{
    GA_WITH_DEVICE(device);
    GA_CUDA_TRY(cudaStreamBeginCapture(ga_cu_stream(stream), (cudaStreamCaptureMode)mode));
    return ga_ok();
}

extern "C" ga_status ga_cuda_stream_end_capture(int device, ga_stream stream, ga_graph *out)
{
    *out = NULL;
    GA_WITH_DEVICE(device);
    cudaGraph_t graph = nullptr;
    GA_CUDA_TRY(cudaStreamEndCapture(ga_cu_stream(stream), &graph));
    captured_graph *g = (captured_graph *)calloc(1, sizeof *g);
    if (!g) {
        cudaGraphDestroy(graph);
        return GA_STATUS(GA_ERR_HOST_OUT_OF_MEMORY, "no host memory for a CUDA graph");
    }
    g->graph = graph;
    /* a graph whose allocations outlive a launch (outputs a caller keeps)
     * could not be launched again without AutoFreeOnLaunch */
    cudaError_t err =
        cudaGraphInstantiateWithFlags(&g->exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
    if (err != cudaSuccess) {
        cudaGraphDestroy(graph);
        free(g);
        return ga_cuda_error(err, "cudaGraphInstantiateWithFlags(&exec, graph, AutoFreeOnLaunch)",
                             __FILE__, __LINE__);
    }
    *out = (ga_graph)g;
    return ga_ok();
}

extern "C" ga_status ga_cuda_graph_launch(int device, ga_graph graph, ga_stream stream)
{
    GA_WITH_DEVICE(device);
    GA_CUDA_TRY(cudaGraphLaunch(((captured_graph *)graph)->exec, ga_cu_stream(stream)));
    return ga_ok();
}

extern "C" ga_status ga_cuda_graph_destroy(int device, ga_graph graph)
{
    if (!graph)
        return ga_ok();
    GA_WITH_DEVICE(device);
    captured_graph *g = (captured_graph *)graph;
    cudaError_t exec_err = cudaGraphExecDestroy(g->exec);
    cudaError_t graph_err = cudaGraphDestroy(g->graph);
    free(g);
    GA_CUDA_TRY(exec_err);
    GA_CUDA_TRY(graph_err);
    return ga_ok();
}

extern "C" ga_status ga_cuda_exchange_capture_mode(int *mode)
{
    cudaStreamCaptureMode m = (cudaStreamCaptureMode)*mode;
    GA_CUDA_TRY(cudaThreadExchangeStreamCaptureMode(&m));
    *mode = (int)m;
    return ga_ok();
}

extern "C" ga_status ga_cuda_stream_device(ga_stream stream, int *device)
{
    if (is_special_stream(stream)) {
        GA_CUDA_TRY(cudaGetDevice(device));
        return ga_ok();
    }
    GA_CUDA_TRY(cudaStreamGetDevice(ga_cu_stream(stream), device));
    return ga_ok();
}

extern "C" ga_status ga_cuda_stream_wait_event(int device, ga_stream stream, ga_event event)
{
    GA_WITH_DEVICE(device);
    GA_CUDA_TRY(cudaStreamWaitEvent(ga_cu_stream(stream), (cudaEvent_t)event, 0));
    return ga_ok();
}

/* A wait captures the event's state when it is enqueued, so one scratch
 * event per thread and device can be recorded again right away. */
static thread_local cudaEvent_t scratch_events[GA_MAX_DEVICES];

static int same_stream(ga_stream a, ga_stream b)
{
    /* handle 0 and 1 both name the legacy default stream */
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    if (x == 0)
        x = 1;
    if (y == 0)
        y = 1;
    return x == y;
}

/* Records this thread's scratch event of `device` on `stream` (of it). */
static ga_status record_scratch(int device, ga_stream stream, cudaEvent_t *out)
{
    GA_WITH_DEVICE(device);
    cudaEvent_t *ev = &scratch_events[device];
    if (!*ev)
        GA_CUDA_TRY(cudaEventCreateWithFlags(ev, cudaEventDisableTiming));
    GA_CUDA_TRY(cudaEventRecord(*ev, ga_cu_stream(stream)));
    *out = *ev;
    return ga_ok();
}

extern "C" ga_status ga_cuda_stream_wait_stream(int consumer_device, ga_stream consumer,
                                                int producer_device, ga_stream producer)
{
    if (consumer_device == producer_device && same_stream(consumer, producer))
        return ga_ok();
    if (consumer_device < 0 || consumer_device >= GA_MAX_DEVICES || producer_device < 0 ||
        producer_device >= GA_MAX_DEVICES)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "device ordinal out of range");
    /* the special handles (0, 1, 2) name a stream of the current device:
     * each side is named with its own device current */
    cudaEvent_t ev;
    GA_TRY_STATUS(record_scratch(producer_device, producer, &ev));
    GA_WITH_DEVICE(consumer_device);
    GA_CUDA_TRY(cudaStreamWaitEvent(ga_cu_stream(consumer), ev, 0));
    return ga_ok();
}

/* -------------------------------------------------------------- events */

extern "C" ga_status ga_cuda_event_create(int device, int timing, ga_event *out)
{
    GA_WITH_DEVICE(device);
    cudaEvent_t e;
    GA_CUDA_TRY(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    *out = (ga_event)e;
    return ga_ok();
}

extern "C" ga_status ga_cuda_event_destroy(int device, ga_event event)
{
    GA_WITH_DEVICE(device);
    GA_CUDA_TRY(cudaEventDestroy((cudaEvent_t)event));
    return ga_ok();
}

extern "C" ga_status ga_cuda_event_record(int device, ga_event event, ga_stream stream)
{
    GA_WITH_DEVICE(device);
    GA_CUDA_TRY(cudaEventRecord((cudaEvent_t)event, ga_cu_stream(stream)));
    return ga_ok();
}

extern "C" ga_status ga_cuda_event_query(int device, ga_event event, int *done)
{
    GA_WITH_DEVICE(device);
    cudaError_t err = cudaEventQuery((cudaEvent_t)event);
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        *done = 0;
        return ga_ok();
    }
    GA_CUDA_TRY(err);
    *done = 1;
    return ga_ok();
}

extern "C" ga_status ga_cuda_event_synchronize(int device, ga_event event)
{
    GA_WITH_DEVICE(device);
    GA_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)event));
    return ga_ok();
}

extern "C" ga_status ga_cuda_event_elapsed_ms(int device, ga_event start, ga_event end, float *ms)
{
    GA_WITH_DEVICE(device);
    GA_CUDA_TRY(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end));
    return ga_ok();
}

/* --------------------------------------------------------- device pool */

/* gpuaccel's own pool per device (not the default pool), so that its
 * reserved size is ours alone to report and trim; how much freed memory it
 * keeps through a synchronization (its release threshold) is csrc/alloc.c's
 * policy. */
static cudaMemPool_t pools[GA_MAX_DEVICES];
static std::mutex pools_mutex;

static ga_status get_pool(int device, cudaMemPool_t *out)
{
    if (device < 0 || device >= GA_MAX_DEVICES)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "device ordinal out of range");
    std::lock_guard<std::mutex> lock(pools_mutex);
    if (!pools[device]) {
        cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.handleTypes = cudaMemHandleTypeNone;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = device;
        cudaMemPool_t pool;
        GA_CUDA_TRY(cudaMemPoolCreate(&pool, &props));
        pools[device] = pool;
    }
    *out = pools[device];
    return ga_ok();
}

extern "C" ga_status ga_cuda_malloc_async(int device, size_t size, ga_stream stream, void **out)
{
    *out = NULL;
    if (size == 0)
        return ga_ok();
    GA_WITH_DEVICE(device);
    cudaMemPool_t pool;
    GA_TRY_STATUS(get_pool(device, &pool));
    GA_CUDA_TRY(cudaMallocFromPoolAsync(out, size, pool, ga_cu_stream(stream)));
    return ga_ok();
}

extern "C" ga_status ga_cuda_free_async(int device, void *ptr, ga_stream stream)
{
    if (!ptr)
        return ga_ok();
    GA_WITH_DEVICE(device);
    GA_CUDA_TRY(cudaFreeAsync(ptr, ga_cu_stream(stream)));
    return ga_ok();
}

extern "C" ga_status ga_cuda_pool_set_release_threshold(int device, uint64_t bytes)
{
    GA_WITH_DEVICE(device);
    cudaMemPool_t pool;
    GA_TRY_STATUS(get_pool(device, &pool));
    GA_CUDA_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &bytes));
    return ga_ok();
}

extern "C" ga_status ga_cuda_pool_trim(int device)
{
    GA_WITH_DEVICE(device);
    cudaMemPool_t pool;
    GA_TRY_STATUS(get_pool(device, &pool));
    GA_CUDA_TRY(cudaMemPoolTrimTo(pool, 0));
    return ga_ok();
}

extern "C" ga_status ga_cuda_pool_reserved(int device, uint64_t *current, uint64_t *peak)
{
    *current = *peak = 0;
    {
        std::lock_guard<std::mutex> lock(pools_mutex);
        if (device < 0 || device >= GA_MAX_DEVICES || !pools[device])
            return ga_ok(); /* nothing allocated yet */
    }
    GA_WITH_DEVICE(device);
    cudaMemPool_t pool = pools[device];
    GA_CUDA_TRY(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, current));
    GA_CUDA_TRY(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, peak));
    return ga_ok();
}

/* -------------------------------------------------------- pinned memory */

extern "C" ga_status ga_cuda_host_alloc(size_t size, void **out)
{
    *out = NULL;
    if (size == 0)
        return ga_ok();
    /* portable: usable by every device's copies, not only the current one */
    GA_CUDA_TRY(cudaHostAlloc(out, size, cudaHostAllocPortable));
    return ga_ok();
}

extern "C" ga_status ga_cuda_host_free(void *ptr)
{
    if (ptr)
        GA_CUDA_TRY(cudaFreeHost(ptr));
    return ga_ok();
}

/* --------------------------------------------------------------- copies */

extern "C" ga_status ga_cuda_memcpy_async(int device, void *dst, const void *src, size_t size,
                                          ga_stream stream)
{
    GA_NVTX_RANGE("copy");
    if (size == 0)
        return ga_ok();
    GA_WITH_DEVICE(device);
    GA_CUDA_TRY(cudaMemcpyAsync(dst, src, size, cudaMemcpyDefault, ga_cu_stream(stream)));
    return ga_ok();
}

extern "C" ga_status ga_cuda_host_access(const void *ptr, size_t size, int write)
{
    (void)ptr, (void)size, (void)write; /* an annotation for the simulator */
    return ga_ok();
}

extern "C" ga_status ga_cuda_pointer_info(const void *ptr, int *kind, int *device)
{
    cudaPointerAttributes attr;
    GA_CUDA_TRY(cudaPointerGetAttributes(&attr, ptr));
    switch (attr.type) {
    case cudaMemoryTypeHost: *kind = 1; break;
    case cudaMemoryTypeDevice: *kind = 2; break;
    case cudaMemoryTypeManaged: *kind = 3; break;
    default: *kind = 0; break;
    }
    *device = attr.type == cudaMemoryTypeUnregistered ? -1 : attr.device;
    return ga_ok();
}

/* ------------------------------------------------------ profiler ranges */

extern "C" void ga_cuda_range_push(const char *name)
{
    nvtxRangePushA(name);
}

extern "C" void ga_cuda_range_pop(void)
{
    nvtxRangePop();
}
