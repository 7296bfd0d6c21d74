/*
 * cudacpu.h — compiles CUDA C++ with the host C++ compiler and runs its
 * kernels on the CPU (a test-only execution layer: tests/test_kernels_on_cpu.py
 * and the simulator build, GPUACCEL_SIM=1).
 *
 * Force-included (g++ -std=c++17 -include kernels/cudacpu/cudacpu.h) before a
 * .cu file that is otherwise compiled unchanged.  Each CUDA thread of a block
 * runs as a fiber (ucontext, kernels/cudacpu/fiber.cpp), so a thread stops at
 * __syncthreads() until every thread of its block has arrived, warp
 * collectives exchange values between the lanes named in their mask, and a
 * __shared__ variable is one object that all threads of the block see.  The
 * threads of a block, and the blocks of a grid, run in the order that
 * GPUACCEL_CUDACPU_SCHEDULE names: forward (the default), reverse, or
 * random[:seed]; a kernel that is only right in one order is wrong.
 *
 * The CUDA toolkit's own headers are used as they are: without __CUDACC__,
 * cuda_runtime.h declares the runtime API and the vector types, and
 * cuda_fp16.h / cuda_bf16.h give their host implementations of __half and
 * __nv_bfloat16.  __CUDA_ARCH__ is never defined here, so where a kernel
 * has a device-only branch, the host branch is what runs.
 *
 * What a launch does that a GPU would not survive is reported as an error
 * of the launch (cudaErrorLaunchFailure from cudaGetLastError, with the
 * details in cudaGetErrorString), never an abort: a barrier that some
 * threads of the block reach and others do not (divergent code, an early
 * return), threads waiting at different barriers, warp collectives whose
 * lanes disagree (a mask naming a lane the block lacks or has lost, lanes
 * at different collectives or with different masks), and deadlock.
 *
 * Limits, on purpose: one launch runs at a time in the process (a
 * __shared__ variable is a function-local static, so blocks run one after
 * another); dynamic shared memory (extern __shared__) is not supported;
 * launches are synchronous and streams order nothing (kernels/sim/sim.c checks
 * stream order); device math functions are the host's libm.
 */
#ifndef GPUACCEL_CUDACPU_H
#define GPUACCEL_CUDACPU_H

#if defined(__CUDACC__) || !defined(__cplusplus)
#error "cudacpu.h is for the host C++ compiler only"
#endif

/* Before the toolkit's headers, which keep these when they are defined.
 * __shared__: one static object per declaration, which the threads of the
 * running block share (blocks run one at a time).  Static rather than
 * thread_local so that AddressSanitizer puts redzones around it. */
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __constant__ static
#define __launch_bounds__(...)

#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

