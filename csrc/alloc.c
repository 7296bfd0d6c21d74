/*
 * alloc.c — gpuaccel's allocators: caching pools of pageable and pinned
 * host memory and the stream-ordered device pool; limits and statistics.
 *
 * Safety across streams: a block remembers, for every stream other than its
 * allocation stream that used it, an event recorded after that use.  A
 * device block is freed on its allocation stream after that stream has
 * waited on those events (GPU-side waits; the host never blocks); a stream
 * is named by device, handle and — for the per-thread default stream, a
 * different stream in each thread — thread (see home_stream).  A pinned
 * block goes back to the pool with its events and is handed out again only
 * once they have completed.
 *
 * CUDA graph capture: while a stream is captured, work queued on it is
 * recorded, not run, so none of the above happens there (no events are
 * recorded or waited on across the capture's boundary, which CUDA
 * refuses); memory allocated on a captured stream is the graph's
 * (cudaMallocAsync there is an allocation node) and is freed in the graph
 * when it goes before the capture ends; other memory freed on a captured
 * stream waits for the capture to end.  The allocator's own event queries
 * and pinned allocations run in relaxed capture mode, so that they never
 * invalidate a capture.
 */
#include "alloc.h"
#include "stream.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GA_HOST_ALIGNMENT 64
#define GA_SIZE_CLASSES 256
/* What gpuaccel's device pool keeps reserved through a synchronization
 * (of a stream, an event or the device): freed memory above it goes back to
 * the device, where torch's caching allocator (or any other) can have it;
 * below it, a freed block is handed out again without a driver call.  It
 * holds the library workspaces (workspace.c) and a few hundred MiB of
 * temporaries. */
#define GA_POOL_RELEASE_THRESHOLD ((uint64_t)512 << 20)
/* Pageable blocks this large are cached when freed (smaller ones malloc
 * recycles well by itself); idle cached bytes stay under host_cache_limit. */
#define GA_HOST_CACHE_MIN_BYTES ((size_t)64 << 10)

typedef struct {
    uint64_t allocated; /* bytes in live blocks */
    uint64_t peak;
    uint64_t limit; /* 0: none */
    uint64_t num_allocs, num_frees, num_ooms;
} ga_counters;

typedef struct pinned_entry {
    void *ptr;
    size_t capacity;
    int n_events;
    ga_event events[GA_BLOCK_MAX_USES];
    int devices[GA_BLOCK_MAX_USES];
    struct pinned_entry *next;
} pinned_entry;

static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t alloc_atfork_once = PTHREAD_ONCE_INIT;
static ga_counters host_counters; /* pageable; the CPU limit covers host + pinned */
static ga_counters pinned_counters;
static ga_counters device_counters[GA_MAX_DEVICES];
static int device_pool_used[GA_MAX_DEVICES];
static pinned_entry *pinned_free[GA_SIZE_CLASSES];
static uint64_t pinned_cached_bytes;
static uint64_t workspace_bytes[GA_MAX_DEVICES];
/* Device blocks freed while their stream was captured, freed once it is
 * not (see ga_block_free) */
static ga_block **deferred_frees;
static int n_deferred_frees, deferred_frees_capacity;

/* A cached pageable block keeps its free-list link in its own first bytes:
 * caching never allocates, so it cannot fail. */
typedef struct host_entry {
    struct host_entry *next;
} host_entry;
static host_entry *host_free[GA_SIZE_CLASSES];
static uint64_t host_cached_bytes;

/* Events are reused: creating one costs a driver call. */
typedef struct {
    ga_event *items;
    int count, capacity;
} event_stack;
static event_stack event_pool[GA_MAX_DEVICES];

static __thread char oom_message[640];

/* ----------------------------------------------------------- the lock */

/* fork() while another thread (a loader worker, say) holds alloc_lock would
 * leave the child's copy locked forever: hold it across the fork instead,
 * so that both copies come out consistent and unlocked. */
static void alloc_atfork_prepare(void)
{
    pthread_mutex_lock(&alloc_lock);
}

static void alloc_atfork_release(void)
{
    pthread_mutex_unlock(&alloc_lock);
}

static void alloc_register_atfork(void)
{
    pthread_atfork(alloc_atfork_prepare, alloc_atfork_release, alloc_atfork_release);
}

/* Every use of the pool goes through here; the fork handlers are in place
 * before the lock is first taken. */
static void alloc_lock_acquire(void)
{
    pthread_once(&alloc_atfork_once, alloc_register_atfork);
    pthread_mutex_lock(&alloc_lock);
}

/* --------------------------------------------------------------- events */

static ga_status event_get(int device, ga_event *out)
{
    event_stack *s = &event_pool[device];
    if (s->count > 0) {
        *out = s->items[--s->count];
        return ga_ok();
    }
    return ga_cuda_event_create(device, 0, out);
}

static void event_put(int device, ga_event ev)
{
    event_stack *s = &event_pool[device];
    if (s->count == s->capacity) {
        int cap = s->capacity ? 2 * s->capacity : 16;
        ga_event *items = realloc(s->items, (size_t)cap * sizeof *items);
        if (!items) {
            ga_cuda_event_destroy(device, ev);
            return;
        }
        s->items = items;
        s->capacity = cap;
    }
    s->items[s->count++] = ev;
}

