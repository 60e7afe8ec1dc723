// The random-k group codec (CPU; the draw in randomk_op.h).
#include "cc/kernels/randomk_op.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cc/kernels/group_op.h"
#include "cc/kernels/payload_size.h"
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

// Appends (key, position) for the positions in [begin, end) whose key
// RandomBits(seed_key, position) is >= threshold (>= 1).
void CollectKeysScalar(SeedKey seed_key, int64_t begin, int64_t end, uint32_t threshold,
                       std::vector<uint32_t>* keys, std::vector<int32_t>* positions) {
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t key = RandomBits(seed_key, static_cast<uint32_t>(i));
    if (key >= threshold) {
      keys->push_back(key);
      positions->push_back(static_cast<int32_t>(i));
    }
  }
}

#if MERGECOMP_X86
// Eight keys at a time, as RandomBits computes them (dense_cpu.h's Mix32x8),
// compared unsigned through a flipped sign bit.
MERGECOMP_AVX2 void CollectKeysAvx2(SeedKey seed_key, int64_t begin, int64_t end,
                                    uint32_t threshold, std::vector<uint32_t>* keys,
                                    std::vector<int32_t>* positions) {
  const __m256i lo = _mm256_set1_epi32(static_cast<int32_t>(seed_key.lo));
  const __m256i hi = _mm256_set1_epi32(static_cast<int32_t>(seed_key.hi));
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i sign = _mm256_set1_epi32(static_cast<int32_t>(0x80000000u));
  const __m256i below = _mm256_set1_epi32(static_cast<int32_t>((threshold - 1) ^ 0x80000000u));
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256i index =
        _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(i))), lanes);
    const __m256i bits = Mix32x8(_mm256_add_epi32(Mix32x8(_mm256_xor_si256(index, lo)), hi));
    uint32_t mask = static_cast<uint32_t>(_mm256_movemask_ps(
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_xor_si256(bits, sign), below))));
    if (mask == 0) continue;
    alignas(32) uint32_t values[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(values), bits);
    while (mask != 0) {
      const int j = __builtin_ctz(mask);
      mask &= mask - 1;
      keys->push_back(values[j]);
      positions->push_back(static_cast<int32_t>(i + j));
    }
  }
  CollectKeysScalar(seed_key, i, end, threshold, keys, positions);
}
#endif

// Below this many positions the radix select over all keys is as quick (at
// 16K positions it took 2.3x as long as the collection: 256 tensors of 16K,
// one group, 27.4 ms vs 11.9 ms).
constexpr int64_t kRandomkMinCollect = 1 << 10;

}  // namespace

// The keys are uniform 32-bit numbers, so a threshold that about
// k + 6 sqrt(k) + 64 of the n keys reach (an exact function of n and k) is
// found without looking at them: one pass computes the keys and collects
// those reaching it, and the k largest of these few are selected. Should
// fewer than k reach it (beyond six standard deviations), the radix select
// over all keys decides. Either way: the k largest keys, ties to the lower
// index, as the CUDA kernel and the reference choose, written to indices in
// ascending order (the group codec's gather and decode rely on it).
template <typename Runner>
void RandomkSelect(int64_t seed, int64_t n, int64_t k, int32_t* indices, const Runner& run) {
  if (k == 0) return;
  const SeedKey seed_key = MakeSeedKey(seed);
  const double wanted = static_cast<double>(k) + 6.0 * std::sqrt(static_cast<double>(k)) + 64.0;
  if (n >= kRandomkMinCollect && 2.0 * wanted < static_cast<double>(n)) {
    const double above = std::ceil(wanted / static_cast<double>(n) * 4294967296.0);
    const uint32_t threshold = static_cast<uint32_t>(4294967296.0 - above);
    const sparse::Blocks blocks = sparse::MakeBlocks(n);
    std::vector<std::vector<uint32_t>> keys(blocks.count);
    std::vector<std::vector<int32_t>> positions(blocks.count);
    const auto collect = MERGECOMP_AVX2_OR_SCALAR(CollectKeysAvx2, CollectKeysScalar);
    run(blocks.count, [&](int64_t b) {
      const size_t expected = static_cast<size_t>(wanted * blocks.size / n * 1.25) + 64;
      keys[b].reserve(expected);
      positions[b].reserve(expected);
      collect(seed_key, blocks.begin(b), blocks.end(b), threshold, &keys[b], &positions[b]);
    });
    std::vector<uint32_t> all_keys;
    std::vector<int32_t> all_positions;
    for (int64_t b = 0; b < blocks.count; ++b) {
      all_keys.insert(all_keys.end(), keys[b].begin(), keys[b].end());
      all_positions.insert(all_positions.end(), positions[b].begin(), positions[b].end());
    }
    const int64_t count = static_cast<int64_t>(all_keys.size());
    if (count >= k) {
      auto key = [&all_keys](int64_t j) { return all_keys[j]; };
      const sparse::Selection selection =
          sparse::SelectLargest(count, k, key, [](int64_t num_blocks, const auto& fn) {
            for (int64_t b = 0; b < num_blocks; ++b) fn(b);
          });
      int64_t position = 0;
      int64_t ties_taken = 0;
      for (int64_t j = 0; j < count && position < k; ++j) {
        if (all_keys[j] > selection.threshold ||
            (all_keys[j] == selection.threshold && ties_taken++ < selection.ties)) {
          indices[position++] = all_positions[j];
        }
      }
      return;
    }
  }
  auto key = [seed_key](int64_t i) { return RandomBits(seed_key, static_cast<uint32_t>(i)); };
  sparse::SelectAndEmitLargest(
      n, k, key,
      [indices](int64_t i, int64_t position) { indices[position] = static_cast<int32_t>(i); },
      run);
}

