// float32 <-> float16 functors of the fp16 codec.
#ifndef TF_MERGECOMP_FP16_OP_H_
#define TF_MERGECOMP_FP16_OP_H_

#include <cstdint>

#include "tensorflow/core/framework/op_kernel.h"

namespace tf_mergecomp {

// Halves are passed as their IEEE binary16 bit patterns.
template <typename Device>
struct Fp16EncodeFunctor {
  void operator()(tensorflow::OpKernelContext* context, const float* input, int64_t n,
                  uint16_t* output);
};

template <typename Device>
struct Fp16DecodeFunctor {
  void operator()(tensorflow::OpKernelContext* context, const uint16_t* input, int64_t n,
                  float* output);
};

template <typename Device>
class Fp16EncodeOp : public tensorflow::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tensorflow::OpKernelContext* context) override {
    const tensorflow::Tensor& input = context->input(0);
    tensorflow::Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, input.shape(), &output));
    Fp16EncodeFunctor<Device>()(context, input.flat<float>().data(), input.NumElements(),
                                reinterpret_cast<uint16_t*>(output->flat<Eigen::half>().data()));
  }
};

template <typename Device>
class Fp16DecodeOp : public tensorflow::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tensorflow::OpKernelContext* context) override {
    const tensorflow::Tensor& input = context->input(0);
    tensorflow::Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, input.shape(), &output));
    Fp16DecodeFunctor<Device>()(
        context, reinterpret_cast<const uint16_t*>(input.flat<Eigen::half>().data()),
        input.NumElements(), output->flat<float>().data());
  }
};

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_FP16_OP_H_