/* ------------------------------------------------------- naming streams */

uint64_t ga_thread_token(void)
{
    static uint64_t next_token = 1;
    static __thread uint64_t token;
    if (!token)
        token = __atomic_fetch_add(&next_token, 1, __ATOMIC_RELAXED);
    return token;
}

/* Handle 2 names the calling thread's per-thread default stream: a
 * different stream in each thread.  Other handles name one stream each
 * (0 and 1 both the legacy default stream) per device. */
static uint64_t stream_thread(ga_stream stream)
{
    return stream == GA_STREAM_PER_THREAD ? ga_thread_token() : 0;
}

static int same_stream(ga_stream a, ga_stream b)
{
    uintptr_t x = (uintptr_t)a ? (uintptr_t)a : 1, y = (uintptr_t)b ? (uintptr_t)b : 1;
    return x == y;
}

/* The stream, named from the calling thread, that a device block's free is
 * queued on: its allocation stream — except another thread's per-thread
 * default stream, which cannot be named here; the legacy default stream
 * stands in for it, as every operation on it waits for all work queued
 * before on every blocking stream, per-thread ones included (and later
 * work on those waits for it). */
static ga_stream home_stream(const ga_block *b)
{
    if (b->stream == GA_STREAM_PER_THREAD && b->owner != ga_thread_token())
        return GA_STREAM_LEGACY;
    return b->stream;
}

/* Whether work queued on `stream` of `device` by the calling thread is
 * already ordered after the block's allocation and before its free. */
static int on_home_stream(const ga_block *b, int device, ga_stream stream)
{
    if (device != b->device || !same_stream(stream, b->stream))
        return 0;
    return stream != GA_STREAM_PER_THREAD || b->owner == ga_thread_token();
}

/* Index of the recorded use by `stream` of `device` (from this thread),
 * or -1. */
static int find_use(const ga_block *b, int device, ga_stream stream)
{
    uint64_t thread = stream_thread(stream);
    for (int k = 0; k < b->n_uses; k++)
        if (same_stream(b->use_streams[k], stream) && b->use_devices[k] == device &&
            b->use_threads[k] == thread)
            return k;
    return -1;
}

/* ------------------------------------------------------------ counters */

static void count_alloc(ga_counters *c, uint64_t bytes)
{
    c->allocated += bytes;
    c->num_allocs++;
    if (c->allocated > c->peak)
        c->peak = c->allocated;
}

static void count_free(ga_counters *c, uint64_t bytes)
{
    c->allocated -= bytes;
    c->num_frees++;
}

static ga_status oom_status(ga_error kind, const char *text)
{
    snprintf(oom_message, sizeof oom_message, "%s", text);
    return ga_status_make(kind, 0, NULL, oom_message, "gpuaccel allocator", __FILE__, __LINE__);
}

/* A limit would be exceeded: "out of memory on cuda:0: allocating X would
 * exceed the limit of Y set with set_memory_limit() (Z already allocated)". */
static ga_status limit_status(ga_counters *c, const char *where, uint64_t in_use, size_t size,
                              ga_error kind)
{
    char want[32], limit[32], used[32], text[512];
    snprintf(text, sizeof text,
             "out of memory on %s: allocating %s would exceed the limit of %s set with "
             "gpuaccel.set_memory_limit() (%s already allocated by gpuaccel)",
             where, ga_format_bytes(size, want, sizeof want),
             ga_format_bytes(c->limit, limit, sizeof limit),
             ga_format_bytes(in_use, used, sizeof used));
    c->num_ooms++;
    return oom_status(kind, text);
}

/* --------------------------------------------------------------- pinned */

static int size_class(size_t size, size_t *capacity)
{
    if (size <= 512) {
        *capacity = 512;
        return 0;
    }
    /* four classes per power of two: at most 25% slack */
    int k = 63 - __builtin_clzll((unsigned long long)(size - 1));
    size_t base = (size_t)1 << k, quarter = base >> 2;
    size_t q = (size - base + quarter - 1) / quarter;
    *capacity = base + q * quarter;
    return (k - 9) * 4 + (int)q;
}

/* The calling thread's stream-capture mode set to relaxed (the previous
 * one in *previous) around the allocator's own queries and pinned
 * allocations: in the default (global) mode they would fail during any
 * capture and invalidate it.  0 when it could not be set. */
static int relax_capture_mode(int *previous)
{
    *previous = GA_CAPTURE_RELAXED;
    return !ga_cuda_exchange_capture_mode(previous).error;
}

static void restore_capture_mode(int relaxed, int previous)
{
    if (relaxed)
        ga_cuda_exchange_capture_mode(&previous);
}

/* 1 when every event of the entry has completed (and recycles them).  A
 * query that fails is not completion: the copy may still be reading the
 * buffer (and a broken context makes new pinned memory no worse). */
