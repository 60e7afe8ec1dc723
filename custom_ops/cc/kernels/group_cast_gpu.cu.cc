// Casts between the group ops' other gradient dtypes (float16, bfloat16,
// float64) and float32 on a CUDA device, for the GPU kernels of the group
// ops (group_op_gpu.cc): declared in group_gpu_launchers.h. Each cast rounds
// as the CPU kernels' static_casts (Eigen's half and bfloat16): to nearest,
// ties to even; a bfloat16 NaN stays a quiet NaN.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/group_gpu_launchers.h"

namespace tf_mergecomp {
namespace group_cast_gpu {
namespace {

__device__ __forceinline__ float FromBfloat16(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

__device__ __forceinline__ uint16_t ToBfloat16(float value) {
  const uint32_t bits = __float_as_uint(value);
  if (value != value) return (bits >> 31) ? 0xffc0u : 0x7fc0u;  // quiet NaN, as Eigen's
  const uint32_t bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + bias) >> 16);
}

__global__ void ToFloatKernel(int kind, const void* input, float* output, int64_t n) {
  gpu::ForEachIndex(n, [&](int64_t i) {
    switch (kind) {
      case MERGECOMP_CAST_HALF:
        output[i] = __half2float(static_cast<const __half*>(input)[i]);
        break;
      case MERGECOMP_CAST_BFLOAT16:
        output[i] = FromBfloat16(static_cast<const uint16_t*>(input)[i]);
        break;
      default: output[i] = __double2float_rn(static_cast<const double*>(input)[i]); break;
    }
  });
}

__global__ void FromFloatKernel(int kind, const float* input, void* output, int64_t n) {
  gpu::ForEachIndex(n, [&](int64_t i) {
    switch (kind) {
      case MERGECOMP_CAST_HALF: static_cast<__half*>(output)[i] = __float2half_rn(input[i]); break;
      case MERGECOMP_CAST_BFLOAT16:
        static_cast<uint16_t*>(output)[i] = ToBfloat16(input[i]);
        break;
      default: static_cast<double*>(output)[i] = static_cast<double>(input[i]); break;
    }
  });
}

bool KnownKind(int kind) {
  return kind == MERGECOMP_CAST_HALF || kind == MERGECOMP_CAST_BFLOAT16 ||
         kind == MERGECOMP_CAST_DOUBLE;
}

}  // namespace
}  // namespace group_cast_gpu
}  // namespace tf_mergecomp

extern "C" int mergecomp_cast_to_float_gpu(int kind, const void* input, float* output, int64_t n,
                                           void* stream) {
  using namespace tf_mergecomp;  // NOLINT
  if (!group_cast_gpu::KnownKind(kind) || n < 0) return MERGECOMP_GPU_BAD_ARGUMENT;
  if (n == 0) return 0;
  group_cast_gpu::ToFloatKernel<<<gpu::GridFor(n), gpu::kThreads, 0,
                                  static_cast<cudaStream_t>(stream)>>>(kind, input, output, n);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int mergecomp_cast_from_float_gpu(int kind, const float* input, void* output,
                                             int64_t n, void* stream) {
  using namespace tf_mergecomp;  // NOLINT
  if (!group_cast_gpu::KnownKind(kind) || n < 0) return MERGECOMP_GPU_BAD_ARGUMENT;
  if (n == 0) return 0;
  group_cast_gpu::FromFloatKernel<<<gpu::GridFor(n), gpu::kThreads, 0,
                                    static_cast<cudaStream_t>(stream)>>>(kind, input, output, n);
  return static_cast<int>(cudaGetLastError());
}
