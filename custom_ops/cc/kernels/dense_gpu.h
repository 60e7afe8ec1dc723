// CUDA building blocks of the dense codecs (framework-free; included only by
// the *_op_gpu.cu.cc files).
//
// Reductions are deterministic: a fixed grid writes one partial per block,
// and one block combines the partials in a fixed tree order. Kernels use
// explicitly rounded arithmetic (__fmul_rn, __fadd_rn, __fdiv_rn) so nvcc
// never fuses a multiply and an add: the GPU then produces the same codes
// as the CPU kernels and the plain-TF references for the same scale.
#ifndef TF_MERGECOMP_DENSE_GPU_H_
#define TF_MERGECOMP_DENSE_GPU_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/kernels/dense_bits.h"

namespace tf_mergecomp {
namespace gpu {

constexpr int kThreads = 256;
// Blocks of a reduction's first pass; scratch holds kReduceBlocks partials
// of up to kReduceFields doubles each.
constexpr int kReduceBlocks = 1024;
constexpr int kReduceFields = 3;
constexpr int64_t kScratchBytes = int64_t{kReduceBlocks} * kReduceFields * sizeof(double);

inline int GridFor(int64_t work_items) {
  const int64_t blocks = (work_items + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

inline int ReduceGridFor(int64_t work_items) {
  const int grid = GridFor(work_items);
  return grid < kReduceBlocks ? grid : kReduceBlocks;
}

// The one grid-stride loop of every kernel: calls fn(i) for each i in
// [0, n) owned by this thread (i = global thread index + multiples of the
// grid's thread count).
template <typename Fn>
__device__ __forceinline__ void ForEachIndex(int64_t n, const Fn& fn) {
  const int64_t stride = int64_t{blockDim.x} * gridDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += stride) fn(i);
}

// ---- tiles: how the element-wise passes split the work ----------------------
// A block owns kTileElements consecutive flat indices, as kUnroll rounds of
// kThreads vectors of kVector elements: thread t's u-th vector starts at
// tile * kTileElements + (u * kThreads + t) * kVector. A warp so touches
// 32 * kVector consecutive elements per access (16-byte loads and stores where
// the memory is 16-byte aligned), and each thread has kUnroll vectors of loads
// in flight before it uses any of them: what keeps device memory busy (one
// 4-byte load per thread at a time reaches a tenth of the bandwidth).
constexpr int kVector = 4;
#ifndef MERGECOMP_TILE_UNROLL
#define MERGECOMP_TILE_UNROLL 2
#endif
constexpr int kUnroll = MERGECOMP_TILE_UNROLL;
constexpr int64_t kTileElements = int64_t{kThreads} * kVector * kUnroll;

__host__ __device__ inline int64_t TilesFor(int64_t n) { return (n + kTileElements - 1) / kTileElements; }

// The first element of the calling thread's u-th vector of `tile`.
__device__ __forceinline__ int64_t TileVector(int64_t tile, int u) {
  return tile * kTileElements + (int64_t{u} * kThreads + threadIdx.x) * kVector;
}

// kVector floats at p: one 16-byte access where p is 16-byte aligned, else one per float.
__device__ __forceinline__ void Load4(const float* p, float v[kVector]) {
  if ((reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x;
    v[1] = x.y;
    v[2] = x.z;
    v[3] = x.w;
  } else {
#pragma unroll
    for (int e = 0; e < kVector; ++e) v[e] = p[e];
  }
}

__device__ __forceinline__ void Store4(float* p, const float v[kVector]) {
  if ((reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int e = 0; e < kVector; ++e) p[e] = v[e];
  }
}

// The tile kernels' launch bounds: kThreads threads, and at least
// MERGECOMP_TILE_MIN_BLOCKS blocks resident per multiprocessor (a cap on
// registers per thread; 1 leaves them to the compiler). Unroll 2 with 4
// blocks (at most 64 registers) was the fastest of the (unroll, blocks) pairs
// tried on an H200 (docs/gpu.md): occupancy pays more than deeper unrolling.
#ifndef MERGECOMP_TILE_MIN_BLOCKS
#define MERGECOMP_TILE_MIN_BLOCKS 4
#endif
#define MERGECOMP_TILE_KERNEL \
  __global__ void __launch_bounds__(::tf_mergecomp::gpu::kThreads, MERGECOMP_TILE_MIN_BLOCKS)

// Blocks of a reduction over tiles: at most kReduceBlocks.
inline int ReduceTileGridFor(int64_t n) {
  const int64_t tiles = TilesFor(n);
  return static_cast<int>(tiles < 1 ? 1 : (tiles > kReduceBlocks ? kReduceBlocks : tiles));
}

// The tiles of the calling block: a contiguous run of the TilesFor(n) tiles,
// the grid's blocks taking equal shares in order. A block so walks its
// elements forward (a segment cursor then steps to the next segment instead of
// searching), and its fixed start-up cost is paid once for many tiles.
struct TileRange {
  int64_t begin;
  int64_t end;
};
__device__ __forceinline__ TileRange TilesOfBlock(int64_t n) {
  const int64_t tiles = TilesFor(n);
  return TileRange{tiles * blockIdx.x / gridDim.x, tiles * (blockIdx.x + 1) / gridDim.x};
}

// Blocks the device holds at once (kThreads threads each; at least 1): the
// grid of a tile pass, which then loops over its share of the tiles.
inline int64_t ResidentBlocks() {
  static const int64_t blocks = [] {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        sms < 1) {
      cudaGetLastError();  // clears the failed query's error
      sms = 1;
    }
    return int64_t{sms} * (2048 / kThreads);
  }();
  return blocks;
}

// Kernels over a list of segments (a group's tensors, PowerSGD's matrices)
// laid end to end: segment s holds flat indices [offsets[s], offsets[s + 1]).
// The segment holding flat index i (i < offsets[count]): the last one starting
// at or before i (empty segments starting there come first and are skipped).
__device__ __forceinline__ int64_t SegmentAt(const int64_t* offsets, int64_t count, int64_t i) {
  int64_t lo = 0, hi = count;  // offsets[lo] <= i < offsets[hi]
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (offsets[mid] <= i) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The segment of a thread's current element; consecutive elements of a
// thread usually stay in one segment, so Seek rarely searches.
struct SegmentCursor {
  int64_t t = 0;
  int64_t begin = 0;
  int64_t end = 0;  // [begin, end): segment t in the flat space

  __device__ void Seek(const int64_t* offsets, int64_t count, int64_t i) {
    if (i >= begin && i < end) return;
    if (i >= end && t + 2 <= count && i < offsets[t + 2] && end > begin) {
      // The next segment (the common step of a forward walk).
      ++t;
      begin = end;
      end = offsets[t + 1];
      if (i >= begin) return;
    }
    t = SegmentAt(offsets, count, i);
    begin = offsets[t];
    end = offsets[t + 1];
  }
  __device__ int64_t size() const { return end - begin; }
};

struct SumOp {
  __device__ __forceinline__ double operator()(double a, double b) const { return a + b; }
};
struct MaxOp {  // NaN-free inputs (callers track NaN apart)
  __device__ __forceinline__ double operator()(double a, double b) const { return b > a ? b : a; }
};

// The one block reduction: combines `value` over the block (kThreads
// threads) in a fixed tree order, so results do not depend on timing; the
// result is returned to every thread. `shared` holds kThreads doubles.
template <typename Op>
__device__ __forceinline__ double BlockReduce(double value, double* shared, Op op) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + stride]);
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();
  return total;
}

__device__ __forceinline__ double BlockSum(double value, double* shared) {
  return BlockReduce(value, shared, SumOp());
}

// Sums field `field` of the first `count` partials (laid out
// [block][kReduceFields]) with one block; valid in thread 0.
__device__ __forceinline__ double SumPartials(const double* partials, int count, int field,
                                             double* shared) {
  double value = 0.0;
  for (int i = threadIdx.x; i < count; i += kThreads) value += partials[i * kReduceFields + field];
  return BlockSum(value, shared);
}

// Sign bits of elements [8 * byte, 8 * byte + 8) clipped to n.
__device__ __forceinline__ uint8_t SignByte(const float* x, int64_t n, int64_t byte) {
  uint32_t bits = 0;
  const int64_t base = byte * 8;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (base + j < n) bits |= uint32_t{IsNonNegative(x[base + j])} << j;
  }
  return static_cast<uint8_t>(bits);
}

