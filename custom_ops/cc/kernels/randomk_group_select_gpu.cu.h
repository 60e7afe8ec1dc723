// Random-k's draws for a whole group on a CUDA device (the group launchers'
// random-k, group_op_gpu.cu.cc): tensor t (k_t > 0) takes the k_t of its n_t
// positions with the largest keys RandomBits(TensorSeed(seed, t), i), ties to
// the lower position, written in ascending order at its slots (slot_base[t]
// on): the CPU's draw (randomk_op.cc), position for position.
//
// The keys are uniform 32-bit numbers and depend on nothing but the seed, so
// (as on the CPU) a threshold that about wanted = k + 6 sqrt(k) + 64 of the n
// keys reach is known without looking at them. For a tensor where 2 * wanted
// < n (and n >= kCollectMin) one pass counts, per chunk of the tensor, the
// keys reaching it and a second writes their positions in order (ordered
// compaction, a block per chunk); the selection then looks at these few
// candidates only. A tensor with fewer than k candidates (beyond six
// standard deviations), more than the room kept for them, or too small or
// dense to collect, is selected over all its keys instead: the same k
// largest either way. The selection is one block per tensor: three radix
// passes of a shared-memory histogram, each digit chosen with a block-wide
// scan, then the emission in index order with block-wide prefix sums. No
// global atomics, no single-thread walks.
#ifndef TF_MERGECOMP_RANDOMK_GROUP_SELECT_GPU_CU_H_
#define TF_MERGECOMP_RANDOMK_GROUP_SELECT_GPU_CU_H_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/random.h"
#include "cc/kernels/sparse_select_gpu.cu.h"

namespace tf_mergecomp {
namespace randomk_group {

using gpu_select::kChunk;
using gpu_select::kItemsPerThread;
using gpu_select::kThreads;

constexpr int64_t kCollectMin = 1 << 10;

// How tensor t's draw finds its candidates.
struct Plan {
  bool collect;        // candidates are the keys >= threshold, at most `room` of them
  uint32_t threshold;
  int64_t room;
};

__host__ __device__ inline Plan PlanFor(int64_t n, int64_t k) {
  Plan plan{false, 0u, 0};
  if (k <= 0) return plan;
  const double wanted = static_cast<double>(k) + 6.0 * sqrt(static_cast<double>(k)) + 64.0;
  if (n < kCollectMin || 2.0 * wanted >= static_cast<double>(n)) return plan;
  const double above = ceil(wanted / static_cast<double>(n) * 4294967296.0);
  plan.collect = true;
  plan.threshold = static_cast<uint32_t>(4294967296.0 - above);
  plan.room = static_cast<int64_t>(2.0 * wanted) + 1024;
  if (plan.room > n) plan.room = n;
  return plan;
}

__host__ __device__ inline int64_t ChunksOf(int64_t n) { return (n + kChunk - 1) / kChunk; }

// The group as the kernels see it.
struct Group {
  int64_t num_tensors;
  const int64_t* offsets;   // device: flat offsets, num_tensors + 1
  const int64_t* tensor_k;  // device: k_t
  int64_t seed;

