// <cuda_fp16.h> of the CUDA emulation: __half as 16 bits with CUDA's
// conversions. float -> half rounds to nearest, ties to even, with half
// denormals, overflow to infinity, and any NaN becoming CUDA's canonical NaN
// 0x7fff; half -> float is exact (a NaN keeps its payload).
#ifndef CUDA_EMULATION_CUDA_FP16_H_
#define CUDA_EMULATION_CUDA_FP16_H_

#include <cstdint>
#include <cstring>

#include "cuda_emulation/qualifiers.h"

namespace cuda_emulation {

inline unsigned short FloatToHalfBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const unsigned short sign = static_cast<unsigned short>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return 0x7fffu;          // NaN
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520: infinity
  if (magnitude <= 0x33000000u) return sign;            // <= 2^-25: zero (2^-25 ties to 0)
  const int exponent = static_cast<int>(magnitude >> 23);  // biased by 127
  const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;  // 24 bits
  // Drop `shift` low bits of the significand: 13 for a normal half (its
  // exponent rebiased), more for a denormal (exponent < 113, i.e. < 2^-14).
  const int shift = exponent >= 113 ? 13 : 126 - exponent;
  uint32_t half = exponent >= 113 ? (static_cast<uint32_t>(exponent - 112) << 10) |
                                        ((significand >> 13) & 0x3ffu)
                                  : significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (half & 1u))) ++half;  // may carry into the exponent
  return static_cast<unsigned short>(sign | half);
}

inline float HalfBitsToFloat(unsigned short h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else {
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;  // 2^-24
    std::memcpy(&bits, &magnitude, sizeof(bits));
    bits |= sign;
  }
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace cuda_emulation

struct __half_raw {
  unsigned short x;
};

struct __half {
  unsigned short __x;
  __half() = default;
  __half(__half_raw raw) : __x(raw.x) {}  // NOLINT: implicit, as CUDA's
  __half(float value) : __x(::cuda_emulation::FloatToHalfBits(value)) {}  // NOLINT
  operator __half_raw() const { return __half_raw{__x}; }
  operator float() const { return ::cuda_emulation::HalfBitsToFloat(__x); }
};

// Two halves, x in the low 16 bits, as CUDA lays them out.
struct alignas(4) __half2 {
  __half x, y;
};
inline __half2 __floats2half2_rn(float low, float high) {
  return __half2{__half(low), __half(high)};
}

inline __half __ushort_as_half(unsigned short bits) { return __half(__half_raw{bits}); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __short_as_half(short bits) {
  return __ushort_as_half(static_cast<unsigned short>(bits));
}
inline short __half_as_short(__half h) { return static_cast<short>(h.__x); }
inline __half __float2half_rn(float value) {
  return __ushort_as_half(::cuda_emulation::FloatToHalfBits(value));
}
inline __half __float2half(float value) { return __float2half_rn(value); }
inline float __half2float(__half h) { return ::cuda_emulation::HalfBitsToFloat(h.__x); }
inline bool __hisnan(__half h) { return (h.__x & 0x7fffu) > 0x7c00u; }
inline int __hisinf(__half h) {
  return h.__x == 0x7c00u ? 1 : (h.__x == 0xfc00u ? -1 : 0);
}

#endif  // CUDA_EMULATION_CUDA_FP16_H_
