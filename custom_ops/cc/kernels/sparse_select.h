// Exact k-largest selection over 32-bit unsigned keys, shared by the sparse
// codecs' CPU kernels (topk, dgc, randomk).
//
// The selection is a radix select: three histogram passes over the key's
// digits (bits 31..21, 20..10, 9..0) narrow down the k-th largest key exactly,
// so the cost is O(n) with no copy of the input, and each pass is split into
// fixed blocks that run in parallel. Ties at the threshold are resolved by
// lower index, so the result is unique: "the k largest keys, ties to the lower
// index", which is what tf.math.top_k returns and what the plain-TensorFlow
// references compute. Emission is in ascending index order.
#ifndef TF_MERGECOMP_SPARSE_SELECT_H_
#define TF_MERGECOMP_SPARSE_SELECT_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace tf_mergecomp {
namespace sparse {

// The order-preserving key of |x|: for non-negative floats the IEEE bit
// pattern orders like the value. NaN maps to the key of +inf, so a NaN is
// treated as an infinitely large magnitude (selected first, ties by index).
inline uint32_t MagnitudeKey(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits &= 0x7fffffffu;
  return bits > 0x7f800000u ? 0x7f800000u : bits;
}

// Take every key > threshold, and the first `ties` keys == threshold in
// index order.
struct Selection {
  uint32_t threshold;
  int64_t ties;
};

struct Blocks {
  int64_t n;
  int64_t size;
  int64_t count;
  int64_t begin(int64_t b) const { return b * size; }
  int64_t end(int64_t b) const { return std::min(n, (b + 1) * size); }
};

// Blocks are a function of n only (not of the thread count), so every
// per-block partial result, and hence the output, is deterministic.
inline Blocks MakeBlocks(int64_t n) {
  const int64_t kMaxBlocks = 64;
  const int64_t kMinBlock = 1 << 15;
  int64_t size = std::max<int64_t>(kMinBlock, (n + kMaxBlocks - 1) / kMaxBlocks);
  Blocks blocks{n, size, n == 0 ? 0 : (n + size - 1) / size};
  return blocks;
}

constexpr int kDigitShift[3] = {21, 10, 0};
constexpr int kDigitBits[3] = {11, 11, 10};

// Finds the threshold of the k largest of key(0..n-1); requires 0 < k <= n.
// run(num_blocks, fn) must call fn(b) once for every b in [0, num_blocks).
template <typename KeyFn, typename Runner>
Selection SelectLargest(int64_t n, int64_t k, KeyFn key, Runner run) {
  const Blocks blocks = MakeBlocks(n);
  uint32_t prefix = 0;
  uint32_t prefix_mask = 0;
  int64_t remaining = k;
  std::vector<uint32_t> histograms;
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = kDigitShift[pass];
    const int bins = 1 << kDigitBits[pass];
    const uint32_t digit_mask = static_cast<uint32_t>(bins - 1);
    histograms.assign(static_cast<size_t>(blocks.count) * bins, 0u);
    run(blocks.count, [&](int64_t b) {
      uint32_t* hist = histograms.data() + b * bins;
      for (int64_t i = blocks.begin(b), e = blocks.end(b); i < e; ++i) {
        const uint32_t kk = key(i);
        if ((kk & prefix_mask) == prefix) ++hist[(kk >> shift) & digit_mask];
      }
    });
    int chosen = 0;
    for (int bin = bins - 1; bin >= 0; --bin) {
      int64_t count = 0;
      for (int64_t b = 0; b < blocks.count; ++b) count += histograms[b * bins + bin];
      if (count >= remaining) {
        chosen = bin;
        break;
      }
      remaining -= count;
    }
    prefix |= static_cast<uint32_t>(chosen) << shift;
    prefix_mask |= digit_mask << shift;
  }
  return Selection{prefix, remaining};
}

// Calls emit(i, position) for each selected i, positions 0.. in index order.
// Returns the number emitted.
template <typename KeyFn, typename EmitFn, typename Runner>
int64_t EmitSelected(int64_t n, Selection selection, KeyFn key, EmitFn emit, Runner run) {
  const Blocks blocks = MakeBlocks(n);
  std::vector<int64_t> greater(blocks.count, 0), equal(blocks.count, 0);
  run(blocks.count, [&](int64_t b) {
    int64_t gt = 0, eq = 0;
    for (int64_t i = blocks.begin(b), e = blocks.end(b); i < e; ++i) {
      const uint32_t kk = key(i);
      gt += kk > selection.threshold;
      eq += kk == selection.threshold;
    }
    greater[b] = gt;
    equal[b] = eq;
  });
  std::vector<int64_t> start(blocks.count + 1, 0), ties(blocks.count, 0);
  int64_t ties_left = selection.ties;
  for (int64_t b = 0; b < blocks.count; ++b) {
    ties[b] = std::min(equal[b], ties_left);
    ties_left -= ties[b];
    start[b + 1] = start[b] + greater[b] + ties[b];
  }
  run(blocks.count, [&](int64_t b) {
    int64_t position = start[b];
    int64_t ties_taken = 0;
    for (int64_t i = blocks.begin(b), e = blocks.end(b); i < e; ++i) {
      const uint32_t kk = key(i);
      if (kk > selection.threshold) {
        emit(i, position++);
      } else if (kk == selection.threshold && ties_taken < ties[b]) {
        ++ties_taken;
        emit(i, position++);
      }
    }
  });
  return start[blocks.count];
}

