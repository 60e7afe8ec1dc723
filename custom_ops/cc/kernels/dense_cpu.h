// CPU building blocks of the dense codecs: block sharding over TensorFlow's
// intra-op pool, an AVX2 path chosen at run time (the library is built
// without -mavx2 so it loads on any x86-64), and the decoder shared by every
// codec whose elements take one of two per-worker values.
#ifndef TF_MERGECOMP_DENSE_CPU_H_
#define TF_MERGECOMP_DENSE_CPU_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "cc/kernels/dense_bits.h"
#include "tensorflow/core/framework/op_kernel.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define MERGECOMP_X86 1
#define MERGECOMP_AVX2 __attribute__((target("avx2")))
// The AVX2 variant of a function where the CPU has AVX2, else the scalar one
// (the AVX2 name is not evaluated off x86).
#define MERGECOMP_AVX2_OR_SCALAR(avx2_fn, scalar_fn) (CpuHasAvx2() ? &avx2_fn : &scalar_fn)
#else
#define MERGECOMP_AVX2_OR_SCALAR(avx2_fn, scalar_fn) (&scalar_fn)
#endif

namespace tf_mergecomp {

// Elements per unit of parallel work. A multiple of 8, so a block's sign
// bits, 2-bit and k-bit codes all start and end on byte boundaries and
// threads never share a byte. Reductions keep one partial per block and
// combine them in block order, so results do not depend on the thread count.
constexpr int64_t kBlockElements = int64_t{1} << 15;

inline int64_t NumBlocks(int64_t n) { return CeilDiv(n, kBlockElements); }

inline bool CpuHasAvx2() {
#if MERGECOMP_X86
  static const bool has_avx2 = __builtin_cpu_supports("avx2");
  return has_avx2;
#else
  return false;
#endif
}

// Calls fn(block) for every block in [0, num_blocks), sharded over the
// intra-op thread pool. cost_per_block is in the pool's units (~cycles).
// backward: the blocks are walked from the last to the first (each shard too),
// for the second pass of a two-pass encode (after a reduction over the whole
// group: QSGD's norm, TernGrad's max, the scale that the error-feedback update
// needs), so that it starts with the blocks the first pass left in cache
// instead of the ones it evicted first. fn must not depend on the order
// (element-wise work on its own block); results are the same either way.
inline void ForEachBlock(tensorflow::OpKernelContext* context, int64_t num_blocks,
                         int64_t cost_per_block, const std::function<void(int64_t)>& fn,
                         bool backward = false) {
  if (num_blocks <= 0) return;
  if (num_blocks == 1) {
    fn(0);
    return;
  }
  auto* pool = context->device()->tensorflow_cpu_worker_threads()->workers;
  pool->ParallelFor(num_blocks, cost_per_block,
                    [&fn, num_blocks, backward](int64_t begin, int64_t end) {
    for (int64_t shard = begin; shard < end; ++shard) {
      fn(backward ? num_blocks - 1 - (begin + end - 1 - shard) : shard);
    }
  });
}

inline void ForEachBlockBackward(tensorflow::OpKernelContext* context, int64_t num_blocks,
                                 int64_t cost_per_block, const std::function<void(int64_t)>& fn) {
  ForEachBlock(context, num_blocks, cost_per_block, fn, /*backward=*/true);
}

// Calls reduce(begin, count) for every block [begin, begin + count) of
// [0, n), sharded as ForEachBlock does, and returns the per-block results in
// block order (for the caller to combine in that order).
template <typename T, typename Reduce>
std::vector<T> ReduceBlocks(tensorflow::OpKernelContext* context, int64_t n,
                            int64_t cost_per_block, const Reduce& reduce) {
  std::vector<T> partial(NumBlocks(n));
  ForEachBlock(context, NumBlocks(n), cost_per_block, [&](int64_t block) {
    const int64_t begin = block * kBlockElements;
    partial[block] = reduce(begin, std::min(kBlockElements, n - begin));
  });
  return partial;
}

// The codecs' CPU kernels read their float32 input and write their float32
// output block by block ([begin, begin + count) with begin a multiple of
// kBlockElements), so that a merged group's tensors need not be
// concatenated first: a block inside one tensor is read or written in place,
// one that spans tensors goes through a per-thread buffer that stays in cache.
class BlockInput {
 public:
  virtual ~BlockInput() = default;
  // The values [begin, begin + count), valid until this thread's next Block().
  virtual const float* Block(int64_t begin, int64_t count) const = 0;
  // All n values in one array when the input is one, else nullptr.
  virtual const float* Contiguous() const { return nullptr; }
};

class GroupTensorsOutput;

class BlockOutput {
 public:
  virtual ~BlockOutput() = default;
  // The output as a group's per-tensor arrays (group_op.h), or nullptr.
  virtual const GroupTensorsOutput* AsGroupTensors() const { return nullptr; }
  // Where to write the values [begin, begin + count).
  virtual float* Begin(int64_t begin, int64_t count) const = 0;
  // Called once those values are written.
  virtual void Commit(int64_t /*begin*/, int64_t /*count*/, float* /*written*/) const {}
  // All n values in one array when the output is one, else nullptr.
  virtual float* Contiguous() const { return nullptr; }
  // True when the output is the second pass over data the encode just read
  // (the error-feedback update): decoders then walk the blocks backward
  // (ForEachBlockBackward).
  virtual bool SecondPass() const { return false; }
};

// ForEachBlock, or ForEachBlockBackward for an output that is a second pass.
inline void ForEachOutputBlock(tensorflow::OpKernelContext* context, const BlockOutput& output,
                               int64_t num_blocks, int64_t cost_per_block,
                               const std::function<void(int64_t)>& fn) {
  if (output.SecondPass()) return ForEachBlockBackward(context, num_blocks, cost_per_block, fn);
  ForEachBlock(context, num_blocks, cost_per_block, fn);
}

class ContiguousInput : public BlockInput {
 public:
  explicit ContiguousInput(const float* data) : data_(data) {}
  const float* Block(int64_t begin, int64_t) const override { return data_ + begin; }
  const float* Contiguous() const override { return data_; }

