/*
 * selftest.cu — kernels that test kernels/cudacpu itself, for
 * tests/test_kernels_on_cpu.py (through driver.cpp's "selftest" op).
 *
 * Some are right and check that CUDA's semantics hold (barriers, warp
 * collectives, atomics, launch checks); the others carry one defect each
 * that the layer must report: a missing barrier (a wrong sum under some
 * schedule, a race under ThreadSanitizer), an index past an array
 * (AddressSanitizer), barriers some threads miss, warp collectives whose
 * lanes disagree.  cudacpu_selftest(name, out, in, n) runs one: it returns
 * the launch's error, or cudaErrorAssert (after printing why on stderr)
 * when a right kernel computed a wrong result.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

namespace
{

constexpr int kSumThreads = 64;

/* A block sum of n ints, the usual shared-memory tree, with or without
 * its barrier between the partial sums and the tree (First) and the one
 * inside the tree (Tree). */
template <bool First, bool Tree> __global__ void block_sum(const int *in, int *out, int n)
{
    __shared__ int part[kSumThreads];
    int s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s += in[i];
    part[threadIdx.x] = s;
    if (First)
        __syncthreads();
    for (int h = kSumThreads / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h)
            part[threadIdx.x] += part[threadIdx.x + h];
        if (Tree)
            __syncthreads();
    }
    if (threadIdx.x == 0)
        out[0] = part[0];
}

/* Thread i writes out[i]: one thread too many for an n-element out. */
__global__ void write_each(int *out)
{
    out[blockIdx.x * blockDim.x + threadIdx.x] = 7;
}

/* An index one past a __shared__ array (through a pointer whose origin
 * the compiler forgets, so that it is AddressSanitizer's redzone that sees
 * it rather than UBSan's bounds checks). */
__global__ void shared_past_end(int *out)
{
    __shared__ int tile[32];
    int *volatile at = tile;
    at[threadIdx.x] = (int)threadIdx.x; /* launched with 33 threads */
    __syncthreads();
    out[threadIdx.x] = tile[31 - threadIdx.x % 32];
}

