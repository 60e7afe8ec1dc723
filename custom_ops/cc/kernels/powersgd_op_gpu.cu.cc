// PowerSGD's per-tensor products on a CUDA device (powersgd_gpu_launchers.h):
// one launch computes every entry of every C_i = op(A_i) B_i of the group,
// the thread of an entry finding its matrix with the group kernels' cursor
// (gpu::SegmentCursor: a binary search over the output offsets when it
// leaves the matrix it last used). The ranks are small (1 to 4 columns), so an
// entry is a dot product over one row of M_i: memory-bound, no tiling.
#include <cuda_runtime.h>

#include <cstdint>

#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/group_gpu_launchers.h"
#include "cc/kernels/powersgd_gpu_launchers.h"

namespace tf_mergecomp {
namespace {

// `tables`' pointers are device pointers, but for host_c_offsets, which the
// kernel does not read.
__global__ void GroupedMatmulKernel(MergecompGpuMatrices tables, int64_t total, const float* a,
                                    int transpose_a, const float* b, float* c) {
  gpu::SegmentCursor matrix;
  gpu::ForEachIndex(total, [&](int64_t e) {
    matrix.Seek(tables.c_offsets, tables.count, e);
    const int64_t i = matrix.t, begin = matrix.begin;
    const int64_t m = tables.m[i], k = tables.k[i], r = tables.r[i];
    const int64_t row = (e - begin) / r, col = (e - begin) % r;
    const float* a_i = a + tables.a_offsets[i];
    const float* b_i = b + tables.b_offsets[i];
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      const float a_value = transpose_a ? a_i[j * m + row] : a_i[row * k + j];
      sum += static_cast<double>(a_value) * static_cast<double>(b_i[j * r + col]);
    }
    c[e] = static_cast<float>(sum);
  });
}

}  // namespace
}  // namespace tf_mergecomp

extern "C" int mergecomp_grouped_matmul_gpu(const MergecompGpuMatrices* matrices, const float* a,
                                            int transpose_a, const float* b, float* c,
                                            void* stream) {
  using namespace tf_mergecomp;
  constexpr int kBadArgument = MERGECOMP_GPU_BAD_ARGUMENT;
  if (matrices == nullptr || matrices->count < 0 || matrices->host_c_offsets == nullptr ||
      matrices->host_c_offsets[0] != 0) {
    return kBadArgument;
  }
  for (int64_t i = 0; i < matrices->count; ++i) {
    if (matrices->host_c_offsets[i + 1] < matrices->host_c_offsets[i]) return kBadArgument;
  }
  const int64_t total = matrices->host_c_offsets[matrices->count];
  return gpu::LaunchOver(total, stream, GroupedMatmulKernel, *matrices, total, a, transpose_a, b,
                         c);
}
