// The shared two-level decoder of the sign codecs (see dense_cpu.h).
#include "cc/kernels/dense_cpu.h"

#include <memory>

namespace tf_mergecomp {
namespace {

// Adds (or, for the first worker, stores) one worker's decoded values for
// elements [begin, begin + count), begin a multiple of 8.
void AccumulateRowScalar(const uint8_t* bits, int64_t begin, int64_t count, float hi, float lo,
                         bool first, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t e = begin + i;
    const float v = ((bits[e >> 3] >> (e & 7)) & 1) ? hi : lo;
    out[i] = first ? v : out[i] + v;
  }
}

#if MERGECOMP_X86
MERGECOMP_AVX2 void AccumulateRowAvx2(const uint8_t* bits, int64_t begin, int64_t count,
                                      float hi, float lo, bool first, float* out) {
  const __m256 hi8 = _mm256_set1_ps(hi);
  const __m256 lo8 = _mm256_set1_ps(lo);
  const uint8_t* byte = bits + begin / 8;
  int64_t i = 0;
  if (first) {
    for (; i + 8 <= count; i += 8) _mm256_storeu_ps(out + i, SelectByBits8(byte[i / 8], hi8, lo8));
  } else {
    for (; i + 8 <= count; i += 8) {
      _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i),
                                              SelectByBits8(byte[i / 8], hi8, lo8)));
    }
  }
  if (i < count) AccumulateRowScalar(bits, begin + i, count - i, hi, lo, first, out + i);
}
#endif

}  // namespace

float* ThreadBlockBuffer(int slot) {
  thread_local std::unique_ptr<float[]> buffers[2];
  if (!buffers[slot]) buffers[slot].reset(new float[kBlockElements]);
  return buffers[slot].get();
}

void DecodeTwoLevel(tensorflow::OpKernelContext* context, const uint8_t* payload,
                    int64_t world_size, int64_t row_bytes, int64_t bits_offset,
                    const float* hi, const float* lo, int64_t n, TwoLevelCombine combine,
                    const BlockOutput& out) {
  const bool avx2 = CpuHasAvx2();
  const float divisor = static_cast<float>(world_size);
  ForEachOutputBlock(context, out, NumBlocks(n), kBlockElements * (2 * world_size + 2),
                     [&](int64_t block) {
    const int64_t begin = block * kBlockElements;
    const int64_t count = std::min(kBlockElements, n - begin);
    float* dst = out.Begin(begin, count);
    for (int64_t w = 0; w < world_size; ++w) {
      const uint8_t* bits = payload + w * row_bytes + bits_offset;
#if MERGECOMP_X86
      if (avx2) {
        AccumulateRowAvx2(bits, begin, count, hi[w], lo[w], w == 0, dst);
        continue;
      }
#endif
      AccumulateRowScalar(bits, begin, count, hi[w], lo[w], w == 0, dst);
    }
    if (combine == TwoLevelCombine::kMean) {
      for (int64_t i = 0; i < count; ++i) dst[i] = dst[i] / divisor;
    } else {
      for (int64_t i = 0; i < count; ++i) dst[i] = dst[i] >= 0.0f ? 1.0f : -1.0f;
    }
    out.Commit(begin, count, dst);
  });
  (void)avx2;
}

}  // namespace tf_mergecomp
