/*
 * sim.c — a simulated CUDA runtime that checks stream ordering (a test
 * build: GPUACCEL_SIM=1, never a release).
 *
 * The CUDA paths of csrc/ (the device pool's cross-stream bookkeeping,
 * transfers, streams and events, DLPack stream handoff, the loader's copy
 * stream) decide *when* the GPU may touch memory; on a machine without a
 * GPU nothing else runs them.  This backend stands in for the runtime:
 * "device" memory is host memory, every queued operation runs at once (so
 * results are as if the GPU ran in order), and a vector clock per stream
 * records what each operation is guaranteed to follow under CUDA's rules:
 *
 *   - work on a stream follows earlier work on the same stream, and
 *     whatever the host had seen finish when it queued the work;
 *   - cudaStreamWaitEvent: later work follows the event's record;
 *   - the legacy default stream (handles 0, 1) follows all earlier work of
 *     the blocking streams of its device (the per-thread default streams,
 *     handle 2, one per thread), and they follow its earlier work;
 *   - stream/event synchronize and a successful query: the host has seen
 *     that work finish (the host as a whole: see host_seen).
 *
 * Every access to a simulated allocation is checked against those clocks:
 * use before the allocation is ordered, a read or write not ordered after
 * the last write, a write or free not ordered after every read, any use of
 * freed memory.  A violation is a bug in gpuaccel's ordering (or a test
 * that races on purpose): the operation is not done, the call fails with
 * the violation as its message (a Python exception, or an unraisable
 * warning from a dealloc), and the violation is also printed on stderr, so
 * that one whose error a caller drops is still seen.
 *
 * Kernels run at once on the simulated memory, so results can be checked
 * as well, and they are the CUDA backend's own: kernels/cuda compiled by
 * the host C++ compiler through kernels/cudacpu, which runs each CUDA
 * thread as a fiber (see kernels/cudacpu/cudacpu.h), with its entry points
 * renamed (kernels/sim/kernel_names.h) so that the ga_cuda_* functions
 * here can check an operation first and then call them.  cuBLASLt and
 * cuDNN do not run here: a matmul takes the path ga_cuda_matmul takes when
 * cuBLASLt cannot fuse it (the generic GEMM kernel and the epilogue
 * kernels), a conv the direct kernels (kernels/cuda/fallback.h).  Each
 * operand's byte extent must lie in one allocation of the kernel's device
 * or in pinned memory (a small memcheck).  Timings, engine choice and
 * graphs are not simulated.
 *
 * Environment: GPUACCEL_SIM_DEVICES (default 2) devices of 16 GiB each.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvtx3/nvToolsExt.h>

#include "../cuda/fallback.h"
#include "../kernels.h"

#define GPUACCEL_SIM_DECLARE_KERNELS
#include "kernel_names.h"

#define SIM_MAX_STREAMS 512
#define SIM_MAX_DEVICES 8
#define SIM_MEMORY ((uint64_t)16 << 30)

enum { SIM_LEGACY, SIM_PER_THREAD, SIM_CREATED };

typedef struct {
    uint32_t c[SIM_MAX_STREAMS];
} vclock;

typedef struct sim_stream {
    int id, device, kind, priority;
    int released; /* back in the pool: a valid stream, handed out again */
    vclock vc;
} sim_stream;

typedef struct sim_event {
    int recorded, device;
    vclock vc;
} sim_event;

typedef struct region {
    char *ptr;
    size_t size;
    int kind; /* 1 pinned, 2 device */
    int device, freed, written;
    vclock alloc, last_write, reads;
    struct region *next;
} region;

static pthread_mutex_t sim_lock = PTHREAD_MUTEX_INITIALIZER;
static sim_stream *streams[SIM_MAX_STREAMS];
static int n_streams;
static sim_stream *legacy[SIM_MAX_DEVICES];
static region *regions;
static uint64_t device_bytes[SIM_MAX_DEVICES], device_peak[SIM_MAX_DEVICES];
static __thread sim_stream *per_thread[SIM_MAX_DEVICES];
/* What the host has seen finish.  One for the process, not per thread:
 * host threads order their work with mutexes the simulator cannot see (a
 * loader worker writes a buffer whose copy the thread that set it up
 * waited for), and in the one interleaving a run explores, work queued
 * after a wait returned does follow it. */
static vclock host_seen;
static __thread int current_device;

#define SIM_STATUS(msg) GA_STATUS(GA_ERR_INVALID_VALUE, "simulated CUDA: " msg)

/* --------------------------------------------------------------- clocks */

static void join(vclock *into, const vclock *other)
{
    for (int k = 0; k < n_streams; k++)
        if (other->c[k] > into->c[k])
            into->c[k] = other->c[k];
}

static int ordered_before(const vclock *a, const vclock *b)
{
    for (int k = 0; k < n_streams; k++)
        if (a->c[k] > b->c[k])
            return 0;
    return 1;
}

static __thread char violation_text[512];

static ga_status violation(const char *what, const region *r, const sim_stream *s)
{
    snprintf(violation_text, sizeof violation_text,
             "simulated CUDA: ordering violation: %s (%s allocation %p of %zu bytes on cuda:%d, "
             "by stream #%d of cuda:%d)",
             what, r->kind == 2 ? "device" : "pinned", (void *)r->ptr, r->size, r->device,
             s ? s->id : -1, s ? s->device : -1);
    fprintf(stderr, "gpuaccel %s\n", violation_text);
    fflush(stderr);
    return GA_STATUS(GA_ERR_INVALID_VALUE, violation_text);
}

