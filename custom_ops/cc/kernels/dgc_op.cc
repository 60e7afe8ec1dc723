// The DGC group codec (CPU; algorithm in dgc_op.h).
#include "cc/kernels/dgc_op.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <vector>

#include "cc/kernels/group_op.h"
#include "cc/kernels/random.h"
#include "cc/kernels/sparse_select.h"
#include "cc/kernels/topk_op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_mergecomp {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;

namespace {

float KeyToFloat(uint32_t key) {
  float value;
  std::memcpy(&value, &key, sizeof(value));
  return value;
}

}  // namespace

namespace {

constexpr int kDgcThresholds = kDgcRefinements + 1;

// Counts, for each threshold key, the entries of x[0, count) whose magnitude
// key reaches it (counts += ...), and with `collect` appends those reaching
// the first (the largest) to one block's lists, up to `cap` of them.
void CountThresholdsScalar(const float* x, int64_t flat_begin, int64_t count,
                           const uint32_t* keys, int64_t* counts, bool* collect, int64_t cap,
                           std::vector<float>* values, std::vector<int32_t>* indices) {
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t key = sparse::MagnitudeKey(x[i]);
    for (int r = 0; r < kDgcThresholds; ++r) counts[r] += key >= keys[r];
    if (*collect && key >= keys[0]) {
      values->push_back(x[i]);
      indices->push_back(static_cast<int32_t>(flat_begin + i));
      if (static_cast<int64_t>(values->size()) > cap) *collect = false;
    }
  }
}

#if MERGECOMP_X86
MERGECOMP_AVX2 void CountThresholdsAvx2(const float* x, int64_t flat_begin, int64_t count,
                                        const uint32_t* keys, int64_t* counts, bool* collect,
                                        int64_t cap, std::vector<float>* values,
                                        std::vector<int32_t>* indices) {
  // Keys compared as signed integers: |x|'s bits (NaN above +inf, which no
  // threshold key exceeds); "key >= t" is "bits > t - 1", for t >= 1.
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i below[kDgcThresholds];
  __m256i sums[kDgcThresholds];
  for (int r = 0; r < kDgcThresholds; ++r) {
    below[r] = _mm256_set1_epi32(static_cast<int32_t>(keys[r] - 1));
    sums[r] = _mm256_setzero_si256();
  }
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i bits =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs_mask);
    __m256i first = _mm256_setzero_si256();
    for (int r = 0; r < kDgcThresholds; ++r) {
      const __m256i reached = _mm256_cmpgt_epi32(bits, below[r]);
      sums[r] = _mm256_sub_epi32(sums[r], reached);
      if (r == 0) first = reached;
    }
    uint32_t mask = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(first)));
    if (mask != 0 && *collect) {
      while (mask != 0) {
        const int j = __builtin_ctz(mask);
        mask &= mask - 1;
        values->push_back(x[i + j]);
        indices->push_back(static_cast<int32_t>(flat_begin + i + j));
      }
      if (static_cast<int64_t>(values->size()) > cap) *collect = false;
    }
  }
  for (int r = 0; r < kDgcThresholds; ++r) {
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sums[r]);
    for (int32_t lane : lanes) counts[r] += lane;
  }
  CountThresholdsScalar(x + i, flat_begin + i, count - i, keys, counts, collect, cap, values,
                        indices);
}
#endif

}  // namespace