// SelectLargest followed by EmitSelected in three passes over the input
// instead of five: after the first histogram pass, the elements in the bin
// holding the k-th largest key (typically a small fraction) are copied out,
// the remaining two digits are resolved on that copy, and the per-block counts
// needed for in-order emission come from the first pass's histograms. Falls
// back to the five-pass path when that bin holds a large part of the input.
// Same result as SelectLargest + EmitSelected. Requires 0 < k <= n.
template <typename KeyFn, typename EmitFn, typename Runner>
void SelectAndEmitLargest(int64_t n, int64_t k, KeyFn key, EmitFn emit, Runner run) {
  const Blocks blocks = MakeBlocks(n);
  const int shift = kDigitShift[0];
  const int bins = 1 << kDigitBits[0];
  std::vector<uint32_t> histograms(static_cast<size_t>(blocks.count) * bins, 0u);
  run(blocks.count, [&](int64_t b) {
    uint32_t* hist = histograms.data() + b * bins;
    for (int64_t i = blocks.begin(b), e = blocks.end(b); i < e; ++i) ++hist[key(i) >> shift];
  });
  uint32_t chosen = 0;
  int64_t remaining = k;
  int64_t in_bin = 0;
  for (int bin = bins - 1; bin >= 0; --bin) {
    int64_t count = 0;
    for (int64_t b = 0; b < blocks.count; ++b) count += histograms[b * bins + bin];
    if (count >= remaining) {
      chosen = static_cast<uint32_t>(bin);
      in_bin = count;
      break;
    }
    remaining -= count;
  }
  if (in_bin > n / 4 + 4096) {
    EmitSelected(n, SelectLargest(n, k, key, run), key, emit, run);
    return;
  }
  std::vector<int64_t> candidate_start(blocks.count + 1, 0);
  for (int64_t b = 0; b < blocks.count; ++b) {
    candidate_start[b + 1] = candidate_start[b] + histograms[b * bins + chosen];
  }
  std::vector<uint32_t> candidate_keys(in_bin);
  run(blocks.count, [&](int64_t b) {
    int64_t position = candidate_start[b];
    for (int64_t i = blocks.begin(b), e = blocks.end(b); i < e; ++i) {
      const uint32_t kk = key(i);
      if ((kk >> shift) == chosen) candidate_keys[position++] = kk;
    }
  });
  auto candidate_key = [&candidate_keys](int64_t j) { return candidate_keys[j]; };
  const Selection selection = SelectLargest(
      in_bin, remaining, candidate_key, [](int64_t num_blocks, const auto& fn) {
        for (int64_t b = 0; b < num_blocks; ++b) fn(b);
      });
  // Per block: keys above the chosen bin all exceed the threshold; within
  // the bin, compare with it.
  std::vector<int64_t> start(blocks.count + 1, 0), ties(blocks.count, 0);
  int64_t ties_left = selection.ties;
  for (int64_t b = 0; b < blocks.count; ++b) {
    int64_t greater = 0, equal = 0;
    for (uint32_t bin = chosen + 1; bin < static_cast<uint32_t>(bins); ++bin) {
      greater += histograms[b * bins + bin];
    }
    for (int64_t j = candidate_start[b]; j < candidate_start[b + 1]; ++j) {
      greater += candidate_keys[j] > selection.threshold;
      equal += candidate_keys[j] == selection.threshold;
    }
    ties[b] = std::min(equal, ties_left);
    ties_left -= ties[b];
    start[b + 1] = start[b] + greater + ties[b];
  }
  run(blocks.count, [&](int64_t b) {
    int64_t position = start[b];
    int64_t ties_taken = 0;
    for (int64_t i = blocks.begin(b), e = blocks.end(b); i < e; ++i) {
      const uint32_t kk = key(i);
      if (kk > selection.threshold) {
        emit(i, position++);
      } else if (kk == selection.threshold && ties_taken < ties[b]) {
        ++ties_taken;
        emit(i, position++);
      }
    }
  });
}

// Little-endian payload of `k` slots: k float32 values, then k int32 indices.
inline float* PayloadValues(uint8_t* payload) { return reinterpret_cast<float*>(payload); }
inline const float* PayloadValues(const uint8_t* payload) {
  return reinterpret_cast<const float*>(payload);
}
inline const int32_t* PayloadIndices(const uint8_t* payload, int64_t k) {
  return reinterpret_cast<const int32_t*>(payload + 4 * k);
}
inline int32_t* PayloadIndices(uint8_t* payload, int64_t k) {
  return reinterpret_cast<int32_t*>(payload + 4 * k);
}

}  // namespace sparse
}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_SPARSE_SELECT_H_
