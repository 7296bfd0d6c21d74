/*
 * parallel.c — a small pthread pool for the CPU kernels.
 *
 * Not OpenMP: libgomp's pool does not survive fork() (a child that touches
 * it hangs), and torch ships its own OpenMP runtime that would share the
 * process with ours.  This pool is started lazily, reset in a forked child,
 * and used by one caller at a time (others run their work inline).
 */
#define _GNU_SOURCE
#include "parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "../kernels.h"

typedef struct {
    ga_range_fn fn;
    void *ctx;
    int64_t n, chunk, nchunks;
    atomic_llong next; /* next chunk to hand out */
    int64_t finished;  /* chunks done; under pool.lock */
    int active;        /* workers inside this job; under pool.lock */
} ga_job;

static struct {
    pthread_mutex_t busy; /* held by the one caller whose job is running */
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    int started;
    int nworkers;
    unsigned long generation;
    ga_job *job;
} pool = {PTHREAD_MUTEX_INITIALIZER,
          PTHREAD_MUTEX_INITIALIZER,
          PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER,
          0,
          0,
          0,
          NULL};

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

int ga_cpu_num_threads(void)
{
    static int cached = 0;
    if (cached > 0)
        return cached;
    int n = 0;
    const char *env = getenv("GPUACCEL_NUM_THREADS");
    if (env && *env)
        n = atoi(env);
    if (n <= 0) {
        cpu_set_t set;
        n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    }
    if (n < 1)
        n = 1;
    if (n > 256)
        n = 256;
    cached = n;
    return n;
}

static int64_t run_chunks(ga_job *job)
{
    int64_t done = 0;
    for (;;) {
        int64_t c = atomic_fetch_add(&job->next, 1);
        if (c >= job->nchunks)
            return done;
        int64_t begin = c * job->chunk;
        int64_t end = begin + job->chunk < job->n ? begin + job->chunk : job->n;
        job->fn(job->ctx, begin, end);
        done++;
    }
}

static void *worker_main(void *arg)
{
    (void)arg;
    /* visible by name in top -H and profilers, beside torch's threads */
    (void)pthread_setname_np(pthread_self(), "gpuaccel-cpu");
    pthread_mutex_lock(&pool.lock);
    unsigned long seen = pool.generation;
    for (;;) {
        while (pool.generation == seen)
            pthread_cond_wait(&pool.wake, &pool.lock);
        seen = pool.generation;
        ga_job *job = pool.job;
        if (!job)
            continue;
        job->active++;
        pthread_mutex_unlock(&pool.lock);
        int64_t done = run_chunks(job);
        pthread_mutex_lock(&pool.lock);
        job->finished += done;
        job->active--;
        pthread_cond_broadcast(&pool.done);
    }
    return NULL;
}

static void atfork_prepare(void)
{
    pthread_mutex_lock(&pool.busy);
    pthread_mutex_lock(&pool.lock);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.busy);
}

static void atfork_child(void)
{
    /* The workers do not exist in the child: forget them and start anew on
     * the next parallel call.  This thread holds both mutexes (prepare). */
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.started = 0;
    pool.nworkers = 0;
    pool.job = NULL;
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.busy);
}

static void register_atfork(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* Called with pool.busy held. */
static void start_workers(void)
{
    pthread_once(&atfork_once, register_atfork);
    int want = ga_cpu_num_threads() - 1;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (int i = 0; i < want; i++) {
        pthread_t tid;
        if (pthread_create(&tid, &attr, worker_main, NULL) != 0)
            break; /* fewer workers is still correct */
        pool.nworkers++;
    }
    pthread_attr_destroy(&attr);
    pool.started = 1;
}

static __thread int inside_range_fn = 0;

void ga_parallel_for(int64_t n, int64_t grain, ga_range_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    int threads = ga_cpu_num_threads();
    if (n <= grain || threads == 1 || inside_range_fn || pthread_mutex_trylock(&pool.busy) != 0) {
        fn(ctx, 0, n);
        return;
    }
    if (!pool.started)
        start_workers();
    if (pool.nworkers == 0) {
        pthread_mutex_unlock(&pool.busy);
        fn(ctx, 0, n);
        return;
    }
    int64_t nchunks = (n + grain - 1) / grain;
    int64_t max_chunks = 4 * (int64_t)(pool.nworkers + 1);
    if (nchunks > max_chunks)
        nchunks = max_chunks;
    ga_job job;
    job.fn = fn;
    job.ctx = ctx;
    job.n = n;
    job.chunk = (n + nchunks - 1) / nchunks;
    job.nchunks = (n + job.chunk - 1) / job.chunk;
    atomic_init(&job.next, 0);
    job.finished = 0;
    job.active = 0;

    pthread_mutex_lock(&pool.lock);
    pool.job = &job;
    pool.generation++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);

    inside_range_fn = 1;
    int64_t done = run_chunks(&job);
    inside_range_fn = 0;

    pthread_mutex_lock(&pool.lock);
    job.finished += done;
    while (job.finished < job.nchunks || job.active > 0)
        pthread_cond_wait(&pool.done, &pool.lock);
    pool.job = NULL;
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.busy);
}
