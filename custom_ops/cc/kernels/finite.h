// Finiteness checks over float arrays, shared by the group kernels (which
// keep non-finite tensors out of the compression state) and PowerSGD's.
#ifndef TF_MERGECOMP_FINITE_H_
#define TF_MERGECOMP_FINITE_H_

#include <algorithm>
#include <cstdint>

#include "Eigen/Core"

namespace tf_mergecomp {

// The exponent bits of a float type: all set means inf or NaN.
template <typename T> struct ExponentBits;
template <> struct ExponentBits<Eigen::half> {
  using Bits = uint16_t;
  static constexpr Bits kMask = 0x7c00;
};
template <> struct ExponentBits<Eigen::bfloat16> {
  using Bits = uint16_t;
  static constexpr Bits kMask = 0x7f80;
};
template <> struct ExponentBits<float> {
  using Bits = uint32_t;
  static constexpr Bits kMask = 0x7f800000u;
};
template <> struct ExponentBits<double> {
  using Bits = uint64_t;
  static constexpr Bits kMask = 0x7ff0000000000000ull;
};

// False when values[begin, end) holds an inf or a NaN. A max over the masked
// exponents (it reaches the mask only there) vectorises, unlike std::isfinite.
template <typename T>
bool AllFinite(const T* values, int64_t begin, int64_t end) {
  using Bits = typename ExponentBits<T>::Bits;
  constexpr Bits kMask = ExponentBits<T>::kMask;
  const auto* bits = reinterpret_cast<const Bits*>(values);
  Bits largest = 0;
  for (int64_t j = begin; j < end; ++j) largest = std::max<Bits>(largest, bits[j] & kMask);
  return largest != kMask;
}

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_FINITE_H_
