/*
 * sim.c — a simulated CUDA runtime that checks stream ordering (a test
 * build: GPUACCEL_SIM=1, never a release).
 *
 * The CUDA paths of csrc/ (the device pool's cross-stream bookkeeping,
 * transfers, streams and events, DLPack stream handoff, the loader's copy
 * stream, CUDA graph capture) decide *when* the GPU may touch memory; on a
 * machine without a GPU nothing else runs them.  This backend stands in
 * for the runtime: "device" memory is host memory, every queued operation
 * runs at once (so results are as if the GPU ran in order), and a vector
 * clock per stream records what each operation is guaranteed to follow
 * under CUDA's rules:
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
 * Stream capture, as the CUDA programming guide defines it: between
 * begin and end capture, work queued on the stream (and on streams that
 * join the capture by waiting on an event recorded in it) is recorded into
 * a graph, not run; cudaMallocAsync / cudaFreeAsync there become the
 * graph's allocation and free nodes, whose memory the graph owns.  What a
 * capture forbids fails as CUDA fails it, with CUDA's error, and
 * invalidates the capture (its end then fails too): synchronizing or
 * querying a capturing stream, a device with a capture, or an event
 * recorded in a capture; a wait on an event recorded outside the capture
 * (cudaErrorStreamCaptureIsolation); the legacy default stream while a
 * blocking stream of its device captures; a free of memory the graph does
 * not own; and the calls that may synchronize (stream, event and device
 * queries and synchronization, pinned allocation and free) from a thread
 * that the capture's mode and the thread's own mode
 * (cudaThreadExchangeStreamCaptureMode) forbid them.  A
 * graph launch replays its nodes in capture order on the launch stream,
 * after the graph's previous launch, each checked like an operation queued
 * then: so memory a graph kept the pointer of and that was freed since is
 * a use of freed memory.  (Branches of one graph replay one after another,
 * so a race between them is not seen.)
 *
 * Kernels run at once on the simulated memory, so results can be checked
 * as well, and they are the CUDA backend's own: kernels/cuda compiled by
 * the host C++ compiler through kernels/cudacpu, which runs each CUDA
 * thread as a fiber (see kernels/cudacpu/cudacpu.h), with its entry points
 * renamed (kernels/sim/kernel_names.h) so that the ga_cuda_* functions
 * here can check an operation first and then call them.  cuBLASLt and
 * cuDNN do not run here: a matmul takes the path ga_cuda_matmul takes when
 * cuBLASLt cannot fuse it (the generic GEMM kernel and the epilogue
 * kernels), a conv the direct kernels (kernels/cuda/fallback.h); like
 * conv.cu, a capturing conv runs only with a plan its thread made eagerly
 * for the same problem.  Each operand's byte extent must lie in one
 * allocation of the kernel's device or in pinned memory (a small
 * memcheck).  Timings and engine choice are not simulated; cuDNN's plan
 * cache is, as far as csrc/ sees it (see conv_setup).
 *
 * Environment: GPUACCEL_SIM_DEVICES (default 2) devices of 16 GiB each;
 * GPUACCEL_SIM_EVENT_QUERY_FAILS=1 (read at each query) makes event
 * queries fail as on a device that hit a fault (cudaErrorLaunchFailure).
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep, strdup */

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nvtx3/nvToolsExt.h>

#include "../conv_key.h"
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

typedef struct sim_graph sim_graph;

typedef struct sim_stream {
    int id, device, kind, priority;
    int released; /* back in the pool: a valid stream, handed out again */
    vclock vc;
    sim_graph *capture; /* the capture its work goes into, or NULL */
    vclock cap;         /* in a capture: how many captured nodes of each stream it follows */
} sim_stream;

typedef struct sim_event {
    int recorded, device;
    vclock vc;
    uint64_t capture; /* last recorded in this capture (its id), or 0 */
    vclock cap;       /* then: the captured nodes it follows */
} sim_event;

typedef struct region {
    char *ptr;
    size_t size;
    int kind; /* 1 pinned, 2 device */
    int device, freed, written;
    vclock alloc, last_write, reads;
    /* a graph allocation: the graph whose node allocates it (the address
     * stays the graph's; freed means not allocated now), until the graph
     * is destroyed */
    sim_graph *graph;
    int pooled;    /* allocated from the device's pool (not a graph's) */
    int node_refs; /* graph nodes that name it: kept while they exist */
    struct region *next;
} region;

/* What an operation does, kept so that a captured one can run again. */
typedef enum {
    OP_MEMCPY,
    OP_COPY,
    OP_FILL,
    OP_BIAS_ACTIVATION,
    OP_ACTIVATION_BACKWARD,
    OP_NORMALIZE,
    OP_RESIZE,
    OP_LOGGER_UPDATE,
    OP_LOGGER_RESET,
    OP_MATMUL,
    OP_CONV_FORWARD,
    OP_CONV_BACKWARD,
} sim_op_kind;

typedef struct {
    sim_op_kind kind;
    int device;
    union {
        struct {
            void *dst;
            const void *src;
            size_t size;
        } memcpy;
        struct {
            ga_tensor dst, src;
        } copy;
        struct {
            ga_tensor dst;
            ga_scalar value;
        } fill;
        ga_bias_act_desc bias_act;
        ga_act_backward_desc act_backward;
        ga_normalize_desc normalize;
        ga_resize_job resize;
        ga_logger_update logger;
        struct {
            void *state;
            int max_metrics;
            int64_t capacity, first_step, nsteps;
        } reset;
        struct {
            ga_matmul_desc desc;
            /* the bias gradient's partial sums go here: a replay passes it
             * again (inside a capture, memory the graph owns) */
            void *workspace;
            size_t workspace_size;
        } matmul;
        ga_conv_desc conv;
        struct {
            ga_conv_geometry geom;
            ga_tensor a, b, out;
            int filter;
        } conv_backward;
    } u;
} sim_op;

/* One operand of a simulated operation: the bytes [lo, hi) it may touch
 * and whether it writes them.  lo NULL: an empty operand, not checked. */
typedef struct {
    const char *lo, *hi;
    int write;
} sim_operand;

#define SIM_MAX_OPERANDS (1 + GA_LOGGER_MAX_PER_CALL)

enum { NODE_OP, NODE_ALLOC, NODE_FREE };

typedef struct sim_node {
    int kind;
    sim_op op;                         /* NODE_OP */
    sim_operand ops[SIM_MAX_OPERANDS]; /* NODE_OP: what it touches */
    int n_ops;
    int kernel_device; /* NODE_OP: a kernel's device, or -1 for a copy */
    region *region;    /* NODE_ALLOC, NODE_FREE */
    struct sim_node *next;
} sim_node;

/* A capture while it lasts, then the graph it made. */
struct sim_graph {
    uint64_t id;
    int device, mode;
    uint64_t thread; /* the thread that began the capture */
    sim_stream *origin;
    int capturing, invalidated;
    char why[640]; /* what invalidated it */
    sim_node *first, *last;
    vclock done; /* its last launch happens before this */
    sim_graph *next_capture;
};

