// PowerSGD's helpers: functors shared by the CPU and CUDA kernels.
//
// PadReshape: a flat buffer of n values as a rows x cols row-major matrix,
// zero-padded after the n-th value (rows * cols >= n).
// Orthonormalize: Gram-Schmidt on the r columns of a rows x r row-major
// matrix, run twice ("twice is enough") for stability at r up to 4 and
// beyond; sums of squares and dot products accumulate in double. A column
// whose norm after projection is below kPowersgdMinNorm becomes zero, so a
// rank-deficient (or all-zero) P stays finite instead of dividing by ~0.
#ifndef TF_MERGECOMP_POWERSGD_OP_H_
#define TF_MERGECOMP_POWERSGD_OP_H_

#include <cstdint>

#include "tensorflow/core/framework/op_kernel.h"

namespace tf_mergecomp {

constexpr double kPowersgdMinNorm = 1e-30;

template <typename Device>
struct PowersgdPadReshapeFunctor {
  void operator()(tensorflow::OpKernelContext* context, const float* input, int64_t n,
                  int64_t total, float* output);
};

template <typename Device>
struct PowersgdOrthonormalizeFunctor {
  void operator()(tensorflow::OpKernelContext* context, const float* input, int64_t rows,
                  int64_t rank, float* output);
};

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_POWERSGD_OP_H_
