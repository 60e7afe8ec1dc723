// Running a launch: the built-in variables, the pool of host threads (one per
// CUDA thread of a block) and RunGrid.
//
// The launching thread is CUDA thread 0; pool worker t runs thread t. Each
// runs its thread of block 0, then of block 1, and so on, without waiting for
// the others between blocks: a grid-stride kernel without barriers costs one
// wake-up per thread, however many blocks. Blocks therefore overlap in time,
// as on a GPU, each with its own shared memory (block_context.cc).
#include "runtime/grid.h"

#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "runtime/block_context.h"
#include "runtime/futex.h"

namespace cuda_emulation {

thread_local uint3 thread_index = {0, 0, 0};
thread_local uint3 block_index = {0, 0, 0};
thread_local dim3 block_dim = dim3(1, 1, 1);
thread_local dim3 grid_dim = dim3(1, 1, 1);

namespace {

thread_local Place current_place;

constexpr int kMaxThreadsPerBlock = 1024;
constexpr int64_t kMaxEmulatedBlocks = int64_t{1} << 28;
constexpr std::size_t kWorkerStackBytes = 8 << 20;

uint3 Unlinear(int64_t index, const dim3& dims) {
  return uint3{static_cast<unsigned int>(index % dims.x),
               static_cast<unsigned int>(index / dims.x % dims.y),
               static_cast<unsigned int>(index / (int64_t{dims.x} * dims.y))};
}

// Rounding to nearest, denormals kept: the device's float environment.
class DeviceFloatEnvironment {
 public:
  DeviceFloatEnvironment() {
#if defined(__x86_64__)
    saved_ = _mm_getcsr();
    _mm_setcsr(0x1f80);  // all exceptions masked, round to nearest, no FTZ / DAZ
#endif
  }
  ~DeviceFloatEnvironment() {
#if defined(__x86_64__)
    _mm_setcsr(saved_);
#endif
  }

