// Framework-free C entry points of PowerSGD's group steps on a CUDA device
// (powersgd_op_gpu.cu.cc), called by the TensorFlow GPU kernels of
// MergecompPowersgdGroupP / Q / Finish (powersgd_op_gpu.cc) on the op's
// stream, and by gpu_check/ through ctypes. Buffers and layout are
// powersgd_op.h's; every launcher covers the whole group in one launch per
// pass (never one launch per tensor):
//
//   P step       mergecomp_powersgd_compensate_gpu  M = g (+ e), raw values into P
//                mergecomp_powersgd_gather_q_gpu    the Q_i of the state, packed
//                mergecomp_grouped_matmul_gpu       P_i = M_i Q_i
//   Q step       mergecomp_powersgd_orthonormalize_gpu
//                mergecomp_grouped_matmul_gpu       Qlocal_i = M_i^T P_i
//   Finish       mergecomp_powersgd_finish_gpu      flags, P_i Qmean_i^T cast into
//                                                   each gradient's dtype, e and Q
//
// Every function returns 0, a cudaError_t of a failed launch, or
// MERGECOMP_GPU_BAD_ARGUMENT (10002, group_gpu_launchers.h) for a bad table;
// mergecomp_group_error_string says which. Nothing synchronises the host.
#ifndef TF_MERGECOMP_POWERSGD_GPU_LAUNCHERS_H_
#define TF_MERGECOMP_POWERSGD_GPU_LAUNCHERS_H_

#include <stdint.h>

extern "C" {

// Matrices C_i = op(A_i) B_i, i < count, all row-major float32 in three flat
// buffers. op(A_i) is m_i x k_i: A_i itself (m_i x k_i at a_offsets[i]) or,
// with transpose_a, the transpose of A_i stored k_i x m_i. B_i is k_i x r_i
// at b_offsets[i]; C_i (m_i x r_i) is written at c_offsets[i], and
// c_offsets[i + 1] - c_offsets[i] = m_i * r_i. Device tables: m, k, r,
// a_offsets, b_offsets, c_offsets (count + 1 entries); host_c_offsets is the
// host copy of c_offsets.
typedef struct MergecompGpuMatrices {
  int64_t count;
  const int64_t* host_c_offsets;
  const int64_t* c_offsets;
  const int64_t* m;
  const int64_t* k;
  const int64_t* r;
  const int64_t* a_offsets;
  const int64_t* b_offsets;
} MergecompGpuMatrices;

// Each entry of C is one dot product summed in float64 in index order, then
// rounded to float32 (Eigen's float32 products on the CPU round otherwise:
// agreement is to float32 rounding, not bit for bit).
int mergecomp_grouped_matmul_gpu(const MergecompGpuMatrices* matrices, const float* a,
                                 int transpose_a, const float* b, float* c, void* stream);

// A group of n tensors in powersgd_op.h's layout. Tensor i is low-rank when
// ranks[i] > 0: the rows_i x cols_i matrix, rows_i = size_i / cols_i. Device
// tables but for the host_ fields:
typedef struct MergecompPowersgdGpuGroup {
  int64_t num_tensors;            // n
  int32_t residual;               // state i holds e_i (size_i floats) before Q_i
  const int64_t* host_offsets;    // host: n + 1 offsets of tensor i's elements in the group
  int64_t host_q_size;            // host: floats of the Q payload
  const int64_t* offsets;         // n + 1: device copy of host_offsets
  const int64_t* m_offsets;       // n: M_i in the compensated buffer (0 if not low-rank)
  const int64_t* p_offsets;       // n: P_i (low-rank) or the raw values in the P payload
  const int64_t* q_offsets;       // n + 1: Q_i in the Q payload (an empty range if not low-rank)
  const int64_t* cols;            // n: cols_i (0 if not low-rank)
  const int64_t* ranks;           // n: r_i (0 if not low-rank)
  const int64_t* kinds;           // n: gradient i's dtype: 0 float32, else MERGECOMP_CAST_*
  const void* const* gradients;   // n pointers: the gradients (P step; else NULL)
  void* const* outputs;           // n pointers: the outputs (finish; else NULL)
  float* const* state;            // n pointers: the state variables' buffers; NULL when
                                  // no tensor keeps state
} MergecompPowersgdGpuGroup;

// M_i = g_i (+ e_i with residual), cast to float32 on the device: into
// `compensated` at m_offsets[i] for a low-rank tensor, else into `p` at
// p_offsets[i] (its raw values).
int mergecomp_powersgd_compensate_gpu(const MergecompPowersgdGpuGroup* group, float* compensated,
                                      float* p, void* stream);

// The Q_i of the state packed into `q` (host_q_size floats, Q payload layout).
int mergecomp_powersgd_gather_q_gpu(const MergecompPowersgdGpuGroup* group, float* q,
                                    void* stream);

// Gram-Schmidt, applied twice, on the columns of every low-rank P_i of `p`
// in place, one block per matrix; dot products and norms summed in float64;
// a column of norm below 1e-30 (or NaN) is multiplied by zero (the CPU
// kernel's semantics, to float32 rounding).
int mergecomp_powersgd_orthonormalize_gpu(const MergecompPowersgdGpuGroup* group, float* p,
                                          void* stream);

// The finish step: nonfinite[i] (device int32[n]) = 1 where the averaged
// P_i (or raw values) or Qmean_i holds an inf or a NaN; output i = P_i
// Qmean_i^T (the averaged values if not low-rank) cast to its dtype, all NaN
// when flagged; for unflagged tensors e_i <- M_i - P_i Qlocal_i^T (residual;
// zero for raw tensors) and Q_i <- Qmean_i. Three launches.
int mergecomp_powersgd_finish_gpu(const MergecompPowersgdGpuGroup* group, const float* p,
                                  const float* q_local, const float* q_mean,
                                  const float* compensated, int32_t* nonfinite, void* stream);

}  // extern "C"

#endif  // TF_MERGECOMP_POWERSGD_GPU_LAUNCHERS_H_
