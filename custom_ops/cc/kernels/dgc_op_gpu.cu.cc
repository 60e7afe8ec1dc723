// DGC's CUDA selection (algorithm in dgc_op.h): its launcher, also used by the
// group launchers (group_op_gpu.cu.cc).
//
// Framework-free entry points (raw device pointers, a cudaStream_t):
//   size_t mergecomp_dgc_workspace_bytes(int64_t n, int64_t sample_size);
//   int mergecomp_dgc_encode_gpu(const float* input, int64_t n, int64_t seed, int64_t k,
//                                   int64_t sample_size, uint8_t* payload,
//                                   void* workspace, cudaStream_t);
// Returns the cudaError_t of the last launch.
//
// On the device the candidates are selected in one formulation: masked key
// m_i = key(|v_i|) + 1 if |v_i| >= threshold, else 0; the k largest m (ties
// to the lower index) are the k largest candidates when there are >= k of
// them. With fewer, the threshold of that selection is 0; only m > 0 entries
// are emitted and the payload, zeroed first, keeps its (0, index 0) padding.
// The result equals the CPU kernel's byte for byte.
#include <cuda_runtime.h>

#include <cstdint>

#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/random.h"
#include "cc/kernels/sparse_gpu_launchers.h"
#include "cc/kernels/sparse_select_gpu.cu.h"