/* ------------------------------------------------------------- streams */

static int device_count(void)
{
    static int count = -1;
    if (count < 0) {
        const char *env = getenv("GPUACCEL_SIM_DEVICES");
        int n = env ? atoi(env) : 2;
        count = n < 0 ? 0 : n > SIM_MAX_DEVICES ? SIM_MAX_DEVICES : n;
    }
    return count;
}

static sim_stream *new_stream(int device, int kind, int priority)
{
    if (n_streams == SIM_MAX_STREAMS)
        return NULL;
    sim_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->id = n_streams;
    s->device = device;
    s->kind = kind;
    s->priority = priority;
    streams[n_streams++] = s;
    return s;
}

/* The stream a handle names for `device` (special handles: that device's
 * legacy stream, this thread's per-thread stream).  Called locked. */
static ga_status resolve(int device, ga_stream handle, sim_stream **out)
{
    if (device < 0 || device >= device_count())
        return SIM_STATUS("device ordinal out of range");
    uintptr_t h = (uintptr_t)handle;
    sim_stream **slot = h == 0 || h == 1 ? &legacy[device] : h == 2 ? &per_thread[device] : NULL;
    if (slot) {
        if (!*slot && !(*slot = new_stream(device, h == 2 ? SIM_PER_THREAD : SIM_LEGACY, 0)))
            return SIM_STATUS("too many streams");
        *out = *slot;
        return ga_ok();
    }
    for (int k = 0; k < n_streams; k++)
        if (streams[k] == (sim_stream *)handle) {
            if (streams[k]->device != device)
                return SIM_STATUS("stream used with another device current");
            *out = streams[k];
            return ga_ok();
        }
    return SIM_STATUS("not a stream handle");
}

/* Queues one operation on `s`: its clock says what it follows. */
static vclock queue_op(sim_stream *s)
{
    if (s->kind == SIM_LEGACY) {
        for (int k = 0; k < n_streams; k++)
            if (streams[k]->device == s->device && streams[k]->kind == SIM_PER_THREAD)
                join(&s->vc, &streams[k]->vc);
    } else if (s->kind == SIM_PER_THREAD && legacy[s->device]) {
        join(&s->vc, &legacy[s->device]->vc);
    }
    join(&s->vc, &host_seen);
    s->vc.c[s->id]++;
    return s->vc;
}

/* -------------------------------------------------------------- memory */

static region *find_region(const void *p)
{
    const char *c = (const char *)p;
    region *freed = NULL;
    for (region *r = regions; r; r = r->next)
        if (c >= r->ptr && c < r->ptr + (r->size ? r->size : 1)) {
            if (!r->freed)
                return r;
            if (!freed)
                freed = r;
        }
    return freed;
}

/* One operand of a simulated operation: the bytes [lo, hi) it may touch
 * and whether it writes them.  lo NULL: an empty operand, not checked. */
typedef struct {
    const char *lo, *hi;
    int write;
} sim_operand;

#define SIM_MAX_OPERANDS (1 + GA_LOGGER_MAX_PER_CALL)

static ga_status operand_violation(const char *what, const sim_operand *o, int kernel_device,
                                   const sim_stream *s)
{
    snprintf(violation_text, sizeof violation_text,
             "simulated CUDA: %s (%s of %zu bytes at %p, by a kernel of cuda:%d on stream #%d)",
             what, o->write ? "write" : "read", (size_t)(o->hi - o->lo), (const void *)o->lo,
             kernel_device, s ? s->id : -1);
    fprintf(stderr, "gpuaccel %s\n", violation_text);
    fflush(stderr);
    return GA_STATUS(GA_ERR_INVALID_VALUE, violation_text);
}

/* Checks that an access by an operation with clock `op` is ordered. */
static ga_status check_region(region *r, const vclock *op, int write, const sim_stream *s)
{
    if (r->freed)
        return violation("use of freed memory", r, s);
    if (!ordered_before(&r->alloc, op))
        return violation("use not ordered after the allocation", r, s);
    if (r->written && !ordered_before(&r->last_write, op))
        return violation(write ? "write not ordered after the last write"
                               : "read not ordered after the last write",
                         r, s);
    if (write && !ordered_before(&r->reads, op))
        return violation("write not ordered after an earlier read", r, s);
    return ga_ok();
}

static void record_region(region *r, const vclock *op, int write)
{
    if (write) {
        r->last_write = *op;
        r->written = 1;
    } else {
        join(&r->reads, op);
    }
}

/* Checks every operand of one operation with clock `op`, then records
 * them all (an operand may be read and written by the same operation).
 * A kernel (kernel_device >= 0) may touch only its own device's memory
 * and pinned host memory; a copy engine (-1) any memory.  An operand of
 * simulated memory must lie inside its allocation (the memcheck part). */
