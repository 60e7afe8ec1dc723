// Block-level cooperation: __syncthreads and its votes, and __shared__
// storage, one copy per thread block.
//
// The threads of a block are host threads (runtime/grid.cc); __syncthreads is
// a real barrier among them (runtime/block_context.cc). As on Volta and later
// GPUs, a thread that has finished the block no longer counts: a barrier
// waits for the block's threads that are still running.
//
// __shared__ declarations are rewritten (rewrite.py) into calls of
// BlockShared<T>(tag): the storage of that declaration for the calling
// thread's block, created by the first thread of the block to reach it and
// filled with 0xA5 bytes (shared memory starts undefined on a GPU, and a read
// of it before any write shows as garbage rather than as zero). Blocks of one
// launch may run at the same time, each with its own copy.
#ifndef CUDA_EMULATION_BLOCK_H_
#define CUDA_EMULATION_BLOCK_H_

#include <cstddef>

namespace cuda_emulation {

enum class Vote { kNone, kOr, kAnd, kCount };

// The barrier of the calling thread's block; returns the vote's result
// (kOr / kAnd: 0 or 1; kCount: the number of non-zero predicates).
int BlockBarrier(Vote vote, int predicate);

// Storage of `bytes` bytes, aligned to `alignment`, for the declaration
// identified by `key`, in the calling thread's block.
void* BlockSharedStorage(const void* key, std::size_t bytes, std::size_t alignment);

// The block's dynamic shared memory (the launch's third argument), 16-byte aligned.
void* DynamicSharedStorage();

template <typename T, std::size_t kAlignment = alignof(T), typename Tag>
inline T& BlockShared(Tag) {
  static const char key = 0;  // one per declaration (each has its own Tag type)
  return *static_cast<T*>(BlockSharedStorage(&key, sizeof(T), kAlignment));
}

template <typename T>
inline T* DynamicShared() {
  return static_cast<T*>(DynamicSharedStorage());
}

}  // namespace cuda_emulation

inline void __syncthreads() { ::cuda_emulation::BlockBarrier(::cuda_emulation::Vote::kNone, 0); }
inline int __syncthreads_or(int predicate) {
  return ::cuda_emulation::BlockBarrier(::cuda_emulation::Vote::kOr, predicate);
}
inline int __syncthreads_and(int predicate) {
  return ::cuda_emulation::BlockBarrier(::cuda_emulation::Vote::kAnd, predicate);
}
inline int __syncthreads_count(int predicate) {
  return ::cuda_emulation::BlockBarrier(::cuda_emulation::Vote::kCount, predicate);
}

#endif  // CUDA_EMULATION_BLOCK_H_