namespace tf_mergecomp {
namespace {

constexpr int kRefinements = 3;  // kDgcRefinements in dgc_op.h

// The threshold search: the sampled threshold t and the counts of
// candidates at t, t/2 and t/4, all found in one pass; the threshold is the
// first of t, t/2, t/4, t/8 reached by at least k entries (t/8 if none), as
// kRefinements rounds of halving and recounting choose it.
struct DgcState {
  float threshold;
  unsigned long long count[kRefinements];
};

__global__ void SampleKernel(const float* input, int64_t n, SeedKey seed_key,
                             int64_t sample_size, uint32_t* sample_keys) {
  gpu::ForEachIndex(sample_size, [&](int64_t j) {
    const uint64_t bits = RandomBits(seed_key, static_cast<uint32_t>(j));
    const int64_t position = static_cast<int64_t>((bits * static_cast<uint64_t>(n)) >> 32);
    sample_keys[j] = gpu_select::MagnitudeKeyDevice(input[position]);
  });
}

__global__ void SetThresholdKernel(const gpu_select::SelectState* sample_state, DgcState* dgc) {
  dgc->threshold = __uint_as_float(sample_state->prefix);
  for (int r = 0; r < kRefinements; ++r) dgc->count[r] = 0;
}

// The candidates at t, t/2 and t/4 (halved as RefineKernel halves), one pass.
__global__ void CountKernel(const float* input, int64_t n, DgcState* dgc) {
  uint32_t threshold_keys[kRefinements];
  float threshold = dgc->threshold;
  for (int r = 0; r < kRefinements; ++r) {
    threshold_keys[r] = gpu_select::MagnitudeKeyDevice(threshold);
    threshold = threshold * 0.5f;
  }
  unsigned long long counts[kRefinements] = {};
  const gpu::TileRange tiles = gpu::TilesOfBlock(n);
  for (int64_t tile = tiles.begin; tile < tiles.end; ++tile) {
    float values[gpu::kUnroll][gpu::kVector];
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) {
      const int64_t first = gpu::TileVector(tile, u);
      if (first + gpu::kVector <= n) {
        gpu::Load4(input + first, values[u]);
      } else {
        for (int e = 0; e < gpu::kVector; ++e) values[u][e] = first + e < n ? input[first + e] : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) {
      const int64_t first = gpu::TileVector(tile, u);
#pragma unroll
      for (int e = 0; e < gpu::kVector; ++e) {
        const uint32_t key = gpu_select::MagnitudeKeyDevice(values[u][e]);
        const bool valid = first + e < n;
        for (int r = 0; r < kRefinements; ++r) counts[r] += valid && key >= threshold_keys[r];
      }
    }
  }
  for (int r = 0; r < kRefinements; ++r) {
    unsigned long long count = counts[r];
    for (int offset = 16; offset > 0; offset >>= 1) {
      count += __shfl_down_sync(0xffffffffu, count, offset);
    }
    if ((threadIdx.x & 31) == 0 && count > 0) atomicAdd(&dgc->count[r], count);
  }
}

// Halves the threshold while fewer than k entries reach it, at most
// kRefinements times.
__global__ void RefineKernel(DgcState* dgc, long long k) {
  for (int r = 0; r < kRefinements; ++r) {
    if (static_cast<long long>(dgc->count[r]) >= k) return;
    dgc->threshold = dgc->threshold * 0.5f;
  }
}

// When fewer than k candidates exist the selection threshold is 0: take no
// zero-keyed (non-candidate) entries.
__global__ void DropNonCandidatesKernel(gpu_select::SelectState* state) {
  if (state->prefix == 0) state->remaining = 0;
}

struct SampleKey {
  const uint32_t* keys;
  __device__ uint32_t operator()(int64_t j) const { return keys[j]; }
};

struct MaskedKey {
  const float* input;
  const DgcState* dgc;
  __device__ uint32_t operator()(int64_t i) const {
    const uint32_t key = gpu_select::MagnitudeKeyDevice(input[i]);
    return key >= gpu_select::MagnitudeKeyDevice(dgc->threshold) ? key + 1u : 0u;
  }
};

size_t Align(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace
}  // namespace tf_mergecomp

extern "C" size_t mergecomp_dgc_workspace_bytes(int64_t n, int64_t sample_size) {
  using namespace tf_mergecomp;
  return Align(sizeof(DgcState)) + Align(sizeof(uint32_t) * sample_size) +
         Align(gpu_select::WorkspaceBytes(sample_size)) + gpu_select::WorkspaceBytes(n);
}

extern "C" int mergecomp_dgc_encode_gpu(const float* input, int64_t n, int64_t seed,
                                           int64_t k, int64_t sample_size, uint8_t* payload,
                                           void* workspace, cudaStream_t stream) {
  using namespace tf_mergecomp;
  if (k <= 0) return 0;
  char* base = static_cast<char*>(workspace);
  DgcState* dgc = reinterpret_cast<DgcState*>(base);
  base += Align(sizeof(DgcState));
  uint32_t* sample_keys = reinterpret_cast<uint32_t*>(base);
  base += Align(sizeof(uint32_t) * sample_size);
  gpu_select::Workspace sample_ws(base, sample_size);
  base += Align(gpu_select::WorkspaceBytes(sample_size));
  gpu_select::Workspace ws(base, n);

  SampleKernel<<<gpu::GridFor(sample_size), gpu::kThreads, 0, stream>>>(input, n, MakeSeedKey(seed),
                                                        sample_size, sample_keys);
  int64_t rank = (sample_size * k + n - 1) / n;
  rank = rank < 1 ? 1 : (rank > sample_size ? sample_size : rank);
  gpu_select::LaunchSelect(sample_size, rank, SampleKey{sample_keys}, sample_ws, stream);
  SetThresholdKernel<<<1, 1, 0, stream>>>(sample_ws.state, dgc);
  const int error = gpu::LaunchTiles(n, stream, CountKernel, input, n, dgc);
  if (error != 0) return error;
  RefineKernel<<<1, 1, 0, stream>>>(dgc, k);
  MaskedKey key{input, dgc};
  gpu_select::LaunchSelect(n, k, key, ws, stream);
  DropNonCandidatesKernel<<<1, 1, 0, stream>>>(ws.state);
  const cudaError_t cleared = cudaMemsetAsync(payload, 0, 8 * k, stream);
  if (cleared != cudaSuccess) return static_cast<int>(cleared);
  gpu_select::ValueIndexEmit emit{input, reinterpret_cast<float*>(payload),
                                  reinterpret_cast<int32_t*>(payload + 4 * k)};
  gpu_select::LaunchEmit(n, key, emit, ws, stream);
  return static_cast<int>(cudaGetLastError());
}