static int pinned_entry_ready(pinned_entry *e)
{
    int previous, relaxed = relax_capture_mode(&previous);
    int ready = 1;
    while (e->n_events > 0) {
        int done = 0;
        int k = e->n_events - 1;
        if (ga_cuda_event_query(e->devices[k], e->events[k], &done).error || !done) {
            ready = 0;
            break;
        }
        event_put(e->devices[k], e->events[k]);
        e->n_events--;
    }
    restore_capture_mode(relaxed, previous);
    return ready;
}

static void *pinned_take_cached(int cls)
{
    for (pinned_entry **link = &pinned_free[cls]; *link; link = &(*link)->next) {
        pinned_entry *e = *link;
        if (pinned_entry_ready(e)) {
            void *ptr = e->ptr;
            *link = e->next;
            pinned_cached_bytes -= e->capacity;
            free(e);
            return ptr;
        }
    }
    return NULL;
}

/* Frees cached pinned blocks whose copies are done; returns bytes freed. */
static uint64_t pinned_release_ready(void)
{
    uint64_t released = 0;
    for (int cls = 0; cls < GA_SIZE_CLASSES; cls++) {
        pinned_entry **link = &pinned_free[cls];
        while (*link) {
            pinned_entry *e = *link;
            if (pinned_entry_ready(e)) {
                *link = e->next;
                ga_cuda_host_free(e->ptr);
                pinned_cached_bytes -= e->capacity;
                released += e->capacity;
                free(e);
            } else {
                link = &e->next;
            }
        }
    }
    return released;
}

/* ------------------------------------------------------------- pageable */

/* Why pageable memory is cached at all: glibc gives large blocks back to
 * the kernel when they are freed (munmap, or trimming the top of the heap),
 * and the next allocation of that size faults every page in again, zeroed
 * by the kernel.  For a loader's batches that is a fault per 4 KiB of every
 * batch: more system time than the batch's whole computation.  A cached
 * block keeps its pages.  Like the pinned pool, blocks are cached in size
 * classes; unlike it, no copy can still be reading a freed pageable block
 * (CUDA copies from pageable memory finish reading it before they return),
 * so a cached block is ready at once. */

static uint64_t host_total_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

/* Idle bytes the cache may hold: $GPUACCEL_HOST_CACHE_BYTES (0: no cache),
 * else 1/16 of the machine's memory, at least 256 MiB (a few batches of any
 * loader) and at most 2 GiB.  Blocks freed beyond it go back to the system.
 * Called with alloc_lock held. */
static uint64_t host_cache_limit(void)
{
    static int known;
    static uint64_t limit;
    if (!known) {
        const char *env = getenv("GPUACCEL_HOST_CACHE_BYTES");
        char *end = NULL;
        unsigned long long bytes = env && *env ? strtoull(env, &end, 10) : 0;
        if (env && *env >= '0' && *env <= '9' && end && *end == '\0') {
            limit = bytes;
        } else {
            uint64_t sixteenth = host_total_memory() / 16;
            uint64_t low = (uint64_t)256 << 20, high = (uint64_t)2 << 30;
            limit = sixteenth < low ? low : sixteenth > high ? high : sixteenth;
        }
        known = 1;
    }
    return limit;
}

/* 1 when it got the memory. */
static int host_memalign(size_t size, void **out)
{
    void *ptr = NULL;
    if (posix_memalign(&ptr, GA_HOST_ALIGNMENT, size) != 0)
        return 0;
    *out = ptr;
    return 1;
}

static void *host_take_cached(int cls, size_t capacity)
{
    host_entry *e = host_free[cls];
    if (!e)
        return NULL;
    host_free[cls] = e->next;
    host_cached_bytes -= capacity;
    return e;
}

/* Caches a freed pageable block of `size` bytes (its class's capacity
 * reserved), or frees it when it is small or the cache is full. */
static void host_put(void *ptr, size_t size, size_t capacity)
{
    if (!ptr)
        return;
    if (size < GA_HOST_CACHE_MIN_BYTES || host_cached_bytes + capacity > host_cache_limit()) {
        free(ptr);
        return;
    }
    size_t class_capacity;
    int cls = size_class(size, &class_capacity);
    host_entry *e = ptr;
    e->next = host_free[cls];
    host_free[cls] = e;
    host_cached_bytes += capacity;
}

/* Frees every cached pageable block; returns the bytes freed. */
static uint64_t host_release_cached(void)
{
    uint64_t released = host_cached_bytes;
    for (int cls = 0; cls < GA_SIZE_CLASSES; cls++) {
        while (host_free[cls]) {
            host_entry *e = host_free[cls];
            host_free[cls] = e->next;
            free(e);
        }
    }
    host_cached_bytes = 0;
    return released;
}

/* ---------------------------------------------------------------- alloc */

