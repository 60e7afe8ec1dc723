// PowerSGD's group steps on a CUDA device (powersgd_gpu_launchers.h).
//
// The two products that reduce over a long dimension, P_i = M_i Q_i and
// Qlocal_i = M_i^T P_i, go through one grouped launch per product per group:
// every entry of every C_i of the group, the thread of an entry finding its
// matrix with the group kernels' cursor (gpu::SegmentCursor: a binary search
// over the output offsets when it leaves the matrix it last used). Not cuBLAS
// per tensor: that is one launch (and its fixed cost) per tensor, the very
// per-tensor cost MergeComp merges away, and with ranks of 1 to 4 columns
// each product reads M once for a few flops per element, memory-bound, so a
// tuned GEMM has nothing to gain over one streaming dot product per entry.
//
// The other passes are element-wise over the group's flat index space (the
// compensation, the finish step) or one block per matrix (Gram-Schmidt, the
// finiteness flags), each one launch for the whole group.
#include <cuda_runtime.h>

#include <cstdint>

#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/float_cast_gpu.cu.h"
#include "cc/kernels/group_gpu_launchers.h"
#include "cc/kernels/powersgd_gpu_launchers.h"

namespace tf_mergecomp {
namespace {

// Gram-Schmidt leaves a column whose norm is below this at zero (powersgd_op.h).
constexpr double kMinNorm = 1e-30;
// Blocks of the one-block-per-matrix kernels (a grid-stride loop covers more).
constexpr int64_t kMaxMatrixBlocks = 65535;

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

// Where tensor i's Q starts in its state variable.
__device__ __forceinline__ int64_t QStateOffset(const MergecompPowersgdGpuGroup& group,
                                                int64_t i) {
  return group.residual ? group.offsets[i + 1] - group.offsets[i] : 0;
}

__global__ void CompensateKernel(MergecompPowersgdGpuGroup group, int64_t total, float* m,
                                 float* p) {
  gpu::SegmentCursor tensor;
  gpu::ForEachIndex(total, [&](int64_t e) {
    tensor.Seek(group.offsets, group.num_tensors, e);
    const int64_t i = tensor.t, j = e - tensor.begin;
    float value = gpu::LoadAsFloat(static_cast<int>(group.kinds[i]), group.gradients[i], j);
    if (group.residual) value = __fadd_rn(value, group.state[i][j]);
    if (group.ranks[i] > 0) {
      m[group.m_offsets[i] + j] = value;
    } else {
      p[group.p_offsets[i] + j] = value;
    }
  });
}

__global__ void GatherQKernel(MergecompPowersgdGpuGroup group, float* q) {
  gpu::SegmentCursor tensor;
  gpu::ForEachIndex(group.host_q_size, [&](int64_t e) {
    tensor.Seek(group.q_offsets, group.num_tensors, e);
    const int64_t i = tensor.t;
    q[e] = group.state[i][QStateOffset(group, i) + e - tensor.begin];
  });
}

// One block per matrix; each thread keeps to its own rows, so the only
// synchronisation is the block sums'.
__global__ void OrthonormalizeKernel(MergecompPowersgdGpuGroup group, float* p) {
  __shared__ double shared[gpu::kThreads];
  for (int64_t i = blockIdx.x; i < group.num_tensors; i += gridDim.x) {
    const int64_t rank = group.ranks[i];
    if (rank == 0) continue;  // the same for the whole block
    const int64_t rows = (group.offsets[i + 1] - group.offsets[i]) / group.cols[i];
    float* matrix = p + group.p_offsets[i];
    for (int64_t j = 0; j < rank; ++j) {
      for (int pass = 0; pass < 2; ++pass) {
        for (int64_t previous = 0; previous < j; ++previous) {
          double dot = 0.0;
          for (int64_t row = threadIdx.x; row < rows; row += blockDim.x) {
            dot += static_cast<double>(matrix[row * rank + previous]) *
                   static_cast<double>(matrix[row * rank + j]);
          }
          const float projection = static_cast<float>(gpu::BlockSum(dot, shared));
          for (int64_t row = threadIdx.x; row < rows; row += blockDim.x) {
            matrix[row * rank + j] = __fsub_rn(matrix[row * rank + j],
                                               __fmul_rn(projection, matrix[row * rank + previous]));
          }
        }
      }
      double squares = 0.0;
      for (int64_t row = threadIdx.x; row < rows; row += blockDim.x) {
        const double value = matrix[row * rank + j];
        squares += value * value;
      }
      const double norm = sqrt(gpu::BlockSum(squares, shared));
      const float scale = norm > kMinNorm ? static_cast<float>(1.0 / norm) : 0.0f;
      for (int64_t row = threadIdx.x; row < rows; row += blockDim.x) {
        matrix[row * rank + j] = __fmul_rn(matrix[row * rank + j], scale);
      }
    }
  }
}

__device__ __forceinline__ bool IsFiniteFloat(float value) {
  return (__float_as_uint(value) & 0x7f800000u) != 0x7f800000u;
}

// One block per tensor: nonfinite[i] = 1 when P_i (or the raw values) or
// Qmean_i holds an inf or a NaN.
__global__ void NonfiniteKernel(MergecompPowersgdGpuGroup group, const float* p,
                                const float* q_mean, int32_t* nonfinite) {
  for (int64_t i = blockIdx.x; i < group.num_tensors; i += gridDim.x) {
    const int64_t size = group.offsets[i + 1] - group.offsets[i];
    const int64_t rank = group.ranks[i];
    const int64_t p_size = rank > 0 ? size / group.cols[i] * rank : size;
    const float* p_i = p + group.p_offsets[i];
    const float* q_i = q_mean + group.q_offsets[i];
    const int64_t q_size = group.q_offsets[i + 1] - group.q_offsets[i];
    int bad = 0;
    for (int64_t j = threadIdx.x; j < p_size; j += blockDim.x) bad |= !IsFiniteFloat(p_i[j]);
    for (int64_t j = threadIdx.x; j < q_size; j += blockDim.x) bad |= !IsFiniteFloat(q_i[j]);
    bad = __syncthreads_or(bad);
    if (threadIdx.x == 0) nonfinite[i] = bad ? 1 : 0;
  }
}

// sum_t a[t] * b[t] over a rank's few columns, in float64, rounded once (as
// the grouped product rounds).
__device__ __forceinline__ float RankDot(const float* a, const float* b, int64_t rank) {
  double sum = 0.0;
  for (int64_t t = 0; t < rank; ++t) sum += static_cast<double>(a[t]) * static_cast<double>(b[t]);
  return static_cast<float>(sum);
}

// Element-wise over the group: the decompressed output in its dtype, and
// the residual. The product P_i Qmean_i^T is an outer product of rank r_i:
// each entry sums r_i terms, so it is computed where it is written (cast into
// the output, no float32 scratch of the group's size) rather than through
// the grouped product, whose B would be Qmean_i^T.
__global__ void FinishKernel(MergecompPowersgdGpuGroup group, int64_t total, const float* p,
                             const float* q_local, const float* q_mean, const float* m,
                             const int32_t* nonfinite) {
  gpu::SegmentCursor tensor;
  gpu::ForEachIndex(total, [&](int64_t e) {
    tensor.Seek(group.offsets, group.num_tensors, e);
    const int64_t i = tensor.t, j = e - tensor.begin;
    const int kind = static_cast<int>(group.kinds[i]);
    if (nonfinite[i]) {
      gpu::StoreFromFloat(kind, group.outputs[i], j, __int_as_float(0x7fc00000));
      return;
    }
    const int64_t rank = group.ranks[i];
    float* residual = group.residual ? group.state[i] : nullptr;
    if (rank > 0) {
      const int64_t cols = group.cols[i];
      const int64_t row = j / cols, col = j % cols;
      const float* p_row = p + group.p_offsets[i] + row * rank;
      gpu::StoreFromFloat(kind, group.outputs[i], j,
                          RankDot(p_row, q_mean + group.q_offsets[i] + col * rank, rank));
      if (residual != nullptr) {
        const float sent = RankDot(p_row, q_local + group.q_offsets[i] + col * rank, rank);
        residual[j] = __fsub_rn(m[group.m_offsets[i] + j], sent);
      }
    } else {
      gpu::StoreFromFloat(kind, group.outputs[i], j, p[group.p_offsets[i] + j]);
      // What was sent is M itself: M - M is +0 (M was finite, as its average is).
      if (residual != nullptr) residual[j] = 0.0f;
    }
  });
}

// Warm start: Q_i <- Qmean_i for every unflagged low-rank tensor.
__global__ void UpdateQKernel(MergecompPowersgdGpuGroup group, const float* q_mean,
                              const int32_t* nonfinite) {
  gpu::SegmentCursor tensor;
  gpu::ForEachIndex(group.host_q_size, [&](int64_t e) {
    tensor.Seek(group.q_offsets, group.num_tensors, e);
    const int64_t i = tensor.t;
    if (nonfinite[i]) return;
    group.state[i][QStateOffset(group, i) + e - tensor.begin] = q_mean[e];
  });
}

bool ValidGroup(const MergecompPowersgdGpuGroup* group) {
  if (group == nullptr || group->num_tensors < 0 || group->host_offsets == nullptr ||
      group->host_offsets[0] != 0 || group->host_q_size < 0) {
    return false;
  }
  for (int64_t i = 0; i < group->num_tensors; ++i) {
    if (group->host_offsets[i + 1] < group->host_offsets[i]) return false;
  }
  return true;
}

int MatrixBlocks(int64_t num_tensors) {
  return static_cast<int>(num_tensors < kMaxMatrixBlocks ? num_tensors : kMaxMatrixBlocks);
}

}  // namespace
}  // namespace tf_mergecomp

