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

  // One of the threads the current barrier waits for has arrived or left the
  // block; the last one completes the barrier.
  void CountDown();
  void Complete();
  // Marks `thread` as gone from the block (once); false if it already was.
  bool Account(int thread);
  int Result(Vote vote) const;

  Grid& grid_;
  const int64_t block_;
  // The barrier, lock-free: remaining_ counts the threads the current
  // generation still waits for (those in the block that have neither arrived
  // nor left); the last to count down sets the next generation's count to the
  // number that arrived, publishes the votes and moves generation_ on.
  std::atomic<int> remaining_;
  std::atomic<int> arrived_{0};
  std::atomic<int> vote_or_{0}, vote_and_{1}, vote_count_{0};
  int last_or_ = 0, last_and_ = 1, last_count_ = 0;  // of the last completed generation
  std::atomic<uint32_t> generation_{0};
  std::unique_ptr<std::atomic<bool>[]> left_;  // per thread: gone from the block, counted

  std::mutex mutex_;  // creation of shared storage and warps
  SharedEntry shared_[kMaxSharedDeclarations];
  std::atomic<int> shared_count_{0};  // entries [0, count) are published
  std::size_t shared_bytes_ = 0;
  void* dynamic_shared_ = nullptr;
  std::unique_ptr<std::atomic<WarpContext*>[]> warps_;
};

}  // namespace cuda_emulation

#endif  // CUDA_EMULATION_RUNTIME_BLOCK_CONTEXT_H_
