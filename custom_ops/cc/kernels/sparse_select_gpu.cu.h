// Exact k-largest selection over 32-bit keys on a CUDA device: the GPU twin of
// sparse_select.h, giving the same selection (ties to the lower index) and the
// same ascending-index emission order.
//
// Kernels that are not templates are static: several launch sources include
// this header and are linked into one library.
//
// Everything is enqueued on one stream without host synchronisation: three
// histogram passes (shared-memory histograms merged with atomics), each
// followed by a one-block kernel that picks the digit (a block-wide scan over
// the bins); then per-chunk counts, a one-block scan over the chunks that
// splits the ties, and an emission kernel that orders each chunk's
// selections with block-wide prefix sums.
#ifndef TF_MERGECOMP_SPARSE_SELECT_GPU_CU_H_
#define TF_MERGECOMP_SPARSE_SELECT_GPU_CU_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/random.h"

namespace tf_mergecomp {
namespace gpu_select {

constexpr int kThreads = 256;
constexpr int kItemsPerThread = 16;
constexpr int64_t kChunk = kThreads * kItemsPerThread;  // elements per emission block
constexpr int kMaxBins = 2048;

struct SelectState {
  uint32_t prefix;
  uint32_t prefix_mask;
  long long remaining;  // after the passes: ties to take at the threshold
};

__device__ __forceinline__ uint32_t MagnitudeKeyDevice(float x) {
  uint32_t bits = __float_as_uint(x) & 0x7fffffffu;
  return bits > 0x7f800000u ? 0x7f800000u : bits;
}

// Workspace: state, histogram, then three arrays of num_chunks int64.
inline int64_t NumChunks(int64_t n) { return (n + kChunk - 1) / kChunk; }
inline size_t WorkspaceBytes(int64_t n) {
  return 256 + sizeof(uint32_t) * kMaxBins + 3 * sizeof(long long) * (NumChunks(n) + 1);
}
struct Workspace {
  SelectState* state;
  uint32_t* histogram;
  long long* greater;
  long long* ties;
  long long* start;
  explicit Workspace(void* base, int64_t n) {
    char* p = static_cast<char*>(base);
    state = reinterpret_cast<SelectState*>(p);
    histogram = reinterpret_cast<uint32_t*>(p + 256);
    greater = reinterpret_cast<long long*>(p + 256 + sizeof(uint32_t) * kMaxBins);
    ties = greater + NumChunks(n) + 1;
    start = ties + NumChunks(n) + 1;
  }
};

static __global__ void InitStateKernel(SelectState* state, uint32_t* histogram, long long k) {
  if (threadIdx.x == 0) {
    state->prefix = 0;
    state->prefix_mask = 0;
    state->remaining = k;
  }
  for (int b = threadIdx.x; b < kMaxBins; b += blockDim.x) histogram[b] = 0;
}

// Block-wide exclusive prefix sum over the kThreads threads' values (warp
// shuffles, then the warps' totals); *total gets the sum. Every thread calls it.
__device__ __forceinline__ long long BlockExclusiveSum(long long value, long long* total) {
  __shared__ long long warp_sums[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  long long inclusive = value;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const long long other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  long long before = 0, all = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) before += warp_sums[w];
    all += warp_sums[w];
  }
  __syncthreads();  // warp_sums is reused by the next call
  *total = all;
  return before + inclusive - value;
}

template <typename KeyFn>
__global__ void HistogramKernel(int64_t n, KeyFn key, const SelectState* state, int shift,
                                int bins, uint32_t* histogram) {
  __shared__ uint32_t local[kMaxBins];
  for (int b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const uint32_t prefix = state->prefix, prefix_mask = state->prefix_mask;
  const uint32_t digit_mask = static_cast<uint32_t>(bins - 1);
  // kUnroll keys per thread loaded before any is counted (loads in flight).
  constexpr int kUnroll = 8;
  const int64_t stride = int64_t{blockDim.x} * gridDim.x;
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint32_t keys[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) keys[u] = key(i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if ((keys[u] & prefix_mask) == prefix) atomicAdd(&local[(keys[u] >> shift) & digit_mask], 1u);
    }
  }
  for (; i < n; i += stride) {
    const uint32_t kk = key(i);
    if ((kk & prefix_mask) == prefix) atomicAdd(&local[(kk >> shift) & digit_mask], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x) {
    if (local[b]) atomicAdd(&histogram[b], local[b]);
  }
}

// One radix pass's choice, by one block of kThreads threads: the digit (from
// the top) whose bin holds the remaining k-th largest key, i.e. the first bin b
// from the top with (keys in the bins above b) + count(b) >= remaining; the
// histogram is cleared for the next pass. Thread t holds the bins
// [bins - (t + 1) * per, bins - t * per), so thread order is bin order from
// the top and one block-wide scan gives every thread the count above its bins.
// With no such bin (never with a consistent histogram) the digit is 0 and
// remaining drops by the total, as a walk over all bins would leave it.
__device__ __forceinline__ void ChooseDigit(SelectState* state, uint32_t* histogram, int shift,
                                            int bins) {
  __shared__ int chosen;
  __shared__ long long remaining_after;
  const long long remaining = state->remaining;
  const int per = (bins + kThreads - 1) / kThreads;
  const int top = bins - threadIdx.x * per;  // this thread's bins: [top - per, top) within [0, bins)
  long long mine = 0;
  for (int b = top - 1; b >= top - per && b >= 0; --b) mine += histogram[b];
  if (threadIdx.x == 0) chosen = -1;
  long long total = 0;
  const long long above = BlockExclusiveSum(mine, &total);  // has synchronised the block
  if (above < remaining && above + mine >= remaining) {  // exactly one thread
    long long left = remaining - above;
    for (int b = top - 1; b >= top - per && b >= 0; --b) {
      if (histogram[b] >= left) {
        chosen = b;
        remaining_after = left;
        break;
      }
      left -= histogram[b];
    }
  }
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += kThreads) histogram[b] = 0;
  if (threadIdx.x == 0) {
    const int digit = chosen < 0 ? 0 : chosen;
    state->remaining = chosen < 0 ? remaining - total : remaining_after;
    state->prefix |= static_cast<uint32_t>(digit) << shift;
    state->prefix_mask |= static_cast<uint32_t>(bins - 1) << shift;
  }
}

static __global__ void ChooseDigitKernel(SelectState* state, uint32_t* histogram, int shift, int bins) {
  ChooseDigit(state, histogram, shift, bins);
}

template <typename KeyFn>
__global__ void CountChunksKernel(int64_t n, KeyFn key, const SelectState* state,
                                  long long* greater, long long* equal) {
  __shared__ unsigned long long gt, eq;
  if (threadIdx.x == 0) gt = eq = 0;
  __syncthreads();
  const uint32_t threshold = state->prefix;
  const int64_t begin = blockIdx.x * kChunk;
  unsigned long long my_gt = 0, my_eq = 0;
  uint32_t keys[kItemsPerThread];
#pragma unroll
  for (int j = 0; j < kItemsPerThread; ++j) {
    const int64_t i = begin + j * kThreads + threadIdx.x;
    keys[j] = i < n ? key(i) : 0u;
  }
#pragma unroll
  for (int j = 0; j < kItemsPerThread; ++j) {
    const int64_t i = begin + j * kThreads + threadIdx.x;
    my_gt += i < n && keys[j] > threshold;
    my_eq += i < n && keys[j] == threshold;
  }
  atomicAdd(&gt, my_gt);
  atomicAdd(&eq, my_eq);
  __syncthreads();
  if (threadIdx.x == 0) {
    greater[blockIdx.x] = static_cast<long long>(gt);
    equal[blockIdx.x] = static_cast<long long>(eq);
  }
}

// The split of the ties over chunks [first, first + count), by one block:
// equal[] in; ties[] (how many of its ties a chunk takes) and start[] (its
// first slot, from `base`) out. The CPU's serial rule: chunks in order take
// ties while `ties_wanted` are not yet taken, so chunk c takes
// min(equal[c], max(0, ties_wanted - ties of the chunks before it)). Each
// thread holds a contiguous run of chunks; block-wide scans give each run
// the counts before it.
__device__ __forceinline__ void SplitTies(int64_t first, int64_t count, long long ties_wanted,
                                          long long base, const long long* greater,
                                          long long* ties_inout, long long* start) {
  const int64_t per = (count + kThreads - 1) / kThreads;
  const int64_t begin = first + threadIdx.x * per;
  const int64_t end = begin + per < first + count ? begin + per : first + count;
  long long my_equal = 0, my_greater = 0;
  for (int64_t c = begin; c < end; ++c) {
    my_equal += ties_inout[c];
    my_greater += greater[c];
  }
  long long total = 0;
  long long equal_before = BlockExclusiveSum(my_equal, &total);
  const long long greater_before = BlockExclusiveSum(my_greater, &total);
  long long taken_before = equal_before < ties_wanted ? equal_before : ties_wanted;
  long long position = base + greater_before + taken_before;
  for (int64_t c = begin; c < end; ++c) {
    const long long left = ties_wanted - equal_before;
    const long long take = left <= 0 ? 0 : (ties_inout[c] < left ? ties_inout[c] : left);
    equal_before += ties_inout[c];
    ties_inout[c] = take;
    start[c] = position;
    position += greater[c] + take;
  }
}

static __global__ void ScanChunksKernel(int64_t num_chunks, const SelectState* state,
                                        const long long* greater, long long* ties_inout,
                                        long long* start) {
  SplitTies(0, num_chunks, state->remaining, 0, greater, ties_inout, start);
}

// Inclusive block-wide sum over kThreads values (Hillis-Steele in shared memory).
__device__ __forceinline__ int BlockInclusiveSum(int value, int* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (int offset = 1; offset < kThreads; offset <<= 1) {
    const int add = threadIdx.x >= offset ? scratch[threadIdx.x - offset] : 0;
    __syncthreads();
    scratch[threadIdx.x] += add;
    __syncthreads();
  }
  const int result = scratch[threadIdx.x];
  __syncthreads();
  return result;
}

template <typename KeyFn, typename EmitFn>
__global__ void EmitKernel(int64_t n, KeyFn key, EmitFn emit, const SelectState* state,
                           const long long* ties, const long long* start) {
  __shared__ int scratch[kThreads];
  const uint32_t threshold = state->prefix;
  const int64_t first = blockIdx.x * kChunk + static_cast<int64_t>(threadIdx.x) * kItemsPerThread;
  uint32_t keys[kItemsPerThread];
  int my_eq = 0;
  for (int j = 0; j < kItemsPerThread; ++j) {
    const int64_t i = first + j;
    keys[j] = i < n ? key(i) : 0u;
    my_eq += (i < n && keys[j] == threshold);
  }
  const int eq_before = BlockInclusiveSum(my_eq, scratch) - my_eq;
  const long long ties_here = ties[blockIdx.x];
  int my_selected = 0, eq_seen = 0;
  bool take[kItemsPerThread];
  for (int j = 0; j < kItemsPerThread; ++j) {
    const int64_t i = first + j;
    bool t = false;
    if (i < n) {
      if (keys[j] > threshold) {
        t = true;
      } else if (keys[j] == threshold) {
        t = eq_before + eq_seen < ties_here;
        ++eq_seen;
      }
    }
    take[j] = t;
    my_selected += t;
  }
  long long position = start[blockIdx.x] + BlockInclusiveSum(my_selected, scratch) - my_selected;
  for (int j = 0; j < kItemsPerThread; ++j) {
    if (take[j]) emit(first + j, position++);
  }
}

// The radix select's digits, from the top: 11, 11 and 10 bits (the CPU's kDigitShift and
// kDigitBits in sparse_select.h). Functions, so that device code may call them too.
__host__ __device__ constexpr int DigitShift(int pass) {
  return pass == 0 ? 21 : (pass == 1 ? 10 : 0);
}
__host__ __device__ constexpr int DigitBits(int pass) { return pass == 2 ? 10 : 11; }

inline int HistogramBlocks(int64_t n) {
  const int64_t blocks = (n + kThreads * 8 - 1) / (kThreads * 8);
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 1024 ? 1024 : blocks));
}

