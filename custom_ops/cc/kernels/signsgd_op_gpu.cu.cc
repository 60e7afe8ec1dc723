// SignSGD / SIGNUM CUDA kernels: one thread per payload byte to encode, one
// per element to vote.
#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/dense_gpu_launchers.h"

namespace tf_mergecomp {
namespace {

__global__ void SignBitsKernel(const float* input, int64_t n, uint8_t* payload) {
  const int64_t bytes = (n + 7) / 8;
  gpu::ForEachIndex(bytes, [&](int64_t k) {
    payload[k] = gpu::SignByte(input, n, k);
  });
}

__global__ void MajorityVoteKernel(const uint8_t* payload, int64_t world_size, int64_t n,
                                   float* output) {
  const int64_t row_bytes = (n + 7) / 8;
  gpu::ForEachIndex(n, [&](int64_t i) {
    int64_t votes = 0;
    for (int64_t w = 0; w < world_size; ++w) votes += gpu::BitAt(payload + w * row_bytes, i) ? 1 : -1;
    output[i] = votes >= 0 ? 1.0f : -1.0f;
  });
}

}  // namespace
}  // namespace tf_mergecomp

extern "C" int mergecomp_signsgd_encode_gpu(const float* input, int64_t n, uint8_t* payload,
                                            void* stream) {
  return tf_mergecomp::gpu::LaunchOver((n + 7) / 8, stream, tf_mergecomp::SignBitsKernel, input,
                                       n, payload);
}

extern "C" int mergecomp_signsgd_decode_gpu(const uint8_t* payload, int64_t world_size,
                                            int64_t n, float* output, void* stream) {
  return tf_mergecomp::gpu::LaunchOver(n, stream, tf_mergecomp::MajorityVoteKernel, payload,
                                       world_size, n, output);
}
