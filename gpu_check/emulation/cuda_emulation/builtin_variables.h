// threadIdx, blockIdx, blockDim, gridDim and warpSize. Every CUDA thread of a
// launch is a host thread of the emulation's pool (runtime/grid.cc), so the
// built-in variables are thread-local: the pool sets them before each block.
#ifndef CUDA_EMULATION_BUILTIN_VARIABLES_H_
#define CUDA_EMULATION_BUILTIN_VARIABLES_H_

#include "cuda_emulation/types.h"

namespace cuda_emulation {
// Defined once in runtime/grid.cc; kernels read them as CUDA's built-ins.
extern thread_local uint3 thread_index;
extern thread_local uint3 block_index;
extern thread_local dim3 block_dim;
extern thread_local dim3 grid_dim;
}  // namespace cuda_emulation

#define threadIdx (static_cast<const uint3&>(::cuda_emulation::thread_index))
#define blockIdx (static_cast<const uint3&>(::cuda_emulation::block_index))
#define blockDim (static_cast<const dim3&>(::cuda_emulation::block_dim))
#define gridDim (static_cast<const dim3&>(::cuda_emulation::grid_dim))
#define warpSize 32

#endif  // CUDA_EMULATION_BUILTIN_VARIABLES_H_
