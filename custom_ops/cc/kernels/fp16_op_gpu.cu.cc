// fp16 CUDA kernels: round-to-nearest-even float32 -> float16 and back.
#include <cuda_fp16.h>

#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/dense_gpu_launchers.h"

namespace tf_mergecomp {
namespace {

__global__ void ToHalfKernel(const float* input, int64_t n, uint16_t* output) {
  gpu::ForEachIndex(n, [&](int64_t i) {
    output[i] = __half_as_ushort(__float2half_rn(input[i]));
  });
}

__global__ void FromHalfKernel(const uint16_t* input, int64_t n, float* output) {
  gpu::ForEachIndex(n, [&](int64_t i) {
    output[i] = __half2float(__ushort_as_half(input[i]));
  });
}

}  // namespace
}  // namespace tf_mergecomp

extern "C" int mergecomp_fp16_encode_gpu(const float* input, int64_t n, uint16_t* output,
                                         void* stream) {
  return tf_mergecomp::gpu::LaunchOver(n, stream, tf_mergecomp::ToHalfKernel, input, n, output);
}

extern "C" int mergecomp_fp16_decode_gpu(const uint16_t* input, int64_t n, float* output,
                                         void* stream) {
  return tf_mergecomp::gpu::LaunchOver(n, stream, tf_mergecomp::FromHalfKernel, input, n, output);
}