static ga_status alloc_host(ga_block *b, size_t size)
{
    ga_counters *c = &host_counters;
    size_t capacity = size;
    int cls = size >= GA_HOST_CACHE_MIN_BYTES ? size_class(size, &capacity) : -1;
    uint64_t in_use = host_counters.allocated + pinned_counters.allocated;
    if (c->limit && in_use + capacity > c->limit)
        return limit_status(c, "cpu", in_use, capacity, GA_ERR_HOST_OUT_OF_MEMORY);
    void *ptr = cls >= 0 ? host_take_cached(cls, capacity) : NULL;
    if (!ptr && size > 0 && !host_memalign(capacity, &ptr) &&
        !(host_release_cached() > 0 && host_memalign(capacity, &ptr))) {
        char want[32], text[256];
        snprintf(text, sizeof text, "could not allocate %s of host memory",
                 ga_format_bytes(capacity, want, sizeof want));
        c->num_ooms++;
        return oom_status(GA_ERR_HOST_OUT_OF_MEMORY, text);
    }
    b->ptr = ptr;
    b->capacity = capacity;
    count_alloc(c, capacity);
    return ga_ok();
}

static ga_status alloc_pinned(ga_block *b, size_t size)
{
    size_t capacity = 0;
    int cls = size ? size_class(size, &capacity) : 0;
    uint64_t in_use = host_counters.allocated + pinned_counters.allocated;
    if (host_counters.limit && in_use + capacity > host_counters.limit)
        return limit_status(&host_counters, "cpu (pinned)", in_use, capacity,
                            GA_ERR_HOST_OUT_OF_MEMORY);
    void *ptr = NULL;
    if (size > 0) {
        ptr = pinned_take_cached(cls);
        if (ptr) {
            /* its copies are done: the new owner may write it at once
             * (only the simulator can say otherwise) */
            ga_status status = ga_cuda_host_access(ptr, capacity, 1);
            if (status.error)
                return status;
        } else {
            int previous, relaxed = relax_capture_mode(&previous);
            ga_status status = ga_cuda_host_alloc(capacity, &ptr);
            if (status.error == GA_ERR_OUT_OF_MEMORY && pinned_release_ready() > 0)
                status = ga_cuda_host_alloc(capacity, &ptr);
            restore_capture_mode(relaxed, previous);
            if (status.error) {
                pinned_counters.num_ooms += status.error == GA_ERR_OUT_OF_MEMORY;
                return status;
            }
        }
    }
    b->ptr = ptr;
    b->capacity = capacity;
    count_alloc(&pinned_counters, capacity);
    return ga_ok();
}

static ga_status device_oom_status(int device, size_t size, ga_status cause)
{
    ga_counters *c = &device_counters[device];
    uint64_t reserved = 0, peak = 0, free_b = 0, total_b = 0;
    ga_cuda_pool_reserved(device, &reserved, &peak);
    ga_cuda_mem_info(device, &free_b, &total_b);
    char want[32], used[32], res[32], fr[32], tot[32], text[600];
    snprintf(text, sizeof text,
             "CUDA out of memory on cuda:%d: tried to allocate %s; gpuaccel has %s allocated "
             "(%s reserved by its pool); the device has %s free of %s (%s: %s)",
             device, ga_format_bytes(size, want, sizeof want),
             ga_format_bytes(c->allocated, used, sizeof used),
             ga_format_bytes(reserved, res, sizeof res), ga_format_bytes(free_b, fr, sizeof fr),
             ga_format_bytes(total_b, tot, sizeof tot), cause.call ? cause.call : "",
             cause.name ? cause.name : "");
    c->num_ooms++;
    ga_status status = oom_status(GA_ERR_OUT_OF_MEMORY, text);
    status.code = cause.code;
    return status;
}

static ga_status alloc_device(ga_block *b, int device, size_t size, ga_stream stream)
{
    ga_counters *c = &device_counters[device];
    char where[32];
    snprintf(where, sizeof where, "cuda:%d", device);
    if (c->limit && c->allocated + size > c->limit)
        return limit_status(c, where, c->allocated, size, GA_ERR_OUT_OF_MEMORY);
    void *ptr = NULL;
    int capturing = 0;
    ga_status status = device_pool_used[device]
                           ? ga_ok()
                           : ga_cuda_pool_set_release_threshold(device, GA_POOL_RELEASE_THRESHOLD);
    if (!status.error)
        status = ga_cuda_stream_capturing(stream, &capturing);
    if (!status.error)
        status = ga_cuda_malloc_async(device, size, stream, &ptr);
    if (status.error == GA_ERR_OUT_OF_MEMORY && !capturing) {
        /* memory cached for other streams may be released to the device */
        ga_cuda_pool_trim(device);
        status = ga_cuda_malloc_async(device, size, stream, &ptr);
    }
    if (status.error == GA_ERR_OUT_OF_MEMORY)
        return device_oom_status(device, size, status);
    if (status.error)
        return status;
    device_pool_used[device] = 1;
    b->graph = capturing;
    b->ptr = ptr;
    b->capacity = size;
    b->stream = stream;
    b->owner = stream_thread(stream);
    count_alloc(c, size);
    return ga_ok();
}

/* A zeroed block record of `kind` (device checked for DEVICE blocks). */
static ga_status new_block(ga_mem_kind kind, int device, size_t size, ga_block **out)
{
    *out = NULL;
    if (kind == GA_MEM_DEVICE && (device < 0 || device >= GA_MAX_DEVICES))
        return GA_STATUS(GA_ERR_INVALID_VALUE, "CUDA device ordinal out of range");
    ga_block *b = calloc(1, sizeof *b);
    if (!b)
        return oom_status(GA_ERR_HOST_OUT_OF_MEMORY, "could not allocate a block record");
    b->kind = kind;
    b->device = kind == GA_MEM_DEVICE ? device : -1;
    b->size = size;
    *out = b;
    return ga_ok();
}