 private:
  const float* data_;
};

class ContiguousOutput : public BlockOutput {
 public:
  explicit ContiguousOutput(float* data) : data_(data) {}
  float* Begin(int64_t begin, int64_t) const override { return data_ + begin; }
  float* Contiguous() const override { return data_; }

 private:
  float* data_;
};

// A per-thread buffer of kBlockElements floats: slot 0 for inputs, 1 for
// outputs (an output may read an input block while it holds its own).
float* ThreadBlockBuffer(int slot);

// Packs IsNonNegative(x[i]) for i in [0, count) into ceil(count / 8) bytes.
inline void PackSignBitsScalar(const float* x, int64_t count, uint8_t* out) {
  for (int64_t byte = 0; byte * 8 < count; ++byte) {
    const int64_t base = byte * 8;
    const int64_t in_byte = count - base < 8 ? count - base : 8;
    uint32_t bits = 0;
    for (int64_t j = 0; j < in_byte; ++j) bits |= uint32_t{IsNonNegative(x[base + j])} << j;
    out[byte] = static_cast<uint8_t>(bits);
  }
}

#if MERGECOMP_X86
// Bit j set when !(x[j] < 0): the unordered "not less than" compare is true
// for NaN, matching IsNonNegative.
MERGECOMP_AVX2 inline uint32_t NonNegativeMask8(__m256 v) {
  return static_cast<uint32_t>(
      _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_NLT_UQ)));
}

MERGECOMP_AVX2 inline void PackSignBitsAvx2(const float* x, int64_t count, uint8_t* out) {
  int64_t i = 0;
  for (; i + 32 <= count; i += 32) {
    const uint32_t word = NonNegativeMask8(_mm256_loadu_ps(x + i)) |
                          NonNegativeMask8(_mm256_loadu_ps(x + i + 8)) << 8 |
                          NonNegativeMask8(_mm256_loadu_ps(x + i + 16)) << 16 |
                          NonNegativeMask8(_mm256_loadu_ps(x + i + 24)) << 24;
    memcpy(out + i / 8, &word, sizeof(word));
  }
  for (; i + 8 <= count; i += 8) out[i / 8] = NonNegativeMask8(_mm256_loadu_ps(x + i));
  if (i < count) PackSignBitsScalar(x + i, count - i, out + i / 8);
}

// Eight lanes: lane j is hi where bit j of byte is set, else lo.
MERGECOMP_AVX2 inline __m256 SelectByBits8(uint32_t byte, __m256 hi, __m256 lo) {
  const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i set = _mm256_cmpeq_epi32(
      _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(byte)), lane_bits), lane_bits);
  return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(set));
}

// random.h's RandomUniform for the eight indices first .. first + 7, with the
// same 32-bit integer arithmetic, so it returns the scalar function's values.
MERGECOMP_AVX2 inline __m256i Mix32x8(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bu)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

MERGECOMP_AVX2 inline __m256 RandomUniform8(SeedKey key, uint32_t first) {
  const __m256i index = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first)),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i bits = Mix32x8(_mm256_xor_si256(index, _mm256_set1_epi32(static_cast<int>(key.lo))));
  bits = Mix32x8(_mm256_add_epi32(bits, _mm256_set1_epi32(static_cast<int>(key.hi))));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(bits, 8)),
                       _mm256_set1_ps(1.0f / 16777216.0f));
}
#endif

inline void PackSignBits(const float* x, int64_t count, uint8_t* out) {
#if MERGECOMP_X86
  if (CpuHasAvx2()) return PackSignBitsAvx2(x, count, out);
#endif
  PackSignBitsScalar(x, count, out);
}

enum class TwoLevelCombine { kMean, kMajority };

// Decodes W payload rows of `row_bytes` bytes whose sign bits start at
// `bits_offset`: worker w's element i is hi[w] if its bit is set, else lo[w].
// The W values are summed in worker order, then divided by W (kMean) or
// mapped to +1 if the sum is >= 0, else -1 (kMajority; ties go to +1).
// The plain-TF references sum in the same order, so results match exactly.
void DecodeTwoLevel(tensorflow::OpKernelContext* context, const uint8_t* payload,
                    int64_t world_size, int64_t row_bytes, int64_t bits_offset,
                    const float* hi, const float* lo, int64_t n, TwoLevelCombine combine,
                    const BlockOutput& out);

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_DENSE_CPU_H_