extern "C" int mergecomp_grouped_matmul_gpu(const MergecompGpuMatrices* matrices, const float* a,
                                            int transpose_a, const float* b, float* c,
                                            void* stream) {
  using namespace tf_mergecomp;  // NOLINT
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

extern "C" int mergecomp_powersgd_compensate_gpu(const MergecompPowersgdGpuGroup* group,
                                                 float* compensated, float* p, void* stream) {
  using namespace tf_mergecomp;  // NOLINT
  if (!ValidGroup(group)) return MERGECOMP_GPU_BAD_ARGUMENT;
  const int64_t total = group->host_offsets[group->num_tensors];
  if (total > 0 && (group->gradients == nullptr || (group->residual && group->state == nullptr))) {
    return MERGECOMP_GPU_BAD_ARGUMENT;
  }
  return gpu::LaunchOver(total, stream, CompensateKernel, *group, total, compensated, p);
}

extern "C" int mergecomp_powersgd_gather_q_gpu(const MergecompPowersgdGpuGroup* group, float* q,
                                               void* stream) {
  using namespace tf_mergecomp;  // NOLINT
  if (!ValidGroup(group) || (group->host_q_size > 0 && group->state == nullptr)) {
    return MERGECOMP_GPU_BAD_ARGUMENT;
  }
  return gpu::LaunchOver(group->host_q_size, stream, GatherQKernel, *group, q);
}

extern "C" int mergecomp_powersgd_orthonormalize_gpu(const MergecompPowersgdGpuGroup* group,
                                                     float* p, void* stream) {
  using namespace tf_mergecomp;  // NOLINT
  if (!ValidGroup(group)) return MERGECOMP_GPU_BAD_ARGUMENT;
  if (group->num_tensors == 0) return 0;
  OrthonormalizeKernel<<<MatrixBlocks(group->num_tensors), gpu::kThreads, 0,
                         static_cast<cudaStream_t>(stream)>>>(*group, p);
  return gpu::ErrorCode();
}

extern "C" int mergecomp_powersgd_finish_gpu(const MergecompPowersgdGpuGroup* group,
                                             const float* p, const float* q_local,
                                             const float* q_mean, const float* compensated,
                                             int32_t* nonfinite, void* stream) {
  using namespace tf_mergecomp;  // NOLINT
  if (!ValidGroup(group)) return MERGECOMP_GPU_BAD_ARGUMENT;
  const int64_t n = group->num_tensors;
  if (n == 0) return 0;
  const int64_t total = group->host_offsets[n];
  if ((total > 0 && group->outputs == nullptr) ||
      (((group->residual && total > 0) || group->host_q_size > 0) && group->state == nullptr)) {
    return MERGECOMP_GPU_BAD_ARGUMENT;
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  NonfiniteKernel<<<MatrixBlocks(n), gpu::kThreads, 0, s>>>(*group, p, q_mean, nonfinite);
  int code = gpu::ErrorCode();
  if (code != 0) return code;
  code = gpu::LaunchOver(total, stream, FinishKernel, *group, total, p, q_local, q_mean,
                         compensated, static_cast<const int32_t*>(nonfinite));
  if (code != 0) return code;
  return gpu::LaunchOver(group->host_q_size, stream, UpdateQKernel, *group, q_mean,
                         static_cast<const int32_t*>(nonfinite));
}
