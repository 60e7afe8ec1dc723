// EF-SignSGD CUDA kernels: one pass packs the sign bits and writes per-block
// L1 sums; one block turns them into the scale; decoding is one thread per
// element.
#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/dense_gpu_launchers.h"

namespace tf_mergecomp {
namespace {

__global__ void EfsignsgdPackKernel(const float* input, int64_t n, uint8_t* payload,
                                    double* partials) {
  __shared__ double shared[gpu::kThreads];
  const int64_t bytes = (n + 7) / 8;
  double l1 = 0.0;
  gpu::ForEachIndex(bytes, [&](int64_t k) {
    payload[kEfsignsgdHeaderBytes + k] = gpu::SignByte(input, n, k);
    for (int64_t i = 8 * k; i < 8 * k + 8 && i < n; ++i) l1 += fabs(static_cast<double>(input[i]));
  });
  l1 = gpu::BlockSum(l1, shared);
  if (threadIdx.x == 0) partials[blockIdx.x * gpu::kReduceFields] = l1;
}

__global__ void EfsignsgdHeaderKernel(const double* partials, int count, int64_t n,
                                      uint8_t* payload) {
  __shared__ double shared[gpu::kThreads];
  const double l1 = gpu::SumPartials(partials, count, 0, shared);
  if (threadIdx.x == 0) {
    StoreFloat(payload, n > 0 ? static_cast<float>(l1 / static_cast<double>(n)) : 0.0f);
  }
}

__global__ void EfsignsgdDecodeKernel(const uint8_t* payload, int64_t world_size, int64_t n,
                                      float* output) {
  const int64_t row_bytes = kEfsignsgdHeaderBytes + (n + 7) / 8;
  gpu::ForEachIndex(n, [&](int64_t i) {
    float total = 0.0f;
    for (int64_t w = 0; w < world_size; ++w) {
      const uint8_t* row = payload + w * row_bytes;
      const float scale = LoadFloat(row);
      const float v = gpu::BitAt(row + kEfsignsgdHeaderBytes, i) ? scale : -scale;
      total = w == 0 ? v : __fadd_rn(total, v);
    }
    output[i] = __fdiv_rn(total, static_cast<float>(world_size));
  });
}

}  // namespace
}  // namespace tf_mergecomp

extern "C" int mergecomp_efsignsgd_encode_gpu(const float* input, int64_t n, uint8_t* payload,
                                              void* scratch, void* stream) {
  return tf_mergecomp::gpu::LaunchPackThenHeader(tf_mergecomp::EfsignsgdPackKernel,
                                                 tf_mergecomp::EfsignsgdHeaderKernel, input, n,
                                                 payload, scratch, stream);
}

extern "C" int mergecomp_efsignsgd_decode_gpu(const uint8_t* payload, int64_t world_size,
                                              int64_t n, float* output, void* stream) {
  return tf_mergecomp::gpu::LaunchOver(n, stream, tf_mergecomp::EfsignsgdDecodeKernel, payload,
                                       world_size, n, output);
}
