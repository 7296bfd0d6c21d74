/*
 * fallback.h — the CUDA backend's own kernels behind its library calls:
 * what ga_cuda_matmul runs when cuBLASLt cannot run a call fused, or runs
 * only its GEMM and bias (matmul_unfused.cu), and the direct route of ga_cuda_conv2d_* when cuDNN
 * cannot (conv_direct.cu).  They need neither library, so the simulator
 * build (kernels/sim/sim.c), which has neither, runs them for every matmul and
 * conv, and tests/test_kernels_on_cpu.py calls them.  Plain C.
 */
#ifndef GPUACCEL_CUDA_FALLBACK_H
#define GPUACCEL_CUDA_FALLBACK_H

#include "../kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What ga_cuda_matmul accepts (shapes, dtypes, which epilogues combine). */
ga_status ga_cuda_matmul_check(const ga_matmul_desc *desc);

/* On a checked descriptor: for an empty D, the sums that are still due
 * (a_row_sums over a non-empty A, zeros otherwise); else D = A @ B by the
 * generic kernel (unless gemm_done: a plain GEMM already wrote D), then
 * epilogue.cu's kernels for everything the descriptor asks after it. */
ga_status ga_cuda_matmul_unfused(int device, const ga_matmul_desc *desc, int gemm_done,
                                 ga_stream stream);

/* D[b] = act(Z[b]) elementwise (Z and D of one shape, any strides; Z may
 * be D itself): the second half of ga_cuda_matmul's split route, after a
 * GEMM (+ bias) wrote the pre-activation Z. */
ga_status ga_cuda_matmul_activation(int device, const ga_matrix *z, const ga_matrix *d,
                                    int64_t batch, ga_activation act, ga_stream stream);

/* ga_cuda_conv2d_* with the same checks, always by the direct kernels. */
ga_status ga_cuda_conv2d_forward_direct(int device, const ga_conv_desc *desc, ga_stream stream);
ga_status ga_cuda_conv2d_backward_data_direct(int device, const ga_conv_geometry *geom,
                                              const ga_tensor *dy, const ga_tensor *w,
                                              const ga_tensor *dx, ga_stream stream);
ga_status ga_cuda_conv2d_backward_filter_direct(int device, const ga_conv_geometry *geom,
                                                const ga_tensor *x, const ga_tensor *dy,
                                                const ga_tensor *dw, ga_stream stream);

#ifdef __cplusplus
}
#endif

#endif
