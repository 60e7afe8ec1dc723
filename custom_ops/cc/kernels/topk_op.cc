// The top-k group codec (CPU): the k largest |values| of the group.
#include "cc/kernels/topk_op.h"

#include <atomic>
#include <cmath>

#include "cc/kernels/random.h"
#include "cc/kernels/sparse_select.h"
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

bool CollectAtLeastScalar(const float* x, int64_t flat_begin, int64_t count,
                          uint32_t threshold_key, int64_t cap, std::vector<float>* values,
                          std::vector<int32_t>* indices) {
  for (int64_t i = 0; i < count; ++i) {
    if (sparse::MagnitudeKey(x[i]) >= threshold_key) {
      values->push_back(x[i]);
      indices->push_back(static_cast<int32_t>(flat_begin + i));
    }
    if ((i & 1023) == 1023 && static_cast<int64_t>(values->size()) > cap) return false;
  }
  return static_cast<int64_t>(values->size()) <= cap;
}

#if MERGECOMP_X86
// 32 elements per test: the key |x| as bits (NaN above +inf, which the
// threshold key never exceeds) compared as signed integers.
MERGECOMP_AVX2 inline uint32_t AtLeastMask8(const float* x, __m256i below) {
  const __m256i bits = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)),
                                        _mm256_set1_epi32(0x7fffffff));
  return static_cast<uint32_t>(
      _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(bits, below))));
}

MERGECOMP_AVX2 bool CollectAtLeastAvx2(const float* x, int64_t flat_begin, int64_t count,
                                       uint32_t threshold_key, int64_t cap,
                                       std::vector<float>* values,
                                       std::vector<int32_t>* indices) {
  const __m256i below = _mm256_set1_epi32(static_cast<int32_t>(threshold_key - 1));
  int64_t i = 0;
  for (; i + 32 <= count; i += 32) {
    uint32_t mask = AtLeastMask8(x + i, below) | AtLeastMask8(x + i + 8, below) << 8 |
                    AtLeastMask8(x + i + 16, below) << 16 | AtLeastMask8(x + i + 24, below) << 24;
    if (mask == 0) continue;
    while (mask != 0) {
      const int j = __builtin_ctz(mask);
      mask &= mask - 1;
      values->push_back(x[i + j]);
      indices->push_back(static_cast<int32_t>(flat_begin + i + j));
    }
    if (static_cast<int64_t>(values->size()) > cap) return false;
  }
  return CollectAtLeastScalar(x + i, flat_begin + i, count - i, threshold_key, cap, values,
                              indices);
}
#endif

}  // namespace

bool CollectAtLeast(const float* values, int64_t flat_begin, int64_t count,
                    uint32_t threshold_key, int64_t cap, std::vector<float>* block_values,
                    std::vector<int32_t>* block_indices) {
#if MERGECOMP_X86
  if (CpuHasAvx2()) {
    return CollectAtLeastAvx2(values, flat_begin, count, threshold_key, cap, block_values,
                              block_indices);
  }
#endif
  return CollectAtLeastScalar(values, flat_begin, count, threshold_key, cap, block_values,
                              block_indices);
}

void EmitLargestCandidates(const BlockCandidates& candidates, int64_t k, uint8_t* payload) {
  std::vector<float> values;
  std::vector<int32_t> indices;
  values.reserve(candidates.total());
  indices.reserve(candidates.total());
  for (size_t b = 0; b < candidates.values.size(); ++b) {
    values.insert(values.end(), candidates.values[b].begin(), candidates.values[b].end());
    indices.insert(indices.end(), candidates.indices[b].begin(), candidates.indices[b].end());
  }
  const int64_t count = static_cast<int64_t>(values.size());
  auto key = [&values](int64_t j) { return sparse::MagnitudeKey(values[j]); };
  const sparse::Selection selection =
      sparse::SelectLargest(count, k, key, [](int64_t num_blocks, const auto& fn) {
        for (int64_t b = 0; b < num_blocks; ++b) fn(b);
      });
  float* out_values = sparse::PayloadValues(payload);
  int32_t* out_indices = sparse::PayloadIndices(payload, k);
  int64_t position = 0;
  int64_t ties_taken = 0;
  for (int64_t j = 0; j < count && position < k; ++j) {
    const uint32_t kk = key(j);
    if (kk > selection.threshold ||
        (kk == selection.threshold && ties_taken++ < selection.ties)) {
      out_values[position] = values[j];
      out_indices[position] = indices[j];
      ++position;
    }
  }
}

