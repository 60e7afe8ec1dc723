// The block barrier, shared memory and the block's warps (block_context.h).
#include "runtime/block_context.h"

#include <cstdlib>
#include <cstring>

#include "runtime/futex.h"
#include "runtime/warp_context.h"

namespace cuda_emulation {

namespace {
constexpr unsigned char kSharedFill = 0xA5;  // shared memory starts undefined
constexpr int kSpinIterations = 2000;

void* AllocateFilled(std::size_t bytes, std::size_t alignment) {
  alignment = alignment < 16 ? 16 : alignment;
  const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* storage = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
  if (storage == nullptr) Fatal("out of host memory for shared memory");
  std::memset(storage, kSharedFill, rounded);
  return storage;
}
}  // namespace

BlockContext::BlockContext(Grid& grid, int64_t block)
    : grid_(grid),
      block_(block),
      remaining_(grid.threads),
      left_(new std::atomic<bool>[grid.threads]()),
      warps_(new std::atomic<WarpContext*>[(grid.threads + 31) / 32]()) {}

BlockContext::~BlockContext() {
  for (int i = 0, n = shared_count_.load(std::memory_order_acquire); i < n; ++i) {
    std::free(shared_[i].storage);
  }
  std::free(dynamic_shared_);
  for (int w = 0; w < (grid_.threads + 31) / 32; ++w) delete warps_[w].load();
}

void BlockContext::Complete() {
  last_or_ = vote_or_.exchange(0, std::memory_order_relaxed);
  last_and_ = vote_and_.exchange(1, std::memory_order_relaxed);
  last_count_ = vote_count_.exchange(0, std::memory_order_relaxed);
  remaining_.store(arrived_.exchange(0, std::memory_order_relaxed), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  WakeAll(generation_);
}

void BlockContext::CountDown() {
  // acq_rel: the last one acquires every arrival's work (and votes) before
  // releasing them all through generation_.
  if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) Complete();
}

int BlockContext::Result(Vote vote) const {
  switch (vote) {
    case Vote::kOr: return last_or_;
    case Vote::kAnd: return last_and_;
    case Vote::kCount: return last_count_;
    default: return 0;
  }
}

int BlockContext::Barrier(int thread, Vote vote, int predicate) {
  (void)thread;
  // The generation cannot move before this thread counts down.
  const uint32_t generation = generation_.load(std::memory_order_acquire);
  if (vote != Vote::kNone) {
    vote_or_.fetch_or(predicate != 0, std::memory_order_relaxed);
    vote_and_.fetch_and(predicate != 0, std::memory_order_relaxed);
    vote_count_.fetch_add(predicate != 0, std::memory_order_relaxed);
  }
  arrived_.fetch_add(1, std::memory_order_relaxed);
  CountDown();
  if (grid_.spin) {
    for (int i = 0; i < kSpinIterations; ++i) {
      if (generation_.load(std::memory_order_acquire) != generation) return Result(vote);
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
  }
  WaitWhileEquals(generation_, generation);
  return Result(vote);
}

bool BlockContext::Account(int thread) {
  // Relaxed: only the exchange's atomicity matters (the thread is counted
  // once); ordering with Warp() comes from fences.
  return !left_[thread].exchange(true, std::memory_order_relaxed);
}

void BlockContext::ThreadFinished(int thread) {
  if (!Account(thread)) return;
  std::atomic_thread_fence(std::memory_order_seq_cst);  // paired with Warp()'s
  if (WarpContext* warp = warps_[thread / 32].load(std::memory_order_acquire)) {
    warp->LaneFinished(thread % 32);
  }
  CountDown();
}

void BlockContext::CountThreadsAlreadyFinished() {
  // After the context's publication and a fence (Grid::Context), paired with
  // the finishing threads' store of their progress, fence and load of the
  // context (grid.cc): a thread is seen here, or sees the context, or both,
  // and Account() counts it once.
  for (int t = 0; t < grid_.threads; ++t) {
    if (grid_.progress[t].load(std::memory_order_relaxed) > block_ && Account(t)) CountDown();
  }
}

void* BlockContext::Shared(const void* key, std::size_t bytes, std::size_t alignment) {
  int count = shared_count_.load(std::memory_order_acquire);
  for (int i = 0; i < count; ++i) {
    if (shared_[i].key == key) return shared_[i].storage;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  count = shared_count_.load(std::memory_order_relaxed);
  for (int i = 0; i < count; ++i) {
    if (shared_[i].key == key) return shared_[i].storage;
  }
  if (count == kMaxSharedDeclarations) Fatal("more than 64 __shared__ declarations in a kernel");
  shared_bytes_ += bytes;
  if (shared_bytes_ > kMaxStaticSharedBytes) {
    Fatal("a kernel's __shared__ variables exceed CUDA's 48 KB of static shared memory");
  }
  shared_[count] = SharedEntry{key, AllocateFilled(bytes, alignment)};
  shared_count_.store(count + 1, std::memory_order_release);
  return shared_[count].storage;
}

void* BlockContext::DynamicShared() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (dynamic_shared_ == nullptr) {
    dynamic_shared_ = AllocateFilled(grid_.config.shared_bytes, 16);
  }
  return dynamic_shared_;
}

WarpContext& BlockContext::Warp(int warp) {
  if (WarpContext* existing = warps_[warp].load(std::memory_order_acquire)) return *existing;
  std::unique_lock<std::mutex> lock(mutex_);
  if (WarpContext* existing = warps_[warp].load(std::memory_order_acquire)) return *existing;
  const int first = warp * 32;
  const int lanes = grid_.threads - first < 32 ? grid_.threads - first : 32;
  WarpContext* context = new WarpContext(lanes, 0);
  warps_[warp].store(context, std::memory_order_release);
  lock.unlock();
  // Lanes already gone: a lane leaving now sees the context or is seen here
  // (publication, fence, loads; ThreadFinished: exchange, fence, load), and a
  // second LaneFinished is harmless.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int lane = 0; lane < lanes; ++lane) {
    if (left_[first + lane].load(std::memory_order_relaxed)) context->LaneFinished(lane);
  }
  return *context;
}

// ---- the block-level API of cuda_emulation/block.h ------------------------------

int BlockBarrier(Vote vote, int predicate) {
  Place& place = CurrentPlace();
  return place.grid->Context(place.block).Barrier(place.thread, vote, predicate);
}

void* BlockSharedStorage(const void* key, std::size_t bytes, std::size_t alignment) {
  Place& place = CurrentPlace();
  return place.grid->Context(place.block).Shared(key, bytes, alignment);
}

void* DynamicSharedStorage() {
  Place& place = CurrentPlace();
  return place.grid->Context(place.block).DynamicShared();
}

}  // namespace cuda_emulation
