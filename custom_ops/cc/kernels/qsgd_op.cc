// QSGD CPU kernels. Encoding takes two passes over the input: the norm (sum
// of squares in double, per block, blocks combined in order), then the
// stochastic levels. Codes of 8 bits (levels 64..127, the default 64) are
// stored as bytes directly; other widths go through a bit packer.
#include "cc/kernels/qsgd_op.h"

#include <cmath>
#include <vector>

#include "cc/kernels/dense_cpu.h"
#include "cc/kernels/dense_register.h"

namespace tf_mergecomp {
namespace {

// Elements per code chunk (a multiple of 8: a chunk of b-bit codes fills
// whole bytes).
constexpr int64_t kChunk = 256;

double SumSquaresScalar(const float* x, int64_t count) {
  double sum = 0.0;
  for (int64_t i = 0; i < count; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return sum;
}

#if MERGECOMP_X86
MERGECOMP_AVX2 double SumSquaresAvx2(const float* x, int64_t count) {
  __m256d sum_lo = _mm256_setzero_pd(), sum_hi = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    // Squares of float32 values are exact in double: no rounding before the sum.
    sum_lo = _mm256_add_pd(sum_lo, _mm256_mul_pd(lo, lo));
    sum_hi = _mm256_add_pd(sum_hi, _mm256_mul_pd(hi, hi));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(sum_lo, sum_hi));
  double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  if (i < count) sum += SumSquaresScalar(x + i, count - i);
  return sum;
}
#endif

// codes[i] = sign * level + s for elements first .. first + count - 1.
// Float arithmetic step by step (one rounding per operation, no fused
// multiply-add) so the plain-TF reference reproduces it exactly.
template <typename Code>
__attribute__((target_clones("avx2", "default"))) void QsgdCodes(
    const float* x, int64_t first, int64_t count, float scale, float levels, SeedKey key,
    Code* codes) {
  for (int64_t i = 0; i < count; ++i) {
    const float v = x[i];
    const float scaled = std::fabs(v) * scale;
    const float rounded =
        std::floor(scaled + RandomUniform(key, static_cast<uint32_t>(first + i)));
    // NaN (a NaN element, or 0 * inf) compares false: level 0.
    const float level = rounded >= 1.0f ? (rounded < levels ? rounded : levels) : 0.0f;
    codes[i] = static_cast<Code>(static_cast<int32_t>(IsNonNegative(v) ? levels + level
                                                                       : levels - level));
  }
}

#if MERGECOMP_X86
// Eight codes, as QsgdCodes computes them (same roundings; min/and reproduce
// its NaN handling: a NaN `rounded` fails the >= 1 test and gives level 0).
MERGECOMP_AVX2 inline __m256i QsgdCodes8(const float* x, int64_t first, __m256 scale,
                                         __m256 levels, SeedKey key) {
  const __m256 v = _mm256_loadu_ps(x);
  const __m256 magnitude = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  const __m256 rounded = _mm256_floor_ps(_mm256_add_ps(
      _mm256_mul_ps(magnitude, scale), RandomUniform8(key, static_cast<uint32_t>(first))));
  const __m256 level = _mm256_and_ps(_mm256_cmp_ps(rounded, _mm256_set1_ps(1.0f), _CMP_GE_OQ),
                                     _mm256_min_ps(rounded, levels));
  const __m256 plus = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_NLT_UQ);
  return _mm256_cvttps_epi32(
      _mm256_blendv_ps(_mm256_sub_ps(levels, level), _mm256_add_ps(levels, level), plus));
}

// 8-bit codes, 32 per iteration; the tail goes through the scalar loop.
MERGECOMP_AVX2 void QsgdByteCodesAvx2(const float* x, int64_t first, int64_t count, float scale,
                                      float levels, SeedKey key, uint8_t* codes) {
  const __m256 scale8 = _mm256_set1_ps(scale);
  const __m256 levels8 = _mm256_set1_ps(levels);
  // packs interleave the 128-bit lanes; this puts the dwords back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i = 0;
  for (; i + 32 <= count; i += 32) {
    const __m256i c0 = QsgdCodes8(x + i, first + i, scale8, levels8, key);
    const __m256i c1 = QsgdCodes8(x + i + 8, first + i + 8, scale8, levels8, key);
    const __m256i c2 = QsgdCodes8(x + i + 16, first + i + 16, scale8, levels8, key);
    const __m256i c3 = QsgdCodes8(x + i + 24, first + i + 24, scale8, levels8, key);
    const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1),
                                              _mm256_packus_epi32(c2, c3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i),
                        _mm256_permutevar8x32_epi32(bytes, order));
  }
  if (i < count) QsgdCodes<uint8_t>(x + i, first + i, count - i, scale, levels, key, codes + i);
}

MERGECOMP_AVX2 void QsgdWideCodesAvx2(const float* x, int64_t first, int64_t count, float scale,
                                      float levels, SeedKey key, uint32_t* codes) {
  const __m256 scale8 = _mm256_set1_ps(scale);
  const __m256 levels8 = _mm256_set1_ps(levels);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i),
                        QsgdCodes8(x + i, first + i, scale8, levels8, key));
  }
  if (i < count) QsgdCodes<uint32_t>(x + i, first + i, count - i, scale, levels, key, codes + i);
}
#endif

void PackCodes(const uint32_t* codes, int64_t count, int bits, uint8_t* out) {
  uint64_t pending = 0;
  int filled = 0;
  for (int64_t i = 0; i < count; ++i) {
    pending |= static_cast<uint64_t>(codes[i]) << filled;
    filled += bits;
    while (filled >= 8) {
      *out++ = static_cast<uint8_t>(pending);
      pending >>= 8;
      filled -= 8;
    }
  }
  if (filled > 0) *out = static_cast<uint8_t>(pending);
}

