/*
 * plan_cache.cu — the process's plan caches and their statistics.
 */
#include "plan_cache.h"

#include "../kernels.h"

GaPlanCache &ga_matmul_plan_cache()
{
    static GaPlanCache cache;
    return cache;
}

GaPlanCache &ga_conv_plan_cache()
{
    static GaPlanCache cache;
    return cache;
}

extern "C" void ga_cuda_plan_cache_stats(uint64_t *matmul_hits, uint64_t *matmul_misses,
                                         uint64_t *conv_hits, uint64_t *conv_misses)
{
    *matmul_hits = ga_matmul_plan_cache().hits();
    *matmul_misses = ga_matmul_plan_cache().misses();
    *conv_hits = ga_conv_plan_cache().hits();
    *conv_misses = ga_conv_plan_cache().misses();
}