namespace cudacpu
{

/* Where a barrier or warp collective is written, for the reports. */
struct Site {
    const char *file;
    int line;
};

uint3 thread_idx();
uint3 block_idx();
dim3 block_dim();
dim3 grid_dim();

/* __syncthreads and its counting forms: op 0 plain, 1 count, 2 and, 3 or. */
int sync_threads(Site site, int op, int predicate);

enum WarpOp {
    WARP_SYNC,
    WARP_SHFL_IDX,
    WARP_SHFL_UP,
    WARP_SHFL_DOWN,
    WARP_SHFL_XOR,
    WARP_ALL,
    WARP_ANY,
    WARP_BALLOT,
};

/* One lane's part in a warp collective: it waits until every lane named in
 * `mask` has arrived at a collective of the same kind with the same mask.
 * Shuffles move `size` bytes from the source lane's `value` into `out`;
 * votes return the ballot of the predicates. */
unsigned warp_collective(Site site, WarpOp op, unsigned mask, const void *value, void *out,
                         size_t size, int lane_arg, int width, int predicate);
unsigned active_mask();

/* Runs `body(closure)` as every thread of every block of the grid. */
void launch(const char *kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            void (*body)(void *), void *closure);

/* Test hook: launches of kernels whose name starts with `kernel` (up to its
 * template arguments) get at most `max` blocks in each dimension, so that a
 * grid-stride loop runs more than once per block.  Only for kernels whose
 * every grid dimension is walked by a grid-stride loop; NULL clears. */
void limit_grid(const char *kernel, dim3 max);

/* Calls fn(kernel, launches) for every kernel launched so far (by name,
 * without template arguments), so that a test can tell what it ran. */
void for_each_launched(void (*fn)(const char *kernel, unsigned long long launches, void *ctx),
                       void *ctx);

/* Launch shapes (tests/test_launch_shapes.py): a kernel marks each
 * iteration of a loop whose trip count grows with the problem with
 * GA_TRIP() (kernels/cuda/common.cuh), which counts it for the calling
 * CUDA thread here. */
void count_trip();

/* One launch as a GPU would get it: the grid asked for (before any
 * limit_grid), the block, how many blocks ran here, and the most loop
 * iterations (GA_TRIP) one thread of those blocks made. */
struct LaunchRecord {
    char kernel[160]; /* without template arguments */
    dim3 grid, block;
    unsigned long long blocks_run, max_trips;
};

/* While on, every launch is recorded (turning it on clears the record). */
void record_launches(bool on);
void for_each_launch(void (*fn)(const LaunchRecord &launch, void *ctx), void *ctx);

/* While on, a launch runs only the first and the last block of its grid
 * (in the grid's linear order): enough to see a launch's shape and the
 * serial work of its threads at sizes where running every block on the CPU
 * would take far too long.  Its results are not the kernel's. */
void sample_blocks(bool on);

template <class... Params> class Launch
{
  public:
    Launch(const char *name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared,
           cudaStream_t stream)
        : name_(name), kernel_(kernel), grid_(grid), block_(block), shared_(shared), stream_(stream)
    {
    }

    /* The arguments are converted to the kernel's parameter types once, as
     * a launch does; every thread then gets its own copy of them. */
    template <class... Args> void operator()(Args &&...args) const
    {
        static_assert(sizeof...(Args) == sizeof...(Params), "kernel launched with the wrong "
                                                            "number of arguments");
        using Tuple = std::tuple<std::decay_t<Params>...>;
        Tuple params(std::forward<Args>(args)...);
        struct Call {
            void (*kernel)(Params...);
            const Tuple *params;
        } call = {kernel_, &params};
        launch(name_, grid_, block_, shared_, stream_, &invoke<Call>, &call);
    }

  private:
    template <class Call> static void invoke(void *closure)
    {
        const Call *c = static_cast<const Call *>(closure);
        std::apply(c->kernel, *c->params);
    }

    const char *name_;
    void (*kernel_)(Params...);
    dim3 grid_, block_;
    size_t shared_;
    cudaStream_t stream_;
};

template <class... Params>
Launch<Params...> make_launch(const char *name, void (*kernel)(Params...), dim3 grid, dim3 block,
                              size_t shared, cudaStream_t stream)
{
    return Launch<Params...>(name, kernel, grid, block, shared, stream);
}

template <class T> T shuffle(Site site, WarpOp op, unsigned mask, T var, int lane_arg, int width)
{
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 16,
                  "a warp shuffle moves a trivially copyable value of at most 16 bytes");
    T out;
    warp_collective(site, op, mask, &var, &out, sizeof(T), lane_arg, width, 0);
    return out;
}

/* Atomics: relaxed, as CUDA's are; __atomic builtins so that
 * ThreadSanitizer sees them as atomic. */
