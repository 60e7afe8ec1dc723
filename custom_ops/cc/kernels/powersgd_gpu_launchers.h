// Framework-free C entry point of PowerSGD's per-tensor matrix products on a
// CUDA device: the two products of powersgd_op.h's kernels, P_i = M_i Q_i
// and Qlocal_i = M_i^T P_i, for every low-rank tensor of a group in one
// launch (a grouped matrix product over device tables of shapes and
// offsets). Left on the CPU: the compensation, the Gram-Schmidt
// orthonormalisation of each P_i and the finish step (powersgd_op.cc); there
// is no TensorFlow GPU kernel of the PowerSGD ops.
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
// agreement is to float32 rounding, not bit for bit). Returns 0 or a
// cudaError_t (MERGECOMP_GPU_BAD_ARGUMENT, 10002, for a bad table).
int mergecomp_grouped_matmul_gpu(const MergecompGpuMatrices* matrices, const float* a,
                                 int transpose_a, const float* b, float* c, void* stream);

}  // extern "C"

#endif  // TF_MERGECOMP_POWERSGD_GPU_LAUNCHERS_H_