static pthread_mutex_t sim_lock = PTHREAD_MUTEX_INITIALIZER;
static sim_stream *streams[SIM_MAX_STREAMS];
static int n_streams;
static sim_stream *legacy[SIM_MAX_DEVICES];
static region *regions;
static uint64_t device_bytes[SIM_MAX_DEVICES];
/* The device's memory pool as CUDA keeps it: what its live allocations use,
 * what it holds reserved (freed memory stays, for reuse, until a
 * synchronization releases what is above the release threshold, or a
 * trim), and that threshold (0 for a new pool, as in CUDA). */
static uint64_t pool_used[SIM_MAX_DEVICES], pool_reserved[SIM_MAX_DEVICES];
static uint64_t pool_peak[SIM_MAX_DEVICES], pool_threshold[SIM_MAX_DEVICES];
static __thread sim_stream *per_thread[SIM_MAX_DEVICES];
/* What the host has seen finish.  One for the process, not per thread:
 * host threads order their work with mutexes the simulator cannot see (a
 * loader worker writes a buffer whose copy the thread that set it up
 * waited for), and in the one interleaving a run explores, work queued
 * after a wait returned does follow it. */
static vclock host_seen;
static __thread int current_device;
/* Captures in progress; the thread's capture mode (cudaThreadExchange-
 * StreamCaptureMode); ids for captures and threads. */
static sim_graph *captures;
static __thread int thread_mode = GA_CAPTURE_GLOBAL;
static uint64_t last_capture_id, last_thread_token;
static __thread uint64_t thread_token;

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
        return violation(r->graph ? "use of a graph's allocation while it is not allocated (its "
                                    "graph freed it, or has not run up to its allocation)"
                                  : "use of freed memory",
                         r, s);
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

/* ------------------------------------------------------- stream capture */

static void drop_old_freed(void);
static ga_status run_op(const sim_op *op, ga_stream stream, const vclock *v);

static uint64_t my_thread(void)
{
    if (!thread_token)
        thread_token = __atomic_add_fetch(&last_thread_token, 1, __ATOMIC_RELAXED);
    return thread_token;
}

static const char *mode_name(int mode)
{
    return mode == GA_CAPTURE_GLOBAL         ? "global"
           : mode == GA_CAPTURE_THREAD_LOCAL ? "thread-local"
                                             : "relaxed";
}

static __thread char capture_text[640];

static void invalidate(sim_graph *g, const char *why)
{
    if (g && !g->invalidated) {
        g->invalidated = 1;
        snprintf(g->why, sizeof g->why, "%s", why);
    }
}

/* CUDA's error `code` (`name`) for `call`, whose text is in capture_text. */
static ga_status capture_status(int code, const char *name, const char *call)
{
    return ga_status_make(GA_ERR_CUDA, code, name, capture_text, call, __FILE__, __LINE__);
}

/* A call that a capture forbids: CUDA's error, and the captures g and g2
 * (either may be NULL) invalidated, as CUDA invalidates them. */
static ga_status capture_violation(int code, const char *name, const char *call, const char *what,
                                   sim_graph *g, sim_graph *g2)
{
    snprintf(capture_text, sizeof capture_text, "simulated CUDA: %s", what);
    invalidate(g, capture_text);
    invalidate(g2, capture_text);
    return capture_status(code, name, call);
}

static sim_graph *capture_of_id(uint64_t id)
{
    for (sim_graph *g = captures; g; g = g->next_capture)
        if (g->id == id)
            return g;
    return NULL;
}

/* Whether `g` forbids the calling thread the calls that may synchronize
 * (by the capture's mode and the thread's own). */
static int forbids(const sim_graph *g)
{
    if (thread_mode == GA_CAPTURE_RELAXED || g->mode == GA_CAPTURE_RELAXED)
        return 0;
    return g->thread == my_thread() ||
           (thread_mode == GA_CAPTURE_GLOBAL && g->mode == GA_CAPTURE_GLOBAL);
}

/* A call that may synchronize (`call`): refused while a capture forbids it
 * to this thread, which invalidates every such capture.  Called locked. */
static ga_status may_synchronize(const char *call)
{
    sim_graph *first = NULL;
    for (sim_graph *g = captures; g; g = g->next_capture)
        if (forbids(g) && !first)
            first = g;
    if (!first)
        return ga_ok();
    snprintf(capture_text, sizeof capture_text,
             "simulated CUDA: %s may synchronize, which a stream capture in progress (%s mode, "
             "begun by %s) forbids to this thread (%s mode)",
             call, mode_name(first->mode),
             first->thread == my_thread() ? "this thread" : "another thread",
             mode_name(thread_mode));
    for (sim_graph *g = captures; g; g = g->next_capture)
        if (forbids(g))
            invalidate(g, capture_text);
    return capture_status(900, "cudaErrorStreamCaptureUnsupported", call);
}

/* Whether work can be queued on `s` (by `call`) as captures stand: not on
 * a stream whose capture is invalidated, and not on the legacy default
 * stream while a blocking stream of its device is captured (it would wait
 * for, and be waited on by, work that does not run).  Called locked. */
static ga_status stream_usable(sim_stream *s, const char *call)
{
    if (s->capture && s->capture->invalidated) {
        snprintf(capture_text, sizeof capture_text,
                 "simulated CUDA: %s on a stream whose capture was invalidated earlier (%.480s)",
                 call, s->capture->why);
        return capture_status(901, "cudaErrorStreamCaptureInvalidated", call);
    }
    if (s->kind != SIM_LEGACY)
        return ga_ok();
    for (int k = 0; k < n_streams; k++) {
        sim_stream *o = streams[k];
        if (o->capture && o->device == s->device && o->kind == SIM_PER_THREAD)
            return capture_violation(906, "cudaErrorStreamCaptureImplicit", call,
                                     "the legacy default stream was used while a blocking stream "
                                     "of its device (a per-thread default stream) is captured",
                                     o->capture, NULL);
    }
    return ga_ok();
}

/* Appends a node, queued on `s`, to the capture `s` is in.  Called locked. */
static ga_status capture_node(sim_stream *s, int kind, const sim_op *op, const sim_operand *ops,
                              int n, int kernel_device, region *r)
{
    sim_node *node = calloc(1, sizeof *node);
    if (!node)
        return GA_STATUS(GA_ERR_HOST_OUT_OF_MEMORY, "simulated CUDA: no memory for a graph node");
    node->kind = kind;
    if (op)
        node->op = *op;
    if (n)
        memcpy(node->ops, ops, (size_t)n * sizeof *ops);
    node->n_ops = n;
    node->kernel_device = kernel_device;
    node->region = r;
    if (r)
        r->node_refs++;
    sim_graph *g = s->capture;
    if (g->last)
        g->last->next = node;
    else
        g->first = node;
    g->last = node;
    s->cap.c[s->id]++;
    return ga_ok();
}

/* The capture is over: its streams run their work again.  Called locked. */
static void leave_capture(sim_graph *g)
{
    for (sim_graph **link = &captures; *link; link = &(*link)->next_capture)
        if (*link == g) {
            *link = g->next_capture;
            break;
        }
    for (int k = 0; k < n_streams; k++)
        if (streams[k]->capture == g) {
            streams[k]->capture = NULL;
            memset(&streams[k]->cap, 0, sizeof streams[k]->cap);
        }
    g->capturing = 0;
}

