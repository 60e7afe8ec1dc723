// Exact k-largest selection over 32-bit keys on a CUDA device: the GPU twin of
// sparse_select.h, giving the same selection (ties to the lower index) and the
// same ascending-index emission order.
//
// Kernels that are not templates are static: several launch sources include
// this header and are linked into one library.
//
// Everything is enqueued on one stream without host synchronisation: three
// histogram passes (shared-memory histograms merged with atomics), each
// followed by a one-thread kernel that picks the digit; then per-chunk counts,
// a one-thread scan over chunks, and an emission kernel that orders each
// chunk's selections with block-wide prefix sums.
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
  state->prefix = 0;
  state->prefix_mask = 0;
  state->remaining = k;
  for (int b = 0; b < kMaxBins; ++b) histogram[b] = 0;
}

template <typename KeyFn>
__global__ void HistogramKernel(int64_t n, KeyFn key, const SelectState* state, int shift,
                                int bins, uint32_t* histogram) {
  __shared__ uint32_t local[kMaxBins];
  for (int b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const uint32_t prefix = state->prefix, prefix_mask = state->prefix_mask;
  const uint32_t digit_mask = static_cast<uint32_t>(bins - 1);
  gpu::ForEachIndex(n, [&](int64_t i) {
    const uint32_t kk = key(i);
    if ((kk & prefix_mask) == prefix) atomicAdd(&local[(kk >> shift) & digit_mask], 1u);
  });
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x) {
    if (local[b]) atomicAdd(&histogram[b], local[b]);
  }
}

// One radix pass's choice: the digit (from the top) whose bin holds the
// remaining k-th largest key; the histogram is cleared for the next pass.
static __device__ void ChooseDigit(SelectState* state, uint32_t* histogram, int shift, int bins) {
  long long remaining = state->remaining;
  int chosen = 0;
  for (int b = bins - 1; b >= 0; --b) {
    const long long count = histogram[b];
    if (count >= remaining) {
      chosen = b;
      break;
    }
    remaining -= count;
  }
  for (int b = 0; b < bins; ++b) histogram[b] = 0;
  state->remaining = remaining;
  state->prefix |= static_cast<uint32_t>(chosen) << shift;
  state->prefix_mask |= static_cast<uint32_t>(bins - 1) << shift;
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
  for (int64_t i = begin + threadIdx.x; i < begin + kChunk && i < n; i += blockDim.x) {
    const uint32_t kk = key(i);
    my_gt += kk > threshold;
    my_eq += kk == threshold;
  }
  atomicAdd(&gt, my_gt);
  atomicAdd(&eq, my_eq);
  __syncthreads();
  if (threadIdx.x == 0) {
    greater[blockIdx.x] = static_cast<long long>(gt);
    equal[blockIdx.x] = static_cast<long long>(eq);
  }
}

// equal[] in, ties[] and start[] out: the same serial split as the CPU code.
static __global__ void ScanChunksKernel(int64_t num_chunks, const SelectState* state,
                                 const long long* greater, long long* ties_inout,
                                 long long* start) {
  long long ties_left = state->remaining;
  start[0] = 0;
  for (int64_t c = 0; c < num_chunks; ++c) {
    const long long take = ties_inout[c] < ties_left ? ties_inout[c] : ties_left;
    ties_left -= take;
    ties_inout[c] = take;
    start[c + 1] = start[c] + greater[c] + take;
  }
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

constexpr int kDigitShiftGpu[3] = {21, 10, 0};
constexpr int kDigitBitsGpu[3] = {11, 11, 10};

inline int HistogramBlocks(int64_t n) {
  const int64_t blocks = (n + kThreads * 8 - 1) / (kThreads * 8);
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 1024 ? 1024 : blocks));
}

// Enqueues the threshold search; requires 0 < k <= n.
template <typename KeyFn>
void LaunchSelect(int64_t n, int64_t k, KeyFn key, Workspace ws, cudaStream_t stream) {
  InitStateKernel<<<1, 1, 0, stream>>>(ws.state, ws.histogram, k);
  for (int pass = 0; pass < 3; ++pass) {
    const int bins = 1 << kDigitBitsGpu[pass];
    HistogramKernel<<<HistogramBlocks(n), kThreads, 0, stream>>>(
        n, key, ws.state, kDigitShiftGpu[pass], bins, ws.histogram);
    ChooseDigitKernel<<<1, 1, 0, stream>>>(ws.state, ws.histogram, kDigitShiftGpu[pass], bins);
  }
}

// Enqueues the emission of the selection found by LaunchSelect (or any state).
template <typename KeyFn, typename EmitFn>
void LaunchEmit(int64_t n, KeyFn key, EmitFn emit, Workspace ws, cudaStream_t stream) {
  const int64_t chunks = NumChunks(n);
  if (chunks == 0) return;
  CountChunksKernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(
      n, key, ws.state, ws.greater, ws.ties);
  ScanChunksKernel<<<1, 1, 0, stream>>>(chunks, ws.state, ws.greater, ws.ties, ws.start);
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