void UnpackCodes(const uint8_t* in, int64_t count, int bits, uint32_t* codes) {
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  uint64_t pending = 0;
  int filled = 0;
  for (int64_t i = 0; i < count; ++i) {
    while (filled < bits) {
      pending |= static_cast<uint64_t>(*in++) << filled;
      filled += 8;
    }
    codes[i] = static_cast<uint32_t>(pending & mask);
    pending >>= bits;
    filled -= bits;
  }
}

template <typename Code>
__attribute__((target_clones("avx2", "default"))) void AccumulateLevels(
    const Code* codes, int64_t count, int32_t levels, float unit, bool first, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const float v = static_cast<float>(static_cast<int32_t>(codes[i]) - levels) * unit;
    out[i] = first ? v : out[i] + v;
  }
}

}  // namespace

void QsgdEncodeBlocks(tensorflow::OpKernelContext* context, const BlockInput& input, int64_t n,
                      int64_t seed, int64_t levels, uint8_t* payload) {
  const bool avx2 = CpuHasAvx2();
  const int64_t num_blocks = NumBlocks(n);
  const auto sum_squares_of = MERGECOMP_AVX2_OR_SCALAR(SumSquaresAvx2, SumSquaresScalar);
  const std::vector<double> partial = ReduceBlocks<double>(
      context, n, kBlockElements,
      [&](int64_t begin, int64_t count) { return sum_squares_of(input.Block(begin, count), count); });
  double sum_squares = 0.0;
  for (double p : partial) sum_squares += p;
  const float norm = static_cast<float>(std::sqrt(sum_squares));
  StoreFloat(payload, norm);

  const float levels_f = static_cast<float>(levels);
  // A zero or NaN norm sends level 0 everywhere; an infinite one gives scale 0.
  const float scale = norm > 0.0f ? levels_f / norm : 0.0f;
  const SeedKey key = MakeSeedKey(seed);
  const int bits = QsgdCodeBits(levels);
  uint8_t* codes_out = payload + kQsgdHeaderBytes;
  ForEachBlockBackward(context, num_blocks, 40 * kBlockElements, [&](int64_t block) {
    const int64_t begin = block * kBlockElements;
    const int64_t end = std::min(begin + kBlockElements, n);
    const float* block_input = input.Block(begin, end - begin);
    if (bits == 8) {
#if MERGECOMP_X86
      if (avx2) {
        QsgdByteCodesAvx2(block_input, begin, end - begin, scale, levels_f, key,
                          codes_out + begin);
        return;
      }
#endif
      QsgdCodes<uint8_t>(block_input, begin, end - begin, scale, levels_f, key,
                         codes_out + begin);
      return;
    }
    uint32_t codes[kChunk];
    for (int64_t first = begin; first < end; first += kChunk) {
      const int64_t count = std::min(kChunk, end - first);
#if MERGECOMP_X86
      if (avx2) {
        QsgdWideCodesAvx2(block_input + (first - begin), first, count, scale, levels_f, key, codes);
      } else {
        QsgdCodes<uint32_t>(block_input + (first - begin), first, count, scale, levels_f, key,
                            codes);
      }
#else
      QsgdCodes<uint32_t>(block_input + (first - begin), first, count, scale, levels_f, key, codes);
#endif
      PackCodes(codes, count, bits, codes_out + first * bits / 8);
    }
  });
}

void QsgdDecodeBlocks(tensorflow::OpKernelContext* context, const uint8_t* payload,
                      int64_t world_size, int64_t n, int64_t levels, const BlockOutput& output) {
  const int64_t row_bytes = QsgdPayloadBytes(n, levels);
  const int bits = QsgdCodeBits(levels);
  const float levels_f = static_cast<float>(levels);
  std::vector<float> unit(world_size);
  for (int64_t w = 0; w < world_size; ++w) unit[w] = LoadFloat(payload + w * row_bytes) / levels_f;
  const float divisor = static_cast<float>(world_size);
  ForEachOutputBlock(context, output, NumBlocks(n), 4 * world_size * kBlockElements,
                     [&](int64_t block) {
    const int64_t begin = block * kBlockElements;
    const int64_t end = std::min(begin + kBlockElements, n);
    float* block_output = output.Begin(begin, end - begin);
    for (int64_t w = 0; w < world_size; ++w) {
      const uint8_t* codes_in = payload + w * row_bytes + kQsgdHeaderBytes;
      if (bits == 8) {
        AccumulateLevels<uint8_t>(codes_in + begin, end - begin, static_cast<int32_t>(levels),
                                  unit[w], w == 0, block_output);
        continue;
      }
      uint32_t codes[kChunk];
      for (int64_t first = begin; first < end; first += kChunk) {
        const int64_t count = std::min(kChunk, end - first);
        UnpackCodes(codes_in + first * bits / 8, count, bits, codes);
        AccumulateLevels<uint32_t>(codes, count, static_cast<int32_t>(levels), unit[w], w == 0,
                                   block_output + (first - begin));
      }
    }
    for (int64_t i = 0; i < end - begin; ++i) block_output[i] = block_output[i] / divisor;
    output.Commit(begin, end - begin, block_output);
  });
}

MERGECOMP_REGISTER_DENSE_GROUP_CODEC(Qsgd, "qsgd");

}  // namespace tf_mergecomp