// Writes the `bits`-bit codes of a warp's 32 * kVector consecutive elements
// (lane l holds codes[e] of element 32 * kVector * group + kVector * l + e;
// 0 past the end) into a little-endian bit stream of `stream_bytes` bytes:
// they are the stream's words [group * W, group * W + W), W = kVector * bits,
// each written once (a 32-bit store where `aligned` and whole, else its bytes
// inside the stream). `scratch`: this warp's 32 * kVector words of shared
// memory (bits <= 32). Every lane of the warp calls it.
__device__ __forceinline__ void WarpPackCodes(const uint32_t codes[kVector], int bits,
                                              int64_t group, uint8_t* stream,
                                              int64_t stream_bytes, bool aligned,
                                              uint32_t* scratch) {
  const int lane = threadIdx.x & 31;
  const int words = kVector * bits;
  for (int w = lane; w < words; w += 32) scratch[w] = 0;
  __syncwarp();
#pragma unroll
  for (int e = 0; e < kVector; ++e) {
    if (codes[e] == 0) continue;
    const int first_bit = (lane * kVector + e) * bits;
    const int shift = first_bit & 31;
    atomicOr(&scratch[first_bit >> 5], codes[e] << shift);
    if (shift + bits > 32) atomicOr(&scratch[(first_bit >> 5) + 1], codes[e] >> (32 - shift));
  }
  __syncwarp();
  for (int w = lane; w < words; w += 32) {
    const uint32_t word = scratch[w];
    const int64_t byte = (group * words + w) * 4;
    if (aligned && byte + 4 <= stream_bytes) {
      *reinterpret_cast<uint32_t*>(stream + byte) = word;
    } else {
      for (int k = 0; k < 4 && byte + k < stream_bytes; ++k) {
        stream[byte + k] = static_cast<uint8_t>(word >> (8 * k));
      }
    }
  }
  __syncwarp();
}

