// The one definition of every codec's payload size in bytes, for n elements
// of a group (or of a single buffer). Framework-free: used by the CPU
// functors and group codecs (hence the ops' shape functions), by the CUDA
// launchers (mergecomp_group_payload_bytes, which the Python GPU check calls)
// and by nothing else that computes a size on its own.
#ifndef TF_MERGECOMP_PAYLOAD_SIZE_H_
#define TF_MERGECOMP_PAYLOAD_SIZE_H_

#include <cstdint>

#include "cc/kernels/dense_bits.h"

namespace tf_mergecomp {
namespace payload_size {

inline int64_t Fp16(int64_t n) { return 2 * n; }       // float16 values
inline int64_t None(int64_t n) { return 4 * n; }       // float32 values
inline int64_t Signsgd(int64_t n) { return CeilDiv(n, 8); }  // sign bits
inline int64_t Onebit(int64_t n) { return kOnebitHeaderBytes + CeilDiv(n, 8); }
inline int64_t Efsignsgd(int64_t n) { return kEfsignsgdHeaderBytes + CeilDiv(n, 8); }
inline int64_t Qsgd(int64_t n, int64_t levels) {
  return kQsgdHeaderBytes + CeilDiv(n * QsgdCodeBits(levels), 8);
}
inline int64_t Terngrad(int64_t n) { return kTerngradHeaderBytes + CeilDiv(n, 4); }
// topk and dgc: k slots of (float32 value, int32 index).
inline int64_t Sparse(int64_t k) { return 8 * k; }
// randomk: the float32 values at the sum over tensors of k_i positions.
inline int64_t Randomk(int64_t total_k) { return 4 * total_k; }
// The group ops' non-finite markers after the codec's payload: one payload
// element (of element_bytes bytes) per tensor.
inline int64_t Markers(int64_t num_tensors, int64_t element_bytes) {
  return num_tensors * element_bytes;
}

}  // namespace payload_size
}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_PAYLOAD_SIZE_H_
