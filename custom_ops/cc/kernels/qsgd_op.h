// Qsgd: the payload size of its group codec (blocks in cc/kernels/qsgd_op.cc).
#ifndef TF_MERGECOMP_QSGD_OP_H_
#define TF_MERGECOMP_QSGD_OP_H_

#include <cstdint>

#include "cc/kernels/payload_size.h"

namespace tf_mergecomp {

inline int64_t QsgdPayloadBytes(int64_t n, int64_t levels) { return payload_size::Qsgd(n, levels); }

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_QSGD_OP_H_