 private:
  unsigned int saved_ = 0;
};

// CUDA thread `thread` of every block of `grid`, block after block.
void RunThread(Grid& grid, int thread) {
  DeviceFloatEnvironment float_environment;
  thread_index = Unlinear(thread, grid.config.block);
  block_dim = grid.config.block;
  grid_dim = grid.config.grid;
  current_place.grid = &grid;
  current_place.thread = thread;
  for (int64_t block = 0; block < grid.blocks; ++block) {
    block_index = Unlinear(block, grid.config.grid);
    current_place.block = block;
    grid.body(grid.closure);
    // Store, fence, load: paired with the context's creation (CAS, fence, loads
    // of progress in CountThreadsAlreadyFinished), at least one of the two sees
    // the other. Relaxed plus fences, so that ThreadSanitizer gets no
    // happens-before from this thread's block to the context's creator.
    grid.progress[thread].store(block + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (BlockContext* context = grid.contexts[block].load(std::memory_order_acquire)) {
      context->ThreadFinished(thread);
    }
  }
  current_place = Place();
  thread_index = uint3{0, 0, 0};
  block_index = uint3{0, 0, 0};
  block_dim = dim3(1, 1, 1);
  grid_dim = dim3(1, 1, 1);
}

class ThreadPool {
 public:
  static ThreadPool& Instance() {
    static ThreadPool* pool = new ThreadPool();  // never destroyed: workers sleep at exit
    return *pool;
  }

  void Run(Grid& grid) {
    std::lock_guard<std::mutex> one_grid_at_a_time(launch_mutex_);
    Grow(grid.threads - 1);
    remaining_.store(static_cast<uint32_t>(grid.threads - 1), std::memory_order_relaxed);
    for (int t = 1; t < grid.threads; ++t) {
      Worker& worker = *workers_[t - 1];
      worker.grid = &grid;
      worker.epoch.fetch_add(1, std::memory_order_release);
      WakeOne(worker.epoch);
    }
    RunThread(grid, 0);
    for (uint32_t left; (left = remaining_.load(std::memory_order_acquire)) != 0;) {
      WaitWhileEquals(remaining_, left);
    }
  }

 private:
  struct Worker {
    ThreadPool* pool;
    int thread;
    Grid* grid = nullptr;
    std::atomic<uint32_t> epoch{0};
  };

  static void* WorkerMain(void* argument) {
    Worker& worker = *static_cast<Worker*>(argument);
    uint32_t seen = 0;
    for (;;) {
      WaitWhileEquals(worker.epoch, seen);
      seen = worker.epoch.load(std::memory_order_acquire);
      RunThread(*worker.grid, worker.thread);
      if (worker.pool->remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        WakeAll(worker.pool->remaining_);
      }
    }
    return nullptr;
  }

  void Grow(int count) {
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setstacksize(&attributes, kWorkerStackBytes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    while (static_cast<int>(workers_.size()) < count) {
      Worker* worker = new Worker();
      worker->pool = this;
      worker->thread = static_cast<int>(workers_.size()) + 1;
      pthread_t id;
      if (pthread_create(&id, &attributes, &WorkerMain, worker) != 0) {
        Fatal("cannot start a host thread for a CUDA thread");
      }
      workers_.push_back(worker);
    }
    pthread_attr_destroy(&attributes);
  }

  std::mutex launch_mutex_;
  std::vector<Worker*> workers_;
  std::atomic<uint32_t> remaining_{0};
};

// CUDA's launch limits; the error a bad configuration gets, or cudaSuccess.
cudaError_t CheckConfig(const LaunchConfig& config) {
  const dim3& b = config.block;
  const dim3& g = config.grid;
  if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 ||
      int64_t{b.x} * b.y * b.z > kMaxThreadsPerBlock) {
    return cudaErrorInvalidConfiguration;
  }
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
    return cudaErrorInvalidConfiguration;
  }
  if (config.shared_bytes > 48 * 1024) return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace

Grid::Grid(const LaunchConfig& launch, void (*thread_body)(void*), void* thread_closure)
    : config(launch),
      threads(static_cast<int>(launch.block.x * launch.block.y * launch.block.z)),
      blocks(int64_t{launch.grid.x} * launch.grid.y * launch.grid.z),
      body(thread_body),
      closure(thread_closure),
      spin(threads <= static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))),
      progress(new std::atomic<int64_t>[threads]()),
      contexts(new std::atomic<BlockContext*>[blocks]()) {}

Grid::~Grid() {
  for (int64_t b = 0; b < blocks; ++b) delete contexts[b].load(std::memory_order_relaxed);
}

BlockContext& Grid::Context(int64_t block) {
  BlockContext* existing = contexts[block].load(std::memory_order_acquire);
  if (existing != nullptr) return *existing;
  BlockContext* fresh = new BlockContext(*this, block);
  if (contexts[block].compare_exchange_strong(existing, fresh, std::memory_order_acq_rel,
                                              std::memory_order_acquire)) {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // see RunThread
    fresh->CountThreadsAlreadyFinished();
    return *fresh;
  }
  delete fresh;
  return *existing;
}

Place& CurrentPlace() {
  if (current_place.grid == nullptr) {
    Fatal("a block or warp intrinsic (__syncthreads, __shared__, *_sync) called outside a kernel");
  }
  return current_place;
}

void Fatal(const char* what) {
  std::fprintf(stderr, "cuda_emulation: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

void RunGrid(const LaunchConfig& config, void (*thread_body)(void*), void* closure) {
  if (current_place.grid != nullptr) {
    Fatal("a launch inside a kernel (dynamic parallelism) is not emulated");
  }
  const cudaError_t error = CheckConfig(config);
  if (error != cudaSuccess) {
    RecordError(error);
    return;
  }
  if (int64_t{config.grid.x} * config.grid.y * config.grid.z > kMaxEmulatedBlocks) {
    Fatal("a grid of more than 2^28 blocks is too large to emulate");
  }
  Grid grid(config, thread_body, closure);
  ThreadPool::Instance().Run(grid);
}

}  // namespace cuda_emulation
