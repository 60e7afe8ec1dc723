// Device-side loads and stores of the gradient dtypes that are not float32
// (float16, bfloat16, float64), through float32: the casts of the group ops'
// GPU kernels (group_cast_gpu.cu.cc) and PowerSGD's (powersgd_op_gpu.cu.cc).
// Each rounds as the CPU kernels' static_casts (Eigen's half and bfloat16):
// to nearest, ties to even; a bfloat16 NaN stays a quiet NaN. `kind` is 0
// for float32 or one of group_gpu_launchers.h's MERGECOMP_CAST_* codes.
// Included only by *_gpu.cu.cc files.
#ifndef TF_MERGECOMP_FLOAT_CAST_GPU_CU_H_
#define TF_MERGECOMP_FLOAT_CAST_GPU_CU_H_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cc/kernels/group_gpu_launchers.h"

namespace tf_mergecomp {
namespace gpu {

__device__ __forceinline__ float FromBfloat16(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

__device__ __forceinline__ uint16_t ToBfloat16(float value) {
  const uint32_t bits = __float_as_uint(value);
  if (value != value) return (bits >> 31) ? 0xffc0u : 0x7fc0u;  // quiet NaN, as Eigen's
  const uint32_t bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + bias) >> 16);
}

// Element i of `values` (of dtype `kind`) as float32.
__device__ __forceinline__ float LoadAsFloat(int kind, const void* values, int64_t i) {
  switch (kind) {
    case MERGECOMP_CAST_HALF: return __half2float(static_cast<const __half*>(values)[i]);
    case MERGECOMP_CAST_BFLOAT16: return FromBfloat16(static_cast<const uint16_t*>(values)[i]);
    case MERGECOMP_CAST_DOUBLE: return __double2float_rn(static_cast<const double*>(values)[i]);
    default: return static_cast<const float*>(values)[i];
  }
}

// Stores `value` as element i of `values` (of dtype `kind`).
__device__ __forceinline__ void StoreFromFloat(int kind, void* values, int64_t i, float value) {
  switch (kind) {
    case MERGECOMP_CAST_HALF: static_cast<__half*>(values)[i] = __float2half_rn(value); break;
    case MERGECOMP_CAST_BFLOAT16: static_cast<uint16_t*>(values)[i] = ToBfloat16(value); break;
    case MERGECOMP_CAST_DOUBLE: static_cast<double*>(values)[i] = static_cast<double>(value); break;
    default: static_cast<float*>(values)[i] = value; break;
  }
}

}  // namespace gpu
}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_FLOAT_CAST_GPU_CU_H_
