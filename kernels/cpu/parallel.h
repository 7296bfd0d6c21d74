/*
 * parallel.h — the CPU backend's worker pool.
 */
#ifndef GPUACCEL_CPU_PARALLEL_H
#define GPUACCEL_CPU_PARALLEL_H

#include <stdint.h>

typedef void (*ga_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Calls fn over disjoint ranges covering [0, n), each at least `grain` long
 * (except the last), on the pool's threads and the caller's.  Runs inline
 * when n is small, when the pool is busy with another caller, or when called
 * from inside a range function. */
void ga_parallel_for(int64_t n, int64_t grain, ga_range_fn fn, void *ctx);

#endif
