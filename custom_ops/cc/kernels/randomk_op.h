// Random-k index selection: functor shared by the CPU and CUDA kernels.
//
// Every position i gets the random key RandomBits(seed, i); the k positions
// with the largest keys (ties to the lower index) are chosen, returned in
// ascending order. That is a uniformly random k-subset, without replacement,
// and a pure function of (seed, n, k): the same on every worker, device and
// thread count, and reproducible in plain TensorFlow (tf.math.top_k on the
// keys).
#ifndef TF_MERGECOMP_RANDOMK_OP_H_
#define TF_MERGECOMP_RANDOMK_OP_H_

#include <cstdint>

#include "tensorflow/core/framework/op_kernel.h"

namespace tf_mergecomp {

template <typename Device>
struct RandomkIndicesFunctor {
  tensorflow::Status operator()(tensorflow::OpKernelContext* context, int64_t seed, int64_t n,
                                int64_t k, int32_t* indices);
};

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_RANDOMK_OP_H_
