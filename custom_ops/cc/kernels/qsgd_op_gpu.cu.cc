// QSGD CUDA kernels: per-block sums of squares, one block for the norm, then
// one thread per element (8-bit codes) or per 8 elements (other widths).
#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/dense_gpu_launchers.h"

namespace tf_mergecomp {
namespace {

__global__ void SumSquaresKernel(const float* input, int64_t n, double* partials) {
  __shared__ double shared[gpu::kThreads];
  double sum = 0.0;
  gpu::ForEachIndex(n, [&](int64_t i) {
    const double v = input[i];
    sum += v * v;  // exact: a float32 squared fits in a double
  });
  sum = gpu::BlockSum(sum, shared);
  if (threadIdx.x == 0) partials[blockIdx.x * gpu::kReduceFields] = sum;
}

__global__ void NormHeaderKernel(const double* partials, int count, uint8_t* payload) {
  __shared__ double shared[gpu::kThreads];
  const double sum = gpu::SumPartials(partials, count, 0, shared);
  if (threadIdx.x == 0) StoreFloat(payload, static_cast<float>(sqrt(sum)));
}

__global__ void QsgdCodes8Kernel(const float* input, int64_t n, SeedKey key, float levels,
                                 uint8_t* payload) {
  const float scale = gpu::QsgdScale(LoadFloat(payload), levels);
  gpu::ForEachIndex(n, [&](int64_t i) {
    payload[kQsgdHeaderBytes + i] = static_cast<uint8_t>(gpu::QsgdCode(input[i], scale, levels, key, i));
  });
}

// Each thread packs 8 elements, which fill exactly `bits` bytes.
__global__ void QsgdCodesPackedKernel(const float* input, int64_t n, SeedKey key, float levels,
                                      int bits, uint8_t* payload) {
  const float scale = gpu::QsgdScale(LoadFloat(payload), levels);
  const int64_t groups = (n + 7) / 8;
  gpu::ForEachIndex(groups, [&](int64_t g) {
    uint8_t* out = payload + kQsgdHeaderBytes + g * bits;
    uint64_t pending = 0;
    int filled = 0;
    for (int64_t i = 8 * g; i < 8 * g + 8 && i < n; ++i) {
      pending |= static_cast<uint64_t>(gpu::QsgdCode(input[i], scale, levels, key, i)) << filled;
      filled += bits;
      while (filled >= 8) {
        *out++ = static_cast<uint8_t>(pending);
        pending >>= 8;
        filled -= 8;
      }
    }
    if (filled > 0) *out = static_cast<uint8_t>(pending);
  });
}

__global__ void QsgdDecodeKernel(const uint8_t* payload, int64_t world_size, int64_t n,
                                 int32_t levels, int bits, int64_t row_bytes, float* output) {
  const float levels_f = static_cast<float>(levels);
  gpu::ForEachIndex(n, [&](int64_t i) {
    float total = 0.0f;
    for (int64_t w = 0; w < world_size; ++w) {
      const uint8_t* row = payload + w * row_bytes;
      const float unit = __fdiv_rn(LoadFloat(row), levels_f);
      const float v = __fmul_rn(static_cast<float>(gpu::CodeAt(row + kQsgdHeaderBytes, i, bits) - levels),
                                unit);
      total = w == 0 ? v : __fadd_rn(total, v);
    }
    output[i] = __fdiv_rn(total, static_cast<float>(world_size));
  });
}

}  // namespace
}  // namespace tf_mergecomp

using tf_mergecomp::gpu::GridFor;
using tf_mergecomp::gpu::kThreads;

extern "C" int mergecomp_qsgd_encode_gpu(const float* input, int64_t n, int64_t seed,
                                         int64_t levels, uint8_t* payload, void* scratch,
                                         void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  double* partials = static_cast<double*>(scratch);
  const int grid = tf_mergecomp::gpu::ReduceGridFor(n);
  tf_mergecomp::SumSquaresKernel<<<grid, kThreads, 0, s>>>(input, n, partials);
  tf_mergecomp::NormHeaderKernel<<<1, kThreads, 0, s>>>(partials, grid, payload);
  if (n == 0) return tf_mergecomp::gpu::ErrorCode();
  const tf_mergecomp::SeedKey key = tf_mergecomp::MakeSeedKey(seed);
  const int bits = tf_mergecomp::QsgdCodeBits(levels);
  const float levels_f = static_cast<float>(levels);
  if (bits == 8) {
    tf_mergecomp::QsgdCodes8Kernel<<<GridFor(n), kThreads, 0, s>>>(input, n, key, levels_f,
                                                                   payload);
  } else {
    tf_mergecomp::QsgdCodesPackedKernel<<<GridFor((n + 7) / 8), kThreads, 0, s>>>(
        input, n, key, levels_f, bits, payload);
  }
  return tf_mergecomp::gpu::ErrorCode();
}

extern "C" int mergecomp_qsgd_decode_gpu(const uint8_t* payload, int64_t world_size, int64_t n,
                                         int64_t levels, float* output, void* stream) {
  if (n == 0) return 0;
  const int bits = tf_mergecomp::QsgdCodeBits(levels);
  const int64_t row_bytes = tf_mergecomp::kQsgdHeaderBytes + (n * bits + 7) / 8;
  return tf_mergecomp::gpu::LaunchOver(n, stream, tf_mergecomp::QsgdDecodeKernel, payload,
                                       world_size, n, static_cast<int32_t>(levels), bits,
                                       row_bytes, output);
}
