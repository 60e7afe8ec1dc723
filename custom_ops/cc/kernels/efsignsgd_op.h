// Efsignsgd: the payload size of its group codec (blocks in cc/kernels/efsignsgd_op.cc).
#ifndef TF_MERGECOMP_EFSIGNSGD_OP_H_
#define TF_MERGECOMP_EFSIGNSGD_OP_H_

#include <cstdint>

#include "cc/kernels/payload_size.h"

namespace tf_mergecomp {

inline int64_t EfsignsgdPayloadBytes(int64_t n, int64_t /*levels*/) { return payload_size::Efsignsgd(n); }

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_EFSIGNSGD_OP_H_
