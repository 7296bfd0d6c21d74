/*
 * logger_update.h — one log() call applied to a LossLogger state; the same
 * code runs on the host (kernels/cpu/logger.c) and in the CUDA kernel
 * (kernels/cuda/logger.cu).
 */
#ifndef GPUACCEL_LOGGER_UPDATE_H
#define GPUACCEL_LOGGER_UPDATE_H

#include <math.h>

#include "convert.h"

/* Applies metric k of the call to the state (one thread per metric). */
GA_HD void ga_logger_apply(const ga_logger_update *u, int k, int64_t step)
{
    char *base = (char *)u->state;
    int m = u->metric[k];
    double *stats = (double *)(base + ga_logger_stats_offset()) + (size_t)m * GA_LOGGER_STATS;
    ga_value loaded = ga_load(u->dtype[k], u->value[k]);
    double v = loaded.is_float ? loaded.f : (double)loaded.i;
    float *row = (float *)(base + ga_logger_values_offset(u->capacity, u->max_metrics)) +
                 (size_t)((step - 1) % u->capacity) * (size_t)u->max_metrics;
    row[m] = (float)v;
    if (isfinite(v)) {
        stats[GA_LOGGER_SUM] += v;
        stats[GA_LOGGER_COUNT] += 1.0;
        if (v > stats[GA_LOGGER_MAX])
            stats[GA_LOGGER_MAX] = v;
        if (-v > stats[GA_LOGGER_NEG_MIN])
            stats[GA_LOGGER_NEG_MIN] = -v;
    } else {
        stats[GA_LOGGER_NONFINITE] += 1.0;
        if (-(double)step > stats[GA_LOGGER_NEG_FIRST_BAD])
            stats[GA_LOGGER_NEG_FIRST_BAD] = -(double)step;
    }
}

GA_HD void ga_logger_mark_step(const ga_logger_update *u, int64_t step)
{
    char *base = (char *)u->state;
    uint64_t *present = (uint64_t *)(base + ga_logger_present_offset(u->max_metrics));
    present[(step - 1) % u->capacity] = u->present;
    *(int64_t *)base = step;
}

GA_HD void ga_logger_reset_stats(void *state, int max_metrics)
{
    double *stats = (double *)((char *)state + ga_logger_stats_offset());
    for (int m = 0; m < max_metrics; m++) {
        double *s = stats + (size_t)m * GA_LOGGER_STATS;
        s[GA_LOGGER_SUM] = s[GA_LOGGER_COUNT] = s[GA_LOGGER_NONFINITE] = 0.0;
        s[GA_LOGGER_MAX] = s[GA_LOGGER_NEG_MIN] = s[GA_LOGGER_NEG_FIRST_BAD] = -INFINITY;
    }
}

/* Clears presence row k (k-th step from first_step) of the window. */
GA_HD void ga_logger_clear_row(void *state, int max_metrics, int64_t capacity, int64_t first_step,
                               int64_t k)
{
    uint64_t *present = (uint64_t *)((char *)state + ga_logger_present_offset(max_metrics));
    present[(first_step - 1 + k) % capacity] = 0;
}

#endif
