/*
 * kernel_names.h — the names kernels/cuda's KERNEL entry points
 * (kernels/entry_points.h) take in the simulator build (GPUACCEL_SIM=1).
 *
 * There kernels/sim/sim.c defines the ga_cuda_* functions that csrc/ calls:
 * they check stream order and operands, then call the real entry point of
 * kernels/cuda (compiled by kernels/cudacpu) to do the work.  So the files
 * of kernels/cuda are compiled with this header force-included, which
 * renames their definitions of those entry points to ga_sim_kernel_<name>
 * (a redeclaration with an assembler name, before the definition); sim.c
 * includes it with GPUACCEL_SIM_DECLARE_KERNELS defined, which declares
 * them under the new names instead.  Both come from the one list.
 */
#ifndef GPUACCEL_SIM_KERNEL_NAMES_H
#define GPUACCEL_SIM_KERNEL_NAMES_H

#include "../entry_points.h"
#include "../kernels.h"

#ifndef GPUACCEL_SIM_DECLARE_KERNELS
#define GA_SIM_RENAME(kind, ret, name, params, ...) \
    extern __typeof__(ga_cuda_##name) ga_cuda_##name __asm__("ga_sim_kernel_" #name);
#else
#define GA_SIM_RENAME(kind, ret, name, params, ...) \
    extern __typeof__(ga_cuda_##name) ga_sim_kernel_##name;
#endif

GA_CUDA_KERNEL_ENTRY_POINTS(GA_SIM_RENAME)

#undef GA_SIM_RENAME

#endif