static ga_status access_all(const sim_operand *ops, int n, const vclock *op, const sim_stream *s,
                            int kernel_device)
{
    region *found[SIM_MAX_OPERANDS];
    for (int k = 0; k < n; k++) {
        found[k] = ops[k].lo ? find_region(ops[k].lo) : NULL;
        region *r = found[k];
        if (!ops[k].lo)
            continue;
        if (!r) {
            if (kernel_device >= 0)
                return operand_violation("kernel operand in pageable host memory", &ops[k],
                                         kernel_device, s);
            continue;
        }
        if (kernel_device >= 0 && r->kind == 2 && r->device != kernel_device)
            return operand_violation("kernel operand in another device's memory", &ops[k],
                                     kernel_device, s);
        if (ops[k].hi > r->ptr + r->size)
            return violation(ops[k].write ? "write past the end of the allocation"
                                          : "read past the end of the allocation",
                             r, s);
        GA_TRY_STATUS(check_region(r, op, ops[k].write, s));
    }
    for (int k = 0; k < n; k++)
        if (found[k])
            record_region(found[k], op, ops[k].write);
    return ga_ok();
}

static int64_t tensor_size(const ga_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

/* The bytes a strided tensor touches (lo NULL when it is empty). */
static sim_operand tensor_operand(const ga_tensor *t, int write)
{
    sim_operand o = {NULL, NULL, write};
    if (!t->data || tensor_size(t) == 0)
        return o;
    int64_t lo = 0, hi = (int64_t)ga_dtype_itemsize(t->dtype);
    for (int d = 0; d < t->ndim; d++) {
        int64_t span = t->strides[d] * (t->shape[d] - 1);
        if (span < 0)
            lo += span;
        else
            hi += span;
    }
    o.lo = (const char *)t->data + lo;
    o.hi = (const char *)t->data + hi;
    return o;
}

/* The same for `batch` matrices (strides in elements). */
static sim_operand matrix_operand(const ga_matrix *m, int64_t batch, int write)
{
    sim_operand o = {NULL, NULL, write};
    if (!m->data || m->rows == 0 || m->cols == 0 || batch == 0)
        return o;
    int64_t spans[3] = {m->row_stride * (m->rows - 1), m->col_stride * (m->cols - 1),
                        m->batch_stride * (batch - 1)};
    int64_t lo = 0, hi = 0, size = (int64_t)ga_dtype_itemsize(m->dtype);
    for (int k = 0; k < 3; k++) {
        if (spans[k] < 0)
            lo += spans[k];
        else
            hi += spans[k];
    }
    o.lo = (const char *)m->data + lo * size;
    o.hi = (const char *)m->data + hi * size + size;
    return o;
}

static sim_operand bytes_operand(const void *p, size_t size, int write)
{
    sim_operand o = {NULL, NULL, write};
    if (p && size) {
        o.lo = (const char *)p;
        o.hi = (const char *)p + size;
    }
    return o;
}

/* ------------------------------------------------------ device queries */

ga_status ga_cuda_device_count(int *count)
{
    *count = device_count();
    return *count ? ga_ok() : GA_STATUS(GA_ERR_NO_DEVICE, "simulated CUDA: no devices");
}

ga_status ga_cuda_device_props(int device, ga_device_props *props)
{
    memset(props, 0, sizeof *props);
    if (device < 0 || device >= device_count())
        return SIM_STATUS("device ordinal out of range");
    snprintf(props->name, sizeof props->name, "gpuaccel simulated device %d", device);
    props->major = 9;
    props->total_memory = SIM_MEMORY;
    props->multiprocessors = 132;
    props->l2_cache_bytes = 50 << 20;
    props->pci_bus = device;
    return ga_ok();
}

ga_status ga_cuda_get_device(int *device)
{
    *device = current_device;
    return ga_ok();
}

ga_status ga_cuda_versions(ga_cuda_versions_info *info)
{
    memset(info, 0, sizeof *info);
    info->archs = "sim";
    return ga_ok();
}

void ga_cuda_library_paths(const char **cublaslt, const char **cudnn)
{
    *cublaslt = "";
    *cudnn = "";
}

ga_status ga_cuda_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes)
{
    if (device < 0 || device >= device_count())
        return SIM_STATUS("device ordinal out of range");
    pthread_mutex_lock(&sim_lock);
    *total_bytes = SIM_MEMORY;
    *free_bytes = SIM_MEMORY - device_bytes[device];
    pthread_mutex_unlock(&sim_lock);
    return ga_ok();
}

ga_status ga_cuda_device_synchronize(int device)
{
    if (device < 0 || device >= device_count())
        return SIM_STATUS("device ordinal out of range");
    pthread_mutex_lock(&sim_lock);
    for (int k = 0; k < n_streams; k++)
        if (streams[k]->device == device)
            join(&host_seen, &streams[k]->vc);
    pthread_mutex_unlock(&sim_lock);
    return ga_ok();
}

ga_status ga_cuda_thread_init(int device)
{
    if (device < 0 || device >= device_count())
        return SIM_STATUS("device ordinal out of range");
    current_device = device;
    return ga_ok();
}

/* ------------------------------------------------------------- streams */

ga_status ga_cuda_stream_acquire(int device, int priority, ga_stream *out)
{
    *out = NULL;
    if (device < 0 || device >= device_count())
        return SIM_STATUS("device ordinal out of range");
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    for (int k = n_streams - 1; k >= 0 && !s; k--)
        if (streams[k]->released && streams[k]->device == device &&
            streams[k]->priority == priority)
            s = streams[k];
    if (s)
        s->released = 0;
    else
        s = new_stream(device, SIM_CREATED, priority);
    pthread_mutex_unlock(&sim_lock);
    if (!s)
        return SIM_STATUS("too many streams");
    *out = (ga_stream)s;
    return ga_ok();
}

