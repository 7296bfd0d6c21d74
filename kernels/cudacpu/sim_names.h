/*
 * sim_names.h — the names kernels/cuda's entry points take in the
 * simulator build (GPUACCEL_SIM=1).
 *
 * There kernels/sim.c defines the ga_cuda_* functions that csrc/ calls:
 * they check stream order and operands, then call the real entry point of
 * kernels/cuda (compiled by kernels/cudacpu) to do the work.  So the files
 * of kernels/cuda are compiled with this header force-included, which
 * renames their definitions; sim.c includes it with
 * GPUACCEL_SIM_DECLARE_KERNELS defined, which declares them under the new
 * names instead.  One list, both sides.
 */
#ifndef GPUACCEL_CUDACPU_SIM_NAMES_H
#define GPUACCEL_CUDACPU_SIM_NAMES_H

#ifndef GPUACCEL_SIM_DECLARE_KERNELS

#define ga_cuda_copy ga_sim_kernel_copy
#define ga_cuda_fill ga_sim_kernel_fill
#define ga_cuda_bias_activation ga_sim_kernel_bias_activation
#define ga_cuda_activation_backward ga_sim_kernel_activation_backward
#define ga_cuda_normalize_images ga_sim_kernel_normalize_images
#define ga_cuda_resize_images ga_sim_kernel_resize_images
#define ga_cuda_logger_update ga_sim_kernel_logger_update
#define ga_cuda_logger_reset_window ga_sim_kernel_logger_reset_window
#define ga_cuda_stream_capturing ga_sim_kernel_stream_capturing

#else

#include "../kernels.h"

extern __typeof__(ga_cuda_copy) ga_sim_kernel_copy;
extern __typeof__(ga_cuda_fill) ga_sim_kernel_fill;
extern __typeof__(ga_cuda_bias_activation) ga_sim_kernel_bias_activation;
extern __typeof__(ga_cuda_activation_backward) ga_sim_kernel_activation_backward;
extern __typeof__(ga_cuda_normalize_images) ga_sim_kernel_normalize_images;
extern __typeof__(ga_cuda_resize_images) ga_sim_kernel_resize_images;
extern __typeof__(ga_cuda_logger_update) ga_sim_kernel_logger_update;
extern __typeof__(ga_cuda_logger_reset_window) ga_sim_kernel_logger_reset_window;
extern __typeof__(ga_cuda_stream_capturing) ga_sim_kernel_stream_capturing;

#endif

#endif