ga_status ga_block_alloc_status(ga_mem_kind kind, int device, size_t size, ga_stream stream,
                                ga_block **out)
{
    ga_block *b;
    *out = NULL;
    /* The record is made and stored in *out under the lock, which fork()
     * takes (see the fork handlers): a child never inherits a block that
     * only a thread of its parent, absent from the child, knew about. */
    alloc_lock_acquire();
    ga_status status = new_block(kind, device, size, &b);
    if (!status.error) {
        status = kind == GA_MEM_HOST     ? alloc_host(b, size)
                 : kind == GA_MEM_PINNED ? alloc_pinned(b, size)
                                         : alloc_device(b, device, size, stream);
        if (status.error)
            free(b);
        else
            *out = b;
    }
    pthread_mutex_unlock(&alloc_lock);
    return status;
}

ga_status ga_block_borrow(int device, void *ptr, size_t size, ga_stream stream, ga_block **out)
{
    GA_TRY_STATUS(new_block(GA_MEM_DEVICE, device, size, out));
    ga_block *b = *out;
    b->borrowed = 1;
    b->ptr = ptr;
    b->capacity = size;
    b->stream = stream;
    b->owner = stream_thread(stream);
    return ga_ok();
}

ga_block *ga_block_alloc(ga_state *st, ga_mem_kind kind, int device, size_t size, ga_stream stream)
{
    ga_block *b;
    ga_status status = ga_block_alloc_status(kind, device, size, stream, &b);
    if (status.error) {
        ga_raise(st, status);
        return NULL;
    }
    return b;
}

ga_status ga_block_set_ready(ga_block *b, ga_stream stream)
{
    if (!b || b->kind != GA_MEM_DEVICE || !b->ptr)
        return ga_ok();
    alloc_lock_acquire();
    ga_status status = ga_ok();
    if (!b->ready)
        status = event_get(b->device, &b->ready);
    if (!status.error)
        status = ga_cuda_event_record(b->device, b->ready, stream);
    pthread_mutex_unlock(&alloc_lock);
    return status;
}

/* Makes `stream` (of `device`) wait for the point where the block's memory
 * became valid: its ready event when the producer set one, else the
 * allocation stream.  Called with alloc_lock held. */
static ga_status wait_until_valid(ga_block *b, int device, ga_stream stream)
{
    if (b->ready)
        return ga_cuda_stream_wait_event(device, stream, b->ready);
    return ga_cuda_stream_wait_stream(device, stream, b->device, home_stream(b));
}

/* 1 when work queued on `stream` is captured into a graph (then no event
 * may cross the capture's boundary); also 1, with the error in *status,
 * when that cannot be told. */
static int captured(ga_stream stream, ga_status *status)
{
    int capturing = 0;
    *status = ga_cuda_stream_capturing(stream, &capturing);
    return capturing || status->error;
}

int ga_block_prepare_use(ga_state *st, ga_block *b, int device, ga_stream stream)
{
    if (!b || b->kind != GA_MEM_DEVICE || !b->ptr || on_home_stream(b, device, stream))
        return 0;
    ga_status capture_status;
    if (captured(stream, &capture_status))
        return capture_status.error ? ga_raise(st, capture_status) : 0;
    alloc_lock_acquire();
    int known = find_use(b, device, stream) >= 0;
    ga_status status = known ? ga_ok() : wait_until_valid(b, device, stream);
    pthread_mutex_unlock(&alloc_lock);
    return status.error ? ga_raise(st, status) : 0;
}

ga_status ga_block_record_use_status(ga_block *b, int device, ga_stream stream)
{
    if (!b || b->kind == GA_MEM_HOST || !b->ptr)
        return ga_ok();
    if (b->kind == GA_MEM_DEVICE && on_home_stream(b, device, stream))
        return ga_ok();
    if (device < 0 || device >= GA_MAX_DEVICES)
        return ga_ok();
    ga_status status = ga_ok();
    if (captured(stream, &status))
        return status;
    alloc_lock_acquire();
    int k = find_use(b, device, stream);
    if (k < 0) {
        if (b->n_uses == GA_BLOCK_MAX_USES) {
            /* Out of slots: settle the oldest use now.  A device block's
             * allocation stream waits for it on the GPU; a pinned block
             * (no stream of its own) waits on the host, which only happens
             * past four concurrent streams. */
            status = b->kind == GA_MEM_DEVICE
                         ? ga_cuda_stream_wait_event(b->device, home_stream(b), b->use_events[0])
                         : ga_cuda_event_synchronize(b->use_devices[0], b->use_events[0]);
            if (status.error)
                goto done;
            event_put(b->use_devices[0], b->use_events[0]);
            memmove(&b->use_streams[0], &b->use_streams[1],
                    (GA_BLOCK_MAX_USES - 1) * sizeof b->use_streams[0]);
            memmove(&b->use_events[0], &b->use_events[1],
                    (GA_BLOCK_MAX_USES - 1) * sizeof b->use_events[0]);
            memmove(&b->use_devices[0], &b->use_devices[1],
                    (GA_BLOCK_MAX_USES - 1) * sizeof b->use_devices[0]);
            memmove(&b->use_threads[0], &b->use_threads[1],
                    (GA_BLOCK_MAX_USES - 1) * sizeof b->use_threads[0]);
            b->n_uses--;
        }
        k = b->n_uses;
        status = event_get(device, &b->use_events[k]);
        if (status.error)
            goto done;
        b->use_streams[k] = stream;
        b->use_devices[k] = device;
        b->use_threads[k] = stream_thread(stream);
        b->n_uses++;
    }
    /* re-recording captures all work queued so far on that stream */
    status = ga_cuda_event_record(device, b->use_events[k], stream);
done:
    pthread_mutex_unlock(&alloc_lock);
    return status;
}

