// EF-SignSGD CPU kernels: one pass packs the sign bits and sums |x| (in
// double, per block, blocks combined in order).
#include "cc/kernels/efsignsgd_op.h"

#include <cmath>
#include <vector>

#include "cc/kernels/dense_cpu.h"
#include "cc/kernels/dense_register.h"

namespace tf_mergecomp {
namespace {

double PackAndSumAbsScalar(const float* x, int64_t count, uint8_t* bits) {
  PackSignBitsScalar(x, count, bits);
  double sum = 0.0;
  for (int64_t i = 0; i < count; ++i) sum += std::fabs(static_cast<double>(x[i]));
  return sum;
}

#if MERGECOMP_X86
MERGECOMP_AVX2 double PackAndSumAbsAvx2(const float* x, int64_t count, uint8_t* bits) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256d sum_lo = _mm256_setzero_pd(), sum_hi = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    bits[i / 8] = static_cast<uint8_t>(NonNegativeMask8(v));
    const __m256 a = _mm256_and_ps(v, abs_mask);
    sum_lo = _mm256_add_pd(sum_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(a)));
    sum_hi = _mm256_add_pd(sum_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(sum_lo, sum_hi));
  double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  if (i < count) sum += PackAndSumAbsScalar(x + i, count - i, bits + i / 8);
  return sum;
}
#endif

}  // namespace

void EfsignsgdEncodeBlocks(tensorflow::OpKernelContext* context, const BlockInput& input,
                           int64_t n, int64_t, int64_t, uint8_t* payload) {
  const auto pack = MERGECOMP_AVX2_OR_SCALAR(PackAndSumAbsAvx2, PackAndSumAbsScalar);
  uint8_t* bits = payload + kEfsignsgdHeaderBytes;
  const std::vector<double> partial = ReduceBlocks<double>(
      context, n, 2 * kBlockElements,
      [&](int64_t begin, int64_t count) { return pack(input.Block(begin, count), count, bits + begin / 8); });
  double sum = 0.0;
  for (double p : partial) sum += p;
  StoreFloat(payload, n > 0 ? static_cast<float>(sum / static_cast<double>(n)) : 0.0f);
}

void EfsignsgdDecodeBlocks(tensorflow::OpKernelContext* context, const uint8_t* payload,
                           int64_t world_size, int64_t n, int64_t, const BlockOutput& output) {
  const int64_t row_bytes = EfsignsgdPayloadBytes(n, 0);
  std::vector<float> plus(world_size), minus(world_size);
  for (int64_t w = 0; w < world_size; ++w) {
    plus[w] = LoadFloat(payload + w * row_bytes);
    minus[w] = -plus[w];
  }
  DecodeTwoLevel(context, payload, world_size, row_bytes, kEfsignsgdHeaderBytes, plus.data(),
                 minus.data(), n, TwoLevelCombine::kMean, output);
}

MERGECOMP_REGISTER_DENSE_GROUP_CODEC(Efsignsgd, "efsignsgd");

}  // namespace tf_mergecomp