namespace {

// Calls visit(block, values, flat_begin, count) for the runs of every block,
// sharded over the intra-op pool (the group already compensated).
void VisitRuns(OpKernelContext* context, const SparseGroupInput& input,
               const sparse::Blocks& blocks, const SparseGroupInput::RunVisitor& visit) {
  ForEachBlock(context, blocks.count, blocks.size, [&](int64_t b) {
    input.ForEachRun(blocks.begin(b), blocks.end(b),
                     [&](const float* values, int64_t flat_begin, int64_t count) {
                       visit(b, values, flat_begin, count);
                     });
  });
}

// Elements sampled for the top-k threshold: n / kTopkSampleStride of them,
// within [kTopkMinSample, kTopkMaxSample], for groups of at least
// kTopkSampledGroup elements; and the margin (in standard deviations of the
// sampled count) by which the threshold undershoots the k-th largest so that
// the one pass collects at least k candidates. Each sample is a compensated
// value read on its own, about 50 ns here: a fixed 16384 of them cost a
// tensor of 131072 to 1M elements more than the exact select they were to
// save (docs/benchmarks.md, "Top-k's sample").
constexpr int64_t kTopkSampleStride = 128;
constexpr int64_t kTopkMinSample = 1024;
constexpr int64_t kTopkMaxSample = 16384;
constexpr int64_t kTopkSampledGroup = 32 * kTopkMinSample;
constexpr double kTopkMarginSigmas = 4.0;

}  // namespace

Status EncodeGroupTopk(OpKernelContext* context, const SparseGroupInput& input, int64_t k,
                       bool compensate, uint8_t* payload) {
  const int64_t n = input.layout().total();
  const sparse::Blocks blocks = sparse::MakeBlocks(n);
  if (k == 0) {
    if (compensate) input.Compensate(context, blocks, nullptr);
    return tensorflow::OkStatus();
  }
  // A threshold key from a sample: the sample only decides where the exact
  // selection starts looking, never what it selects.
  uint32_t threshold_key = 0;
  double expected_fraction = 0.0;
  if (n >= kTopkSampledGroup) {
    // A multiple of 4: the sample is drawn in 4 chunks.
    const int64_t sample_size =
        std::min(kTopkMaxSample, std::max(kTopkMinSample, n / kTopkSampleStride)) / 4 * 4;
    const double expected = static_cast<double>(k) * sample_size / static_cast<double>(n);
    const int64_t rank = static_cast<int64_t>(
        std::ceil(expected + kTopkMarginSigmas * std::sqrt(expected) + 16.0));
    if (rank < sample_size / 4) {
      const SeedKey sample_key = MakeSeedKey(0x70b4);
      std::vector<uint32_t> sample(sample_size);
      const int64_t chunk_size = sample_size / 4;
      // Stratified: one position drawn in each of sample_size equal strata, so
      // that the reads go through the group in order (no worse an estimate of
      // the threshold than positions drawn anywhere).
      ForEachBlock(context, 4, 200 * chunk_size, [&](int64_t chunk) {
        for (int64_t j = chunk * chunk_size; j < (chunk + 1) * chunk_size; ++j) {
          const int64_t stratum_begin = j * n / sample_size;
          const int64_t stratum = (j + 1) * n / sample_size - stratum_begin;
          const uint64_t bits = RandomBits(sample_key, static_cast<uint32_t>(j));
          const int64_t position = stratum_begin + static_cast<int64_t>(
              (bits * static_cast<uint64_t>(stratum)) >> 32);
          sample[j] = sparse::MagnitudeKey(compensate ? input.ValueBefore(position)
                                                      : input.ValueAt(position));
        }
      });
      std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(),
                       std::greater<uint32_t>());
      threshold_key = sample[rank - 1];
      expected_fraction = static_cast<double>(rank) / sample_size;
    }
  }
  if (threshold_key > 0) {
    BlockCandidates candidates(blocks.count);
    const int64_t cap = static_cast<int64_t>(4.0 * expected_fraction * blocks.size) + 4096;
    for (int64_t b = 0; b < blocks.count; ++b) {
      candidates.values[b].reserve(cap / 2);
      candidates.indices[b].reserve(cap / 2);
    }
    std::atomic<bool> overflow{false};
    const SparseGroupInput::RunVisitor collect = [&](int64_t b, const float* values,
                                                     int64_t flat_begin, int64_t count) {
      if (overflow.load(std::memory_order_relaxed)) return;
      if (!CollectAtLeast(values, flat_begin, count, threshold_key, cap, &candidates.values[b],
                          &candidates.indices[b])) {
        overflow.store(true, std::memory_order_relaxed);
      }
    };
    if (compensate) {
      input.Compensate(context, blocks, &collect);
    } else {
      VisitRuns(context, input, blocks, collect);
    }
    if (!overflow.load() && candidates.total() >= k) {
      EmitLargestCandidates(candidates, k, payload);
      return tensorflow::OkStatus();
    }
  } else if (compensate) {
    input.Compensate(context, blocks, nullptr);
  }
  // The exact radix select over every key of the group.
  std::vector<uint32_t> keys(n);
  VisitRuns(context, input, blocks, [&](int64_t, const float* values, int64_t flat_begin,
                                        int64_t count) {
    for (int64_t i = 0; i < count; ++i) keys[flat_begin + i] = sparse::MagnitudeKey(values[i]);
  });
  CpuBlockRunner run(context, blocks.size * 4);
  float* values = sparse::PayloadValues(payload);
  int32_t* indices = sparse::PayloadIndices(payload, k);
  sparse::SelectAndEmitLargest(
      n, k, [&keys](int64_t i) { return keys[i]; },
      [&](int64_t i, int64_t position) {
        values[position] = input.ValueAt(i);
        indices[position] = static_cast<int32_t>(i);
      },
      run);
  return tensorflow::OkStatus();
}

