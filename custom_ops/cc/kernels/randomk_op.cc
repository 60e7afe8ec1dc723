// CPU kernel of MergecompRandomkIndices (algorithm in randomk_op.h).
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif
#include "cc/kernels/randomk_op.h"

#include <algorithm>

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
using CPUDevice = Eigen::ThreadPoolDevice;

template <>
Status RandomkIndicesFunctor<CPUDevice>::operator()(OpKernelContext* context, int64_t seed,
                                                    int64_t n, int64_t k, int32_t* indices) {
  if (k == 0) return tensorflow::OkStatus();
  const SeedKey seed_key = MakeSeedKey(seed);
  auto key = [seed_key](int64_t i) { return RandomBits(seed_key, static_cast<uint32_t>(i)); };
  CpuBlockRunner run(context, sparse::MakeBlocks(n).size * 8);
  sparse::SelectAndEmitLargest(
      n, k, key,
      [indices](int64_t i, int64_t position) { indices[position] = static_cast<int32_t>(i); },
      run);
  return tensorflow::OkStatus();
}

template <typename Device>
class RandomkIndicesOp : public OpKernel {
 public:
  explicit RandomkIndicesOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("n", &n_));
    OP_REQUIRES_OK(context, context->GetAttr("k", &k_));
    OP_REQUIRES(context, k_ <= n_ && n_ <= INT32_MAX,
                tensorflow::errors::InvalidArgument("need 0 <= k <= n <= 2^31 - 1"));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& seed = context->input(0);
    OP_REQUIRES(context, seed.dims() == 0,
                tensorflow::errors::InvalidArgument("seed must be a scalar"));
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({k_}), &indices));
    OP_REQUIRES_OK(context, RandomkIndicesFunctor<Device>()(context, seed.scalar<int64_t>()(), n_,
                                                            k_, indices->flat<int32_t>().data()));
  }

 private:
  int64_t n_;
  int64_t k_;
};

REGISTER_KERNEL_BUILDER(Name("MergecompRandomkIndices").Device(tensorflow::DEVICE_CPU),
                        RandomkIndicesOp<CPUDevice>);

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

  void ForEachSent(const uint8_t* payload, const int32_t* positions, const GroupLayout& layout,
                   const GroupCodecParams& params,
                   const std::function<void(int64_t, float)>& sent) const override {
    const float* values = reinterpret_cast<const float*>(payload);
    int64_t slot = 0;
    for (int64_t i = 0; i < layout.num_tensors(); ++i) {
      const float scale = Scale(layout, params, i);
      for (int64_t end = slot + params.tensor_k[i]; slot < end; ++slot) {
        sent(positions[slot], params.scale ? values[slot] * scale : values[slot]);
      }
    }
  }

  Status Encode(OpKernelContext* context, const BlockInput& compensated, const GroupLayout& layout,
                const GroupCodecParams& params, int64_t seed, uint8_t* payload,
                int32_t* positions) const override {
    TF_RETURN_IF_ERROR(CheckTensorK(layout, params));
    const float* input = compensated.Contiguous();
    float* values = reinterpret_cast<float*>(payload);
    int64_t slot = 0;
    for (int64_t i = 0; i < layout.num_tensors(); ++i) {
      const int64_t k = params.tensor_k[i];
      TF_RETURN_IF_ERROR(RandomkIndicesFunctor<CPUDevice>()(context, TensorSeed(seed, i),
                                                            layout.size(i), k, positions + slot));
      for (int64_t end = slot + k; slot < end; ++slot) {
        positions[slot] += static_cast<int32_t>(layout.offset(i));
        values[slot] = input[positions[slot]];
      }
    }
    return tensorflow::OkStatus();
  }

  Status Decode(OpKernelContext* context, const uint8_t* rows, int64_t, const int32_t* positions,
                const GroupLayout& layout, const GroupCodecParams& params,
                const BlockOutput& block_output) const override {
    TF_RETURN_IF_ERROR(CheckTensorK(layout, params));
    return WriteThroughContiguous(context, layout.total(), block_output, [&](float* output) {
      return Scatter(reinterpret_cast<const float*>(rows), positions, layout, params, output);
    });
  }

 private:
  static Status Scatter(const float* values, const int32_t* positions, const GroupLayout& layout,
                        const GroupCodecParams& params, float* output) {
    std::fill(output, output + layout.total(), 0.0f);
    int64_t slot = 0;
    for (int64_t i = 0; i < layout.num_tensors(); ++i) {
      const float scale = Scale(layout, params, i);
      for (int64_t end = slot + params.tensor_k[i]; slot < end; ++slot) {
        output[positions[slot]] = params.scale ? values[slot] * scale : values[slot];
      }
    }
    return tensorflow::OkStatus();
  }

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

#if GOOGLE_CUDA
using GPUDevice = Eigen::GpuDevice;
// Specialised in randomk_op_gpu.cu.cc.
template <>
Status RandomkIndicesFunctor<GPUDevice>::operator()(OpKernelContext* context, int64_t seed,
                                                    int64_t n, int64_t k, int32_t* indices);
REGISTER_KERNEL_BUILDER(Name("MergecompRandomkIndices").Device(tensorflow::DEVICE_GPU).HostMemory("seed"),
                        RandomkIndicesOp<GPUDevice>);
#endif  // GOOGLE_CUDA

}  // namespace tf_mergecomp
