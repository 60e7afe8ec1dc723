// Finiteness checks over float arrays, shared by the group kernels (which
// keep non-finite tensors out of the compression state) and PowerSGD's.
#ifndef TF_MERGECOMP_FINITE_H_
#define TF_MERGECOMP_FINITE_H_

#include <algorithm>
#include <cstdint>

#include "Eigen/Core"
#include "cc/kernels/dense_cpu.h"

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

// False when values[begin, end) holds an inf or a NaN (exponent bits all set).
template <typename T>
bool AllFiniteScalar(const T* values, int64_t begin, int64_t end) {
  using Bits = typename ExponentBits<T>::Bits;
  constexpr Bits kMask = ExponentBits<T>::kMask;
  const auto* bits = reinterpret_cast<const Bits*>(values);
  Bits largest = 0;
  for (int64_t j = begin; j < end; ++j) largest = std::max<Bits>(largest, bits[j] & kMask);
  return largest != kMask;
}

#if MERGECOMP_X86
// All ones in each lane of 32 bytes at `at` whose masked exponent equals the mask.
template <typename Bits>
MERGECOMP_AVX2 inline __m256i ExponentFullAvx2(const Bits* at, __m256i mask) {
  const __m256i exponent =
      _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)), mask);
  if constexpr (sizeof(Bits) == 2) return _mm256_cmpeq_epi16(exponent, mask);
  if constexpr (sizeof(Bits) == 4) return _mm256_cmpeq_epi32(exponent, mask);
  if constexpr (sizeof(Bits) == 8) return _mm256_cmpeq_epi64(exponent, mask);
}

// The lanes' results ORed together and tested once at the end: the check
// reads every gradient of a group before its encode, so it must run at
// memory speed, and without -mavx2 the scalar loop does not vectorise for
// 32- and 64-bit lanes.
template <typename T>
MERGECOMP_AVX2 bool AllFiniteAvx2(const T* values, int64_t begin, int64_t end) {
  using Bits = typename ExponentBits<T>::Bits;
  constexpr Bits kMask = ExponentBits<T>::kMask;
  constexpr int64_t kLanes = 32 / sizeof(Bits);
  const auto* bits = reinterpret_cast<const Bits*>(values);
  __m256i mask;
  if constexpr (sizeof(Bits) == 2) {
    mask = _mm256_set1_epi16(static_cast<int16_t>(kMask));
  } else if constexpr (sizeof(Bits) == 4) {
    mask = _mm256_set1_epi32(static_cast<int32_t>(kMask));
  } else {
    mask = _mm256_set1_epi64x(static_cast<int64_t>(kMask));
  }
  __m256i any = _mm256_setzero_si256();
  int64_t j = begin;
  for (; j + 4 * kLanes <= end; j += 4 * kLanes) {
    any = _mm256_or_si256(
        any, _mm256_or_si256(_mm256_or_si256(ExponentFullAvx2(bits + j, mask),
                                             ExponentFullAvx2(bits + j + kLanes, mask)),
                             _mm256_or_si256(ExponentFullAvx2(bits + j + 2 * kLanes, mask),
                                             ExponentFullAvx2(bits + j + 3 * kLanes, mask))));
  }
  for (; j + kLanes <= end; j += kLanes) any = _mm256_or_si256(any, ExponentFullAvx2(bits + j, mask));
  return _mm256_testz_si256(any, any) && AllFiniteScalar(values, j, end);
}
#endif

template <typename T>
bool AllFinite(const T* values, int64_t begin, int64_t end) {
#if MERGECOMP_X86
  if (CpuHasAvx2()) return AllFiniteAvx2(values, begin, end);
#endif
  return AllFiniteScalar(values, begin, end);
}

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_FINITE_H_
