// Qsgd encode/decode functors (see cc/ops/qsgd_ops.cc for the wire format).
#ifndef TF_MERGECOMP_QSGD_OP_H_
#define TF_MERGECOMP_QSGD_OP_H_

#include "cc/kernels/dense_op.h"
#include "cc/kernels/payload_size.h"

namespace tf_mergecomp {

template <typename Device>
struct QsgdEncodeFunctor {
  static int64_t PayloadBytes(int64_t n, int64_t levels) { return payload_size::Qsgd(n, levels); }
  void operator()(tensorflow::OpKernelContext* context, const float* input, int64_t n,
                  int64_t seed, int64_t levels, uint8_t* payload);
};

template <typename Device>
struct QsgdDecodeFunctor {
  static int64_t RowBytes(int64_t n, int64_t levels) { return payload_size::Qsgd(n, levels); }
  void operator()(tensorflow::OpKernelContext* context, const uint8_t* payload,
                  int64_t world_size, int64_t n, int64_t levels, float* output);
};

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_QSGD_OP_H_
