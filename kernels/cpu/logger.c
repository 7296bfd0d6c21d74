/*
 * logger.c — LossLogger accumulation for host values (Python numbers, CPU
 * tensors); the reference twin of kernels/cuda/logger.cu.
 */
#include "../logger_update.h"

static ga_status check(const ga_logger_update *u)
{
    if (u->n < 0 || u->n > GA_LOGGER_MAX_PER_CALL || u->capacity < 1 || u->max_metrics < 1 ||
        u->max_metrics > GA_LOGGER_MAX_METRICS)
        return GA_STATUS(GA_ERR_INVALID_VALUE, "logger: bad update");
    for (int k = 0; k < u->n; k++)
        if (u->metric[k] < 0 || u->metric[k] >= u->max_metrics)
            return GA_STATUS(GA_ERR_INVALID_VALUE, "logger: metric index out of range");
    return ga_ok();
}

ga_status ga_cpu_logger_update(const ga_logger_update *u)
{
    GA_TRY_STATUS(check(u));
    int64_t step = u->step ? u->step : *(int64_t *)u->state + 1;
    for (int k = 0; k < u->n; k++)
        ga_logger_apply(u, k, step);
    ga_logger_mark_step(u, step);
    return ga_ok();
}

void ga_cpu_logger_reset_window(void *state, int max_metrics, int64_t capacity, int64_t first_step,
                                int64_t nsteps)
{
    ga_logger_reset_stats(state, max_metrics);
    for (int64_t k = 0; k < nsteps && k < capacity; k++)
        ga_logger_clear_row(state, max_metrics, capacity, first_step, k);
}
