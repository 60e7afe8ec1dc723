// 1-bit SGD CUDA kernels: one pass packs the sign bits and writes per-block
// side sums; one block turns them into mu+ and mu-; decoding is one thread
// per element.
#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/dense_gpu_launchers.h"

namespace tf_mergecomp {
namespace {

__global__ void OnebitPackKernel(const float* input, int64_t n, uint8_t* payload,
                                 double* partials) {
  __shared__ double shared[gpu::kThreads];
  const int64_t bytes = (n + 7) / 8;
  double positive = 0.0, negative = 0.0, positive_count = 0.0;
  gpu::ForEachIndex(bytes, [&](int64_t k) {
    payload[kOnebitHeaderBytes + k] = gpu::SignByte(input, n, k);
    for (int64_t i = 8 * k; i < 8 * k + 8 && i < n; ++i) {
      const bool plus = IsNonNegative(input[i]);
      positive += plus ? static_cast<double>(input[i]) : 0.0;
      negative += plus ? 0.0 : static_cast<double>(input[i]);
      positive_count += plus ? 1.0 : 0.0;
    }
  });
  positive = gpu::BlockSum(positive, shared);
  negative = gpu::BlockSum(negative, shared);
  positive_count = gpu::BlockSum(positive_count, shared);
  if (threadIdx.x == 0) {
    double* mine = partials + blockIdx.x * gpu::kReduceFields;
    mine[0] = positive;
    mine[1] = negative;
    mine[2] = positive_count;
  }
}

__global__ void OnebitHeaderKernel(const double* partials, int count, int64_t n,
                                   uint8_t* payload) {
  __shared__ double shared[gpu::kThreads];
  const double positive = gpu::SumPartials(partials, count, 0, shared);
  const double negative = gpu::SumPartials(partials, count, 1, shared);
  const double positive_count = gpu::SumPartials(partials, count, 2, shared);
  if (threadIdx.x == 0) {
    const double negative_count = static_cast<double>(n) - positive_count;
    StoreFloat(payload, positive_count > 0 ? static_cast<float>(positive / positive_count) : 0.0f);
    StoreFloat(payload + 4,
               negative_count > 0 ? static_cast<float>(negative / negative_count) : 0.0f);
  }
}

__global__ void OnebitDecodeKernel(const uint8_t* payload, int64_t world_size, int64_t n,
                                   float* output) {
  const int64_t row_bytes = kOnebitHeaderBytes + (n + 7) / 8;
  gpu::ForEachIndex(n, [&](int64_t i) {
    float total = 0.0f;
    for (int64_t w = 0; w < world_size; ++w) {
      const uint8_t* row = payload + w * row_bytes;
      const float v = gpu::BitAt(row + kOnebitHeaderBytes, i) ? LoadFloat(row) : LoadFloat(row + 4);
      total = w == 0 ? v : __fadd_rn(total, v);
    }
    output[i] = __fdiv_rn(total, static_cast<float>(world_size));
  });
}

}  // namespace
}  // namespace tf_mergecomp

extern "C" int mergecomp_onebit_encode_gpu(const float* input, int64_t n, uint8_t* payload,
                                           void* scratch, void* stream) {
  return tf_mergecomp::gpu::LaunchPackThenHeader(tf_mergecomp::OnebitPackKernel,
                                                 tf_mergecomp::OnebitHeaderKernel, input, n,
                                                 payload, scratch, stream);
}

extern "C" int mergecomp_onebit_decode_gpu(const uint8_t* payload, int64_t world_size,
                                           int64_t n, float* output, void* stream) {
  return tf_mergecomp::gpu::LaunchOver(n, stream, tf_mergecomp::OnebitDecodeKernel, payload,
                                       world_size, n, output);
}
