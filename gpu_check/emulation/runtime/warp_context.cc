// Warp collectives (warp_context.h) and the warp API of cuda_emulation/warp.h.
#include "runtime/warp_context.h"

#include "runtime/block_context.h"
#include "runtime/grid.h"

namespace cuda_emulation {

WarpContext::WarpContext(int lanes, unsigned int finished)
    : existing_(lanes >= 32 ? 0xffffffffu : (1u << lanes) - 1u), finished_(finished) {}

unsigned int WarpContext::Expected() const { return mask_ & existing_ & ~finished_; }

void WarpContext::ArriveComplete() {
  if (phase_ == Phase::kArriving && (arrived_ & Expected()) == Expected()) {
    phase_ = Phase::kDeparting;
    departed_ = 0;
    changed_.notify_all();
  }
}

uint64_t WarpContext::Exchange(int lane, unsigned int mask, WarpOp op, uint64_t value,
                               int source_lane) {
  const unsigned int me = 1u << lane;
  if (!(mask & me)) Fatal("a warp *_sync intrinsic called by a lane outside its mask");
  std::unique_lock<std::mutex> lock(mutex_);
  // Join the collective of the same mask still arriving, or wait to start one.
  changed_.wait(lock, [&] {
    return phase_ == Phase::kIdle || (phase_ == Phase::kArriving && mask_ == mask);
  });
  if (phase_ == Phase::kIdle) {
    phase_ = Phase::kArriving;
    mask_ = mask;
    arrived_ = 0;
  }
  values_[lane] = value;
  arrived_ |= me;
  ArriveComplete();
  changed_.wait(lock, [&] { return phase_ == Phase::kDeparting; });
  const unsigned int present = arrived_ & mask_;
  uint64_t result = 0;
  if (op == WarpOp::kShuffle) {
    const bool source_present =
        source_lane >= 0 && source_lane < 32 && ((present >> source_lane) & 1u);
    result = source_present ? values_[source_lane] : value;
  } else if (op == WarpOp::kBallot) {
    uint64_t ballot = 0;
    for (int l = 0; l < 32; ++l) {
      if (((present >> l) & 1u) && values_[l] != 0) ballot |= uint64_t{1} << l;
    }
    result = (uint64_t{present} << 32) | ballot;
  }
  departed_ |= me;
  if ((departed_ & arrived_) == arrived_) {
    phase_ = Phase::kIdle;
    changed_.notify_all();
  }
  return result;
}

void WarpContext::LaneFinished(int lane) {
  std::lock_guard<std::mutex> lock(mutex_);
  finished_ |= 1u << lane;
  ArriveComplete();
}

unsigned int WarpContext::Running() {
  std::lock_guard<std::mutex> lock(mutex_);
  return existing_ & ~finished_;
}

// ---- the warp-level API ---------------------------------------------------------

int LaneId() { return CurrentPlace().thread % 32; }

uint64_t WarpExchange(unsigned int mask, WarpOp op, uint64_t value, int source_lane) {
  Place& place = CurrentPlace();
  WarpContext& warp = place.grid->Context(place.block).Warp(place.thread / 32);
  return warp.Exchange(place.thread % 32, mask, op, value, source_lane);
}

unsigned int WarpActiveMask() {
  Place& place = CurrentPlace();
  return place.grid->Context(place.block).Warp(place.thread / 32).Running();
}

}  // namespace cuda_emulation
