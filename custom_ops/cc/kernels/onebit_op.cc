// 1-bit SGD CPU kernels: one pass packs the sign bits and sums each side (in
// double, per block, blocks combined in order).
#include "cc/kernels/onebit_op.h"

#include <vector>

#include "cc/kernels/dense_cpu.h"
#include "cc/kernels/dense_register.h"

namespace tf_mergecomp {
namespace {

struct SideSums {
  double positive = 0.0;  // sum of elements with !(x < 0); NaN joins this side
  double negative = 0.0;  // sum of elements x < 0
  int64_t positive_count = 0;
};

SideSums PackAndSumSidesScalar(const float* x, int64_t count, uint8_t* bits) {
  PackSignBitsScalar(x, count, bits);
  SideSums sums;
  for (int64_t i = 0; i < count; ++i) {
    const bool positive = IsNonNegative(x[i]);
    sums.positive += positive ? static_cast<double>(x[i]) : 0.0;
    sums.negative += positive ? 0.0 : static_cast<double>(x[i]);
    sums.positive_count += positive;
  }
  return sums;
}

#if MERGECOMP_X86
MERGECOMP_AVX2 inline __m256d WidenAdd(__m256d lo_sum, __m256 v, __m256d* hi_sum) {
  *hi_sum = _mm256_add_pd(*hi_sum, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  return _mm256_add_pd(lo_sum, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
}

MERGECOMP_AVX2 inline double HorizontalSum(__m256d a, __m256d b) {
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(a, b));
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

MERGECOMP_AVX2 SideSums PackAndSumSidesAvx2(const float* x, int64_t count, uint8_t* bits) {
  __m256d pos_lo = _mm256_setzero_pd(), pos_hi = _mm256_setzero_pd();
  __m256d neg_lo = _mm256_setzero_pd(), neg_hi = _mm256_setzero_pd();
  int64_t positive_count = 0;
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 positive = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_NLT_UQ);
    const uint32_t mask = static_cast<uint32_t>(_mm256_movemask_ps(positive));
    bits[i / 8] = static_cast<uint8_t>(mask);
    positive_count += __builtin_popcount(mask);
    pos_lo = WidenAdd(pos_lo, _mm256_and_ps(positive, v), &pos_hi);
    neg_lo = WidenAdd(neg_lo, _mm256_andnot_ps(positive, v), &neg_hi);
  }
  SideSums sums;
  sums.positive = HorizontalSum(pos_lo, pos_hi);
  sums.negative = HorizontalSum(neg_lo, neg_hi);
  sums.positive_count = positive_count;
  if (i < count) {
    const SideSums tail = PackAndSumSidesScalar(x + i, count - i, bits + i / 8);
    sums.positive += tail.positive;
    sums.negative += tail.negative;
    sums.positive_count += tail.positive_count;
  }
  return sums;
}
#endif

}  // namespace

void OnebitEncodeBlocks(tensorflow::OpKernelContext* context, const BlockInput& input, int64_t n,
                        int64_t, int64_t, uint8_t* payload) {
  const auto pack = MERGECOMP_AVX2_OR_SCALAR(PackAndSumSidesAvx2, PackAndSumSidesScalar);
  uint8_t* bits = payload + kOnebitHeaderBytes;
  const std::vector<SideSums> partial = ReduceBlocks<SideSums>(
      context, n, 3 * kBlockElements,
      [&](int64_t begin, int64_t count) { return pack(input.Block(begin, count), count, bits + begin / 8); });
  SideSums total;
  for (const SideSums& p : partial) {
    total.positive += p.positive;
    total.negative += p.negative;
    total.positive_count += p.positive_count;
  }
  const int64_t negative_count = n - total.positive_count;
  const float mean_positive =
      total.positive_count > 0
          ? static_cast<float>(total.positive / static_cast<double>(total.positive_count))
          : 0.0f;
  const float mean_negative =
      negative_count > 0 ? static_cast<float>(total.negative / static_cast<double>(negative_count))
                         : 0.0f;
  StoreFloat(payload, mean_positive);
  StoreFloat(payload + 4, mean_negative);
}

void OnebitDecodeBlocks(tensorflow::OpKernelContext* context, const uint8_t* payload,
                        int64_t world_size, int64_t n, int64_t, const BlockOutput& output) {
  const int64_t row_bytes = OnebitPayloadBytes(n, 0);
  std::vector<float> positive(world_size), negative(world_size);
  for (int64_t w = 0; w < world_size; ++w) {
    positive[w] = LoadFloat(payload + w * row_bytes);
    negative[w] = LoadFloat(payload + w * row_bytes + 4);
  }
  DecodeTwoLevel(context, payload, world_size, row_bytes, kOnebitHeaderBytes, positive.data(),
                 negative.data(), n, TwoLevelCombine::kMean, output);
}

MERGECOMP_REGISTER_DENSE_GROUP_CODEC(Onebit, "onebit");

}  // namespace tf_mergecomp
