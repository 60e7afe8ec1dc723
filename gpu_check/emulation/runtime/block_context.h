// One thread block's barrier, shared memory and warps (internal).
#ifndef CUDA_EMULATION_RUNTIME_BLOCK_CONTEXT_H_
#define CUDA_EMULATION_RUNTIME_BLOCK_CONTEXT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda_emulation/block.h"
#include "runtime/grid.h"

namespace cuda_emulation {

class WarpContext;

class BlockContext {
 public:
  BlockContext(Grid& grid, int64_t block);
  ~BlockContext();
  BlockContext(const BlockContext&) = delete;
  BlockContext& operator=(const BlockContext&) = delete;

  // __syncthreads(_or/_and/_count) of thread `thread`.
  int Barrier(int thread, Vote vote, int predicate);
  // Thread `thread` has left the block: later barriers no longer wait for it.
  void ThreadFinished(int thread);
  // For the context's creator: counts the threads that left the block before
  // the context existed (Grid::progress).
  void CountThreadsAlreadyFinished();

  void* Shared(const void* key, std::size_t bytes, std::size_t alignment);
  void* DynamicShared();
  WarpContext& Warp(int warp);

 private:
  static constexpr int kMaxSharedDeclarations = 64;
  static constexpr std::size_t kMaxStaticSharedBytes = 48 * 1024;  // CUDA's limit
  struct SharedEntry {
    const void* key;
    void* storage;
  };

  void MarkFinished(int thread);      // under mutex_
  void CompleteIfAllArrived();        // under mutex_
  int Result(Vote vote) const;

  Grid& grid_;
  const int64_t block_;
  std::mutex mutex_;
  std::vector<char> finished_;  // per thread, counted in finished_count_
  int finished_count_ = 0;
  // The barrier: arrivals and votes of the current generation, the votes of
  // the last completed one (read by its waiters once generation_ moves on).
  int arrived_ = 0;
  int vote_or_ = 0, vote_and_ = 1, vote_count_ = 0;
  int last_or_ = 0, last_and_ = 1, last_count_ = 0;
  std::atomic<uint32_t> generation_{0};

  SharedEntry shared_[kMaxSharedDeclarations];
  std::atomic<int> shared_count_{0};  // entries [0, count) are published
  std::size_t shared_bytes_ = 0;
  void* dynamic_shared_ = nullptr;
  std::unique_ptr<std::atomic<WarpContext*>[]> warps_;
};

}  // namespace cuda_emulation

#endif  // CUDA_EMULATION_RUNTIME_BLOCK_CONTEXT_H_
