// CUDA's declaration qualifiers for host C++. Device code is host code here:
// __global__ / __device__ / __host__ / __constant__ vanish, __forceinline__ is
// `inline`. __shared__ never reaches the compiler: gpu_check/emulation/rewrite.py
// turns each __shared__ declaration into per-block storage (block.h); the macro
// below only turns a declaration the rewrite missed into a clear error.
#ifndef CUDA_EMULATION_QUALIFIERS_H_
#define CUDA_EMULATION_QUALIFIERS_H_

#define CUDA_EMULATION 1

#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ \
  static_assert(false, "__shared__ outside gpu_check/emulation/rewrite.py's rewrite");

#endif  // CUDA_EMULATION_QUALIFIERS_H_