__device__ __forceinline__ bool BitAt(const uint8_t* bits, int64_t i) {
  return (bits[i >> 3] >> (i & 7)) & 1;
}

// Per-element arithmetic of the stochastic codecs, shared by the
// single-buffer and the group kernels: the CPU kernels' operations, each
// rounded once (no fused multiply-add).
__device__ __forceinline__ uint32_t QsgdCode(float v, float scale, float levels, SeedKey key,
                                             int64_t i) {
  const float rounded = floorf(
      __fadd_rn(__fmul_rn(fabsf(v), scale), RandomUniform(key, static_cast<uint32_t>(i))));
  // NaN (a NaN element, or 0 * inf) compares false: level 0.
  const float level = rounded >= 1.0f ? (rounded < levels ? rounded : levels) : 0.0f;
  return static_cast<uint32_t>(
      static_cast<int32_t>(IsNonNegative(v) ? __fadd_rn(levels, level) : __fsub_rn(levels, level)));
}

// levels / norm, or 0 for a zero or NaN norm.
__device__ __forceinline__ float QsgdScale(float norm, float levels) {
  return norm > 0.0f ? __fdiv_rn(levels, norm) : 0.0f;
}

// Code i of a little-endian stream of `bits`-bit codes.
__device__ __forceinline__ int32_t CodeAt(const uint8_t* codes, int64_t i, int bits) {
  const int64_t first_bit = i * bits;
  const uint8_t* byte = codes + (first_bit >> 3);
  const int shift = static_cast<int>(first_bit & 7);
  uint64_t window = 0;
  for (int k = 0; 8 * k < shift + bits; ++k) window |= static_cast<uint64_t>(byte[k]) << (8 * k);
  return static_cast<int32_t>((window >> shift) & ((uint64_t{1} << bits) - 1));
}

// TernGrad's 2-bit code: 0 = not sent, 1 = +1, 3 = -1. A zero or NaN max
// gives a NaN probability, which never sends.
__device__ __forceinline__ uint32_t TernaryCode(float v, float max_abs, SeedKey key, int64_t i) {
  const bool sent = RandomUniform(key, static_cast<uint32_t>(i)) < __fdiv_rn(fabsf(v), max_abs);
  return sent ? (IsNonNegative(v) ? 1u : 3u) : 0u;
}

__device__ __forceinline__ float TernaryValue(uint32_t code) {
  return (code & 1) ? ((code & 2) ? -1.0f : 1.0f) : 0.0f;
}

inline int ErrorCode() { return static_cast<int>(cudaGetLastError()); }

// Launches `kernel(args...)` on GridFor(work_items) blocks of kThreads threads
// on `stream` (a cudaStream_t) and returns ErrorCode(); returns 0 without
// launching when there is no work.
template <typename... Params, typename... Args>
inline int LaunchOver(int64_t work_items, void* stream, void (*kernel)(Params...),
                      Args... args) {
  if (work_items == 0) return 0;
  kernel<<<GridFor(work_items), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args...);
  return ErrorCode();
}

// Launches `kernel(args...)` over the tiles of [0, n) (each block loops over
// TilesOfBlock(n)); returns 0 without launching when n == 0.
template <typename... Params, typename... Args>
inline int LaunchTiles(int64_t n, void* stream, void (*kernel)(Params...), Args... args) {
  if (n == 0) return 0;
  const int64_t tiles = TilesFor(n);
  const int64_t blocks = tiles < ResidentBlocks() ? tiles : ResidentBlocks();
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      args...);
  return ErrorCode();
}

// Encoders of a sign-bit payload with a reduced header: `pack(input, n,
// payload, partials)` runs one thread per payload byte on ReduceGridFor
// blocks, writing the bits and one partial per block to `scratch`; then one
// block runs `header(partials, blocks, n, payload)`.
inline int LaunchPackThenHeader(void (*pack)(const float*, int64_t, uint8_t*, double*),
                                void (*header)(const double*, int, int64_t, uint8_t*),
                                const float* input, int64_t n, uint8_t* payload, void* scratch,
                                void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  double* partials = static_cast<double*>(scratch);
  const int grid = ReduceGridFor((n + 7) / 8);
  pack<<<grid, kThreads, 0, s>>>(input, n, payload, partials);
  header<<<1, kThreads, 0, s>>>(partials, grid, n, payload);
  return ErrorCode();
}

}  // namespace gpu
}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_DENSE_GPU_H_
