// Deep Gradient Compression's sampled-threshold selection: the algorithm
// of the dgc group codec (dgc_op.cc) and its CUDA launcher (dgc_op_gpu.cu.cc).
//
// Algorithm (both devices, bit-identical):
//   1. sample_size positions j -> floor(RandomBits(seed, j) * n / 2^32)
//      (uniform, with replacement), magnitudes |v| there (NaN as +inf);
//   2. threshold = the r-th largest sampled magnitude, r = ceil(sample_size * k / n);
//   3. c = #{i : |v_i| >= threshold}; up to kDgcRefinements times, while c < k,
//      halve the threshold and count again;
//   4. candidates = {i : |v_i| >= threshold}. The payload holds the k largest
//      candidates (ties to the lower index) if c >= k, else all c candidates,
//      in ascending index order, followed by k - c padding slots
//      (value 0, index 0), which add nothing when decoded.
// Payload: as top-k's, exactly k slots (8k bytes).
#ifndef TF_MERGECOMP_DGC_OP_H_
#define TF_MERGECOMP_DGC_OP_H_

#include <cstdint>

#include "tensorflow/core/framework/op_kernel.h"

namespace tf_mergecomp {

constexpr int kDgcRefinements = 3;

// Rank of the threshold within the sample: ceil(sample_size * k / n), >= 1.
inline int64_t DgcSampleRank(int64_t n, int64_t k, int64_t sample_size) {
  const int64_t rank = (sample_size * k + n - 1) / n;
  return rank < 1 ? 1 : (rank > sample_size ? sample_size : rank);
}

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_DGC_OP_H_
