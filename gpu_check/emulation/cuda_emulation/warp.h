// Warp-level intrinsics: warps are 32 consecutive threads of a block (by
// linear thread index). Every *_sync call is a meeting of the lanes named in
// its mask (lanes beyond the block's last thread, or that have finished the
// block, are left out): each lane leaves its value, waits for the others, and
// reads what it needs (runtime/warp_context.cc). A lane calling with a mask
// that does not hold it is an error, as on the device.
//
// What this cannot show: true divergence. __activemask() returns the warp's
// lanes still running the block, not the lanes converged at the call.
#ifndef CUDA_EMULATION_WARP_H_
#define CUDA_EMULATION_WARP_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace cuda_emulation {

enum class WarpOp { kSync, kShuffle, kBallot };

// Every lane of `mask` calls it with its `value`; returns, for kShuffle,
// the value left by lane `source_lane` (the caller's own value when that lane
// is not in the mask), for kBallot the lanes that took part (bits 32..63) and
// those of them whose value is non-zero (bits 0..31), for kSync 0.
uint64_t WarpExchange(unsigned int mask, WarpOp op, uint64_t value, int source_lane);
unsigned int WarpActiveMask();
int LaneId();

template <typename T>
inline T WarpShuffle(unsigned int mask, T value, int source_lane) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                "shuffles move values of up to 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = WarpExchange(mask, WarpOp::kShuffle, bits, source_lane);
  T result;
  std::memcpy(&result, &bits, sizeof(T));
  return result;
}

}  // namespace cuda_emulation

inline unsigned int __activemask() { return ::cuda_emulation::WarpActiveMask(); }
inline void __syncwarp(unsigned int mask = 0xffffffffu) {
  ::cuda_emulation::WarpExchange(mask, ::cuda_emulation::WarpOp::kSync, 0, 0);
}
inline unsigned int __ballot_sync(unsigned int mask, int predicate) {
  return static_cast<unsigned int>(::cuda_emulation::WarpExchange(
      mask, ::cuda_emulation::WarpOp::kBallot, predicate != 0, 0));
}
inline int __any_sync(unsigned int mask, int predicate) {
  return __ballot_sync(mask, predicate) != 0;
}
inline int __all_sync(unsigned int mask, int predicate) {
  const uint64_t both = ::cuda_emulation::WarpExchange(mask, ::cuda_emulation::WarpOp::kBallot,
                                                       predicate != 0, 0);
  return static_cast<unsigned int>(both) == static_cast<unsigned int>(both >> 32);
}

// Lanes are grouped by `width` (a power of two up to 32), as CUDA defines:
// __shfl_sync's source is taken modulo width within the caller's group;
// up/down shifts do not wrap (lanes without a source keep their own value).
template <typename T>
inline T __shfl_sync(unsigned int mask, T value, int source, int width = 32) {
  const int lane = ::cuda_emulation::LaneId();
  const int base = lane & ~(width - 1);
  return ::cuda_emulation::WarpShuffle(mask, value, base + (source & (width - 1)));
}
template <typename T>
inline T __shfl_up_sync(unsigned int mask, T value, unsigned int delta, int width = 32) {
  const int lane = ::cuda_emulation::LaneId();
  const int in_group = lane & (width - 1);
  const int source = in_group >= static_cast<int>(delta) ? lane - static_cast<int>(delta) : lane;
  return ::cuda_emulation::WarpShuffle(mask, value, source);
}
template <typename T>
inline T __shfl_down_sync(unsigned int mask, T value, unsigned int delta, int width = 32) {
  const int lane = ::cuda_emulation::LaneId();
  const int in_group = lane & (width - 1);
  const int source =
      in_group + static_cast<int>(delta) < width ? lane + static_cast<int>(delta) : lane;
  return ::cuda_emulation::WarpShuffle(mask, value, source);
}
template <typename T>
inline T __shfl_xor_sync(unsigned int mask, T value, int lane_mask, int width = 32) {
  // As CUDA: a source in a later group of `width` lanes reads the caller's value.
  const int lane = ::cuda_emulation::LaneId();
  const int source = lane ^ lane_mask;
  const bool later_group = source >= ((lane + width) & ~(width - 1));
  return ::cuda_emulation::WarpShuffle(mask, value, later_group ? lane : source);
}

#endif  // CUDA_EMULATION_WARP_H_