/* Frees a graph (its capture over).  Its allocations that are not
 * allocated now go with it; one that is (an output its last launch left
 * allocated) becomes an ordinary allocation, freed by cudaFreeAsync.
 * Called locked. */
static void graph_free(sim_graph *g)
{
    for (sim_node *node = g->first, *next; node; node = next) {
        next = node->next;
        if (node->region)
            node->region->node_refs--;
        free(node);
    }
    for (region *r = regions; r; r = r->next)
        if (r->graph == g)
            r->graph = NULL;
    free(g);
    drop_old_freed();
}

/* A synchronization with work of `device` (cudaStreamSynchronize,
 * cudaEventSynchronize, cudaDeviceSynchronize): its pool gives back to the
 * device the freed memory above its release threshold.  Called locked. */
static void pool_release(int device)
{
    if (device < 0 || device >= SIM_MAX_DEVICES || pool_reserved[device] <= pool_threshold[device])
        return;
    pool_reserved[device] =
        pool_used[device] > pool_threshold[device] ? pool_used[device] : pool_threshold[device];
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
    uint64_t held = device_bytes[device] + (pool_reserved[device] - pool_used[device]);
    *free_bytes = held < SIM_MEMORY ? SIM_MEMORY - held : 0;
    pthread_mutex_unlock(&sim_lock);
    return ga_ok();
}

