// Casts between the group ops' other gradient dtypes (float16, bfloat16,
// float64) and float32 on a CUDA device, for the GPU kernels of the group
// ops (group_op_gpu.cc): declared in group_gpu_launchers.h. The element casts
// are float_cast_gpu.cu.h's (rounding as the CPU kernels' static_casts).
#include <cuda_runtime.h>

#include <cstdint>

#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/float_cast_gpu.cu.h"
#include "cc/kernels/group_gpu_launchers.h"

namespace tf_mergecomp {
namespace group_cast_gpu {
namespace {

__global__ void ToFloatKernel(int kind, const void* input, float* output, int64_t n) {
  gpu::ForEachIndex(n, [&](int64_t i) { output[i] = gpu::LoadAsFloat(kind, input, i); });
}

__global__ void FromFloatKernel(int kind, const float* input, void* output, int64_t n) {
  gpu::ForEachIndex(n, [&](int64_t i) { gpu::StoreFromFloat(kind, output, i, input[i]); });
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
