// CUDA building blocks of the dense codecs (framework-free; included only by
// the *_op_gpu.cu.cc files).
//
// Reductions are deterministic: a fixed grid writes one partial per block,
// and one block combines the partials in a fixed tree order. Kernels use
// explicitly rounded arithmetic (__fmul_rn, __fadd_rn, __fdiv_rn) so nvcc
// never fuses a multiply and an add: the GPU then produces the same codes
// as the CPU kernels and the plain-TF references for the same scale.
#ifndef TF_MERGECOMP_DENSE_GPU_H_
#define TF_MERGECOMP_DENSE_GPU_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/kernels/dense_bits.h"

namespace tf_mergecomp {
namespace gpu {

constexpr int kThreads = 256;
// Blocks of a reduction's first pass; scratch holds kReduceBlocks partials
// of up to kReduceFields doubles each.
constexpr int kReduceBlocks = 512;
constexpr int kReduceFields = 3;
constexpr int64_t kScratchBytes = int64_t{kReduceBlocks} * kReduceFields * sizeof(double);

inline int GridFor(int64_t work_items) {
  const int64_t blocks = (work_items + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

inline int ReduceGridFor(int64_t work_items) {
  const int grid = GridFor(work_items);
  return grid < kReduceBlocks ? grid : kReduceBlocks;
}

// Sums `value` over the block (kThreads threads) in a fixed tree order; the
// result is valid in thread 0.
__device__ __forceinline__ double BlockSum(double value, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();
  return total;
}

// Sums field `field` of the first `count` partials (laid out
// [block][kReduceFields]) with one block; valid in thread 0.
__device__ __forceinline__ double SumPartials(const double* partials, int count, int field,
                                             double* shared) {
  double value = 0.0;
  for (int i = threadIdx.x; i < count; i += kThreads) value += partials[i * kReduceFields + field];
  return BlockSum(value, shared);
}

// Sign bits of elements [8 * byte, 8 * byte + 8) clipped to n.
__device__ __forceinline__ uint8_t SignByte(const float* x, int64_t n, int64_t byte) {
  uint32_t bits = 0;
  const int64_t base = byte * 8;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (base + j < n) bits |= uint32_t{IsNonNegative(x[base + j])} << j;
  }
  return static_cast<uint8_t>(bits);
}

__device__ __forceinline__ bool BitAt(const uint8_t* bits, int64_t i) {
  return (bits[i >> 3] >> (i & 7)) & 1;
}

inline int ErrorCode() { return static_cast<int>(cudaGetLastError()); }

// Launches `kernel(args...)` on GridFor(work_items) blocks of kThreads threads
// on `stream` (a cudaStream_t) and returns ErrorCode(); returns 0 without
// launching when there is no work.
template <typename... Params, typename... Args>
inline int LaunchOver(int64_t work_items, void* stream, void (*kernel)(Params...),
                      Args... args) {
  if (work_items == 0) return 0;
  kernel<<<GridFor(work_items), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args...);
  return ErrorCode();
}

// Encoders of a sign-bit payload with a reduced header: `pack(input, n,
// payload, partials)` runs one thread per payload byte on ReduceGridFor
// blocks, writing the bits and one partial per block to `scratch`; then one
// block runs `header(partials, blocks, n, payload)`.
inline int LaunchPackThenHeader(void (*pack)(const float*, int64_t, uint8_t*, double*),
                                void (*header)(const double*, int, int64_t, uint8_t*),
                                const float* input, int64_t n, uint8_t* payload, void* scratch,
                                void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  double* partials = static_cast<double*>(scratch);
  const int grid = ReduceGridFor((n + 7) / 8);
  pack<<<grid, kThreads, 0, s>>>(input, n, payload, partials);
  header<<<1, kThreads, 0, s>>>(partials, grid, n, payload);
  return ErrorCode();
}

}  // namespace gpu
}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_DENSE_GPU_H_