int ga_block_record_use(ga_state *st, ga_block *b, int device, ga_stream stream)
{
    ga_status status = ga_block_record_use_status(b, device, stream);
    return status.error ? ga_raise(st, status) : 0;
}

ga_status ga_block_host_wait(ga_block *b)
{
    if (!b || b->kind != GA_MEM_PINNED || !b->ptr)
        return ga_ok();
    ga_status status = ga_ok();
    for (;;) {
        /* take the newest use out of the block and wait for it unlocked
         * (the caller holds the block, so nobody frees it meanwhile) */
        alloc_lock_acquire();
        int k = b->n_uses - 1;
        ga_event event = k >= 0 ? b->use_events[k] : NULL;
        int device = k >= 0 ? b->use_devices[k] : -1;
        b->n_uses = k >= 0 ? k : 0;
        pthread_mutex_unlock(&alloc_lock);
        if (!event)
            break;
        status = ga_cuda_event_synchronize(device, event);
        alloc_lock_acquire();
        event_put(device, event);
        pthread_mutex_unlock(&alloc_lock);
        if (status.error)
            return status;
    }
    return ga_cuda_host_access(b->ptr, b->size, 1);
}

ga_status ga_block_wait_all(ga_block *b, int device, ga_stream stream)
{
    ga_status status = ga_ok();
    if (!b || b->kind != GA_MEM_DEVICE || !b->ptr || captured(stream, &status))
        return status;
    alloc_lock_acquire();
    status = wait_until_valid(b, device, stream);
    int own = find_use(b, device, stream);
    for (int k = 0; k < b->n_uses && !status.error; k++)
        if (k != own)
            status = ga_cuda_stream_wait_event(device, stream, b->use_events[k]);
    pthread_mutex_unlock(&alloc_lock);
    return status;
}

static void report_unraisable(ga_status status)
{
    /* No exception may escape a dealloc; at interpreter exit the CUDA
     * context may already be gone, and there is nobody left to tell. */
    if (Py_IsInitialized() && !ga_is_finalizing()) {
        char text[1024];
        PyErr_Format(PyExc_RuntimeWarning, "gpuaccel: freeing memory failed: %s",
                     ga_status_text(status, text, sizeof text));
        PyErr_WriteUnraisable(NULL);
    }
}

/* Frees a device block on its allocation stream after that stream has
 * waited for the recorded uses (none inside a capture: see captured);
 * the caller frees the record.  Called with alloc_lock held. */
static ga_status free_device_block(ga_block *b, ga_stream home, int capturing)
{
    ga_status status = ga_ok();
    if (b->ready) {
        event_put(b->device, b->ready);
        b->ready = NULL;
    }
    for (int k = 0; k < b->n_uses; k++) {
        if (!status.error && !capturing)
            status = ga_cuda_stream_wait_event(b->device, home, b->use_events[k]);
        event_put(b->use_devices[k], b->use_events[k]);
    }
    b->n_uses = 0;
    if (b->borrowed) /* the owner frees it, after what home now waits for */
        return status;
    if (!status.error)
        status = ga_cuda_free_async(b->device, b->ptr, home);
    count_free(&device_counters[b->device], b->capacity);
    return status;
}

/* Frees the deferred device blocks whose stream is no longer captured.
 * Called with alloc_lock held; the first error is returned. */
static ga_status free_deferred(void)
{
    ga_status first = ga_ok();
    for (int k = 0; k < n_deferred_frees;) {
        ga_block *b = deferred_frees[k];
        ga_stream home = home_stream(b);
        ga_status status;
        if (captured(home, &status) && !status.error) {
            k++;
            continue;
        }
        deferred_frees[k] = deferred_frees[--n_deferred_frees];
        if (!status.error)
            status = free_device_block(b, home, 0);
        if (status.error && !first.error)
            first = status;
        free(b);
    }
    return first;
}

/* Keeps a device block to free once its stream's capture is over (0), or
 * -1 when there is no room to keep it. */
static int defer_free(ga_block *b)
{
    if (n_deferred_frees == deferred_frees_capacity) {
        int capacity = deferred_frees_capacity ? 2 * deferred_frees_capacity : 16;
        ga_block **grown = realloc(deferred_frees, (size_t)capacity * sizeof *grown);
        if (!grown)
            return -1;
        deferred_frees = grown;
        deferred_frees_capacity = capacity;
    }
    deferred_frees[n_deferred_frees++] = b;
    return 0;
}

