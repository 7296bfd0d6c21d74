/*
 * probe_stubs.cu — test-only: what kernels/cuda/conv.cu and matmul.cu
 * call outside their descriptor code (the direct kernels, the plan caches,
 * the epilogue kernels, copies, the unfused matmul path), for the
 * device-less descriptor probe that tests/test_cuda_descriptors.py builds
 * from them with GA_DESCRIPTOR_PROBE.  The probe never reaches these: each fails loudly
 * if it ever did.
 */
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/conv_direct.cuh"
#include "kernels/cuda/fallback.h"
#include "kernels/cuda/plan_cache.h"
#include "kernels/kernels.h"

[[noreturn]] static void not_in_the_probe(const char *what)
{
    fprintf(stderr, "descriptor probe: %s called; the probe builds descriptors only\n", what);
    abort();
}

ga_status ga_conv_check(const ga_conv_geometry *, const ga_tensor *, const ga_tensor *,
                        const ga_tensor *)
{
    not_in_the_probe(__func__);
}

ga_status ga_conv_check_forward(const ga_conv_desc *)
{
    not_in_the_probe(__func__);
}

ga_status ga_conv_direct(GaConvOp, const ga_conv_geometry &, const ga_tensor &, const ga_tensor &,
                         const ga_tensor &, const void *, ga_activation, const ga_tensor *,
                         cudaStream_t)
{
    not_in_the_probe(__func__);
}

GaPlanCache &ga_conv_plan_cache()
{
    not_in_the_probe(__func__);
}

extern "C" ga_status ga_cuda_bias_activation(int, const ga_bias_act_desc *, ga_stream)
{
    not_in_the_probe(__func__);
}

extern "C" ga_status ga_cuda_copy(int, const ga_tensor *, const ga_tensor *, ga_stream)
{
    not_in_the_probe(__func__);
}

GaPlanCache &ga_matmul_plan_cache()
{
    not_in_the_probe(__func__);
}

ga_status ga_cuda_matmul_check(const ga_matmul_desc *)
{
    not_in_the_probe(__func__);
}

ga_status ga_cuda_matmul_unfused(int, const ga_matmul_desc *, int, ga_stream)
{
    not_in_the_probe(__func__);
}