ga_status ga_cuda_device_synchronize(int device)
{
    if (device < 0 || device >= device_count())
        return SIM_STATUS("device ordinal out of range");
    pthread_mutex_lock(&sim_lock);
    ga_status status = ga_ok();
    for (int k = 0; k < n_streams && !status.error; k++)
        if (streams[k]->device == device && streams[k]->capture)
            status =
                capture_violation(900, "cudaErrorStreamCaptureUnsupported", "cudaDeviceSynchronize",
                                  "a device was synchronized while one of its streams is "
                                  "captured",
                                  streams[k]->capture, NULL);
    if (!status.error)
        status = may_synchronize("cudaDeviceSynchronize");
    for (int k = 0; k < n_streams && !status.error; k++)
        if (streams[k]->device == device)
            join(&host_seen, &streams[k]->vc);
    if (!status.error)
        pool_release(device);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_thread_init(int device)
{
    if (device < 0 || device >= device_count())
        return SIM_STATUS("device ordinal out of range");
    current_device = device;
    thread_mode = GA_CAPTURE_RELAXED; /* as kernels/cuda/runtime.cu */
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

/* Synchronize (query: `call` says which) a stream: refused while it is
 * captured or a capture forbids it. */
static ga_status stream_wait_host(int device, ga_stream stream, const char *call)
{
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    ga_status status = resolve(device, stream, &s);
    if (!status.error)
        status = stream_usable(s, call);
    if (!status.error && s->capture)
        status = capture_violation(900, "cudaErrorStreamCaptureUnsupported", call,
                                   "a stream was synchronized or queried while it is captured",
                                   s->capture, NULL);
    if (!status.error)
        status = may_synchronize(call);
    if (!status.error)
        join(&host_seen, &s->vc);
    if (!status.error && strcmp(call, "cudaStreamSynchronize") == 0)
        pool_release(s->device);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_stream_synchronize(int device, ga_stream stream)
{
    return stream_wait_host(device, stream, "cudaStreamSynchronize");
}

ga_status ga_cuda_stream_query(int device, ga_stream stream, int *done)
{
    *done = 1; /* everything has run */
    ga_status status = stream_wait_host(device, stream, "cudaStreamQuery");
    if (status.error)
        *done = 0;
    return status;
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

/* `s` waits for what a record on a captured stream (or an event recorded
 * there) follows, `cap`: inside its capture `g`, joining it when `s` is in
 * none.  Called locked. */
static ga_status wait_captured(sim_stream *s, sim_graph *g, const vclock *cap, const char *call)
{
    if (s->capture == g) {
        join(&s->cap, cap);
        return ga_ok();
    }
    if (s->capture)
        return capture_violation(902, "cudaErrorStreamCaptureMerge", call,
                                 "a captured stream waited on work of another capture", s->capture,
                                 g);
    if (s->kind == SIM_LEGACY)
        return capture_violation(906, "cudaErrorStreamCaptureImplicit", call,
                                 "the legacy default stream cannot join a capture", g, NULL);
    s->capture = g; /* a fork: its work goes into the capture from now on */
    s->cap = *cap;
    return ga_ok();
}

ga_status ga_cuda_stream_wait_event(int device, ga_stream stream, ga_event event)
{
    static const char *const call = "cudaStreamWaitEvent";
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    sim_event *e = (sim_event *)event;
    ga_status status = resolve(device, stream, &s);
    if (!status.error)
        status = stream_usable(s, call);
    if (!status.error && e->recorded) {
        sim_graph *g = e->capture ? capture_of_id(e->capture) : NULL;
        if (e->capture && !g)
            status = capture_violation(907, "cudaErrorCapturedEvent", call,
                                       "a wait on an event last recorded in a capture that is over",
                                       s->capture, NULL);
        else if (g)
            status = wait_captured(s, g, &e->cap, call);
        else if (s->capture)
            status = capture_violation(905, "cudaErrorStreamCaptureIsolation", call,
                                       "a captured stream waited on an event recorded outside the "
                                       "capture",
                                       s->capture, NULL);
        else
            join(&s->vc, &e->vc);
    }
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_stream_wait_stream(int consumer_device, ga_stream consumer, int producer_device,
                                     ga_stream producer)
{
    static const char *const call = "cudaStreamWaitEvent";
    pthread_mutex_lock(&sim_lock);
    sim_stream *c = NULL, *p = NULL;
    ga_status status = resolve(consumer_device, consumer, &c);
    if (!status.error)
        status = resolve(producer_device, producer, &p);
    if (!status.error && c != p)
        status = stream_usable(p, "cudaEventRecord");
    if (!status.error && c != p)
        status = stream_usable(c, call);
    if (!status.error && c != p) {
        /* an event recorded on p, waited on by c */
        if (p->capture)
            status = wait_captured(c, p->capture, &p->cap, call);
        else if (c->capture)
            status = capture_violation(905, "cudaErrorStreamCaptureIsolation", call,
                                       "a captured stream waited on an event recorded outside the "
                                       "capture",
                                       c->capture, NULL);
        else {
            vclock v = queue_op(p);
            join(&c->vc, &v);
        }
    }
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_stream_capturing(ga_stream stream, int *capturing)
{
    *capturing = 0;
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    ga_status status = ga_ok();
    if ((uintptr_t)stream <= 2) {
        status = resolve(current_device, stream, &s);
    } else {
        for (int k = 0; k < n_streams && !s; k++)
            if (streams[k] == (sim_stream *)stream)
                s = streams[k];
        if (!s)
            status = SIM_STATUS("not a stream handle");
    }
    /* the legacy default stream takes part in a blocking stream's capture:
     * cudaStreamIsCapturing refuses to answer for it then */
    for (int k = 0; s && s->kind == SIM_LEGACY && k < n_streams && !status.error; k++)
        if (streams[k]->capture && streams[k]->device == s->device &&
            streams[k]->kind == SIM_PER_THREAD) {
            snprintf(capture_text, sizeof capture_text,
                     "simulated CUDA: the legacy default stream was asked about while a blocking "
                     "stream of its device (a per-thread default stream) is captured");
            status = capture_status(906, "cudaErrorStreamCaptureImplicit", "cudaStreamIsCapturing");
        }
    /* as cudaStreamIsCapturing's cudaStreamCaptureStatusActive */
    if (s && !status.error)
        *capturing = s->capture && !s->capture->invalidated;
    pthread_mutex_unlock(&sim_lock);
    return status;
}

/* ---------------------------------------------------------------- graphs */

ga_status ga_cuda_stream_begin_capture(int device, ga_stream stream, int mode)
{
    static const char *const call = "cudaStreamBeginCapture";
    if (mode < GA_CAPTURE_GLOBAL || mode > GA_CAPTURE_RELAXED)
        return SIM_STATUS("not a stream capture mode");
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    sim_graph *g = NULL;
    ga_status status = resolve(device, stream, &s);
    if (!status.error && s->kind == SIM_LEGACY) {
        snprintf(capture_text, sizeof capture_text,
                 "simulated CUDA: the legacy default stream cannot be captured");
        status = capture_status(900, "cudaErrorStreamCaptureUnsupported", call);
    } else if (!status.error && s->capture) {
        snprintf(capture_text, sizeof capture_text,
                 "simulated CUDA: the stream is being captured already");
        status = capture_status(401, "cudaErrorIllegalState", call);
    } else if (!status.error && !(g = calloc(1, sizeof *g))) {
        status = GA_STATUS(GA_ERR_HOST_OUT_OF_MEMORY, "simulated CUDA: no memory for a graph");
    }
    if (!status.error) {
        g->id = ++last_capture_id;
        g->device = device;
        g->mode = mode;
        g->thread = my_thread();
        g->origin = s;
        g->capturing = 1;
        g->next_capture = captures;
        captures = g;
        s->capture = g;
        memset(&s->cap, 0, sizeof s->cap);
    }
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_stream_end_capture(int device, ga_stream stream, ga_graph *out)
{
    static const char *const call = "cudaStreamEndCapture";
    *out = NULL;
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    ga_status status = resolve(device, stream, &s);
    sim_graph *g = s ? s->capture : NULL;
    if (!status.error && !g) {
        snprintf(capture_text, sizeof capture_text, "simulated CUDA: the stream is not captured");
        status = capture_status(401, "cudaErrorIllegalState", call);
    } else if (!status.error && g->origin != s) {
        status = capture_violation(903, "cudaErrorStreamCaptureUnmatched", call,
                                   "a capture was ended on a stream that joined it, not on the "
                                   "one that began it",
                                   g, NULL);
    } else if (!status.error && g->mode != GA_CAPTURE_RELAXED && g->thread != my_thread()) {
        snprintf(capture_text, sizeof capture_text,
                 "simulated CUDA: a %s capture was ended by another thread than the one that "
                 "began it",
                 mode_name(g->mode));
        status = capture_status(908, "cudaErrorStreamCaptureWrongThread", call);
    } else if (!status.error) {
        /* every stream that joined must have been joined back */
        for (int k = 0; k < n_streams && !g->invalidated; k++) {
            sim_stream *m = streams[k];
            if (m->capture == g && m != s && s->cap.c[m->id] < m->cap.c[m->id])
                invalidate(g, "simulated CUDA: a stream that joined the capture has work the "
                              "capturing stream did not wait for (an unjoined fork)");
        }
        int unjoined = g->invalidated && strstr(g->why, "unjoined fork") != NULL;
        leave_capture(g);
        if (g->invalidated) {
            snprintf(capture_text, sizeof capture_text, "%s", g->why);
            status = unjoined ? capture_status(904, "cudaErrorStreamCaptureUnjoined", call)
                              : capture_status(901, "cudaErrorStreamCaptureInvalidated", call);
            graph_free(g);
        } else {
            *out = (ga_graph)g;
        }
    }
    pthread_mutex_unlock(&sim_lock);
    return status;
}

/* The graph's nodes in order on `s`, after its previous launch, each
 * checked as an operation queued then.  Called locked. */
static ga_status replay(sim_graph *g, sim_stream *s, ga_stream handle)
{
    join(&s->vc, &g->done);
    ga_status status = ga_ok();
    /* instantiated to free, before a launch, what the last one left
     * allocated (kernels/cuda/runtime.cu: AutoFreeOnLaunch) */
    for (region *r = regions; r && !status.error; r = r->next)
        if (r->graph == g && !r->freed) {
            vclock v = queue_op(s);
            status = check_region(r, &v, 1, s);
            if (!status.error) {
                r->freed = 1;
                device_bytes[r->device] -= r->size;
            }
        }
    for (sim_node *node = g->first; node && !status.error; node = node->next) {
        vclock v = queue_op(s);
        region *r = node->region;
        switch (node->kind) {
        case NODE_OP:
            status = access_all(node->ops, node->n_ops, &v, s, node->kernel_device);
            if (!status.error)
                status = run_op(&node->op, handle, &v);
            break;
        case NODE_ALLOC:
            r->freed = 0;
            r->written = 0;
            r->alloc = v;
            memset(&r->last_write, 0, sizeof r->last_write);
            memset(&r->reads, 0, sizeof r->reads);
            device_bytes[r->device] += r->size;
            break;
        case NODE_FREE:
            status = check_region(r, &v, 1, s);
            if (!status.error) {
                r->freed = 1;
                device_bytes[r->device] -= r->size;
            }
            break;
        }
    }
    g->done = s->vc;
    return status;
}

ga_status ga_cuda_graph_launch(int device, ga_graph graph, ga_stream stream)
{
    sim_graph *g = (sim_graph *)graph;
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    ga_status status = resolve(device, stream, &s);
    if (!status.error)
        status = stream_usable(s, "cudaGraphLaunch");
    if (!status.error && g->device != device)
        status = SIM_STATUS("a graph launched on a stream of another device than its own");
    if (!status.error && s->capture)
        status = GA_STATUS(GA_ERR_NOT_SUPPORTED,
                           "simulated CUDA: a graph launched into a capture (a child graph) is "
                           "not simulated");
    if (!status.error)
        status = replay(g, s, stream);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_graph_destroy(int device, ga_graph graph)
{
    (void)device;
    if (!graph)
        return ga_ok();
    pthread_mutex_lock(&sim_lock);
    graph_free((sim_graph *)graph);
    pthread_mutex_unlock(&sim_lock);
    return ga_ok();
}

ga_status ga_cuda_exchange_capture_mode(int *mode)
{
    if (*mode < GA_CAPTURE_GLOBAL || *mode > GA_CAPTURE_RELAXED)
        return SIM_STATUS("not a stream capture mode");
    int previous = thread_mode;
    thread_mode = *mode;
    *mode = previous;
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
    if (!status.error)
        status = stream_usable(s, "cudaEventRecord");
    if (!status.error && s->capture) {
        /* no node: inside the capture it marks a point to wait for */
        e->capture = s->capture->id;
        e->cap = s->cap;
        e->recorded = 1;
    } else if (!status.error) {
        e->vc = queue_op(s);
        e->capture = 0;
        e->recorded = 1;
    }
    pthread_mutex_unlock(&sim_lock);
    return status;
}

/* Synchronize (query) an event: `call` says which. */
static ga_status event_wait_host(sim_event *e, const char *call)
{
    ga_status status = ga_ok();
    if (e->capture)
        status = capture_violation(907, "cudaErrorCapturedEvent", call,
                                   "an event last recorded in a capture was synchronized or "
                                   "queried",
                                   capture_of_id(e->capture), NULL);
    if (!status.error)
        status = may_synchronize(call);
    if (!status.error)
        join(&host_seen, &e->vc);
    return status;
}

ga_status ga_cuda_event_synchronize(int device, ga_event event)
{
    (void)device;
    pthread_mutex_lock(&sim_lock);
    sim_event *e = (sim_event *)event;
    ga_status status = event_wait_host(e, "cudaEventSynchronize");
    if (!status.error && e->recorded)
        pool_release(e->device);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_event_query(int device, ga_event event, int *done)
{
    (void)device;
    *done = 0;
    const char *fails = getenv("GPUACCEL_SIM_EVENT_QUERY_FAILS");
    if (fails && strcmp(fails, "1") == 0)
        return ga_status_make(GA_ERR_CUDA, 719, "cudaErrorLaunchFailure",
                              "simulated CUDA: a fault (GPUACCEL_SIM_EVENT_QUERY_FAILS=1)",
                              "cudaEventQuery", __FILE__, __LINE__);
    pthread_mutex_lock(&sim_lock);
    ga_status status = event_wait_host((sim_event *)event, "cudaEventQuery");
    pthread_mutex_unlock(&sim_lock);
    *done = !status.error; /* everything has run */
    return status;
}

ga_status ga_cuda_event_elapsed_ms(int device, ga_event start, ga_event end, float *ms)
{
    (void)device, (void)start, (void)end;
    *ms = 0;
    return ga_ok();
}

/* -------------------------------------------------------------- memory */

/* A new region of `size` bytes of `device`, not yet listed.  NULL when out
 * of host memory. */
static region *new_device_region(int device, size_t size)
{
    region *r = calloc(1, sizeof *r);
    char *p = r ? aligned_alloc(256, (size + 255) / 256 * 256) : NULL;
    if (!p) {
        free(r);
        return NULL;
    }
    r->ptr = p;
    r->size = size;
    r->kind = 2;
    r->device = device;
    return r;
}

ga_status ga_cuda_malloc_async(int device, size_t size, ga_stream stream, void **out)
{
    *out = NULL;
    if (size == 0)
        return ga_ok();
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    region *r = NULL;
    ga_status status = resolve(device, stream, &s);
    if (!status.error)
        status = stream_usable(s, "cudaMallocFromPoolAsync");
    if (status.error)
        goto done;
    if (device_bytes[device] + size > SIM_MEMORY) {
        status = GA_STATUS(GA_ERR_OUT_OF_MEMORY, "simulated CUDA: out of memory");
        goto done;
    }
    if (!(r = new_device_region(device, size))) {
        status = GA_STATUS(GA_ERR_OUT_OF_MEMORY, "simulated CUDA: out of host memory");
        goto done;
    }
    if (s->capture) {
        /* an allocation node: the graph owns the memory, allocated when a
         * launch reaches the node */
        r->graph = s->capture;
        r->freed = 1;
        status = capture_node(s, NODE_ALLOC, NULL, NULL, 0, -1, r);
        if (status.error) {
            free(r->ptr);
            free(r);
            goto done;
        }
    } else {
        r->alloc = queue_op(s);
        r->pooled = 1;
        device_bytes[device] += size;
        pool_used[device] += size;
        if (pool_used[device] > pool_reserved[device])
            pool_reserved[device] = pool_used[device];
        if (pool_reserved[device] > pool_peak[device])
            pool_peak[device] = pool_reserved[device];
    }
    r->next = regions;
    regions = r;
    *out = r->ptr;
done:
    pthread_mutex_unlock(&sim_lock);
    return status;
}

/* Freed regions stay listed (and their memory kept) so that a late use is
 * caught as such; the oldest are dropped beyond this many (not a graph's,
 * whose address stays the graph's, nor one a graph node names). */
#define SIM_KEEP_FREED 4096

static void drop_old_freed(void)
{
    int kept = 0;
    for (region **link = &regions; *link;) {
        region *r = *link;
        if (r->freed && !r->graph && !r->node_refs && ++kept > SIM_KEEP_FREED) {
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
    static const char *const call = "cudaFreeAsync";
    if (!ptr)
        return ga_ok();
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    ga_status status = resolve(device, stream, &s);
    region *r = NULL;
    if (!status.error)
        status = stream_usable(s, call);
    if (!status.error) {
        /* the live allocation at ptr, else a graph's (allocated or not) */
        r = find_region(ptr);
        if (r && r->freed)
            for (region *o = regions; o; o = o->next)
                if (o->ptr == ptr && o->graph)
                    r = o;
        if (!r || r->kind != 2 || r->ptr != ptr || r->device != device || (r->freed && !r->graph))
            status = SIM_STATUS("cudaFreeAsync of a pointer that is no allocation of this device");
    }
    if (!status.error && s->capture) {
        if (!r->graph)
            status = capture_violation(1, "cudaErrorInvalidValue", call,
                                       "during capture cudaFreeAsync makes a free node, which "
                                       "must free a graph's allocation; this memory was "
                                       "allocated outside any capture",
                                       s->capture, NULL);
        else
            status = capture_node(s, NODE_FREE, NULL, NULL, 0, -1, r);
    } else if (!status.error) {
        vclock v = queue_op(s);
        if (r->graph && r->freed)
            status = violation("cudaFreeAsync of a graph's allocation that is not allocated (its "
                               "graph freed it, or has not been launched)",
                               r, s);
        else
            status = check_region(r, &v, 1, s); /* after every use, like a write */
        if (!status.error) {
            r->freed = 1;
            device_bytes[device] -= r->size;
            if (r->pooled)
                pool_used[device] -= r->size; /* still reserved */
            drop_old_freed();
        }
    }
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_pool_set_release_threshold(int device, uint64_t bytes)
{
    if (device < 0 || device >= device_count())
        return SIM_STATUS("device ordinal out of range");
    pthread_mutex_lock(&sim_lock);
    pool_threshold[device] = bytes;
    pthread_mutex_unlock(&sim_lock);
    return ga_ok();
}

ga_status ga_cuda_pool_trim(int device)
{
    if (device < 0 || device >= device_count())
        return SIM_STATUS("device ordinal out of range");
    pthread_mutex_lock(&sim_lock);
    pool_reserved[device] = pool_used[device];
    pthread_mutex_unlock(&sim_lock);
    return ga_ok();
}

ga_status ga_cuda_pool_reserved(int device, uint64_t *current, uint64_t *peak)
{
    pthread_mutex_lock(&sim_lock);
    *current = device >= 0 && device < SIM_MAX_DEVICES ? pool_reserved[device] : 0;
    *peak = device >= 0 && device < SIM_MAX_DEVICES ? pool_peak[device] : 0;
    pthread_mutex_unlock(&sim_lock);
    return ga_ok();
}

ga_status ga_cuda_host_alloc(size_t size, void **out)
{
    *out = NULL;
    pthread_mutex_lock(&sim_lock);
    ga_status status = may_synchronize("cudaHostAlloc");
    pthread_mutex_unlock(&sim_lock);
    if (status.error)
        return status;
    region *r = calloc(1, sizeof *r);
    char *p = r ? aligned_alloc(4096, (size + 4095) / 4096 * 4096) : NULL;
    if (!p) {
        free(r);
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
    ga_status status = may_synchronize("cudaFreeHost");
    if (status.error) {
    } else if (!r || r->kind != 1 || r->ptr != ptr || r->freed) {
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

/* ---------------------------------------------------------- operations */

/* Runs an operation (queued with clock v) on the simulated memory. */
static ga_status run_op(const sim_op *op, ga_stream stream, const vclock *v)
{
    const int d = op->device;
    switch (op->kind) {
    case OP_MEMCPY:
        memmove(op->u.memcpy.dst, op->u.memcpy.src, op->u.memcpy.size);
        if (!find_region(op->u.memcpy.dst)) /* into pageable memory: done on return */
            join(&host_seen, v);
        return ga_ok();
    case OP_COPY: return ga_sim_kernel_copy(d, &op->u.copy.dst, &op->u.copy.src, stream);
    case OP_FILL: return ga_sim_kernel_fill(d, &op->u.fill.dst, op->u.fill.value, stream);
    case OP_BIAS_ACTIVATION: return ga_sim_kernel_bias_activation(d, &op->u.bias_act, stream);
    case OP_ACTIVATION_BACKWARD:
        return ga_sim_kernel_activation_backward(d, &op->u.act_backward, stream);
    case OP_NORMALIZE: return ga_sim_kernel_normalize_images(d, &op->u.normalize, stream);
    case OP_RESIZE: return ga_sim_kernel_resize_images(d, &op->u.resize, 1, stream);
    case OP_LOGGER_UPDATE: return ga_sim_kernel_logger_update(d, &op->u.logger, stream);
    case OP_LOGGER_RESET:
        return ga_sim_kernel_logger_reset_window(d, op->u.reset.state, op->u.reset.max_metrics,
                                                 op->u.reset.capacity, op->u.reset.first_step,
                                                 op->u.reset.nsteps, stream);
    case OP_MATMUL:
        return ga_cuda_matmul_unfused(d, &op->u.matmul.desc, 0, op->u.matmul.workspace,
                                      op->u.matmul.workspace_size, stream);
    case OP_CONV_FORWARD: return ga_cuda_conv2d_forward_direct(d, &op->u.conv, stream);
    case OP_CONV_BACKWARD: {
        const ga_conv_geometry *g = &op->u.conv_backward.geom;
        const ga_tensor *a = &op->u.conv_backward.a, *b = &op->u.conv_backward.b;
        const ga_tensor *out = &op->u.conv_backward.out;
        return op->u.conv_backward.filter
                   ? ga_cuda_conv2d_backward_filter_direct(d, g, a, b, out, stream)
                   : ga_cuda_conv2d_backward_data_direct(d, g, a, b, out, stream);
    }
    }
    return SIM_STATUS("unknown operation");
}

/* conv.cu runs a capturing call only with a cuDNN plan its thread has
 * ready (plans are kept per thread, whatever the stream): the problems
 * each thread ran eagerly, as hashes of their device and key
 * (kernels/conv_key.h, the key of conv.cu's plan cache). */
typedef struct {
    uint64_t thread, key;
} conv_plan;
static conv_plan *conv_plans;
static size_t n_conv_plans, conv_plans_capacity;

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t k = 0; k < n; k++) {
        h ^= b[k];
        h *= 1099511628211ull; /* FNV-1a */
    }
    return h;
}

static int conv_plan_ready(uint64_t key)
{
    uint64_t me = my_thread();
    for (size_t k = 0; k < n_conv_plans; k++)
        if (conv_plans[k].key == key && conv_plans[k].thread == me)
            return 1;
    return 0;
}

static void conv_plan_made(uint64_t key)
{
    if (conv_plan_ready(key))
        return;
    if (n_conv_plans == conv_plans_capacity) {
        size_t capacity = conv_plans_capacity ? 2 * conv_plans_capacity : 64;
        conv_plan *grown = realloc(conv_plans, capacity * sizeof *grown);
        if (!grown)
            return; /* not remembered: a later capture of it is refused, as without a plan */
        conv_plans = grown;
        conv_plans_capacity = capacity;
    }
    conv_plans[n_conv_plans++] = (conv_plan){my_thread(), key};
}

static ga_status refuse_conv_capture(const char *op)
{
    snprintf(capture_text, sizeof capture_text,
             "%s: this shape has no cuDNN plan on this thread yet, and choosing one cannot run "
             "inside a CUDA graph capture; run one step with the same shapes, dtypes and layouts "
             "eagerly on this thread before capturing (a warm-up, as torch.cuda.graphs asks)",
             op);
    return capture_status(900, "cudaErrorStreamCaptureUnsupported", "cudaStreamIsCapturing");
}

/* An operation of `device` queued on `stream` that touches `ops` (a kernel
 * of kernel_device, or a copy engine's: -1): run at once, after
 * access_all's checks, or, on a captured stream, recorded into its graph.
 * conv_key (0: none): a conv's problem, which a capture runs only with a
 * plan (see conv_plans).  Called locked. */
static ga_status submit(int device, ga_stream stream, const sim_op *op, const sim_operand *ops,
                        int n, int kernel_device, uint64_t conv_key, const char *call)
{
    sim_stream *s = NULL;
    GA_TRY_STATUS(resolve(device, stream, &s));
    GA_TRY_STATUS(stream_usable(s, call));
    if (s->capture) {
        if (conv_key && !conv_plan_ready(conv_key))
            return refuse_conv_capture(op->kind == OP_CONV_FORWARD ? "conv2d"
                                       : op->u.conv_backward.filter
                                           ? "conv2d_backward (weight gradient)"
                                           : "conv2d_backward (input gradient)");
        return capture_node(s, NODE_OP, op, ops, n, kernel_device, NULL);
    }
    vclock v = queue_op(s);
    GA_TRY_STATUS(access_all(ops, n, &v, s, kernel_device));
    GA_TRY_STATUS(run_op(op, stream, &v));
    if (conv_key)
        conv_plan_made(conv_key);
    return ga_ok();
}

ga_status ga_cuda_memcpy_async(int device, void *dst, const void *src, size_t size,
                               ga_stream stream)
{
    sim_op op = {.kind = OP_MEMCPY, .device = device};
    op.u.memcpy.dst = dst;
    op.u.memcpy.src = src;
    op.u.memcpy.size = size;
    sim_operand ops[2] = {bytes_operand(src, size, 0), bytes_operand(dst, size, 1)};
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    ga_status status = size ? submit(device, stream, &op, ops, 2, -1, 0, "cudaMemcpyAsync")
                            : resolve(device, stream, &s);
    pthread_mutex_unlock(&sim_lock);
    return status;
}

/* ------------------------------------------------------------- kernels */

/* A kernel of `device` on `stream`: see submit. */
static ga_status kernel(int device, ga_stream stream, const sim_op *op, const sim_operand *ops,
                        int n, uint64_t conv_key)
{
    pthread_mutex_lock(&sim_lock);
    ga_status status = submit(device, stream, op, ops, n, device, conv_key, "cudaLaunchKernel");
    pthread_mutex_unlock(&sim_lock);
    return status;
}

ga_status ga_cuda_copy(int device, const ga_tensor *dst, const ga_tensor *src, ga_stream stream)
{
    sim_op op = {.kind = OP_COPY, .device = device};
    op.u.copy.dst = *dst;
    op.u.copy.src = *src;
    sim_operand ops[2] = {tensor_operand(src, 0), tensor_operand(dst, 1)};
    return kernel(device, stream, &op, ops, 2, 0);
}

ga_status ga_cuda_fill(int device, const ga_tensor *dst, ga_scalar value, ga_stream stream)
{
    sim_op op = {.kind = OP_FILL, .device = device};
    op.u.fill.dst = *dst;
    op.u.fill.value = value;
    sim_operand ops[1] = {tensor_operand(dst, 1)};
    return kernel(device, stream, &op, ops, 1, 0);
}

/* The library calls run as gpuaccel's own kernels over the operands'
 * simulated memory (the unfused matmul, the direct conv), so the CUDA paths
 * of csrc/ around them (workspaces, helper copies, result arrays, streams)
 * run end to end.  The workspace is taken as written by every call, as a
 * library call may. */

static uint64_t matmul_calls;

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
    sim_op op = {.kind = OP_MATMUL, .device = device};
    op.u.matmul.desc = *desc;
    op.u.matmul.workspace = workspace;
    op.u.matmul.workspace_size = workspace_size;
    ga_status status = ga_cuda_matmul_check(desc);
    if (!status.error)
        status = kernel(device, stream, &op, ops, (int)(sizeof ops / sizeof *ops), 0);
    pthread_mutex_lock(&sim_lock);
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
    sim_op op = {.kind = OP_BIAS_ACTIVATION, .device = device};
    op.u.bias_act = *desc;
    return kernel(device, stream, &op, ops, (int)(sizeof ops / sizeof *ops), 0);
}

size_t ga_cuda_activation_backward_workspace(const ga_act_backward_desc *desc)
{
    return ga_sim_kernel_activation_backward_workspace(desc);
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
        bytes_operand(desc->workspace, desc->workspace_size, 1),
    };
    sim_op op = {.kind = OP_ACTIVATION_BACKWARD, .device = device};
    op.u.act_backward = *desc;
    return kernel(device, stream, &op, ops, (int)(sizeof ops / sizeof *ops), 0);
}

/* cuDNN's plan cache, as csrc/ sees it through ga_conv_tuning (kernels.h):
 * problems keyed as kernels/cuda keys them (kernels/conv_key.h).  A call
 * that may not tune, of a problem not met before, runs nothing and asks
 * for setup; the call that sets it up "tunes" — "sim" is the one engine: a
 * call that prefers it reuses it, any other tunes — taking
 * GPUACCEL_SIM_TUNE_SECONDS of wall time when that is set (a search takes
 * time, and tests see whether the caller let other threads run meanwhile);
 * later calls hit.  The direct kernels compute, as on the direct route. */
typedef struct sim_plan {
    int device;
    char *key;
    struct sim_plan *next;
} sim_plan;

static sim_plan *sim_plans;
static uint64_t sim_conv_hits, sim_conv_misses;

static int sim_plan_known(int device, const char *key)
{
    for (sim_plan *p = sim_plans; p; p = p->next)
        if (p->device == device && strcmp(p->key, key) == 0)
            return 1;
    return 0;
}

static void sim_tune_delay(void)
{
    const char *env = getenv("GPUACCEL_SIM_TUNE_SECONDS");
    double seconds = env && *env ? strtod(env, NULL) : 0.0;
    if (seconds > 0) {
        struct timespec ts;
        ts.tv_sec = (time_t)seconds;
        ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
        nanosleep(&ts, NULL);
    }
}

static const char *const conv_op_names[3] = {"conv2d", "conv2d_backward (input gradient)",
                                             "conv2d_backward (weight gradient)"};

/* Whether `stream` of `device` is captured now (an unknown stream is
 * left to the submission, which reports it). */
static int stream_captured(int device, ga_stream stream)
{
    pthread_mutex_lock(&sim_lock);
    sim_stream *s = NULL;
    int captured = !resolve(device, stream, &s).error && s->capture;
    pthread_mutex_unlock(&sim_lock);
    return captured;
}

/* The plan-cache half of a conv call: 1 when the call is done (it came
 * back for setup), 0 when the direct kernels are to run; *status a failure.
 * *capture_key: the problem's key for the capture check (see conv_plans),
 * 0 when it has none (conv.cu then takes the direct kernels, which a
 * capture may run).  As conv.cu, a search (a problem not met before) is
 * refused inside a capture before it starts. */
static int conv_setup(int device, ga_stream stream, ga_conv_key_op op, const ga_conv_geometry *geom,
                      const ga_tensor *x, const ga_tensor *w, const ga_tensor *y, const void *bias,
                      ga_activation act, const ga_tensor *preact, size_t workspace_size,
                      const ga_tensor *out, ga_conv_tuning *tuning, uint64_t *capture_key,
                      ga_status *status)
{
    *status = ga_ok();
    *capture_key = 0;
    if (tuning) {
        tuning->needs_setup = 0;
        tuning->choice_cached = 0;
        tuning->key[0] = '\0';
        tuning->chosen[0] = '\0';
        memset(&tuning->report, 0, sizeof tuning->report);
    }
    int64_t numel = 1;
    for (int d = 0; d < out->ndim && d < GA_MAX_NDIM; d++)
        numel *= out->shape[d];
    char key[GA_CONV_KEY_MAX];
    if (numel == 0 ||
        !ga_conv_key(key, sizeof key, op, geom, x, w, y, bias, act, preact, workspace_size))
        return 0; /* nothing to key: the kernels check and run (or do nothing) */
    uint64_t h = hash_bytes(14695981039346656037ull, &device, sizeof device);
    h = hash_bytes(h, key, strlen(key));
    *capture_key = h ? h : 1;
    int may_tune = !tuning || tuning->may_tune;
    pthread_mutex_lock(&sim_lock);
    int known = sim_plan_known(device, key);
    if (!tuning || !may_tune) {
        sim_conv_hits += known;
        sim_conv_misses += !known;
    }
    pthread_mutex_unlock(&sim_lock);
    if (tuning)
        snprintf(tuning->key, sizeof tuning->key, "%s", key);
    if (!known && !may_tune) {
        tuning->needs_setup = 1;
        return 1;
    }
    int tuned = 0;
    if (!known && stream_captured(device, stream)) {
        *status = refuse_conv_capture(conv_op_names[op]);
        return 1;
    }
    if (!known) {
        sim_tune_delay(); /* the search, outside the lock as cuDNN's would be */
        tuned = !(tuning && tuning->preferred && strcmp(tuning->preferred, "sim") == 0);
        sim_plan *p = malloc(sizeof *p);
        char *copy = strdup(key);
        if (!p || !copy) {
            free(p);
            free(copy);
            *status = GA_STATUS(GA_ERR_HOST_OUT_OF_MEMORY, "simulated cuDNN: plan cache");
            return 1;
        }
        pthread_mutex_lock(&sim_lock);
        p->device = device;
        p->key = copy;
        p->next = sim_plans;
        sim_plans = p;
        pthread_mutex_unlock(&sim_lock);
    }
    if (tuning) {
        snprintf(tuning->chosen, sizeof tuning->chosen, "sim");
        tuning->report.fallback = 1;
        tuning->report.tuned = tuned;
        tuning->report.cache_hit = known;
        sim_inject_fallback(&tuning->report);
    }
    return 0;
}

ga_status ga_cuda_conv2d_forward(int device, const ga_conv_desc *desc, void *workspace,
                                 size_t workspace_size, ga_stream stream, ga_conv_tuning *tuning)
{
    ga_status status;
    uint64_t key;
    if (conv_setup(device, stream, GA_CONV_KEY_FWD, &desc->geom, &desc->x, &desc->w, &desc->y,
                   desc->bias, desc->activation, &desc->preact, workspace ? workspace_size : 0,
                   &desc->y, tuning, &key, &status))
        return status;
    sim_operand ops[] = {
        tensor_operand(&desc->x, 0),
        tensor_operand(&desc->w, 0),
        tensor_operand(&desc->y, 1),
        bytes_operand(desc->bias, ga_dtype_itemsize(desc->x.dtype) * (size_t)desc->w.shape[0], 0),
        tensor_operand(&desc->preact, 1),
        bytes_operand(workspace, workspace_size, 1),
    };
    sim_op op = {.kind = OP_CONV_FORWARD, .device = device};
    op.u.conv = *desc;
    return kernel(device, stream, &op, ops, (int)(sizeof ops / sizeof *ops), key);
}

/* Both backward passes: `a` and `b` read, `out` written (dx from dy and w,
 * or dw from x and dy); x, w, y: the same in conv roles, for the key. */
static ga_status conv_backward(int device, const ga_conv_geometry *geom, const ga_tensor *a,
                               const ga_tensor *b, const ga_tensor *out, int filter,
                               void *workspace, size_t workspace_size, ga_stream stream,
                               ga_conv_tuning *tuning)
{
    const ga_tensor *x = filter ? a : out, *w = filter ? out : b, *y = filter ? b : a;
    ga_status status;
    uint64_t key;
    if (conv_setup(device, stream, filter ? GA_CONV_KEY_BWD_FILTER : GA_CONV_KEY_BWD_DATA, geom, x,
                   w, y, NULL, GA_ACT_NONE, NULL, workspace ? workspace_size : 0, out, tuning, &key,
                   &status))
        return status;
    sim_operand ops[] = {tensor_operand(a, 0), tensor_operand(b, 0), tensor_operand(out, 1),
                         bytes_operand(workspace, workspace_size, 1)};
    sim_op op = {.kind = OP_CONV_BACKWARD, .device = device};
    op.u.conv_backward.geom = *geom;
    op.u.conv_backward.a = *a;
    op.u.conv_backward.b = *b;
    op.u.conv_backward.out = *out;
    op.u.conv_backward.filter = filter;
    return kernel(device, stream, &op, ops, (int)(sizeof ops / sizeof *ops), key);
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
    *conv_hits = sim_conv_hits;
    *conv_misses = sim_conv_misses;
    pthread_mutex_unlock(&sim_lock);
}

ga_status ga_cuda_normalize_images(int device, const ga_normalize_desc *desc, ga_stream stream)
{
    size_t n = (size_t)(desc->n * desc->h * desc->w * desc->c);
    sim_operand ops[] = {bytes_operand(desc->src, n, 0),
                         bytes_operand(desc->dst, n * ga_dtype_itemsize(desc->dtype), 1)};
    sim_op op = {.kind = OP_NORMALIZE, .device = device};
    op.u.normalize = *desc;
    return kernel(device, stream, &op, ops, 2, 0);
}

ga_status ga_cuda_logger_update(int device, const ga_logger_update *u, ga_stream stream)
{
    sim_operand ops[1 + GA_LOGGER_MAX_PER_CALL];
    int n = u->n < 0 || u->n > GA_LOGGER_MAX_PER_CALL ? 0 : u->n;
    ops[0] = bytes_operand(u->state, ga_logger_state_bytes(u->capacity, u->max_metrics), 1);
    for (int k = 0; k < n; k++)
        ops[1 + k] = bytes_operand(u->value[k], ga_dtype_itemsize(u->dtype[k]), 0);
    sim_op op = {.kind = OP_LOGGER_UPDATE, .device = device};
    op.u.logger = *u;
    return kernel(device, stream, &op, ops, 1 + n, 0);
}

ga_status ga_cuda_logger_reset_window(int device, void *state, int max_metrics, int64_t capacity,
                                      int64_t first_step, int64_t nsteps, ga_stream stream)
{
    sim_operand ops[1] = {bytes_operand(state, ga_logger_state_bytes(capacity, max_metrics), 1)};
    sim_op op = {.kind = OP_LOGGER_RESET, .device = device};
    op.u.reset.state = state;
    op.u.reset.max_metrics = max_metrics;
    op.u.reset.capacity = capacity;
    op.u.reset.first_step = first_step;
    op.u.reset.nsteps = nsteps;
    return kernel(device, stream, &op, ops, 1, 0);
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
        sim_op op = {.kind = OP_RESIZE, .device = device};
        op.u.resize = *job;
        status = kernel(device, stream, &op, ops, 2, 0);
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
        sim_stream *s = NULL;
        ga_status status = resolve(d->device, stream, &s);
        if (!status.error)
            status = stream_usable(s, "nvjpegDecodeBatched");
        if (!status.error && s->capture)
            /* it decodes on the host at the call, so a graph could not
             * replay it; what nvJPEG does in a capture needs a GPU */
            status = GA_STATUS(GA_ERR_NOT_SUPPORTED,
                               "simulated CUDA: the simulator's nvJPEG stand-in cannot be "
                               "captured into a CUDA graph");
        if (!status.error) {
            vclock v = queue_op(s);
            status = access_all(ops, 1, &v, s, d->device);
        }
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