// Enqueues the threshold search; requires 0 < k <= n.
template <typename KeyFn>
void LaunchSelect(int64_t n, int64_t k, KeyFn key, Workspace ws, cudaStream_t stream) {
  InitStateKernel<<<1, kThreads, 0, stream>>>(ws.state, ws.histogram, k);
  for (int pass = 0; pass < 3; ++pass) {
    const int bins = 1 << DigitBits(pass);
    HistogramKernel<<<HistogramBlocks(n), kThreads, 0, stream>>>(
        n, key, ws.state, DigitShift(pass), bins, ws.histogram);
    ChooseDigitKernel<<<1, kThreads, 0, stream>>>(ws.state, ws.histogram, DigitShift(pass),
                                                  bins);
  }
}

// Enqueues the emission of the selection found by LaunchSelect (or any state).
template <typename KeyFn, typename EmitFn>
void LaunchEmit(int64_t n, KeyFn key, EmitFn emit, Workspace ws, cudaStream_t stream) {
  const int64_t chunks = NumChunks(n);
  if (chunks == 0) return;
  CountChunksKernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(
      n, key, ws.state, ws.greater, ws.ties);
  ScanChunksKernel<<<1, kThreads, 0, stream>>>(chunks, ws.state, ws.greater, ws.ties, ws.start);
  EmitKernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(n, key, emit, ws.state,
                                                                     ws.ties, ws.start);
}

struct MagnitudeKey {
  const float* input;
  __device__ uint32_t operator()(int64_t i) const { return MagnitudeKeyDevice(input[i]); }
};

// Random-k's key: position i's random bits under the seed.
struct RandomBitsKey {
  SeedKey seed_key;
  __device__ uint32_t operator()(int64_t i) const {
    return RandomBits(seed_key, static_cast<uint32_t>(i));
  }
};

struct ValueIndexEmit {
  const float* input;
  float* values;
  int32_t* indices;
  __device__ void operator()(int64_t i, long long position) const {
    values[position] = input[i];
    indices[position] = static_cast<int32_t>(i);
  }
};

}  // namespace gpu_select
}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_SPARSE_SELECT_GPU_CU_H_