void ga_cuda_stream_release(int device, int priority, ga_stream stream)
{
    (void)device, (void)priority;
    pthread_mutex_lock(&sim_lock);
    ((sim_stream *)stream)->released = 1;
    pthread_mutex_unlock(&sim_lock);
}

ga_status ga_cuda_stream_synchronize(int device, ga_stream stream)
{
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    ga_status status = resolve(device, stream, &s);
    if (!status.error)
        join(&host_seen, &s->vc);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_stream_query(int device, ga_stream stream, int *done)
{
    *done = 1; /* everything has run */
    return ga_cuda_stream_synchronize(device, stream);
}

ga_status ga_cuda_stream_device(ga_stream stream, int *device)
{
    uintptr_t h = (uintptr_t)stream;
    if (h <= 2) {
        *device = current_device;
        return ga_ok();
    }
    pthread_mutex_lock(&sim_lock);
    *device = -1;
    for (int k = 0; k < n_streams; k++)
        if (streams[k] == (sim_stream *)stream)
            *device = streams[k]->device;
    pthread_mutex_unlock(&sim_lock);
    return *device >= 0 ? ga_ok() : SIM_STATUS("not a stream handle");
}

ga_status ga_cuda_stream_wait_event(int device, ga_stream stream, ga_event event)
{
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    sim_event *e = (sim_event *)event;
    ga_status status = resolve(device, stream, &s);
    if (!status.error && e->recorded)
        join(&s->vc, &e->vc);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_stream_wait_stream(int consumer_device, ga_stream consumer, int producer_device,
                                     ga_stream producer)
{
    pthread_mutex_lock(&sim_lock);
    sim_stream *c = NULL, *p = NULL;
    ga_status status = resolve(consumer_device, consumer, &c);
    if (!status.error)
        status = resolve(producer_device, producer, &p);
    if (!status.error && c != p) {
        vclock v = queue_op(p); /* the event record */
        join(&c->vc, &v);
    }
    pthread_mutex_unlock(&sim_lock);
    return status;
}

/* No stream is captured here, unless a test says every stream is
 * (GPUACCEL_SIM_CAPTURING=1, read at each query): what a call does inside
 * a capture is then seen without a GPU. */
ga_status ga_cuda_stream_capturing(ga_stream stream, int *capturing)
{
    (void)stream;
    const char *env = getenv("GPUACCEL_SIM_CAPTURING");
    *capturing = env && strcmp(env, "1") == 0;
    return ga_ok();
}

/* ------------------------------------------------------ profiler ranges */

/* Real NVTX ranges (the header-only library of the CUDA toolkit), as in
 * kernels/cuda/runtime.cu, so that the tests see the ranges a GPU build
 * opens. */
void ga_cuda_range_push(const char *name)
{
    nvtxRangePushA(name);
}

void ga_cuda_range_pop(void)
{
    nvtxRangePop();
}

/* -------------------------------------------------------------- events */

ga_status ga_cuda_event_create(int device, int timing, ga_event *out)
{
    (void)timing;
    *out = NULL;
    if (device < 0 || device >= device_count())
        return SIM_STATUS("device ordinal out of range");
    sim_event *e = calloc(1, sizeof *e);
    if (!e)
        return GA_STATUS(GA_ERR_HOST_OUT_OF_MEMORY, "simulated CUDA: no memory for an event");
    e->device = device;
    *out = (ga_event)e;
    return ga_ok();
}

ga_status ga_cuda_event_destroy(int device, ga_event event)
{
    (void)device;
    free(event);
    return ga_ok();
}

ga_status ga_cuda_event_record(int device, ga_event event, ga_stream stream)
{
    sim_event *e = (sim_event *)event;
    if (e->device != device)
        return SIM_STATUS("event recorded with another device current");
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    ga_status status = resolve(device, stream, &s);
    if (!status.error) {
        e->vc = queue_op(s);
        e->recorded = 1;
    }
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_event_synchronize(int device, ga_event event)
{
    (void)device;
    pthread_mutex_lock(&sim_lock);
    join(&host_seen, &((sim_event *)event)->vc);
    pthread_mutex_unlock(&sim_lock);
    return ga_ok();
}

ga_status ga_cuda_event_query(int device, ga_event event, int *done)
{
    *done = 1;
    return ga_cuda_event_synchronize(device, event);
}

ga_status ga_cuda_event_elapsed_ms(int device, ga_event start, ga_event end, float *ms)
{
    (void)device, (void)start, (void)end;
    *ms = 0;
    return ga_ok();
}

/* -------------------------------------------------------------- memory */

ga_status ga_cuda_malloc_async(int device, size_t size, ga_stream stream, void **out)
{
    *out = NULL;
    if (size == 0)
        return ga_ok();
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    ga_status status = resolve(device, stream, &s);
    if (status.error)
        goto done;
    if (device_bytes[device] + size > SIM_MEMORY) {
        status = GA_STATUS(GA_ERR_OUT_OF_MEMORY, "simulated CUDA: out of memory");
        goto done;
    }
    region *r = calloc(1, sizeof *r);
    char *p = r ? aligned_alloc(256, (size + 255) / 256 * 256) : NULL;
    if (!p) {
        free(r);
        status = GA_STATUS(GA_ERR_OUT_OF_MEMORY, "simulated CUDA: out of host memory");
        goto done;
    }
    r->ptr = p;
    r->size = size;
    r->kind = 2;
    r->device = device;
    r->alloc = queue_op(s);
    r->next = regions;
    regions = r;
    device_bytes[device] += size;
    if (device_bytes[device] > device_peak[device])
        device_peak[device] = device_bytes[device];
    *out = p;
done:
    pthread_mutex_unlock(&sim_lock);
    return status;
}

/* Freed regions stay listed (and their memory kept) so that a late use is
 * caught as such; the oldest are dropped beyond this many. */
#define SIM_KEEP_FREED 4096

static void drop_old_freed(void)
{
    int kept = 0;
    for (region **link = &regions; *link;) {
        region *r = *link;
        if (r->freed && ++kept > SIM_KEEP_FREED) {
            *link = r->next;
            free(r->ptr);
            free(r);
        } else {
            link = &r->next;
        }
    }
}

ga_status ga_cuda_free_async(int device, void *ptr, ga_stream stream)
{
    if (!ptr)
        return ga_ok();
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    ga_status status = resolve(device, stream, &s);
    region *r = find_region(ptr);
    if (!status.error && (!r || r->kind != 2 || r->ptr != ptr || r->device != device))
        status = SIM_STATUS("cudaFreeAsync of a pointer that is no allocation of this device");
    if (!status.error) {
        vclock v = queue_op(s);
        status = check_region(r, &v, 1, s); /* after every use, like a write */
    }
    if (!status.error) {
        r->freed = 1;
        device_bytes[device] -= r->size;
        drop_old_freed();
    }
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_pool_set_release_threshold(int device, uint64_t bytes)
{
    (void)device, (void)bytes;
    return ga_ok();
}

ga_status ga_cuda_pool_trim(int device)
{
    (void)device;
    return ga_ok();
}

ga_status ga_cuda_pool_reserved(int device, uint64_t *current, uint64_t *peak)
{
    pthread_mutex_lock(&sim_lock);
    *current = device >= 0 && device < SIM_MAX_DEVICES ? device_bytes[device] : 0;
    *peak = device >= 0 && device < SIM_MAX_DEVICES ? device_peak[device] : 0;
    pthread_mutex_unlock(&sim_lock);
    return ga_ok();
}

ga_status ga_cuda_host_alloc(size_t size, void **out)
{
    region *r = calloc(1, sizeof *r);
    char *p = r ? aligned_alloc(4096, (size + 4095) / 4096 * 4096) : NULL;
    if (!p) {
        free(r);
        *out = NULL;
        return GA_STATUS(GA_ERR_OUT_OF_MEMORY, "simulated CUDA: out of pinned memory");
    }
    r->ptr = p;
    r->size = size;
    r->kind = 1;
    r->device = -1;
    pthread_mutex_lock(&sim_lock);
    r->next = regions;
    regions = r;
    pthread_mutex_unlock(&sim_lock);
    *out = p;
    return ga_ok();
}

ga_status ga_cuda_host_free(void *ptr)
{
    if (!ptr)
        return ga_ok();
    pthread_mutex_lock(&sim_lock);
    region *r = find_region(ptr);
    ga_status status = ga_ok();
    if (!r || r->kind != 1 || r->ptr != ptr || r->freed) {
        status = SIM_STATUS("cudaFreeHost of a pointer that is no pinned allocation");
    } else {
        /* the host gives the memory back: every copy that used it must
         * have been seen finished */
        if (r->written && !ordered_before(&r->last_write, &host_seen))
            status = violation("pinned memory freed before a copy into it finished", r, NULL);
        else if (!ordered_before(&r->reads, &host_seen))
            status = violation("pinned memory freed before a copy from it finished", r, NULL);
    }
    if (!status.error) {
        r->freed = 1;
        drop_old_freed();
    }
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_memcpy_async(int device, void *dst, const void *src, size_t size,
                               ga_stream stream)
{
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    ga_status status = resolve(device, stream, &s);
    if (!status.error && size) {
        vclock v = queue_op(s);
        sim_operand ops[2] = {bytes_operand(src, size, 0), bytes_operand(dst, size, 1)};
        status = access_all(ops, 2, &v, s, -1);
        if (!status.error) {
            memmove(dst, src, size);
            if (!find_region(dst)) /* into pageable memory: done on return */
                join(&host_seen, &v);
        }
    }
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_host_access(const void *ptr, size_t size, int write)
{
    if (!ptr || !size)
        return ga_ok();
    pthread_mutex_lock(&sim_lock);
    region *r = find_region(ptr);
    ga_status status = ga_ok();
    if (r && r->kind == 2)
        status = violation("host access to device memory", r, NULL);
    else if (r && r->freed)
        status = violation("host use of freed pinned memory", r, NULL);
    else if (r && (const char *)ptr + size > r->ptr + r->size)
        status = violation("host access past the end of a pinned allocation", r, NULL);
    else if (r && r->written && !ordered_before(&r->last_write, &host_seen))
        status = violation(write ? "host write before a copy into it finished"
                                 : "host read before a copy into it finished",
                           r, NULL);
    else if (r && write && !ordered_before(&r->reads, &host_seen))
        status = violation("host write before a copy from it finished", r, NULL);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_pointer_info(const void *ptr, int *kind, int *device)
{
    pthread_mutex_lock(&sim_lock);
    region *r = ptr ? find_region(ptr) : NULL;
    *kind = r && !r->freed ? r->kind : 0;
    *device = r && !r->freed ? r->device : -1;
    pthread_mutex_unlock(&sim_lock);
    return ga_ok();
}

/* ------------------------------------------------------------- kernels */

/* Queues a kernel of `device` on `stream` that touches `ops`, checked as
 * access_all does.  Called locked; on success the caller runs the kernel
 * at once. */
static ga_status launch(int device, ga_stream stream, const sim_operand *ops, int n)
{
    sim_stream *s = NULL;
    GA_TRY_STATUS(resolve(device, stream, &s));
    vclock v = queue_op(s);
    return access_all(ops, n, &v, s, device);
}

ga_status ga_cuda_copy(int device, const ga_tensor *dst, const ga_tensor *src, ga_stream stream)
{
    sim_operand ops[2] = {tensor_operand(src, 0), tensor_operand(dst, 1)};
    pthread_mutex_lock(&sim_lock);
    ga_status status = launch(device, stream, ops, 2);
    if (!status.error)
        status = ga_sim_kernel_copy(device, dst, src, stream);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_fill(int device, const ga_tensor *dst, ga_scalar value, ga_stream stream)
{
    sim_operand ops[1] = {tensor_operand(dst, 1)};
    pthread_mutex_lock(&sim_lock);
    ga_status status = launch(device, stream, ops, 1);
    if (!status.error)
        status = ga_sim_kernel_fill(device, dst, value, stream);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

/* The library calls run as gpuaccel's own kernels over the operands'
 * simulated memory (the unfused matmul, the direct conv), so the CUDA paths
 * of csrc/ around them (workspaces, helper copies, result arrays, streams)
 * run end to end.  The workspace is taken as written by every call, as a
 * library call may. */

static uint64_t matmul_calls, conv_calls;

/* A library refusal injected by tests: GPUACCEL_SIM_FALLBACK="<reason>:
 * <status>:<text>" (reason: a ga_fallback_reason value) makes every matmul
 * and conv report it, as kernels/cuda reports what cuBLASLt and cuDNN
 * answered, so csrc's counting and fallback policy run without them. */
static void sim_inject_fallback(ga_op_report *report)
{
    const char *env = getenv("GPUACCEL_SIM_FALLBACK");
    if (!env || !*env)
        return;
    char *end = NULL;
    long reason = strtol(env, &end, 10);
    if (reason <= GA_FALLBACK_NONE || reason >= GA_FALLBACK_REASON_COUNT || *end != ':')
        return;
    long status = strtol(end + 1, &end, 10);
    report->reason = (ga_fallback_reason)reason;
    report->library_status = (int)status;
    snprintf(report->detail, sizeof report->detail, "%s", *end == ':' ? end + 1 : "");
}

size_t ga_cuda_matmul_workspace_size(int device)
{
    (void)device;
    return (size_t)1 << 20;
}

ga_status ga_cuda_matmul(int device, const ga_matmul_desc *desc, void *workspace,
                         size_t workspace_size, ga_stream stream, ga_op_report *report)
{
    memset(report, 0, sizeof *report);
    const ga_matmul_desc *d = desc; /* short: nine operands follow */
    size_t bias_size = ga_dtype_itemsize(d->bias_dtype) * (size_t)d->d.cols;
    sim_operand ops[] = {
        matrix_operand(&d->a, d->batch, 0),
        matrix_operand(&d->b, d->batch, 0),
        matrix_operand(&d->d, d->batch, 1),
        bytes_operand(d->bias, bias_size, 0),
        matrix_operand(&d->preact, d->batch, 1),
        d->dact ? matrix_operand(&d->dact_aux, d->batch, 0) : bytes_operand(NULL, 0, 0),
        bytes_operand(d->col_sums, ga_dtype_itemsize(d->col_sums_dtype) * (size_t)d->d.cols, 1),
        bytes_operand(d->a_row_sums, ga_dtype_itemsize(d->a_row_sums_dtype) * (size_t)d->a.rows, 1),
        bytes_operand(workspace, workspace_size, 1),
    };
    pthread_mutex_lock(&sim_lock);
    ga_status status = launch(device, stream, ops, (int)(sizeof ops / sizeof *ops));
    if (!status.error)
        status = ga_cuda_matmul_check(desc);
    if (!status.error)
        status = ga_cuda_matmul_unfused(device, desc, 0, stream);
    report->fallback = !status.error;
    report->cache_hit = matmul_calls++ > 0;
    sim_inject_fallback(report);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_bias_activation(int device, const ga_bias_act_desc *desc, ga_stream stream)
{
    int64_t channels = desc->x.ndim ? desc->x.shape[desc->channel_dim] : 1;
    sim_operand ops[] = {
        tensor_operand(&desc->x, 0),
        tensor_operand(&desc->y, 1),
        tensor_operand(&desc->preact, 1),
        bytes_operand(desc->bias, ga_dtype_itemsize(desc->bias_dtype) * (size_t)channels, 0),
    };
    pthread_mutex_lock(&sim_lock);
    ga_status status = launch(device, stream, ops, (int)(sizeof ops / sizeof *ops));
    if (!status.error)
        status = ga_sim_kernel_bias_activation(device, desc, stream);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_activation_backward(int device, const ga_act_backward_desc *desc,
                                      ga_stream stream)
{
    int64_t channels = desc->grad_y.ndim ? desc->grad_y.shape[desc->channel_dim] : 1;
    sim_operand ops[] = {
        tensor_operand(&desc->grad_y, 0),
        desc->activation ? tensor_operand(&desc->aux, 0) : bytes_operand(NULL, 0, 0),
        tensor_operand(&desc->dz, 1),
        bytes_operand(desc->bias_grad, ga_dtype_itemsize(desc->bias_grad_dtype) * (size_t)channels,
                      1),
    };
    pthread_mutex_lock(&sim_lock);
    ga_status status = launch(device, stream, ops, (int)(sizeof ops / sizeof *ops));
    if (!status.error)
        status = ga_sim_kernel_activation_backward(device, desc, stream);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

/* cuDNN's engine choice, for csrc/'s tuning file: "sim" is the one engine;
 * a call without a preference (or with another name) tunes, one with it
 * reuses it.  The direct kernels compute, as on the direct route. */
static void conv_tuning_report(ga_conv_tuning *tuning)
{
    int reuse = tuning->preferred && strcmp(tuning->preferred, "sim") == 0;
    snprintf(tuning->chosen, sizeof tuning->chosen, "sim");
    memset(&tuning->report, 0, sizeof tuning->report);
    tuning->report.fallback = 1;
    tuning->report.tuned = !reuse;
    sim_inject_fallback(&tuning->report);
    conv_calls++;
}

ga_status ga_cuda_conv2d_forward(int device, const ga_conv_desc *desc, void *workspace,
                                 size_t workspace_size, ga_stream stream, ga_conv_tuning *tuning)
{
    sim_operand ops[] = {
        tensor_operand(&desc->x, 0),
        tensor_operand(&desc->w, 0),
        tensor_operand(&desc->y, 1),
        bytes_operand(desc->bias, ga_dtype_itemsize(desc->x.dtype) * (size_t)desc->w.shape[0], 0),
        tensor_operand(&desc->preact, 1),
        bytes_operand(workspace, workspace_size, 1),
    };
    pthread_mutex_lock(&sim_lock);
    ga_status status = launch(device, stream, ops, (int)(sizeof ops / sizeof *ops));
    if (!status.error) {
        status = ga_cuda_conv2d_forward_direct(device, desc, stream);
        conv_tuning_report(tuning);
    }
    pthread_mutex_unlock(&sim_lock);
    return status;
}

/* Both backward passes: `a` and `b` read, `out` written (dx from dy and w,
 * or dw from x and dy). */
static ga_status conv_backward(int device, const ga_conv_geometry *geom, const ga_tensor *a,
                               const ga_tensor *b, const ga_tensor *out, int filter,
                               void *workspace, size_t workspace_size, ga_stream stream,
                               ga_conv_tuning *tuning)
{
    sim_operand ops[] = {tensor_operand(a, 0), tensor_operand(b, 0), tensor_operand(out, 1),
                         bytes_operand(workspace, workspace_size, 1)};
    pthread_mutex_lock(&sim_lock);
    ga_status status = launch(device, stream, ops, (int)(sizeof ops / sizeof *ops));
    if (!status.error) {
        status = filter ? ga_cuda_conv2d_backward_filter_direct(device, geom, a, b, out, stream)
                        : ga_cuda_conv2d_backward_data_direct(device, geom, a, b, out, stream);
        conv_tuning_report(tuning);
    }
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_conv2d_backward_data(int device, const ga_conv_geometry *geom,
                                       const ga_tensor *dy, const ga_tensor *w, const ga_tensor *dx,
                                       void *workspace, size_t workspace_size, ga_stream stream,
                                       ga_conv_tuning *tuning)
{
    return conv_backward(device, geom, dy, w, dx, 0, workspace, workspace_size, stream, tuning);
}

ga_status ga_cuda_conv2d_backward_filter(int device, const ga_conv_geometry *geom,
                                         const ga_tensor *x, const ga_tensor *dy,
                                         const ga_tensor *dw, void *workspace,
                                         size_t workspace_size, ga_stream stream,
                                         ga_conv_tuning *tuning)
{
    return conv_backward(device, geom, x, dy, dw, 1, workspace, workspace_size, stream, tuning);
}

void ga_cuda_plan_cache_stats(uint64_t *matmul_hits, uint64_t *matmul_misses, uint64_t *conv_hits,
                              uint64_t *conv_misses)
{
    pthread_mutex_lock(&sim_lock);
    *matmul_hits = matmul_calls ? matmul_calls - 1 : 0;
    *matmul_misses = matmul_calls ? 1 : 0;
    *conv_hits = 0;
    *conv_misses = conv_calls;
    pthread_mutex_unlock(&sim_lock);
}

ga_status ga_cuda_normalize_images(int device, const ga_normalize_desc *desc, ga_stream stream)
{
    size_t n = (size_t)(desc->n * desc->h * desc->w * desc->c);
    sim_operand ops[] = {bytes_operand(desc->src, n, 0),
                         bytes_operand(desc->dst, n * ga_dtype_itemsize(desc->dtype), 1)};
    pthread_mutex_lock(&sim_lock);
    ga_status status = launch(device, stream, ops, 2);
    if (!status.error)
        status = ga_sim_kernel_normalize_images(device, desc, stream);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_logger_update(int device, const ga_logger_update *u, ga_stream stream)
{
    sim_operand ops[1 + GA_LOGGER_MAX_PER_CALL];
    int n = u->n < 0 || u->n > GA_LOGGER_MAX_PER_CALL ? 0 : u->n;
    ops[0] = bytes_operand(u->state, ga_logger_state_bytes(u->capacity, u->max_metrics), 1);
    for (int k = 0; k < n; k++)
        ops[1 + k] = bytes_operand(u->value[k], ga_dtype_itemsize(u->dtype[k]), 0);
    pthread_mutex_lock(&sim_lock);
    ga_status status = launch(device, stream, ops, 1 + n);
    if (!status.error)
        status = ga_sim_kernel_logger_update(device, u, stream);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_logger_reset_window(int device, void *state, int max_metrics, int64_t capacity,
                                      int64_t first_step, int64_t nsteps, ga_stream stream)
{
    sim_operand ops[1] = {bytes_operand(state, ga_logger_state_bytes(capacity, max_metrics), 1)};
    pthread_mutex_lock(&sim_lock);
    ga_status status = launch(device, stream, ops, 1);
    if (!status.error)
        status = ga_sim_kernel_logger_reset_window(device, state, max_metrics, capacity, first_step,
                                                   nsteps, stream);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_resize_images(int device, const ga_resize_job *jobs, int n, ga_stream stream)
{
    ga_status status = ga_ok();
    for (int k = 0; k < n && !status.error; k++) {
        const ga_resize_job *job = &jobs[k];
        size_t src_bytes = (size_t)(job->src_pitch * job->src_h);
        size_t dst_bytes = (size_t)(job->g.out_h * job->g.out_w * 3);
        sim_operand ops[] = {bytes_operand(job->src, src_bytes, 0),
                             bytes_operand(job->dst, dst_bytes, 1)};
        pthread_mutex_lock(&sim_lock);
        status = launch(device, stream, ops, 2);
        if (!status.error)
            status = ga_sim_kernel_resize_images(device, job, 1, stream);
        pthread_mutex_unlock(&sim_lock);
    }
    return status;
}

/* ----------------------------------------------------------- nvJPEG
 *
 * nvJPEG does not run here: its stand-in decodes each image on the CPU
 * (libjpeg-turbo, at full size) straight into the simulated device
 * buffer, after checking that buffer's stream order like a kernel's
 * output.  So the loader's decode="gpu" path (file reads, device buffers,
 * the resize and normalize kernels, the copy stream's events) runs and is
 * checked; nvJPEG's own behaviour needs a GPU. */

struct ga_jpeg_decoder {
    int device;
    ga_image_workspace *ws;
};

int ga_cuda_nvjpeg_available(void)
{
    return ga_cpu_jpeg_available();
}

const char *ga_cuda_nvjpeg_version(void)
{
    return ga_cpu_jpeg_available() ? "simulated (libjpeg-turbo on the CPU)" : "";
}

ga_status ga_cuda_jpeg_decoder_create(int device, ga_jpeg_decoder **out, int *hardware)
{
    if (!ga_cpu_jpeg_available())
        return GA_STATUS(GA_ERR_NOT_SUPPORTED, "the simulator's nvJPEG stands on libjpeg-turbo, "
                                               "which this build lacks");
    ga_jpeg_decoder *d = calloc(1, sizeof *d);
    if (!d || !(d->ws = ga_cpu_image_workspace_new())) {
        free(d);
        return GA_STATUS(GA_ERR_HOST_OUT_OF_MEMORY, "no memory for a JPEG decoder");
    }
    d->device = device;
    *hardware = 0;
    *out = d;
    return ga_ok();
}

void ga_cuda_jpeg_decoder_destroy(ga_jpeg_decoder *d)
{
    if (d) {
        ga_cpu_image_workspace_free(d->ws);
        free(d);
    }
}

ga_status ga_cuda_jpeg_image_size(ga_jpeg_decoder *d, const uint8_t *data, size_t size,
                                  int64_t *width, int64_t *height)
{
    return ga_cpu_image_size(data, size, width, height, d->ws);
}

ga_status ga_cuda_decode_jpegs(ga_jpeg_decoder *d, int n, const uint8_t *const *data,
                               const size_t *sizes, uint8_t *const *dst, const int64_t *widths,
                               const int64_t *heights, int *bad, ga_stream stream)
{
    for (int i = 0; i < n; i++) {
        sim_operand ops[] = {bytes_operand(dst[i], (size_t)(widths[i] * heights[i] * 3), 1)};
        pthread_mutex_lock(&sim_lock);
        ga_status status = launch(d->device, stream, ops, 1);
        pthread_mutex_unlock(&sim_lock);
        if (status.error)
            return status;
        /* the whole image at its own size: a resize to the same size */
        ga_image_transform full;
        memset(&full, 0, sizeof full);
        full.out_h = full.resize_h = heights[i];
        full.out_w = full.resize_w = widths[i];
        bad[i] = ga_cpu_decode_image(data[i], sizes[i], &full, 0, dst[i], d->ws, NULL).error != 0;
    }
    return ga_ok();
}
