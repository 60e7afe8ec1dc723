// CUDA's arithmetic and bit intrinsics as host functions.
//
// The _rn float operations are exactly rounded IEEE operations (round to
// nearest even) as on the device: the emulated build compiles with
// -ffp-contract=off, so the host compiler never fuses a multiply and an add
// behind their back, and x86-64 evaluates float in SSE registers (no excess
// precision). Denormals are kept (no flush to zero), as nvcc does by default;
// runtime/grid.cc clears the x86 FTZ/DAZ bits in every emulated thread.
#ifndef CUDA_EMULATION_INTRINSICS_H_
#define CUDA_EMULATION_INTRINSICS_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace cuda_emulation {
template <typename To, typename From>
inline To BitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "bit casts keep the size");
  To to;
  std::memcpy(&to, &from, sizeof(to));
  return to;
}
}  // namespace cuda_emulation

// ---- rounded arithmetic ----------------------------------------------------------
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __saturatef(float a) { return a >= 1.0f ? 1.0f : (a > 0.0f ? a : 0.0f); }

// ---- conversions -----------------------------------------------------------------
inline float __double2float_rn(double a) { return static_cast<float>(a); }
inline int __float2int_rn(float a) { return static_cast<int>(std::nearbyint(a)); }
inline int __float2int_rz(float a) { return static_cast<int>(a); }
inline unsigned int __float_as_uint(float a) { return cuda_emulation::BitCast<unsigned int>(a); }
inline float __uint_as_float(unsigned int a) { return cuda_emulation::BitCast<float>(a); }
inline int __float_as_int(float a) { return cuda_emulation::BitCast<int>(a); }
inline float __int_as_float(int a) { return cuda_emulation::BitCast<float>(a); }
inline long long __double_as_longlong(double a) { return cuda_emulation::BitCast<long long>(a); }
inline double __longlong_as_double(long long a) { return cuda_emulation::BitCast<double>(a); }

// ---- bits ----------------------------------------------------------------------------
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned int>(x)); }
inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}
inline unsigned int __brev(unsigned int x) {
  unsigned int r = 0;
  for (int i = 0; i < 32; ++i, x >>= 1) r = (r << 1) | (x & 1u);
  return r;
}
inline unsigned long long __brevll(unsigned long long x) {
  unsigned long long r = 0;
  for (int i = 0; i < 64; ++i, x >>= 1) r = (r << 1) | (x & 1ull);
  return r;
}
// Bits [start, start + 32) of the 64-bit value hi:lo; shift clamped to 32.
inline unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int shift) {
  const unsigned long long both = (static_cast<unsigned long long>(hi) << 32) | lo;
  const unsigned int s = shift < 32 ? shift : 32;
  return static_cast<unsigned int>(both >> s);
}

// ---- read-only loads -------------------------------------------------------------------
template <typename T>
inline T __ldg(const T* address) {
  return *address;
}

// ---- CUDA's global min/max overloads (device functions in CUDA's math API) ------------
inline int min(int a, int b) { return b < a ? b : a; }
inline unsigned int min(unsigned int a, unsigned int b) { return b < a ? b : a; }
inline long long min(long long a, long long b) { return b < a ? b : a; }
inline unsigned long long min(unsigned long long a, unsigned long long b) {
  return b < a ? b : a;
}
inline float min(float a, float b) { return std::fmin(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline int max(int a, int b) { return b > a ? b : a; }
inline unsigned int max(unsigned int a, unsigned int b) { return b > a ? b : a; }
inline long long max(long long a, long long b) { return b > a ? b : a; }
inline unsigned long long max(unsigned long long a, unsigned long long b) {
  return b > a ? b : a;
}
inline float max(float a, float b) { return std::fmax(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// fabsf, floorf, sqrtf, fminf, fmaxf, ...: <cmath>'s host functions, which
// round as CUDA's (both IEEE correctly rounded for these).
using std::fabs;
using std::floor;
using std::fmax;
using std::fmin;
using std::sqrt;

#endif  // CUDA_EMULATION_INTRINSICS_H_
