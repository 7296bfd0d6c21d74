/*
 * logger.cu — LossLogger accumulation on the GPU: one tiny kernel per
 * log() call, queued on the stream that produced the values, so logging
 * never waits for the GPU.  Twin of kernels/cpu/logger.c.
 */
#include "../logger_update.h"
#include "common.cuh"

namespace
{

/* One thread per metric of the call.  With step == 0 (CUDA graph replay)
 * the step comes from the state's own counter, so each replay writes the
 * next ring row. */
__global__ void logger_update_kernel(ga_logger_update u)
{
    __shared__ int64_t step;
    if (threadIdx.x == 0)
        step = u.step ? u.step : *(const int64_t *)u.state + 1;
    __syncthreads();
    if ((int)threadIdx.x < u.n)
        ga_logger_apply(&u, threadIdx.x, step);
    /* no barrier: the step counter and the presence row that thread 0
     * writes are no memory any thread's metric touches */
    if (threadIdx.x == 0)
        ga_logger_mark_step(&u, step);
}

__global__ void logger_reset_kernel(void *state, int max_metrics, int64_t capacity,
                                    int64_t first_step, int64_t nsteps)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        ga_logger_reset_stats(state, max_metrics);
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < nsteps && k < capacity;
         k += (int64_t)gridDim.x * blockDim.x) {
        GA_TRIP();
        ga_logger_clear_row(state, max_metrics, capacity, first_step, k);
    }
}

} // namespace

extern "C" ga_status ga_cuda_logger_update(int device, const ga_logger_update *u, ga_stream stream)
{
    GA_NVTX_RANGE("logger_update");
    if (u->n < 0 || u->n > GA_LOGGER_MAX_PER_CALL || u->capacity < 1 || u->max_metrics < 1 ||
        u->max_metrics > GA_LOGGER_MAX_METRICS)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "logger: bad update");
    GA_WITH_DEVICE(device);
    GA_LAUNCH(1, 32, 0, ga_cu_stream(stream), logger_update_kernel)(*u);
    GA_CUDA_LAUNCH_CHECK("logger_update_kernel");
    return ga_ok();
}

extern "C" ga_status ga_cuda_logger_reset_window(int device, void *state, int max_metrics,
                                                 int64_t capacity, int64_t first_step,
                                                 int64_t nsteps, ga_stream stream)
{
    GA_WITH_DEVICE(device);
    cudaStream_t s = ga_cu_stream(stream);
    GA_LAUNCH(4, 256, 0, s, logger_reset_kernel)(state, max_metrics, capacity, first_step, nsteps);
    GA_CUDA_LAUNCH_CHECK("logger_reset_kernel");
    return ga_ok();
}