// Random-k within a group samples each tensor on its own, k_i = tensor_k[i]
// positions drawn from TensorSeed(seed, i), as the tensor would be sampled
// in a group of its own: merging changes no draw. The payload is the
// tensors' values back to back; codec_context holds their positions in the
// group's flat space for the decoder.
class RandomkGroupCodec : public GroupCodec {
 public:
  int64_t PayloadBytes(const GroupLayout& layout, const GroupCodecParams& params) const override {
    return payload_size::Randomk(ContextSize(layout, params));
  }
  int64_t ContextSize(const GroupLayout&, const GroupCodecParams& params) const override {
    int64_t slots = 0;
    for (int64_t k : params.tensor_k) slots += k;
    return slots;
  }
  bool SendsEntries() const override { return true; }
  bool TakesSentWhileEncoding() const override { return true; }

  Status Encode(OpKernelContext* context, const BlockInput& block_input, const GroupLayout& layout,
                const GroupCodecParams& params, int64_t seed, uint8_t* payload,
                int32_t* positions) const override {
    TF_RETURN_IF_ERROR(CheckTensorK(layout, params));
    const auto& input = static_cast<const SparseGroupInput&>(block_input);
    std::vector<int64_t> first_slot(layout.num_tensors() + 1, 0);
    for (int64_t i = 0; i < layout.num_tensors(); ++i) {
      first_slot[i + 1] = first_slot[i] + params.tensor_k[i];
    }
    // The positions depend on the seed alone, so they are drawn first (in
    // ascending order, tensor after tensor); the one compensation pass then
    // gathers each block's sent values and takes them out of the state while
    // the block is in cache. Tensors of at least kParallelTensor elements
    // draw with every thread; the smaller ones are drawn a tensor per thread,
    // all in one sharding.
    constexpr int64_t kParallelTensor = int64_t{1} << 20;
    auto draw = [&](int64_t i, const auto& run) {
      int32_t* tensor_positions = positions + first_slot[i];
      RandomkSelect(TensorSeed(seed, i), layout.size(i), params.tensor_k[i], tensor_positions, run);
      const int32_t offset = static_cast<int32_t>(layout.offset(i));
      for (int64_t slot = 0; slot < params.tensor_k[i]; ++slot) tensor_positions[slot] += offset;
    };
    const auto serial = [](int64_t num_blocks, const auto& fn) {
      for (int64_t b = 0; b < num_blocks; ++b) fn(b);
    };
    std::vector<int64_t> small;
    for (int64_t i = 0; i < layout.num_tensors(); ++i) {
      if (params.tensor_k[i] == 0) continue;
      if (layout.size(i) >= kParallelTensor) {
        draw(i, CpuBlockRunner(context, sparse::MakeBlocks(layout.size(i)).size * 8));
      } else {
        small.push_back(i);
      }
    }
    int64_t small_elements = 0;
    for (int64_t i : small) small_elements += layout.size(i);
    ForEachBlock(context, static_cast<int64_t>(small.size()),
                 small.empty() ? 0 : 8 * small_elements / static_cast<int64_t>(small.size()),
                 [&](int64_t s) { draw(small[s], serial); });

    float* values = reinterpret_cast<float*>(payload);
    const int32_t* all = positions;
    const int32_t* all_end = positions + first_slot.back();
    const SparseGroupInput::RunVisitor gather = [&](int64_t, const float* run,
                                                    int64_t flat_begin, int64_t count) {
      const int32_t* first = std::lower_bound(all, all_end, flat_begin);
      const int32_t* last = std::lower_bound(first, all_end, flat_begin + count);
      if (first == last) return;
      const int64_t t = layout.TensorAt(flat_begin);
      const int64_t offset = layout.offset(t);
      const float scale = Scale(layout, params, t);
      for (const int32_t* position = first; position < last; ++position) {
        const float value = run[*position - flat_begin];
        values[position - all] = value;
        input.TakeSent(t, *position - offset, params.scale ? value * scale : value);
      }
    };
    input.Compensate(context, sparse::MakeBlocks(layout.total()), &gather);
    return tensorflow::OkStatus();
  }