ga_status ga_block_free_status(ga_block *b)
{
    if (!b)
        return ga_ok();
    ga_status status = ga_ok();
    alloc_lock_acquire();
    if (n_deferred_frees)
        status = free_deferred();
    switch (b->kind) {
    case GA_MEM_HOST:
        host_put(b->ptr, b->size, b->capacity);
        count_free(&host_counters, b->capacity);
        break;
    case GA_MEM_PINNED:
        if (b->ptr) {
            size_t capacity;
            int cls = size_class(b->size, &capacity);
            pinned_entry *e = malloc(sizeof *e);
            if (!e) {
                /* cannot cache it: wait for its copies, then give it back */
                for (int k = 0; k < b->n_uses; k++)
                    ga_cuda_event_synchronize(b->use_devices[k], b->use_events[k]);
                ga_cuda_host_free(b->ptr);
            } else {
                e->ptr = b->ptr;
                e->capacity = b->capacity;
                e->n_events = b->n_uses;
                memcpy(e->events, b->use_events, sizeof e->events);
                memcpy(e->devices, b->use_devices, sizeof e->devices);
                e->next = pinned_free[cls];
                pinned_free[cls] = e;
                pinned_cached_bytes += e->capacity;
                b->n_uses = 0;
            }
        }
        count_free(&pinned_counters, b->capacity);
        break;
    case GA_MEM_DEVICE: {
        ga_stream home = home_stream(b);
        ga_status capture_status;
        int capturing = b->ptr && captured(home, &capture_status);
        if (capturing && capture_status.error) {
            if (!status.error)
                status = capture_status;
            capturing = 0; /* cannot tell: free it as before any capture */
        }
        if (capturing && !b->graph && defer_free(b) == 0) {
            pthread_mutex_unlock(&alloc_lock);
            return status; /* freed by a later call, once the capture is over */
        }
        /* a free node for the graph's own memory (its uses are inside the
         * capture, unrecorded); or, out of room to defer, a free now that
         * CUDA refuses, reported below */
        ga_status freed = free_device_block(b, home, capturing);
        if (freed.error && !status.error)
            status = freed;
        break;
    }
    }
    for (int k = 0; k < b->n_uses; k++)
        event_put(b->use_devices[k], b->use_events[k]);
    pthread_mutex_unlock(&alloc_lock);
    free(b);
    return status;
}

void ga_block_free(ga_block *b)
{
    ga_status status = ga_block_free_status(b);
    if (status.error)
        report_unraisable(status);
}

/* ------------------------------------------------------ module functions */

/* device=None: the current CUDA device when CUDA is usable, else the CPU. */
static int stats_device(ga_state *st, PyObject *obj, ga_device *out)
{
    if (obj == Py_None) {
        if (ga_cuda_usable()) {
            out->type = GA_DEVICE_CUDA;
            if (ga_cuda_get_device(&out->index).error)
                out->index = 0;
        } else {
            out->type = GA_DEVICE_CPU;
            out->index = 0;
        }
        return 0;
    }
    if (ga_device_from_object(st, obj, out, "device") < 0)
        return -1;
    if (out->type == GA_DEVICE_CUDA && ga_ensure_cuda_device(st, out->index) < 0)
        return -1;
    return 0;
}

static PyObject *limit_or_none(uint64_t limit)
{
    if (!limit)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(limit);
}