namespace {

// One worker's sparse payload as the decoder reads it: the slots [0,
// ascending) whose indices do not descend (all of them but DGC's padding,
// index 0, at the end), found by binary search per block; the rest, `tail`,
// sorted by index with slot order kept among equal ones.
struct SparseRow {
  const float* values;
  const int32_t* indices;
  int64_t ascending;
  std::vector<std::pair<int32_t, float>> tail;
};

}  // namespace

Status SparseGroupCodec::Decode(OpKernelContext* context, const uint8_t* rows, int64_t num_rows,
                                const int32_t*, const GroupLayout& layout,
                                const GroupCodecParams& params, const BlockOutput& output) const {
  const int64_t n = layout.total();
  const int64_t k = params.k;
  std::vector<SparseRow> sparse_rows(num_rows);
  for (int64_t w = 0; w < num_rows; ++w) {
    SparseRow& row = sparse_rows[w];
    row.values = sparse::PayloadValues(rows + w * 8 * k);
    row.indices = sparse::PayloadIndices(rows + w * 8 * k, k);
    row.ascending = k;
    for (int64_t slot = 0; slot < k; ++slot) {
      const int32_t index = row.indices[slot];
      if (index < 0 || index >= n) {
        return tensorflow::errors::InvalidArgument("sparse payload of worker ", w,
                                                   " holds index ", index, " outside [0, ", n,
                                                   ")");
      }
      if (row.ascending == k && slot > 0 && index < row.indices[slot - 1]) row.ascending = slot;
    }
    for (int64_t slot = row.ascending; slot < k; ++slot) {
      row.tail.emplace_back(row.indices[slot], row.values[slot]);
    }
    std::stable_sort(row.tail.begin(), row.tail.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  const float divisor = static_cast<float>(num_rows);
  return ZeroAndScatter(context, layout, output, [&](const std::vector<float*>& arrays,
                                                     int64_t begin, int64_t end) {
    // Worker by worker, slot by slot: each element receives its entries in
    // the order of the reference's tensor_scatter_nd_add over all rows.
    TensorCursor cursor(layout, begin);
    auto add = [&](int32_t index, float value) {
      int64_t j = 0;
      const int64_t t = cursor.Locate(index, &j);
      arrays[t][j] += value;
    };
    for (const SparseRow& row : sparse_rows) {
      const int32_t* first = std::lower_bound(row.indices, row.indices + row.ascending, begin);
      const int32_t* last = std::lower_bound(first, row.indices + row.ascending, end);
      for (const int32_t* slot = first; slot < last; ++slot) {
        add(*slot, row.values[slot - row.indices]);
      }
      auto tail = std::lower_bound(row.tail.begin(), row.tail.end(), begin,
                                   [](const auto& entry, int64_t i) { return entry.first < i; });
      for (; tail != row.tail.end() && tail->first < end; ++tail) add(tail->first, tail->second);
    }
    if (num_rows > 1) {
      // The mean: the untouched zeros stay +0 (0 / W), so the whole block is divided.
      layout.ForEachPart(begin, end, [&](int64_t t, int64_t part_begin, int64_t part_end) {
        for (int64_t j = part_begin; j < part_end; ++j) arrays[t][j] = arrays[t][j] / divisor;
      });
    }
  });
}

void SparseGroupCodec::ForEachSent(const uint8_t* payload, const int32_t*, const GroupLayout&,
                                   const GroupCodecParams& params,
                                   const std::function<void(int64_t, float)>& sent) const {
  const float* values = sparse::PayloadValues(payload);
  const int32_t* indices = sparse::PayloadIndices(payload, params.k);
  for (int64_t slot = 0; slot < params.k; ++slot) sent(indices[slot], values[slot]);
}

class TopkGroupCodec : public SparseGroupCodec {
 public:
  Status Encode(OpKernelContext* context, const BlockInput& input, const GroupLayout&,
                const GroupCodecParams& params, int64_t, uint8_t* payload,
                int32_t*) const override {
    return EncodeGroupTopk(context, static_cast<const SparseGroupInput&>(input), params.k,
                           /*compensate=*/true, payload);
  }
};
REGISTER_GROUP_CODEC("topk", TopkGroupCodec);


}  // namespace tf_mergecomp
