// Counter-based random numbers shared by every stochastic codec.
//
// A draw is a pure function of (seed, element index): results do not depend
// on how the work is sharded over threads or GPU blocks, a CPU and a CUDA
// kernel give the same numbers, and workers given the same seed draw the same
// numbers. The arithmetic is 32-bit unsigned only, so the plain-TensorFlow
// reference (tf_mergecomp/compressors/counter_random.py) reproduces it exactly.
#ifndef TF_MERGECOMP_RANDOM_H_
#define TF_MERGECOMP_RANDOM_H_

#include <cstdint>

#if defined(__CUDACC__)
#define MERGECOMP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MERGECOMP_HOST_DEVICE inline
#endif

namespace tf_mergecomp {

// A bijective 32-bit integer finaliser (well-mixed: each input bit flips
// about half the output bits).
MERGECOMP_HOST_DEVICE uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

struct SeedKey {
  uint32_t lo;
  uint32_t hi;
};

MERGECOMP_HOST_DEVICE SeedKey MakeSeedKey(int64_t seed) {
  const uint64_t s = static_cast<uint64_t>(seed);
  SeedKey key;
  key.hi = Mix32(static_cast<uint32_t>(s >> 32) + 0x9e3779b9u);
  key.lo = Mix32(static_cast<uint32_t>(s) ^ key.hi);
  return key;
}

// 32 random bits for element `index`.
MERGECOMP_HOST_DEVICE uint32_t RandomBits(SeedKey key, uint32_t index) {
  return Mix32(Mix32(index ^ key.lo) + key.hi);
}

// Uniform in [0, 1) with 24 bits of resolution (exact in float32).
MERGECOMP_HOST_DEVICE float RandomUniform(SeedKey key, uint32_t index) {
  return static_cast<float>(RandomBits(key, index) >> 8) * (1.0f / 16777216.0f);
}

// Seeds of a group hold the index of its first tensor in bits [12, 24)
// (tf_mergecomp/mergecomp.py): tensor i of the group then draws exactly what
// it draws as a group of its own, so per-tensor draws do not depend on the
// partition. Used by the CPU group codecs and the CUDA group launchers.
constexpr int kTensorSeedShift = 12;
MERGECOMP_HOST_DEVICE int64_t TensorSeed(int64_t group_seed, int64_t tensor) {
  return group_seed + (tensor << kTensorSeedShift);
}

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_RANDOM_H_