template <class T> T atomic_cas(T *p, T compare, T value)
{
    __atomic_compare_exchange(p, &compare, &value, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare; /* the old value, on success and on failure */
}

template <class T, class F> T atomic_update(T *p, F f)
{
    T old;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    for (;;) {
        T value = f(old);
        if (__atomic_compare_exchange(p, &old, &value, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return old;
    }
}

} // namespace cudacpu

#define CUDACPU_HERE (::cudacpu::Site{__FILE__, __LINE__})

#define threadIdx (::cudacpu::thread_idx())
#define blockIdx (::cudacpu::block_idx())
#define blockDim (::cudacpu::block_dim())
#define gridDim (::cudacpu::grid_dim())
static constexpr int warpSize = 32;

/* kernel<<<grid, block, shared, stream>>>(args) is written
 * GA_LAUNCH(grid, block, shared, stream, kernel)(args) in kernels/cuda
 * (see kernels/cuda/common.cuh); this is its host-compiler half. */
#define CUDACPU_LAUNCH(grid, block, shared, stream, ...) \
    ::cudacpu::make_launch(#__VA_ARGS__, __VA_ARGS__, grid, block, shared, stream)

#define __syncthreads() ((void)::cudacpu::sync_threads(CUDACPU_HERE, 0, 1))
#define __syncthreads_count(p) ::cudacpu::sync_threads(CUDACPU_HERE, 1, (p) != 0)
#define __syncthreads_and(p) ::cudacpu::sync_threads(CUDACPU_HERE, 2, (p) != 0)
#define __syncthreads_or(p) ::cudacpu::sync_threads(CUDACPU_HERE, 3, (p) != 0)

static inline void cudacpu_syncwarp(::cudacpu::Site site, unsigned mask = 0xffffffffu)
{
    ::cudacpu::warp_collective(site, ::cudacpu::WARP_SYNC, mask, nullptr, nullptr, 0, 0, 32, 0);
}
#define __syncwarp(...) cudacpu_syncwarp(CUDACPU_HERE __VA_OPT__(, ) __VA_ARGS__)

template <class T>
static inline T cudacpu_shfl(::cudacpu::Site site, ::cudacpu::WarpOp op, unsigned mask, T var,
                             int lane_arg, int width = warpSize)
{
    return ::cudacpu::shuffle<T>(site, op, mask, var, lane_arg, width);
}
#define __shfl_sync(mask, ...) \
    cudacpu_shfl(CUDACPU_HERE, ::cudacpu::WARP_SHFL_IDX, mask, __VA_ARGS__)
#define __shfl_up_sync(mask, ...) \
    cudacpu_shfl(CUDACPU_HERE, ::cudacpu::WARP_SHFL_UP, mask, __VA_ARGS__)
#define __shfl_down_sync(mask, ...) \
    cudacpu_shfl(CUDACPU_HERE, ::cudacpu::WARP_SHFL_DOWN, mask, __VA_ARGS__)
#define __shfl_xor_sync(mask, ...) \
    cudacpu_shfl(CUDACPU_HERE, ::cudacpu::WARP_SHFL_XOR, mask, __VA_ARGS__)

#define __all_sync(mask, p)                                                                        \
    ((int)::cudacpu::warp_collective(CUDACPU_HERE, ::cudacpu::WARP_ALL, mask, nullptr, nullptr, 0, \
                                     0, 32, (p) != 0))
#define __any_sync(mask, p)                                                                        \
    ((int)::cudacpu::warp_collective(CUDACPU_HERE, ::cudacpu::WARP_ANY, mask, nullptr, nullptr, 0, \
                                     0, 32, (p) != 0))
#define __ballot_sync(mask, p)                                                                     \
    ::cudacpu::warp_collective(CUDACPU_HERE, ::cudacpu::WARP_BALLOT, mask, nullptr, nullptr, 0, 0, \
                               32, (p) != 0)
#define __activemask() (::cudacpu::active_mask())

static inline void __threadfence()
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
static inline void __threadfence_block()
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
template <class T> static inline T __ldg(const T *p)
{
    return *p;
}

/* ------------------------------------------------------------ atomics */

#define CUDACPU_ATOMIC_INT(T)                                                         \
    static inline T atomicAdd(T *p, T v)                                              \
    {                                                                                 \
        return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);                            \
    }                                                                                 \
    static inline T atomicSub(T *p, T v)                                              \
    {                                                                                 \
        return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED);                            \
    }                                                                                 \
    static inline T atomicAnd(T *p, T v)                                              \
    {                                                                                 \
        return __atomic_fetch_and(p, v, __ATOMIC_RELAXED);                            \
    }                                                                                 \
    static inline T atomicOr(T *p, T v)                                               \
    {                                                                                 \
        return __atomic_fetch_or(p, v, __ATOMIC_RELAXED);                             \
    }                                                                                 \
    static inline T atomicXor(T *p, T v)                                              \
    {                                                                                 \
        return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED);                            \
    }                                                                                 \
    static inline T atomicExch(T *p, T v)                                             \
    {                                                                                 \
        return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);                           \
    }                                                                                 \
    static inline T atomicCAS(T *p, T c, T v)                                         \
    {                                                                                 \
        return ::cudacpu::atomic_cas(p, c, v);                                        \
    }                                                                                 \
    static inline T atomicMin(T *p, T v)                                              \
    {                                                                                 \
        return ::cudacpu::atomic_update(p, [v](T old) { return v < old ? v : old; }); \
    }                                                                                 \
    static inline T atomicMax(T *p, T v)                                              \
    {                                                                                 \
        return ::cudacpu::atomic_update(p, [v](T old) { return v > old ? v : old; }); \
    }

CUDACPU_ATOMIC_INT(int)
CUDACPU_ATOMIC_INT(unsigned int)
CUDACPU_ATOMIC_INT(long long int)
CUDACPU_ATOMIC_INT(unsigned long long int)
#undef CUDACPU_ATOMIC_INT

static inline float atomicAdd(float *p, float v)
{
    return ::cudacpu::atomic_update(p, [v](float old) { return old + v; });
}
static inline double atomicAdd(double *p, double v)
{
    return ::cudacpu::atomic_update(p, [v](double old) { return old + v; });
}
static inline float atomicExch(float *p, float v)
{
    float old;
    __atomic_exchange(p, &v, &old, __ATOMIC_RELAXED);
    return old;
}
/* ((old >= limit) ? 0 : old + 1) and ((old == 0 || old > limit) ? limit : old - 1) */
static inline unsigned int atomicInc(unsigned int *p, unsigned int limit)
{
    return ::cudacpu::atomic_update(
        p, [limit](unsigned int old) { return old >= limit ? 0u : old + 1u; });
}
static inline unsigned int atomicDec(unsigned int *p, unsigned int limit)
{
    return ::cudacpu::atomic_update(
        p, [limit](unsigned int old) { return old == 0u || old > limit ? limit : old - 1u; });
}

#endif