PyObject *ga_py_memory_stats(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"device", NULL};
    PyObject *device_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:memory_stats", kwlist, &device_obj))
        return NULL;
    ga_state *st = ga_state_from_module(module);
    ga_device device;
    if (stats_device(st, device_obj, &device) < 0)
        return NULL;
    alloc_lock_acquire();
    PyObject *result;
    if (device.type == GA_DEVICE_CPU) {
        ga_counters h = host_counters, p = pinned_counters;
        uint64_t cached = pinned_cached_bytes, pageable_cached = host_cached_bytes;
        uint64_t cache_limit = host_cache_limit();
        pthread_mutex_unlock(&alloc_lock);
        result = Py_BuildValue(
            "{s:s,s:K,s:K,s:K,s:N,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "device", "cpu",
            "allocated_bytes", (unsigned long long)(h.allocated + p.allocated),
            "peak_allocated_bytes", (unsigned long long)(h.peak > p.peak ? h.peak : p.peak),
            "reserved_bytes",
            (unsigned long long)(h.allocated + p.allocated + cached + pageable_cached),
            "limit_bytes", limit_or_none(h.limit), "num_allocs",
            (unsigned long long)(h.num_allocs + p.num_allocs), "num_frees",
            (unsigned long long)(h.num_frees + p.num_frees), "num_ooms",
            (unsigned long long)(h.num_ooms + p.num_ooms), "pageable_allocated_bytes",
            (unsigned long long)h.allocated, "pageable_cached_bytes",
            (unsigned long long)pageable_cached, "pageable_cache_limit_bytes",
            (unsigned long long)cache_limit, "pinned_allocated_bytes",
            (unsigned long long)p.allocated, "pinned_cached_bytes", (unsigned long long)cached,
            "pinned_peak_bytes", (unsigned long long)p.peak);
        return result;
    }
    ga_counters c = device_counters[device.index];
    int pool_used = device_pool_used[device.index];
    uint64_t workspace = workspace_bytes[device.index];
    pthread_mutex_unlock(&alloc_lock);
    uint64_t reserved = 0, reserved_peak = 0, free_b = 0, total_b = 0;
    if (pool_used && ga_cuda_pool_reserved(device.index, &reserved, &reserved_peak).error)
        PyErr_Clear();
    ga_status status = ga_cuda_mem_info(device.index, &free_b, &total_b);
    if (status.error)
        return ga_raise(st, status), NULL;
    char where[32];
    snprintf(where, sizeof where, "cuda:%d", device.index);
    return Py_BuildValue(
        "{s:s,s:K,s:K,s:K,s:K,s:N,s:K,s:K,s:K,s:K,s:K,s:K}", "device", where, "allocated_bytes",
        (unsigned long long)c.allocated, "peak_allocated_bytes", (unsigned long long)c.peak,
        "reserved_bytes", (unsigned long long)reserved, "peak_reserved_bytes",
        (unsigned long long)reserved_peak, "limit_bytes", limit_or_none(c.limit), "num_allocs",
        (unsigned long long)c.num_allocs, "num_frees", (unsigned long long)c.num_frees, "num_ooms",
        (unsigned long long)c.num_ooms, "workspace_bytes", (unsigned long long)workspace,
        "device_free_bytes", (unsigned long long)free_b, "device_total_bytes",
        (unsigned long long)total_b);
}

ga_status ga_block_free_deferred(void)
{
    alloc_lock_acquire();
    ga_status status = n_deferred_frees ? free_deferred() : ga_ok();
    pthread_mutex_unlock(&alloc_lock);
    return status;
}

void ga_alloc_count_workspace(int device, int64_t delta)
{
    if (device < 0 || device >= GA_MAX_DEVICES)
        return;
    alloc_lock_acquire();
    workspace_bytes[device] += (uint64_t)delta;
    pthread_mutex_unlock(&alloc_lock);
}

PyObject *ga_py_empty_cache(PyObject *module, PyObject *unused)
{
    (void)unused;
    ga_status status = ga_block_free_deferred();
    if (status.error)
        return ga_raise(ga_state_from_module(module), status), NULL;
    alloc_lock_acquire();
    pinned_release_ready();
    host_release_cached();
    int used[GA_MAX_DEVICES];
    memcpy(used, device_pool_used, sizeof used);
    pthread_mutex_unlock(&alloc_lock);
    for (int d = 0; d < GA_MAX_DEVICES; d++)
        if (used[d])
            ga_cuda_pool_trim(d);
    Py_RETURN_NONE;
}

PyObject *ga_py_set_memory_limit(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"limit", "device", NULL};
    PyObject *limit_obj, *device_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:set_memory_limit", kwlist, &limit_obj,
                                     &device_obj))
        return NULL;
    ga_state *st = ga_state_from_module(module);
    ga_device device;
    if (stats_device(st, device_obj, &device) < 0)
        return NULL;
    uint64_t limit = 0;
    if (limit_obj == Py_None) {
        limit = 0;
    } else if (PyFloat_Check(limit_obj)) {
        double fraction = PyFloat_AS_DOUBLE(limit_obj);
        if (!(fraction > 0.0 && fraction <= 1.0)) {
            PyErr_Format(PyExc_ValueError,
                         "set_memory_limit: a float limit is a fraction of the device's memory "
                         "in (0, 1], got %R",
                         limit_obj);
            return NULL;
        }
        uint64_t total = 0, free_b = 0;
        if (device.type == GA_DEVICE_CPU) {
            total = host_total_memory();
        } else {
            ga_status status = ga_cuda_mem_info(device.index, &free_b, &total);
            if (status.error)
                return ga_raise(st, status), NULL;
        }
        limit = (uint64_t)(fraction * (double)total);
        if (limit == 0)
            limit = 1;
    } else if (PyLong_Check(limit_obj) && !PyBool_Check(limit_obj)) {
        long long bytes = PyLong_AsLongLong(limit_obj);
        if (bytes == -1 && PyErr_Occurred())
            return NULL;
        if (bytes <= 0) {
            PyErr_Format(PyExc_ValueError,
                         "set_memory_limit: limit must be a positive number of bytes, a "
                         "fraction in (0, 1] or None, got %lld",
                         bytes);
            return NULL;
        }
        limit = (uint64_t)bytes;
    } else {
        PyErr_Format(PyExc_TypeError,
                     "set_memory_limit: limit must be an int (bytes), a float (fraction of the "
                     "device's memory) or None, got %.200s",
                     ga_type_name(limit_obj));
        return NULL;
    }
    alloc_lock_acquire();
    if (device.type == GA_DEVICE_CPU)
        host_counters.limit = limit;
    else
        device_counters[device.index].limit = limit;
    pthread_mutex_unlock(&alloc_lock);
    Py_RETURN_NONE;
}
