// TernGrad CUDA kernels: per-block max |x| (NaN tracked apart), one block for
// the scale, then one thread per payload byte (4 elements).
#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/dense_gpu_launchers.h"

namespace tf_mergecomp {
namespace {

__global__ void MaxAbsKernel(const float* input, int64_t n, double* partials) {
  __shared__ double shared[gpu::kThreads];
  double max_abs = 0.0, has_nan = 0.0;
  gpu::ForEachIndex(n, [&](int64_t i) {
    const float a = fabsf(input[i]);
    if (a != a) {
      has_nan = 1.0;
    } else if (a > max_abs) {
      max_abs = a;
    }
  });
  max_abs = gpu::BlockReduce(max_abs, shared, gpu::MaxOp());
  has_nan = gpu::BlockReduce(has_nan, shared, gpu::MaxOp());
  if (threadIdx.x == 0) {
    partials[blockIdx.x * gpu::kReduceFields] = max_abs;
    partials[blockIdx.x * gpu::kReduceFields + 1] = has_nan;
  }
}

__global__ void MaxHeaderKernel(const double* partials, int count, uint8_t* payload) {
  if (threadIdx.x != 0) return;
  float max_abs = 0.0f;
  bool has_nan = false;
  for (int b = 0; b < count; ++b) {
    const float m = static_cast<float>(partials[b * gpu::kReduceFields]);
    max_abs = m > max_abs ? m : max_abs;
    has_nan |= partials[b * gpu::kReduceFields + 1] != 0.0;
  }
  StoreFloat(payload, has_nan ? __int_as_float(0x7fc00000) : max_abs);
}

__global__ void TernaryCodesKernel(const float* input, int64_t n, SeedKey key, uint8_t* payload) {
  const float max_abs = LoadFloat(payload);
  const int64_t bytes = (n + 3) / 4;
  gpu::ForEachIndex(bytes, [&](int64_t k) {
    uint32_t byte = 0;
    for (int j = 0; j < 4 && 4 * k + j < n; ++j) {
      const int64_t i = 4 * k + j;
      byte |= gpu::TernaryCode(input[i], max_abs, key, i) << (2 * j);
    }
    payload[kTerngradHeaderBytes + k] = static_cast<uint8_t>(byte);
  });
}

__global__ void TerngradDecodeKernel(const uint8_t* payload, int64_t world_size, int64_t n,
                                     float* output) {
  const int64_t row_bytes = kTerngradHeaderBytes + (n + 3) / 4;
  gpu::ForEachIndex(n, [&](int64_t i) {
    float total = 0.0f;
    for (int64_t w = 0; w < world_size; ++w) {
      const uint8_t* row = payload + w * row_bytes;
      const uint32_t code = (row[kTerngradHeaderBytes + (i >> 2)] >> (2 * (i & 3))) & 3;
      const float v = __fmul_rn(LoadFloat(row), gpu::TernaryValue(code));
      total = w == 0 ? v : __fadd_rn(total, v);
    }
    output[i] = __fdiv_rn(total, static_cast<float>(world_size));
  });
}

}  // namespace
}  // namespace tf_mergecomp

using tf_mergecomp::gpu::GridFor;
using tf_mergecomp::gpu::kThreads;

extern "C" int mergecomp_terngrad_encode_gpu(const float* input, int64_t n, int64_t seed,
                                             uint8_t* payload, void* scratch, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  double* partials = static_cast<double*>(scratch);
  const int grid = tf_mergecomp::gpu::ReduceGridFor(n);
  tf_mergecomp::MaxAbsKernel<<<grid, kThreads, 0, s>>>(input, n, partials);
  tf_mergecomp::MaxHeaderKernel<<<1, 32, 0, s>>>(partials, grid, payload);
  if (n == 0) return tf_mergecomp::gpu::ErrorCode();
  tf_mergecomp::TernaryCodesKernel<<<GridFor((n + 3) / 4), kThreads, 0, s>>>(
      input, n, tf_mergecomp::MakeSeedKey(seed), payload);
  return tf_mergecomp::gpu::ErrorCode();
}

extern "C" int mergecomp_terngrad_decode_gpu(const uint8_t* payload, int64_t world_size,
                                             int64_t n, float* output, void* stream) {
  return tf_mergecomp::gpu::LaunchOver(n, stream, tf_mergecomp::TerngradDecodeKernel, payload,
                                       world_size, n, output);
}
