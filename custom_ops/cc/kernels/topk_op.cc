// CPU kernels of MergecompTopkEncode and MergecompSparseScatterMean.
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif
#include "cc/kernels/topk_op.h"

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
using CPUDevice = Eigen::ThreadPoolDevice;

template <>
Status TopkEncodeFunctor<CPUDevice>::operator()(OpKernelContext* context, const float* input,
                                                int64_t n, int64_t k, uint8_t* payload) {
  if (k == 0) return tensorflow::OkStatus();
  CpuBlockRunner run(context, sparse::MakeBlocks(n).size * 4);
  auto key = [input](int64_t i) { return sparse::MagnitudeKey(input[i]); };
  float* values = sparse::PayloadValues(payload);
  int32_t* indices = sparse::PayloadIndices(payload, k);
  sparse::SelectAndEmitLargest(
      n, k, key,
      [&](int64_t i, int64_t position) {
        values[position] = input[i];
        indices[position] = static_cast<int32_t>(i);
      },
      run);
  return tensorflow::OkStatus();
}

template <>
Status SparseScatterMeanFunctor<CPUDevice>::operator()(OpKernelContext* context,
                                                       const uint8_t* payloads, int64_t workers,
                                                       int64_t k, int64_t n, float* output) {
  std::fill(output, output + n, 0.0f);
  // Worker by worker, slot by slot: the same summation order as the
  // reference's tensor_scatter_nd_add over the concatenated updates.
  for (int64_t w = 0; w < workers; ++w) {
    const uint8_t* payload = payloads + w * 8 * k;
    float values_buffer;
    int32_t index;
    for (int64_t j = 0; j < k; ++j) {
      std::memcpy(&values_buffer, payload + 4 * j, 4);
      std::memcpy(&index, payload + 4 * k + 4 * j, 4);
      if (index < 0 || index >= n) {
        return tensorflow::errors::InvalidArgument("sparse payload of worker ", w,
                                                   " holds index ", index,
                                                   " outside [0, ", n, ")");
      }
      output[index] += values_buffer;
    }
  }
  if (workers > 1) {
    const float divisor = static_cast<float>(workers);
    for (int64_t i = 0; i < n; ++i) output[i] /= divisor;
  }
  return tensorflow::OkStatus();
}

template <typename Device>
class TopkEncodeOp : public OpKernel {
 public:
  explicit TopkEncodeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("k", &k_));
    OP_REQUIRES(context, k_ >= 0, tensorflow::errors::InvalidArgument("k must be >= 0"));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    OP_REQUIRES(context, input.dims() == 1,
                tensorflow::errors::InvalidArgument("input must be 1-D"));
    const int64_t n = input.dim_size(0);
    OP_REQUIRES(context, k_ <= n,
                tensorflow::errors::InvalidArgument("k = ", k_, " exceeds n = ", n));
    OP_REQUIRES(context, n <= INT32_MAX,
                tensorflow::errors::InvalidArgument("n must fit int32 indices"));
    Tensor* payload = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({8 * k_}), &payload));
    OP_REQUIRES_OK(context, TopkEncodeFunctor<Device>()(context, input.flat<float>().data(), n,
                                                        k_, payload->flat<uint8_t>().data()));
  }

 private:
  int64_t k_;
};

template <typename Device>
class SparseScatterMeanOp : public OpKernel {
 public:
  explicit SparseScatterMeanOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("n", &n_));
    OP_REQUIRES_OK(context, context->GetAttr("k", &k_));
    OP_REQUIRES(context, n_ >= 0 && k_ >= 0 && k_ <= n_,
                tensorflow::errors::InvalidArgument("need 0 <= k <= n"));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& collected = context->input(0);
    OP_REQUIRES(context, collected.dims() == 1,
                tensorflow::errors::InvalidArgument("collected payloads must be 1-D"));
    const int64_t bytes = collected.dim_size(0);
    int64_t workers = 0;
    if (k_ > 0) {
      OP_REQUIRES(context, bytes % (8 * k_) == 0,
                  tensorflow::errors::InvalidArgument("collected payloads hold ", bytes,
                                                      " bytes, not a multiple of 8k = ", 8 * k_));
      workers = bytes / (8 * k_);
    }
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({n_}), &output));
    OP_REQUIRES_OK(context, SparseScatterMeanFunctor<Device>()(
                                context, collected.flat<uint8_t>().data(), workers, k_, n_,
                                output->flat<float>().data()));
  }

 private:
  int64_t n_;
  int64_t k_;
};

REGISTER_KERNEL_BUILDER(Name("MergecompTopkEncode").Device(tensorflow::DEVICE_CPU),
                        TopkEncodeOp<CPUDevice>);
REGISTER_KERNEL_BUILDER(Name("MergecompSparseScatterMean").Device(tensorflow::DEVICE_CPU),
                        SparseScatterMeanOp<CPUDevice>);

Status SparseGroupCodec::Decode(OpKernelContext* context, const uint8_t* rows, int64_t num_rows,
                                const int32_t*, const GroupLayout& layout,
                                const GroupCodecParams& params, const BlockOutput& output) const {
  return WriteThroughContiguous(context, layout.total(), output, [&](float* values) {
    return SparseScatterMeanFunctor<CPUDevice>()(context, rows, num_rows, params.k,
                                                 layout.total(), values);
  });
}

void SparseGroupCodec::ForEachSent(const uint8_t* payload, const int32_t*, const GroupLayout&,
                                   const GroupCodecParams& params,
                                   const std::function<void(int64_t, float)>& sent) const {
  const float* values = reinterpret_cast<const float*>(payload);
  const int32_t* indices = reinterpret_cast<const int32_t*>(payload + 4 * params.k);
  for (int64_t slot = 0; slot < params.k; ++slot) sent(indices[slot], values[slot]);
}

class TopkGroupCodec : public SparseGroupCodec {
 public:
  Status Encode(OpKernelContext* context, const BlockInput& input, const GroupLayout& layout,
                const GroupCodecParams& params, int64_t, uint8_t* payload,
                int32_t*) const override {
    const float* values = input.Contiguous();
    return TopkEncodeFunctor<CPUDevice>()(context, values, layout.total(), params.k, payload);
  }
};
REGISTER_GROUP_CODEC("topk", TopkGroupCodec);

#if GOOGLE_CUDA
using GPUDevice = Eigen::GpuDevice;
// Specialised in topk_op_gpu.cu.cc.
template <>
Status TopkEncodeFunctor<GPUDevice>::operator()(OpKernelContext* context, const float* input,
                                                int64_t n, int64_t k, uint8_t* payload);
template <>
Status SparseScatterMeanFunctor<GPUDevice>::operator()(OpKernelContext* context,
                                                       const uint8_t* payloads, int64_t workers,
                                                       int64_t k, int64_t n, float* output);
REGISTER_KERNEL_BUILDER(Name("MergecompTopkEncode").Device(tensorflow::DEVICE_GPU),
                        TopkEncodeOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("MergecompSparseScatterMean").Device(tensorflow::DEVICE_GPU),
                        SparseScatterMeanOp<GPUDevice>);
#endif  // GOOGLE_CUDA

}  // namespace tf_mergecomp
