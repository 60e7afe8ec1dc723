// One warp's meeting point for the *_sync intrinsics (internal).
#ifndef CUDA_EMULATION_RUNTIME_WARP_CONTEXT_H_
#define CUDA_EMULATION_RUNTIME_WARP_CONTEXT_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "cuda_emulation/warp.h"

namespace cuda_emulation {

// One collective at a time: the lanes of its mask (less the lanes that do
// not exist or have finished the block) arrive, leaving their values; once
// all have arrived each reads its result and departs; the next collective
// starts when all have departed.
class WarpContext {
 public:
  WarpContext(int lanes, unsigned int finished);
  uint64_t Exchange(int lane, unsigned int mask, WarpOp op, uint64_t value, int source_lane);
  void LaneFinished(int lane);
  unsigned int Running();  // lanes that exist and have not finished

 private:
  enum class Phase { kIdle, kArriving, kDeparting };
  unsigned int Expected() const;  // under mutex_
  void ArriveComplete();          // under mutex_

  const unsigned int existing_;
  std::mutex mutex_;
  std::condition_variable changed_;
  unsigned int finished_;
  Phase phase_ = Phase::kIdle;
  unsigned int mask_ = 0;      // the current collective's
  unsigned int arrived_ = 0;
  unsigned int departed_ = 0;
  uint64_t values_[32] = {};
};

}  // namespace cuda_emulation

#endif  // CUDA_EMULATION_RUNTIME_WARP_CONTEXT_H_
