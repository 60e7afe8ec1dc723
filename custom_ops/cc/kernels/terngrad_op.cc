// TernGrad CPU kernels. Encoding takes two passes: max |x| (per block, NaN
// tracked separately because max() would drop it), then the Bernoulli draws.
#include "cc/kernels/terngrad_op.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "cc/kernels/dense_cpu.h"
#include "cc/kernels/dense_register.h"

namespace tf_mergecomp {
namespace {

constexpr int64_t kChunk = 256;  // elements per code chunk (a multiple of 4)

struct MaxAbs {
  float value = 0.0f;
  bool has_nan = false;
};

MaxAbs MaxAbsScalar(const float* x, int64_t count) {
  MaxAbs result;
  for (int64_t i = 0; i < count; ++i) {
    const float a = std::fabs(x[i]);
    result.has_nan |= a != a;
    result.value = a > result.value ? a : result.value;
  }
  return result;
}

#if MERGECOMP_X86
MERGECOMP_AVX2 MaxAbs MaxAbsAvx2(const float* x, int64_t count) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 max8 = _mm256_setzero_ps();
  __m256 nan8 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    nan8 = _mm256_or_ps(nan8, is_nan);
    max8 = _mm256_max_ps(max8, _mm256_andnot_ps(is_nan, _mm256_and_ps(v, abs_mask)));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, max8);
  MaxAbs result = MaxAbsScalar(x + i, count - i);
  for (float lane : lanes) result.value = lane > result.value ? lane : result.value;
  result.has_nan |= _mm256_movemask_ps(nan8) != 0;
  return result;
}
#endif

// 2-bit codes: 0 = not sent, 1 = +1, 3 = -1.
__attribute__((target_clones("avx2", "default"))) void TernaryCodes(
    const float* x, int64_t first, int64_t count, float max_abs, SeedKey key, uint8_t* codes) {
  for (int64_t i = 0; i < count; ++i) {
    const float v = x[i];
    // A zero or NaN max gives a NaN probability, which never sends.
    const bool sent =
        RandomUniform(key, static_cast<uint32_t>(first + i)) < std::fabs(v) / max_abs;
    codes[i] = sent ? (IsNonNegative(v) ? 1 : 3) : 0;
  }
}

#if MERGECOMP_X86
// Bit j of the index moved to bit 2j: interleaves the "sent" and "negative"
// masks of 8 elements into their 16 bits of 2-bit codes.
struct SpreadTable {
  uint16_t bits[256];
  SpreadTable() {
    for (uint32_t byte = 0; byte < 256; ++byte) {
      uint32_t spread = 0;
      for (int j = 0; j < 8; ++j) spread |= ((byte >> j) & 1u) << (2 * j);
      bits[byte] = static_cast<uint16_t>(spread);
    }
  }
};

// Codes of elements [first, first + count), first a multiple of 8, written
// from byte first / 4 of `packed`; the tail (count % 8) is left to the caller.
MERGECOMP_AVX2 int64_t TernaryCodesAvx2(const float* x, int64_t first, int64_t count,
                                        float max_abs, SeedKey key, uint8_t* packed) {
  static const SpreadTable spread;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 max8 = _mm256_set1_ps(max_abs);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 probability = _mm256_div_ps(_mm256_and_ps(v, abs_mask), max8);
    const __m256 sent = _mm256_cmp_ps(
        RandomUniform8(key, static_cast<uint32_t>(first + i)), probability, _CMP_LT_OQ);
    const __m256 negative = _mm256_andnot_ps(
        _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_NLT_UQ), sent);
    const uint16_t codes = static_cast<uint16_t>(
        spread.bits[_mm256_movemask_ps(sent)] | spread.bits[_mm256_movemask_ps(negative)] << 1);
    memcpy(packed + (first + i) / 4, &codes, sizeof(codes));
  }
  return i;
}
#endif

}  // namespace

