// Top-k sparsification: the sparse group codecs' shared parts (topk, dgc).
//
// Payload of k slots (8k bytes, little-endian): k float32 values, then k int32
// indices, in ascending index order. The decoder of W such payloads
// concatenated (W * 8k bytes) adds every worker's values into zeros, worker
// by worker, and divides by W. dgc uses the same payload.
#ifndef TF_MERGECOMP_TOPK_OP_H_
#define TF_MERGECOMP_TOPK_OP_H_

#include <cstdint>
#include <vector>

#include "cc/kernels/group_op.h"
#include "cc/kernels/payload_size.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tf_mergecomp {

class SparseGroupCodec : public GroupCodec {
 public:
  int64_t PayloadBytes(const GroupLayout&, const GroupCodecParams& params) const override {
    return payload_size::Sparse(params.k);
  }
  tensorflow::Status Decode(tensorflow::OpKernelContext* context, const uint8_t* rows,
                            int64_t num_rows, const int32_t*, const GroupLayout& layout,
                            const GroupCodecParams& params,
                            const BlockOutput& output) const override;
  bool SendsEntries() const override { return true; }
  void ForEachSent(const uint8_t* payload, const int32_t*, const GroupLayout&,
                   const GroupCodecParams& params,
                   const std::function<void(int64_t, float)>& sent) const override;
};

// Entries of a group gathered block by block, each block's in ascending flat
// order (so all of them, block after block, are in ascending order).
struct BlockCandidates {
  explicit BlockCandidates(int64_t blocks) : values(blocks), indices(blocks) {}
  int64_t total() const {
    int64_t count = 0;
    for (const auto& v : values) count += static_cast<int64_t>(v.size());
    return count;
  }
  std::vector<std::vector<float>> values;
  std::vector<std::vector<int32_t>> indices;
};

// Appends the entries of values[0, count) (flat indices flat_begin..) whose
// magnitude key is >= threshold_key (>= 1) to one block's lists. Returns
// false, having stopped early, once the block holds more than `cap` entries.
bool CollectAtLeast(const float* values, int64_t flat_begin, int64_t count,
                    uint32_t threshold_key, int64_t cap, std::vector<float>* block_values,
                    std::vector<int32_t>* block_indices);

// Writes the k largest-magnitude candidates (ties to the lower index; NaN
// as +inf) into the sparse payload's k slots in ascending index order.
// Requires candidates.total() >= k.
void EmitLargestCandidates(const BlockCandidates& candidates, int64_t k, uint8_t* payload);

// The exact top-k of a compensated group into the 8k-byte payload: the k
// largest |p| (NaN as +inf, ties to the lower index), ascending index order,
// as the plain-TF reference select them. With
// `compensate`, runs input.Compensate and selects in the same pass (a
// threshold taken from a sample of p before it, so that one compare-and-
// collect pass leaves a few more than k candidates; the radix select over the
// whole group only when that falls short); without, the compensation has run.
tensorflow::Status EncodeGroupTopk(tensorflow::OpKernelContext* context,
                                   const SparseGroupInput& input, int64_t k, bool compensate,
                                   uint8_t* payload);

// Runs fn(b) for b in [0, num_blocks) on TensorFlow's intra-op pool.
class CpuBlockRunner {
 public:
  CpuBlockRunner(tensorflow::OpKernelContext* context, int64_t cost_per_block)
      : workers_(context->device()->tensorflow_cpu_worker_threads()->workers),
        cost_per_block_(cost_per_block) {}

  template <typename Fn>
  void operator()(int64_t num_blocks, const Fn& fn) const {
    if (num_blocks <= 1) {
      for (int64_t b = 0; b < num_blocks; ++b) fn(b);
      return;
    }
    workers_->ParallelFor(num_blocks, cost_per_block_, [&fn](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) fn(b);
    });
  }

 private:
  tensorflow::thread::ThreadPool* workers_;
  int64_t cost_per_block_;
};

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_TOPK_OP_H_
