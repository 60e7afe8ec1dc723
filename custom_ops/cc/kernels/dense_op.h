// The OpKernel classes of the dense codecs, generic over the codec's functor.
//
// An encode functor F provides
//   static int64_t PayloadBytes(int64_t n, int64_t levels);
//   void operator()(OpKernelContext*, const float* input, int64_t n, int64_t seed,
//                   int64_t levels, uint8_t* payload);
// and a decode functor
//   static int64_t RowBytes(int64_t n, int64_t levels);
//   void operator()(OpKernelContext*, const uint8_t* payload, int64_t world_size,
//                   int64_t n, int64_t levels, float* output);
// (codecs without a seed or levels ignore those arguments). Functors are
// specialised per device: CPU in <codec>_op.cc, GPU in <codec>_op_gpu.cu.cc.
#ifndef TF_MERGECOMP_DENSE_OP_H_
#define TF_MERGECOMP_DENSE_OP_H_

#include <cstdint>

#include "cc/kernels/dense_bits.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_mergecomp {

template <typename Functor>
class DenseEncodeOp : public tensorflow::OpKernel {
 public:
  explicit DenseEncodeOp(tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    if (context->HasAttr("levels")) OP_REQUIRES_OK(context, context->GetAttr("levels", &levels_));
  }

  void Compute(tensorflow::OpKernelContext* context) override {
    const tensorflow::Tensor& input = context->input(0);
    OP_REQUIRES(context, tensorflow::TensorShapeUtils::IsVector(input.shape()),
                tensorflow::errors::InvalidArgument("input must be 1-D, got shape ",
                                                    input.shape().DebugString()));
    int64_t seed = 0;
    if (context->num_inputs() > 1) {
      const tensorflow::Tensor& seed_tensor = context->input(1);
      OP_REQUIRES(context, tensorflow::TensorShapeUtils::IsScalar(seed_tensor.shape()),
                  tensorflow::errors::InvalidArgument("seed must be a scalar"));
      seed = seed_tensor.scalar<int64_t>()();
    }
    const int64_t n = input.dim_size(0);
    tensorflow::Tensor* payload = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, tensorflow::TensorShape({Functor::PayloadBytes(n, levels_)}),
                                &payload));
    Functor()(context, input.flat<float>().data(), n, seed, levels_,
              payload->flat<uint8_t>().data());
  }

 private:
  int64_t levels_ = 0;
};

template <typename Functor>
class DenseDecodeOp : public tensorflow::OpKernel {
 public:
  explicit DenseDecodeOp(tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("n", &n_));
    if (context->HasAttr("levels")) OP_REQUIRES_OK(context, context->GetAttr("levels", &levels_));
  }

  void Compute(tensorflow::OpKernelContext* context) override {
    const tensorflow::Tensor& payload = context->input(0);
    const int64_t row_bytes = Functor::RowBytes(n_, levels_);
    OP_REQUIRES(context,
                payload.dims() == 2 && payload.dim_size(0) >= 1 &&
                    payload.dim_size(1) == row_bytes,
                tensorflow::errors::InvalidArgument(
                    "payload must have shape [world_size >= 1, ", row_bytes, "] for n = ", n_,
                    ", got ", payload.shape().DebugString()));
    tensorflow::Tensor* output = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, tensorflow::TensorShape({n_}), &output));
    Functor()(context, payload.flat<uint8_t>().data(), payload.dim_size(0), n_, levels_,
              output->flat<float>().data());
  }

 private:
  int64_t n_ = 0;
  int64_t levels_ = 0;
};

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_DENSE_OP_H_
