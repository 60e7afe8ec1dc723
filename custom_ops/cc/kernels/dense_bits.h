// Bit layouts shared by the dense codecs (signsgd, signum, onebit, efsignsgd,
// qsgd, terngrad), usable from C++, CUDA and framework-free code.
//
// Bit streams are little-endian at both levels: element i's k-bit code
// occupies stream bits [i*k, (i+1)*k), and stream bit j is bit (j % 8) of
// byte j / 8 (least significant first). Scalars in payload headers are
// float32 in the machine's byte order (little-endian on x86-64 and on
// NVIDIA GPUs), copied bytewise because payload rows need not be aligned.
#ifndef TF_MERGECOMP_DENSE_BITS_H_
#define TF_MERGECOMP_DENSE_BITS_H_

#include <cstdint>
#include <cstring>

#include "cc/kernels/random.h"

namespace tf_mergecomp {

// The sign bit every sign codec sends: 1 means "+", and sign(0) = +1.
// Written as !(x < 0) so that -0.0 and NaN are "+" (NaN compares false).
MERGECOMP_HOST_DEVICE bool IsNonNegative(float x) { return !(x < 0.0f); }

MERGECOMP_HOST_DEVICE float LoadFloat(const uint8_t* bytes) {
  float value;
  memcpy(&value, bytes, sizeof(value));
  return value;
}

MERGECOMP_HOST_DEVICE void StoreFloat(uint8_t* bytes, float value) {
  memcpy(bytes, &value, sizeof(value));
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bits per QSGD code: ceil(log2(2s + 1)), enough for the 2s + 1 values
// sign * level + s in [0, 2s].
inline int QsgdCodeBits(int64_t levels) {
  int bits = 0;
  while ((int64_t{1} << bits) < 2 * levels + 1) ++bits;
  return bits;
}

constexpr int64_t kOnebitHeaderBytes = 8;     // mu+, mu-
constexpr int64_t kEfsignsgdHeaderBytes = 4;  // scale
constexpr int64_t kQsgdHeaderBytes = 4;       // norm
constexpr int64_t kTerngradHeaderBytes = 4;   // max |g|

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_DENSE_BITS_H_
