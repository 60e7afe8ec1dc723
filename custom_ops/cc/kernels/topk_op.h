// Top-k sparsification: functors shared by the CPU and CUDA kernels.
//
// Payload of k slots (8k bytes, little-endian): k float32 values, then k int32
// indices, in ascending index order. MergecompSparseScatterMean decodes W such
// payloads concatenated (W * 8k bytes): it adds every worker's values into
// zeros, worker by worker, and divides by W. dgc uses the same payload.
#ifndef TF_MERGECOMP_TOPK_OP_H_
#define TF_MERGECOMP_TOPK_OP_H_

#include <cstdint>

#include "cc/kernels/group_op.h"
#include "cc/kernels/payload_size.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tf_mergecomp {

template <typename Device>
struct TopkEncodeFunctor {
  // Selects the k largest |input| (NaN as +inf; ties to the lower index).
  tensorflow::Status operator()(tensorflow::OpKernelContext* context, const float* input,
                                int64_t n, int64_t k, uint8_t* payload);
};

template <typename Device>
struct SparseScatterMeanFunctor {
  tensorflow::Status operator()(tensorflow::OpKernelContext* context, const uint8_t* payloads,
                                int64_t workers, int64_t k, int64_t n, float* output);
};

// The group codecs sending k slots of the group's flat space (topk, dgc):
// their payload size and decode (CPU, in topk_op.cc).
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