__global__ void barrier_in_branch(int *out)
{
    if (threadIdx.x < 10)
        __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void return_before_barrier(int *out)
{
    if (threadIdx.x == 3)
        return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void two_barriers(int *out)
{
    if (threadIdx.x % 2)
        __syncthreads();
    else
        __syncthreads();
    out[threadIdx.x] = 1;
}

/* Launched with 40 threads: warp 1 has lanes 0-7 only. */
__global__ void full_mask_partial_warp(int *out)
{
    out[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0);
}

__global__ void lanes_at_different_votes(int *out)
{
    if (threadIdx.x < 16)
        out[threadIdx.x] = (int)__ballot_sync(0xffffffffu, 1);
    else
        out[threadIdx.x] = __any_sync(0xffffffffu, 1);
}

__global__ void barrier_against_syncwarp(int *out)
{
    if (threadIdx.x == 0)
        __syncthreads();
    else
        __syncwarp();
    out[threadIdx.x] = 1;
}

__global__ void mask_without_caller(int *out)
{
    out[threadIdx.x] = __shfl_sync(0x1u, (int)threadIdx.x, 0); /* lanes 1-31 not in it */
}

__global__ void shuffle_from_exited_lane(int *out)
{
    if (threadIdx.x == 5)
        return;
    out[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 5);
}

/* Every warp collective, right; 64 threads, 9 results per thread. */
__global__ void warp_collectives(int *out)
{
    int t = (int)threadIdx.x, lane = t % 32, v = 100 + t;
    int *o = out + 9 * t;
    o[0] = __shfl_sync(0xffffffffu, v, 3);
    o[1] = __shfl_sync(0xffffffffu, v, lane + 1, 8);
    o[2] = __shfl_up_sync(0xffffffffu, v, 2);
    o[3] = __shfl_down_sync(0xffffffffu, v, 3, 16);
    o[4] = __shfl_xor_sync(0xffffffffu, v, 5);
    o[5] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
    o[6] = __all_sync(0xffffffffu, v > 99) + 2 * __any_sync(0xffffffffu, lane == 31);
    if (lane < 16) { /* a half-warp collective */
        __syncwarp(0x0000ffffu);
        o[7] = (int)__ballot_sync(0x0000ffffu, lane % 2);
    } else {
        o[7] = -1;
    }
    __syncwarp();
    double d = 0.5 * t;
    o[8] = (int)(2 * __shfl_down_sync(0xffffffffu, d, 1));
}

/* Lanes 0-3 of warp 0 have returned: the others vote without them.
 * (__activemask is the lanes that run together at that moment, which
 * depends on the schedule: here, the lanes that have not returned yet.) */
__global__ void vote_after_exit(int *out)
{
    if (threadIdx.x < 4)
        return;
    out[threadIdx.x] = (int)__ballot_sync(0xfffffff0u, 1);
    out[32 + threadIdx.x] = (int)__activemask();
}

__global__ void barrier_counts(int *out)
{
    int t = (int)threadIdx.x;
    out[0] = 0;
    int c = __syncthreads_count(t % 3 == 0);
    int a = __syncthreads_and(t < 1000);
    int o = __syncthreads_or(t == 17);
    int none = __syncthreads_or(0);
    if (t == 0) {
        out[0] = c;
        out[1] = a;
        out[2] = o;
        out[3] = none;
    }
}

__global__ void atomics(int *ints, float *floats, double *doubles, unsigned *wrap,
                        unsigned long long *big)
{
    int t = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    atomicAdd(&ints[0], 1);
    atomicSub(&ints[1], 2);
    atomicMax(&ints[2], t);
    atomicMin(&ints[3], -t);
    atomicOr(&ints[4], 1 << (t % 31));
    int seen = atomicAdd(&ints[5], 0);
    for (int old; (old = atomicCAS(&ints[5], seen, seen + 3)) != seen;)
        seen = old;
    atomicAdd(&floats[0], 0.25f);
    atomicAdd(&doubles[0], 0.125);
    atomicInc(&wrap[0], 9);
    atomicDec(&wrap[1], 9);
    atomicAdd(&big[0], 1ull << 33);
    atomicExch(&ints[6], 42);
}

/* Each thread takes the next slot of the order it ran in. */
__global__ void record_order(int *out, int *counter)
{
    int slot = atomicAdd(counter, 1);
    out[slot] = (int)(blockIdx.x * blockDim.x + threadIdx.x);
}

cudaError_t expect(const char *what, long long got, long long want)
{
    if (got == want)
        return cudaSuccess;
    fprintf(stderr, "selftest: %s: got %lld, want %lld\n", what, got, want);
    return cudaErrorAssert;
}

cudaError_t check_warp_collectives(const int *out)
{
    for (int t = 0; t < 64; t++) {
        int lane = t % 32, base = t - lane;
        const int *o = out + 9 * t;
        int seg8 = lane & ~7, seg16 = lane & ~15;
        unsigned ballot = 0;
        for (int l = 0; l < 32; l++)
            ballot |= (unsigned)(l % 3 == 0) << l;
        unsigned half = 0;
        for (int l = 0; l < 16; l++)
            half |= (unsigned)(l % 2) << l;
        long long want[9] = {
            100 + base + 3,
            100 + base + seg8 + (lane + 1) % 8,
            100 + base + (lane >= 2 ? lane - 2 : lane),
            100 + base + (lane + 3 < seg16 + 16 ? lane + 3 : lane),
            100 + base + (lane ^ 5),
            (int)ballot,
            1 + 2,
            lane < 16 ? (int)half : -1,
            lane < 31 ? t + 1 : t,
        };
        for (int k = 0; k < 9; k++) {
            char what[64];
            snprintf(what, sizeof what, "warp_collectives thread %d result %d", t, k);
            cudaError_t e = expect(what, o[k], want[k]);
            if (e)
                return e;
        }
    }
    return cudaSuccess;
}

} // namespace

extern "C" cudaError_t cudacpu_selftest(const char *name, void *out_, const void *in_, int n)
{
    int *out = (int *)out_;
    const int *in = (const int *)in_;
    cudaGetLastError();
    if (!strcmp(name, "block_sum"))
        CUDACPU_LAUNCH(1, kSumThreads, 0, 0, block_sum<true, true>)(in, out, n);
    else if (!strcmp(name, "block_sum_no_barrier"))
        CUDACPU_LAUNCH(1, kSumThreads, 0, 0, block_sum<false, true>)(in, out, n);
    else if (!strcmp(name, "block_sum_no_tree_barrier"))
        CUDACPU_LAUNCH(1, kSumThreads, 0, 0, block_sum<true, false>)(in, out, n);
    else if (!strcmp(name, "write_each")) /* n + 1 threads */
        CUDACPU_LAUNCH(1, n + 1, 0, 0, write_each)(out);
    else if (!strcmp(name, "shared_past_end"))
        CUDACPU_LAUNCH(1, 33, 0, 0, shared_past_end)(out);
    else if (!strcmp(name, "barrier_in_branch"))
        CUDACPU_LAUNCH(1, 32, 0, 0, barrier_in_branch)(out);
    else if (!strcmp(name, "return_before_barrier"))
        CUDACPU_LAUNCH(1, 32, 0, 0, return_before_barrier)(out);
    else if (!strcmp(name, "two_barriers"))
        CUDACPU_LAUNCH(1, 32, 0, 0, two_barriers)(out);
    else if (!strcmp(name, "full_mask_partial_warp"))
        CUDACPU_LAUNCH(1, 40, 0, 0, full_mask_partial_warp)(out);
    else if (!strcmp(name, "lanes_at_different_votes"))
        CUDACPU_LAUNCH(1, 32, 0, 0, lanes_at_different_votes)(out);
    else if (!strcmp(name, "barrier_against_syncwarp"))
        CUDACPU_LAUNCH(1, 32, 0, 0, barrier_against_syncwarp)(out);
    else if (!strcmp(name, "mask_without_caller"))
        CUDACPU_LAUNCH(1, 32, 0, 0, mask_without_caller)(out);
    else if (!strcmp(name, "shuffle_from_exited_lane"))
        CUDACPU_LAUNCH(1, 32, 0, 0, shuffle_from_exited_lane)(out);
    else if (!strcmp(name, "oversized_block"))
        CUDACPU_LAUNCH(1, 1025, 0, 0, write_each)(out);
    else if (!strcmp(name, "dynamic_shared_memory"))
        CUDACPU_LAUNCH(1, 32, 128, 0, write_each)(out);
    else if (!strcmp(name, "record_order")) /* n threads in blocks of 32 */
        CUDACPU_LAUNCH((n + 31) / 32, 32, 0, 0, record_order)(out, out + n);
    else if (!strcmp(name, "warp_collectives")) {
        CUDACPU_LAUNCH(1, 64, 0, 0, warp_collectives)(out);
        cudaError_t e = cudaGetLastError();
        return e ? e : check_warp_collectives(out);
    } else if (!strcmp(name, "vote_after_exit")) {
        CUDACPU_LAUNCH(1, 32, 0, 0, vote_after_exit)(out);
        cudaError_t e = cudaGetLastError();
        for (int t = 4; t < 32 && !e; t++) {
            /* the lanes that run with the caller: at least the caller */
            unsigned active = (unsigned)out[32 + t];
            if (expect("vote_after_exit", out[t], (int)0xfffffff0u) ||
                expect("activemask has the caller", active >> t & 1, 1))
                e = cudaErrorAssert;
        }
        return e;
    } else if (!strcmp(name, "barrier_counts")) {
        CUDACPU_LAUNCH(1, 100, 0, 0, barrier_counts)(out);
        cudaError_t e = cudaGetLastError();
        if (!e && (expect("count", out[0], 34) || expect("and", out[1], 1) ||
                   expect("or", out[2], 1) || expect("or of none", out[3], 0)))
            e = cudaErrorAssert;
        return e;
    } else if (!strcmp(name, "atomics")) {
        int ints[7] = {0, 0, -1, 1, 0, 0, 0};
        float floats[1] = {0};
        double doubles[1] = {0};
        unsigned wrap[2] = {0, 0};
        unsigned long long big[1] = {0};
        const int blocks = 3, threads = 47, total = blocks * threads;
        CUDACPU_LAUNCH(blocks, threads, 0, 0, atomics)(ints, floats, doubles, wrap, big);
        cudaError_t e = cudaGetLastError();
        if (e)
            return e;
        if (expect("atomicAdd", ints[0], total) || expect("atomicSub", ints[1], -2 * total) ||
            expect("atomicMax", ints[2], total - 1) || expect("atomicMin", ints[3], 1 - total) ||
            expect("atomicOr", ints[4], 0x7fffffff) || expect("atomicCAS", ints[5], 3 * total) ||
            expect("atomicExch", ints[6], 42) ||
            expect("atomicAdd float", (long long)(floats[0] * 4), total) ||
            expect("atomicAdd double", (long long)(doubles[0] * 8), total) ||
            expect("atomicInc", wrap[0], total % 10) ||
            expect("atomicDec", wrap[1], (10 - total % 10) % 10) ||
            expect("atomicAdd u64", (long long)(big[0] >> 33), total))
            return cudaErrorAssert;
        return cudaSuccess;
    } else {
        fprintf(stderr, "selftest: no test named %s\n", name);
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
