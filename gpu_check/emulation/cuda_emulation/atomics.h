// CUDA's atomic functions on host memory: GCC's __atomic builtins with relaxed
// ordering, as CUDA's atomics order nothing beyond the one location. They are
// atomic for ThreadSanitizer too: concurrent atomics are no race, and they
// create no happens-before that would hide one elsewhere. Only CUDA's
// overloads exist (no atomicAdd on long long, as on the device).
#ifndef CUDA_EMULATION_ATOMICS_H_
#define CUDA_EMULATION_ATOMICS_H_

#include "cuda_emulation/intrinsics.h"

namespace cuda_emulation {

template <typename T>
inline T AtomicAdd(T* address, T value) {
  return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}

// Floating-point read-modify-write through a compare-and-swap of the bits.
template <typename T, typename Bits, typename Fn>
inline T AtomicFloatUpdate(T* address, Fn update) {
  Bits* bits = reinterpret_cast<Bits*>(address);
  Bits expected = __atomic_load_n(bits, __ATOMIC_RELAXED);
  for (;;) {
    const T old = BitCast<T>(expected);
    const Bits desired = BitCast<Bits>(update(old));
    if (__atomic_compare_exchange_n(bits, &expected, desired, /*weak=*/true, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED)) {
      return old;
    }
  }
}

template <typename T>
inline T AtomicMax(T* address, T value) {
  T old = __atomic_load_n(address, __ATOMIC_RELAXED);
  while (old < value && !__atomic_compare_exchange_n(address, &old, value, true,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}

template <typename T>
inline T AtomicMin(T* address, T value) {
  T old = __atomic_load_n(address, __ATOMIC_RELAXED);
  while (value < old && !__atomic_compare_exchange_n(address, &old, value, true,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}

template <typename T>
inline T AtomicCas(T* address, T compare, T value) {
  __atomic_compare_exchange_n(address, &compare, value, false, __ATOMIC_RELAXED,
                              __ATOMIC_RELAXED);
  return compare;  // the old value either way
}

}  // namespace cuda_emulation

#define CUDA_EMULATION_INTEGER_ATOMICS(T)                                                      \
  inline T atomicAdd(T* a, T v) { return ::cuda_emulation::AtomicAdd(a, v); }                \
  inline T atomicSub(T* a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }       \
  inline T atomicExch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }     \
  inline T atomicMax(T* a, T v) { return ::cuda_emulation::AtomicMax(a, v); }                \
  inline T atomicMin(T* a, T v) { return ::cuda_emulation::AtomicMin(a, v); }                \
  inline T atomicCAS(T* a, T compare, T v) { return ::cuda_emulation::AtomicCas(a, compare, v); }

CUDA_EMULATION_INTEGER_ATOMICS(int)
CUDA_EMULATION_INTEGER_ATOMICS(unsigned int)
CUDA_EMULATION_INTEGER_ATOMICS(unsigned long long)
#undef CUDA_EMULATION_INTEGER_ATOMICS

// Signed 64-bit: CUDA has max, min and the bitwise ones, not add.
inline long long atomicMax(long long* a, long long v) { return ::cuda_emulation::AtomicMax(a, v); }
inline long long atomicMin(long long* a, long long v) { return ::cuda_emulation::AtomicMin(a, v); }

#define CUDA_EMULATION_BITWISE_ATOMICS(T)                                                    \
  inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_RELAXED); }     \
  inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }       \
  inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_RELAXED); }

CUDA_EMULATION_BITWISE_ATOMICS(int)
CUDA_EMULATION_BITWISE_ATOMICS(unsigned int)
CUDA_EMULATION_BITWISE_ATOMICS(unsigned long long)
CUDA_EMULATION_BITWISE_ATOMICS(long long)
#undef CUDA_EMULATION_BITWISE_ATOMICS

// Wrapping increment / decrement of unsigned int, as CUDA defines them.
inline unsigned int atomicInc(unsigned int* a, unsigned int limit) {
  unsigned int old = __atomic_load_n(a, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(a, &old, old >= limit ? 0u : old + 1u, true,
                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
inline unsigned int atomicDec(unsigned int* a, unsigned int limit) {
  unsigned int old = __atomic_load_n(a, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(a, &old, (old == 0u || old > limit) ? limit : old - 1u,
                                      true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}

inline float atomicAdd(float* a, float v) {
  return ::cuda_emulation::AtomicFloatUpdate<float, unsigned int>(
      a, [v](float old) { return old + v; });
}
inline double atomicAdd(double* a, double v) {
  return ::cuda_emulation::AtomicFloatUpdate<double, unsigned long long>(
      a, [v](double old) { return old + v; });
}
inline float atomicExch(float* a, float v) {
  return ::cuda_emulation::AtomicFloatUpdate<float, unsigned int>(a, [v](float) { return v; });
}

// __threadfence and friends: a full fence (ThreadSanitizer does not model
// stand-alone fences; races through them are reported as races).
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

#endif  // CUDA_EMULATION_ATOMICS_H_