  Status Decode(OpKernelContext* context, const uint8_t* rows, int64_t, const int32_t* positions,
                const GroupLayout& layout, const GroupCodecParams& params,
                const BlockOutput& block_output) const override {
    TF_RETURN_IF_ERROR(CheckTensorK(layout, params));
    const float* values = reinterpret_cast<const float*>(rows);
    // Tensor by tensor the positions lie in the tensor and ascend, so all of
    // them ascend and each block finds its own by binary search.
    std::vector<float> scales(layout.num_tensors());
    int64_t slot = 0;
    for (int64_t i = 0; i < layout.num_tensors(); ++i) {
      scales[i] = Scale(layout, params, i);
      for (int64_t end = slot + params.tensor_k[i]; slot < end; ++slot) {
        if (positions[slot] < layout.offset(i) || positions[slot] >= layout.offset(i + 1) ||
            (slot > 0 && positions[slot] <= positions[slot - 1])) {
          return tensorflow::errors::InvalidArgument(
              "randomk: position ", positions[slot], " (slot ", slot, ") is not in tensor ", i,
              " or not above the one before");
        }
      }
    }
    const int32_t* all = positions;
    const int32_t* all_end = positions + slot;
    return ZeroAndScatter(context, layout, block_output, [&](const std::vector<float*>& arrays,
                                                             int64_t begin, int64_t end) {
      const int32_t* first = std::lower_bound(all, all_end, begin);
      const int32_t* last = std::lower_bound(first, all_end, end);
      TensorCursor cursor(layout, begin);
      for (const int32_t* position = first; position < last; ++position) {
        int64_t j = 0;
        const int64_t t = cursor.Locate(*position, &j);
        const float value = values[position - all];
        arrays[t][j] = params.scale ? value * scales[t] : value;
      }
    });
  }

 private:
  // scale=True: the unbiased n_i / k_i, rounded to float32 once.
  static float Scale(const GroupLayout& layout, const GroupCodecParams& params, int64_t i) {
    const int64_t k = params.tensor_k[i];
    return params.scale && k > 0 ? static_cast<float>(static_cast<double>(layout.size(i)) / k)
                                 : 1.0f;
  }

  static Status CheckTensorK(const GroupLayout& layout, const GroupCodecParams& params) {
    if (static_cast<int64_t>(params.tensor_k.size()) != layout.num_tensors() ||
        layout.total() > INT32_MAX) {
      return tensorflow::errors::InvalidArgument(
          "randomk needs one k per tensor (", layout.num_tensors(), ", got ",
          params.tensor_k.size(), ") and a group of < 2^31 elements");
    }
    for (int64_t i = 0; i < layout.num_tensors(); ++i) {
      if (params.tensor_k[i] < 0 || params.tensor_k[i] > layout.size(i)) {
        return tensorflow::errors::InvalidArgument("randomk: tensor ", i, " has k = ",
                                                   params.tensor_k[i], " outside [0, ",
                                                   layout.size(i), "]");
      }
    }
    return tensorflow::OkStatus();
  }
};
REGISTER_GROUP_CODEC("randomk", RandomkGroupCodec);


}  // namespace tf_mergecomp
