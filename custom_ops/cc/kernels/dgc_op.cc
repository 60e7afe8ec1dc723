// CPU kernel of MergecompDgcEncode (algorithm in dgc_op.h).
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif
#include "cc/kernels/dgc_op.h"

#include <algorithm>
#include <array>
#include <functional>
#include <vector>

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
using CPUDevice = Eigen::ThreadPoolDevice;

namespace {

float KeyToFloat(uint32_t key) {
  float value;
  std::memcpy(&value, &key, sizeof(value));
  return value;
}

}  // namespace

template <>
Status DgcEncodeFunctor<CPUDevice>::operator()(OpKernelContext* context, const float* input,
                                               int64_t n, int64_t seed, int64_t k,
                                               int64_t sample_size, uint8_t* payload) {
  if (k == 0) return tensorflow::OkStatus();
  const SeedKey seed_key = MakeSeedKey(seed);
  std::vector<float> sample(sample_size);
  for (int64_t j = 0; j < sample_size; ++j) {
    const uint64_t bits = RandomBits(seed_key, static_cast<uint32_t>(j));
    const int64_t position = static_cast<int64_t>((bits * static_cast<uint64_t>(n)) >> 32);
    sample[j] = KeyToFloat(sparse::MagnitudeKey(input[position]));
  }
  const int64_t rank = DgcSampleRank(n, k, sample_size);
  std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(),
                   std::greater<float>());
  float threshold = sample[rank - 1];

  const sparse::Blocks blocks = sparse::MakeBlocks(n);
  CpuBlockRunner run(context, blocks.size * 2);
  auto key = [input](int64_t i) { return sparse::MagnitudeKey(input[i]); };
  // The candidates at the sampled threshold and at each refinement (halved
  // up to kDgcRefinements times) are counted in one pass over the input;
  // the first that reaches k wins, as refining one count at a time would.
  constexpr int kThresholds = kDgcRefinements + 1;
  float thresholds[kThresholds];
  uint32_t threshold_keys[kThresholds];
  for (int r = 0; r < kThresholds; ++r) {
    thresholds[r] = r == 0 ? threshold : thresholds[r - 1] * 0.5f;
    threshold_keys[r] = sparse::MagnitudeKey(thresholds[r]);
  }
  std::vector<std::array<int64_t, kThresholds>> block_counts(blocks.count);
  run(blocks.count, [&](int64_t b) {
    std::array<int64_t, kThresholds> counts{};
    for (int64_t i = blocks.begin(b), e = blocks.end(b); i < e; ++i) {
      const uint32_t k_i = key(i);
      for (int r = 0; r < kThresholds; ++r) counts[r] += k_i >= threshold_keys[r];
    }
    block_counts[b] = counts;
  });
  int64_t candidates = 0;
  for (int r = 0; r < kThresholds; ++r) {
    candidates = 0;
    for (const auto& counts : block_counts) candidates += counts[r];
    threshold = thresholds[r];
    if (candidates >= k) break;
  }

  float* values = sparse::PayloadValues(payload);
  int32_t* indices = sparse::PayloadIndices(payload, k);
  const uint32_t threshold_key = sparse::MagnitudeKey(threshold);
  // ">= threshold" is "> threshold_key - 1", or everything when the key is 0.
  const sparse::Selection all_candidates =
      threshold_key == 0 ? sparse::Selection{0, n} : sparse::Selection{threshold_key - 1, 0};
  if (candidates <= k) {
    sparse::EmitSelected(
        n, all_candidates, key,
        [&](int64_t i, int64_t position) {
          values[position] = input[i];
          indices[position] = static_cast<int32_t>(i);
        },
        run);
    std::fill(values + candidates, values + k, 0.0f);
    std::fill(indices + candidates, indices + k, 0);
    return tensorflow::OkStatus();
  }
  // More candidates than slots: the k largest of them, which (all candidates
  // being larger than all others) is the exact top-k.
  std::vector<uint32_t> candidate_keys(candidates);
  std::vector<int32_t> candidate_indices(candidates);
  sparse::EmitSelected(
      n, all_candidates, key,
      [&](int64_t i, int64_t position) {
        candidate_keys[position] = key(i);
        candidate_indices[position] = static_cast<int32_t>(i);
      },
      run);
  auto candidate_key = [&candidate_keys](int64_t j) { return candidate_keys[j]; };
  CpuBlockRunner candidate_run(context, sparse::MakeBlocks(candidates).size * 4);
  const sparse::Selection selection =
      sparse::SelectLargest(candidates, k, candidate_key, candidate_run);
  sparse::EmitSelected(
      candidates, selection, candidate_key,
      [&](int64_t j, int64_t position) {
        const int32_t i = candidate_indices[j];
        values[position] = input[i];
        indices[position] = i;
      },
      candidate_run);
  return tensorflow::OkStatus();
}

template <typename Device>
class DgcEncodeOp : public OpKernel {
 public:
  explicit DgcEncodeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("k", &k_));
    OP_REQUIRES_OK(context, context->GetAttr("sample_size", &sample_size_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    const Tensor& seed = context->input(1);
    OP_REQUIRES(context, input.dims() == 1,
                tensorflow::errors::InvalidArgument("input must be 1-D"));
    OP_REQUIRES(context, seed.dims() == 0,
                tensorflow::errors::InvalidArgument("seed must be a scalar"));
    const int64_t n = input.dim_size(0);
    OP_REQUIRES(context, k_ <= n,
                tensorflow::errors::InvalidArgument("k = ", k_, " exceeds n = ", n));
    OP_REQUIRES(context, n <= INT32_MAX,
                tensorflow::errors::InvalidArgument("n must fit int32 indices"));
    Tensor* payload = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({8 * k_}), &payload));
    OP_REQUIRES_OK(context,
                   DgcEncodeFunctor<Device>()(context, input.flat<float>().data(), n,
                                              seed.scalar<int64_t>()(), k_, sample_size_,
                                              payload->flat<uint8_t>().data()));
  }

 private:
  int64_t k_;
  int64_t sample_size_;
};

REGISTER_KERNEL_BUILDER(Name("MergecompDgcEncode").Device(tensorflow::DEVICE_CPU).HostMemory("seed"),
                        DgcEncodeOp<CPUDevice>);

class DgcGroupCodec : public SparseGroupCodec {
 public:
  Status Encode(OpKernelContext* context, const BlockInput& input, const GroupLayout& layout,
                const GroupCodecParams& params, int64_t seed, uint8_t* payload,
                int32_t*) const override {
    const float* values = input.Contiguous();
    return DgcEncodeFunctor<CPUDevice>()(context, values, layout.total(), seed, params.k,
                                         params.sample_size, payload);
  }
};
REGISTER_GROUP_CODEC("dgc", DgcGroupCodec);

#if GOOGLE_CUDA
using GPUDevice = Eigen::GpuDevice;
// Specialised in dgc_op_gpu.cu.cc.
template <>
Status DgcEncodeFunctor<GPUDevice>::operator()(OpKernelContext* context, const float* input,
                                               int64_t n, int64_t seed, int64_t k,
                                               int64_t sample_size, uint8_t* payload);
REGISTER_KERNEL_BUILDER(Name("MergecompDgcEncode").Device(tensorflow::DEVICE_GPU).HostMemory("seed"),
                        DgcEncodeOp<GPUDevice>);
#endif  // GOOGLE_CUDA

}  // namespace tf_mergecomp