  __device__ int64_t Size(int64_t t) const { return offsets[t + 1] - offsets[t]; }
  __device__ SeedKey KeyOf(int64_t t) const { return MakeSeedKey(TensorSeed(seed, t)); }
};

// Workspace: per tensor (chunk_base has one more entry) and per chunk tables,
// then the candidates' positions (int32, local to their tensor).
struct Workspace {
  int64_t* chunk_base;       // first chunk of tensor t (collecting tensors only have chunks)
  int64_t* slot_base;        // first slot of tensor t
  int64_t* candidate_base;   // first candidate entry of tensor t
  long long* found;          // candidates tensor t found (all, also beyond its room)
  long long* chunk_count;    // candidates per chunk
  long long* chunk_start;    // a chunk's first candidate entry
  int32_t* candidates;
};

inline int64_t Aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Sizes from the host's copy of the offsets and k_t.
struct Sizes {
  int64_t chunks = 0;
  int64_t candidates = 0;
  int64_t Bytes(int64_t num_tensors) const {
    return 3 * Aligned(8 * (num_tensors + 1)) + Aligned(8 * num_tensors) +
           2 * Aligned(8 * (chunks + 1)) + Aligned(4 * (candidates + 1));
  }
};

inline Sizes SizesFor(int64_t num_tensors, const int64_t* host_offsets,
                      const int64_t* host_tensor_k) {
  Sizes sizes;
  for (int64_t t = 0; t < num_tensors; ++t) {
    const Plan plan = PlanFor(host_offsets[t + 1] - host_offsets[t], host_tensor_k[t]);
    if (!plan.collect) continue;
    sizes.chunks += ChunksOf(host_offsets[t + 1] - host_offsets[t]);
    sizes.candidates += plan.room;
  }
  return sizes;
}

inline Workspace Carve(void* base, int64_t num_tensors, const Sizes& sizes) {
  char* p = static_cast<char*>(base);
  Workspace ws;
  ws.chunk_base = reinterpret_cast<int64_t*>(p);
  p += Aligned(8 * (num_tensors + 1));
  ws.slot_base = reinterpret_cast<int64_t*>(p);
  p += Aligned(8 * (num_tensors + 1));
  ws.candidate_base = reinterpret_cast<int64_t*>(p);
  p += Aligned(8 * (num_tensors + 1));
  ws.found = reinterpret_cast<long long*>(p);
  p += Aligned(8 * num_tensors);
  ws.chunk_count = reinterpret_cast<long long*>(p);
  p += Aligned(8 * (sizes.chunks + 1));
  ws.chunk_start = reinterpret_cast<long long*>(p);
  p += Aligned(8 * (sizes.chunks + 1));
  ws.candidates = reinterpret_cast<int32_t*>(p);
  return ws;
}

// One block: the chunk, slot and candidate bases (prefix sums over the
// tensors, each thread a contiguous run of them).
__global__ void TablesKernel(Group group, Workspace ws) {
  const int64_t count = group.num_tensors;
  const int64_t per = (count + kThreads - 1) / kThreads;
  const int64_t begin = threadIdx.x * per;
  const int64_t end = begin + per < count ? begin + per : count;
  long long chunks = 0, slots = 0, room = 0;
  for (int64_t t = begin; t < end; ++t) {
    const Plan plan = PlanFor(group.Size(t), group.tensor_k[t]);
    if (plan.collect) chunks += ChunksOf(group.Size(t));
    room += plan.room;
    slots += group.tensor_k[t];
  }
  long long all_chunks = 0, all = 0;
  chunks = gpu_select::BlockExclusiveSum(chunks, &all_chunks);
  slots = gpu_select::BlockExclusiveSum(slots, &all);
  room = gpu_select::BlockExclusiveSum(room, &all);
  for (int64_t t = begin; t < end; ++t) {
    const Plan plan = PlanFor(group.Size(t), group.tensor_k[t]);
    ws.chunk_base[t] = chunks;
    ws.slot_base[t] = slots;
    ws.candidate_base[t] = room;
    if (plan.collect) chunks += ChunksOf(group.Size(t));
    room += plan.room;
    slots += group.tensor_k[t];
  }
  if (threadIdx.x == 0) ws.chunk_base[count] = all_chunks;
}

// The tensor of chunk `chunk` and the chunk's position range in it.
struct Chunk {
  int64_t t, begin, end;
  __device__ Chunk(const Group& group, const Workspace& ws, int64_t chunk) {
    t = gpu::SegmentAt(ws.chunk_base, group.num_tensors, chunk);
    const int64_t size = group.Size(t);
    begin = (chunk - ws.chunk_base[t]) * kChunk;
    end = begin + kChunk < size ? begin + kChunk : size;
  }
};

// One block per chunk: how many of its keys reach the tensor's threshold.
__global__ void CountKernel(Group group, Workspace ws) {
  const Chunk chunk(group, ws, blockIdx.x);
  const SeedKey key = group.KeyOf(chunk.t);
  const uint32_t threshold = PlanFor(group.Size(chunk.t), group.tensor_k[chunk.t]).threshold;
  long long mine = 0;
  for (int64_t i = chunk.begin + threadIdx.x; i < chunk.end; i += kThreads) {
    mine += RandomBits(key, static_cast<uint32_t>(i)) >= threshold;
  }
  long long total = 0;
  gpu_select::BlockExclusiveSum(mine, &total);
  if (threadIdx.x == 0) ws.chunk_count[blockIdx.x] = total;
}

// One block per collecting tensor: its chunks' first entries (a block-wide
// scan over runs of chunks) and how many candidates it found.
__global__ void ScanKernel(Group group, Workspace ws) {
  for (int64_t t = blockIdx.x; t < group.num_tensors; t += gridDim.x) {
    const int64_t first = ws.chunk_base[t], count = ws.chunk_base[t + 1] - first;
    if (count == 0) continue;
    const int64_t per = (count + kThreads - 1) / kThreads;
    const int64_t begin = first + threadIdx.x * per;
    const int64_t end = begin + per < first + count ? begin + per : first + count;
    long long mine = 0;
    for (int64_t c = begin; c < end; ++c) mine += ws.chunk_count[c];
    long long total = 0;
    long long start = gpu_select::BlockExclusiveSum(mine, &total);
    for (int64_t c = begin; c < end; ++c) {
      ws.chunk_start[c] = start;
      start += ws.chunk_count[c];
    }
    if (threadIdx.x == 0) ws.found[t] = total;
  }
}

// One block per chunk: the positions of its keys reaching the threshold, in
// order, at the chunk's entries (those within the tensor's room).
__global__ void CollectKernel(Group group, Workspace ws) {
  __shared__ int scratch[kThreads];
  const Chunk chunk(group, ws, blockIdx.x);
  const SeedKey key = group.KeyOf(chunk.t);
  const Plan plan = PlanFor(group.Size(chunk.t), group.tensor_k[chunk.t]);
  const int64_t first = chunk.begin + static_cast<int64_t>(threadIdx.x) * kItemsPerThread;
  int mine = 0;
  bool reach[kItemsPerThread];
#pragma unroll
  for (int j = 0; j < kItemsPerThread; ++j) {
    const int64_t i = first + j;
    reach[j] = i < chunk.end && RandomBits(key, static_cast<uint32_t>(i)) >= plan.threshold;
    mine += reach[j];
  }
  long long entry = ws.chunk_start[blockIdx.x] + gpu_select::BlockInclusiveSum(mine, scratch) - mine;
  int32_t* out = ws.candidates + ws.candidate_base[chunk.t];
#pragma unroll
  for (int j = 0; j < kItemsPerThread; ++j) {
    if (!reach[j]) continue;
    if (entry < plan.room) out[entry] = static_cast<int32_t>(first + j);
    ++entry;
  }
}

// One block per tensor: the selection over its candidates (or all its
// keys), emitted in position order: group positions and the values of p there.
__global__ void SelectKernel(Group group, Workspace ws, const float* p, float* values,
                             int32_t* positions) {
  __shared__ uint32_t histogram[gpu_select::kMaxBins];
  __shared__ gpu_select::SelectState state;
  for (int64_t t = blockIdx.x; t < group.num_tensors; t += gridDim.x) {
    const int64_t k = group.tensor_k[t];
    if (k == 0) continue;
    const int64_t n = group.Size(t);
    const Plan plan = PlanFor(n, k);
    const bool from_candidates = plan.collect && ws.found[t] >= k && ws.found[t] <= plan.room;
    const int64_t items = from_candidates ? ws.found[t] : n;
    const int32_t* candidates = ws.candidates + ws.candidate_base[t];
    const SeedKey seed_key = group.KeyOf(t);
    // Item m: its position in the tensor and its key.
    auto position_of = [&](int64_t m) -> int64_t {
      return from_candidates ? candidates[m] : m;
    };
    auto key_of = [&](int64_t m) -> uint32_t {
      return RandomBits(seed_key, static_cast<uint32_t>(position_of(m)));
    };
    __syncthreads();  // the previous tensor's last reads of the shared state
    if (threadIdx.x == 0) {
      state.prefix = 0;
      state.prefix_mask = 0;
      state.remaining = k;
    }
    for (int b = threadIdx.x; b < gpu_select::kMaxBins; b += kThreads) histogram[b] = 0;
    __syncthreads();
    for (int pass = 0; pass < 3; ++pass) {
      const int shift = gpu_select::DigitShift(pass);
      const int bins = 1 << gpu_select::DigitBits(pass);
      const uint32_t prefix = state.prefix, prefix_mask = state.prefix_mask;
      for (int64_t m = threadIdx.x; m < items; m += kThreads) {
        const uint32_t key = key_of(m);
        if ((key & prefix_mask) == prefix) {
          atomicAdd(&histogram[(key >> shift) & static_cast<uint32_t>(bins - 1)], 1u);
        }
      }
      __syncthreads();
      gpu_select::ChooseDigit(&state, histogram, shift, bins);  // clears the histogram
      __syncthreads();
    }
    const uint32_t threshold = state.prefix;
    const long long ties = state.remaining;
    // Emission: rounds of kChunk items, kItemsPerThread consecutive ones a thread.
    long long ties_before = 0, selected_before = 0;
    const int64_t offset = group.offsets[t];
    for (int64_t round = 0; round < items; round += kChunk) {
      const int64_t first = round + static_cast<int64_t>(threadIdx.x) * kItemsPerThread;
      uint32_t keys[kItemsPerThread];
      int my_ties = 0;
#pragma unroll
      for (int j = 0; j < kItemsPerThread; ++j) {
        keys[j] = first + j < items ? key_of(first + j) : 0u;
        my_ties += first + j < items && keys[j] == threshold;
      }
      long long all_ties = 0;
      long long tie_rank = ties_before + gpu_select::BlockExclusiveSum(my_ties, &all_ties);
      bool take[kItemsPerThread];
      int my_selected = 0;
#pragma unroll
      for (int j = 0; j < kItemsPerThread; ++j) {
        take[j] = false;
        if (first + j >= items) continue;
        if (keys[j] > threshold) {
          take[j] = true;
        } else if (keys[j] == threshold) {
          take[j] = tie_rank < ties;
          ++tie_rank;
        }
        my_selected += take[j];
      }
      long long all_selected = 0;
      long long slot =
          ws.slot_base[t] + selected_before + gpu_select::BlockExclusiveSum(my_selected, &all_selected);
#pragma unroll
      for (int j = 0; j < kItemsPerThread; ++j) {
        if (!take[j]) continue;
        const int64_t position = offset + position_of(first + j);
        positions[slot] = static_cast<int32_t>(position);
        values[slot] = p[position];
        ++slot;
      }
      ties_before += all_ties;
      selected_before += all_selected;
    }
  }
}

// Enqueues the draws of every tensor with k_t > 0 on `stream`; `workspace`
// holds Sizes::Bytes. Returns the launches' error code.
inline int LaunchSelect(const Group& group, const Sizes& sizes, void* workspace, const float* p,
                        float* values, int32_t* positions, cudaStream_t stream) {
  if (group.num_tensors == 0) return 0;
  const Workspace ws = Carve(workspace, group.num_tensors, sizes);
  const int tensor_blocks =
      static_cast<int>(group.num_tensors < 65535 ? group.num_tensors : 65535);
  TablesKernel<<<1, kThreads, 0, stream>>>(group, ws);
  if (sizes.chunks > 0) {
    const unsigned chunks = static_cast<unsigned>(sizes.chunks);
    CountKernel<<<chunks, kThreads, 0, stream>>>(group, ws);
    ScanKernel<<<tensor_blocks, kThreads, 0, stream>>>(group, ws);
    CollectKernel<<<chunks, kThreads, 0, stream>>>(group, ws);
  }
  SelectKernel<<<tensor_blocks, kThreads, 0, stream>>>(group, ws, p, values, positions);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace randomk_group
}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_RANDOMK_GROUP_SELECT_GPU_CU_H_
