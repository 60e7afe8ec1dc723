// A running launch as the runtime sees it (internal to runtime/*.cc).
#ifndef CUDA_EMULATION_RUNTIME_GRID_H_
#define CUDA_EMULATION_RUNTIME_GRID_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "cuda_emulation/launch.h"
#include "cuda_emulation/types.h"

namespace cuda_emulation {

class BlockContext;

// Every thread runs blocks 0, 1, ..., blocks - 1 in turn, as thread `t` of
// each (runtime/grid.cc). Threads do not wait for each other between blocks:
// only a barrier, shared memory or a warp operation creates the block's
// context, and its barriers then wait for the threads still in the block.
struct Grid {
  Grid(const LaunchConfig& config, void (*body)(void*), void* closure);
  ~Grid();

  // The block's context, created by the first thread that needs it.
  BlockContext& Context(int64_t block);

  LaunchConfig config;
  int threads;     // per block
  int64_t blocks;  // in the grid
  void (*body)(void*);
  void* closure;
  bool spin;  // barriers spin before sleeping (a block no larger than the CPU count)
  // progress[t]: blocks thread t has finished (it finished block b iff > b).
  std::unique_ptr<std::atomic<int64_t>[]> progress;
  std::unique_ptr<std::atomic<BlockContext*>[]> contexts;
};

// Where the calling host thread is in the running grid.
struct Place {
  Grid* grid = nullptr;  // null outside a kernel
  int thread = 0;        // linear thread index in the block
  int64_t block = 0;     // linear block index
};
Place& CurrentPlace();  // aborts outside a kernel

[[noreturn]] void Fatal(const char* what);
void RecordError(cudaError_t error);  // as the thread's last error

}  // namespace cuda_emulation

#endif  // CUDA_EMULATION_RUNTIME_GRID_H_