// The group's DGC: the sample and threshold come from the compensated values
// before the compensation pass, which then counts every refinement's
// candidates and collects those of the sampled threshold. Same result as
// DgcEncodeFunctor on the compensated group: when a threshold reaching k
// candidates exists, the payload is the exact top-k (which is what "the k
// largest candidates" are, candidates being larger than all others), else
// the candidates of the last refinement and padding.
class DgcGroupCodec : public SparseGroupCodec {
 public:
  Status Encode(OpKernelContext* context, const BlockInput& block_input, const GroupLayout& layout,
                const GroupCodecParams& params, int64_t seed, uint8_t* payload,
                int32_t*) const override {
    const auto& input = static_cast<const SparseGroupInput&>(block_input);
    const int64_t n = layout.total();
    const int64_t k = params.k;
    const sparse::Blocks blocks = sparse::MakeBlocks(n);
    if (k == 0) {
      input.Compensate(context, blocks, nullptr);
      return tensorflow::OkStatus();
    }
    const int64_t sample_size = params.sample_size;
    const SeedKey seed_key = MakeSeedKey(seed);
    // The threshold depends on the sample as a multiset, so its positions are
    // put in ascending order of 32K-element spans (a counting sort) before
    // the values are read: reads moving forward through g and the state
    // overlap their cache misses far better than random ones (ResNet50's
    // gradients as one group: the sample's reads took a quarter of the encode).
    std::vector<uint32_t> positions(sample_size);
    constexpr int kSpanBits = 15;
    std::vector<int64_t> span_start((n >> kSpanBits) + 2, 0);
    for (int64_t j = 0; j < sample_size; ++j) {
      const uint64_t bits = RandomBits(seed_key, static_cast<uint32_t>(j));
      positions[j] = static_cast<uint32_t>((bits * static_cast<uint64_t>(n)) >> 32);
      ++span_start[(positions[j] >> kSpanBits) + 1];
    }
    for (size_t span = 1; span < span_start.size(); ++span) span_start[span] += span_start[span - 1];
    std::vector<uint32_t> ordered(sample_size);
    for (int64_t j = 0; j < sample_size; ++j) ordered[span_start[positions[j] >> kSpanBits]++] = positions[j];
    std::vector<float> sample(sample_size);
    // In parallel too, so the misses of the threads overlap.
    constexpr int64_t kSampleChunk = 8192;
    ForEachBlock(context, CeilDiv(sample_size, kSampleChunk), 200 * kSampleChunk,
                 [&](int64_t chunk) {
                   const int64_t end = std::min(sample_size, (chunk + 1) * kSampleChunk);
                   for (int64_t j = chunk * kSampleChunk; j < end; ++j) {
                     sample[j] = KeyToFloat(sparse::MagnitudeKey(input.ValueBefore(ordered[j])));
                   }
                 });
    const int64_t rank = DgcSampleRank(n, k, sample_size);
    std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(),
                     std::greater<float>());
    float thresholds[kDgcThresholds];
    uint32_t threshold_keys[kDgcThresholds];
    for (int r = 0; r < kDgcThresholds; ++r) {
      thresholds[r] = r == 0 ? sample[rank - 1] : thresholds[r - 1] * 0.5f;
      threshold_keys[r] = sparse::MagnitudeKey(thresholds[r]);
    }

    // One pass: compensate, count at every threshold, collect at the first
    // (unless its key is 0: everything would be collected).
    std::vector<std::array<int64_t, kDgcThresholds>> block_counts(blocks.count);
    BlockCandidates candidates(blocks.count);
    const int64_t cap = 4 * k * blocks.size / std::max<int64_t>(n, 1) + 4096;
    std::vector<char> collecting(blocks.count, threshold_keys[0] > 0 ? 1 : 0);
    const auto count_of = MERGECOMP_AVX2_OR_SCALAR(CountThresholdsAvx2, CountThresholdsScalar);
    const SparseGroupInput::RunVisitor count = [&](int64_t b, const float* values,
                                                   int64_t flat_begin, int64_t run) {
      bool collect = collecting[b] != 0;
      if (threshold_keys[kDgcThresholds - 1] == 0) {
        // Every key reaches a zero threshold key (the vector compare needs t >= 1).
        collect = false;
        CountThresholdsScalar(values, flat_begin, run, threshold_keys, block_counts[b].data(),
                              &collect, cap, nullptr, nullptr);
      } else {
        count_of(values, flat_begin, run, threshold_keys, block_counts[b].data(), &collect, cap,
                 &candidates.values[b], &candidates.indices[b]);
      }
      collecting[b] = collect ? 1 : 0;
    };
    for (auto& counts : block_counts) counts.fill(0);
    input.Compensate(context, blocks, &count);

    int64_t found = 0;
    int last = 0;
    for (int r = 0; r < kDgcThresholds; ++r) {
      found = 0;
      for (const auto& counts : block_counts) found += counts[r];
      last = r;
      if (found >= k) break;
    }
    const bool collected =
        std::all_of(collecting.begin(), collecting.end(), [](char c) { return c != 0; });
    if (found >= k && last == 0 && collected) {
      EmitLargestCandidates(candidates, k, payload);
      return tensorflow::OkStatus();
    }
    if (found >= k) return EncodeGroupTopk(context, input, k, /*compensate=*/false, payload);

    // Fewer than k reach the last threshold: all of them, then padding.
    const uint32_t last_key = threshold_keys[last];
    std::vector<int64_t> start(blocks.count + 1, 0);
    for (int64_t b = 0; b < blocks.count; ++b) start[b + 1] = start[b] + block_counts[b][last];
    float* values = sparse::PayloadValues(payload);
    int32_t* indices = sparse::PayloadIndices(payload, k);
    ForEachBlock(context, blocks.count, blocks.size, [&](int64_t b) {
      int64_t position = start[b];
      input.ForEachRun(blocks.begin(b), blocks.end(b),
                       [&](const float* run, int64_t flat_begin, int64_t count) {
                         for (int64_t i = 0; i < count; ++i) {
                           if (sparse::MagnitudeKey(run[i]) >= last_key) {
                             values[position] = run[i];
                             indices[position] = static_cast<int32_t>(flat_begin + i);
                             ++position;
                           }
                         }
                       });
    });
    std::fill(values + found, values + k, 0.0f);
    std::fill(indices + found, indices + k, 0);
    return tensorflow::OkStatus();
  }
};
REGISTER_GROUP_CODEC("dgc", DgcGroupCodec);


}  // namespace tf_mergecomp