void TerngradEncodeBlocks(tensorflow::OpKernelContext* context, const BlockInput& input,
                          int64_t n, int64_t seed, int64_t, uint8_t* payload) {
  const bool avx2 = CpuHasAvx2();
  const int64_t num_blocks = NumBlocks(n);
  const auto max_abs_of = MERGECOMP_AVX2_OR_SCALAR(MaxAbsAvx2, MaxAbsScalar);
  const std::vector<MaxAbs> partial = ReduceBlocks<MaxAbs>(
      context, n, kBlockElements,
      [&](int64_t begin, int64_t count) { return max_abs_of(input.Block(begin, count), count); });
  MaxAbs total;
  for (const MaxAbs& p : partial) {
    total.has_nan |= p.has_nan;
    total.value = p.value > total.value ? p.value : total.value;
  }
  const float max_abs = total.has_nan ? std::numeric_limits<float>::quiet_NaN() : total.value;
  StoreFloat(payload, max_abs);

  const SeedKey key = MakeSeedKey(seed);
  uint8_t* packed = payload + kTerngradHeaderBytes;
  ForEachBlockBackward(context, num_blocks, 40 * kBlockElements, [&](int64_t block) {
    const int64_t begin = block * kBlockElements;
    const int64_t end = std::min(begin + kBlockElements, n);
    const float* block_input = input.Block(begin, end - begin);
    int64_t done = 0;
#if MERGECOMP_X86
    if (avx2) done = TernaryCodesAvx2(block_input, begin, end - begin, max_abs, key, packed);
#endif
    uint8_t codes[kChunk];
    for (int64_t first = begin + done; first < end; first += kChunk) {
      const int64_t count = std::min(kChunk, end - first);
      TernaryCodes(block_input + (first - begin), first, count, max_abs, key, codes);
      for (int64_t i = count; i < CeilDiv(count, 4) * 4; ++i) codes[i] = 0;
      uint8_t* out = packed + first / 4;
      for (int64_t k = 0; k < CeilDiv(count, 4); ++k) {
        out[k] = static_cast<uint8_t>(codes[4 * k] | codes[4 * k + 1] << 2 |
                                      codes[4 * k + 2] << 4 | codes[4 * k + 3] << 6);
      }
    }
  });
}

// The four decoded values of every code byte of one worker (m * {0, +1, 0,
// -1} per 2-bit code, the products the plain-TF reference rounds),
// so a byte decodes with one 16-byte load instead of four bit extractions.
struct TernaryByteTable {
  explicit TernaryByteTable(float max_abs) {
    for (int c = 0; c < 4; ++c) {
      const float t = (c & 1) ? ((c & 2) ? -1.0f : 1.0f) : 0.0f;
      code[c] = max_abs * t;
    }
    for (int byte = 0; byte < 256; ++byte) {
      for (int j = 0; j < 4; ++j) values[byte][j] = code[(byte >> (2 * j)) & 3];
    }
  }
  float code[4];
  alignas(16) float values[256][4];
};

void TerngradDecodeBlocks(tensorflow::OpKernelContext* context, const uint8_t* payload,
                          int64_t world_size, int64_t n, int64_t, const BlockOutput& output) {
  const int64_t row_bytes = TerngradPayloadBytes(n, 0);
  const float divisor = static_cast<float>(world_size);
  std::vector<std::unique_ptr<TernaryByteTable>> tables;
  for (int64_t w = 0; w < world_size; ++w) {
    tables.emplace_back(new TernaryByteTable(LoadFloat(payload + w * row_bytes)));
  }
  ForEachOutputBlock(context, output, NumBlocks(n), 2 * world_size * kBlockElements,
                     [&](int64_t block) {
    const int64_t begin = block * kBlockElements;  // a multiple of 4: whole code bytes
    const int64_t end = std::min(begin + kBlockElements, n);
    float* block_output = output.Begin(begin, end - begin);
    for (int64_t w = 0; w < world_size; ++w) {
      const TernaryByteTable& table = *tables[w];
      const uint8_t* packed = payload + w * row_bytes + kTerngradHeaderBytes;
      int64_t e = begin;
      if (w == 0) {
        for (; e + 4 <= end; e += 4) {
          memcpy(block_output + (e - begin), table.values[packed[e >> 2]], 4 * sizeof(float));
        }
      } else {
        for (; e + 4 <= end; e += 4) {
          float* out = block_output + (e - begin);
          const float* v = table.values[packed[e >> 2]];
          for (int j = 0; j < 4; ++j) out[j] = out[j] + v[j];
        }
      }
      for (; e < end; ++e) {
        const float v = table.code[(packed[e >> 2] >> (2 * (e & 3))) & 3];
        block_output[e - begin] = w == 0 ? v : block_output[e - begin] + v;
      }
    }
    if (world_size > 1) {
      for (int64_t i = 0; i < end - begin; ++i) block_output[i] = block_output[i] / divisor;
    }
    output.Commit(begin, end - begin, block_output);
  });
}

MERGECOMP_REGISTER_DENSE_GROUP_CODEC(Terngrad, "terngrad");

}  // namespace tf_mergecomp
