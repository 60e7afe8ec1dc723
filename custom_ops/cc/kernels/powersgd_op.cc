// CPU kernels of MergecompPowersgdPadReshape and MergecompPowersgdOrthonormalize.
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif
#include "cc/kernels/powersgd_op.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_mergecomp {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using CPUDevice = Eigen::ThreadPoolDevice;

template <>
void PowersgdPadReshapeFunctor<CPUDevice>::operator()(OpKernelContext* context,
                                                      const float* input, int64_t n,
                                                      int64_t total, float* output) {
  std::memcpy(output, input, sizeof(float) * n);
  std::fill(output + n, output + total, 0.0f);
}

template <>
void PowersgdOrthonormalizeFunctor<CPUDevice>::operator()(OpKernelContext* context,
                                                          const float* input, int64_t rows,
                                                          int64_t rank, float* output) {
  std::memcpy(output, input, sizeof(float) * rows * rank);
  for (int64_t j = 0; j < rank; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t p = 0; p < j; ++p) {
        double dot = 0.0;
        for (int64_t i = 0; i < rows; ++i) {
          dot += static_cast<double>(output[i * rank + p]) * output[i * rank + j];
        }
        const float projection = static_cast<float>(dot);
        for (int64_t i = 0; i < rows; ++i) output[i * rank + j] -= projection * output[i * rank + p];
      }
    }
    double squares = 0.0;
    for (int64_t i = 0; i < rows; ++i) {
      squares += static_cast<double>(output[i * rank + j]) * output[i * rank + j];
    }
    const double norm = std::sqrt(squares);
    // A NaN norm also takes the zero scale, and NaN * 0 keeps the NaN: NaN
    // inputs propagate rather than vanish.
    const float scale = norm > kPowersgdMinNorm ? static_cast<float>(1.0 / norm) : 0.0f;
    for (int64_t i = 0; i < rows; ++i) output[i * rank + j] *= scale;
  }
}

template <typename Device>
class PowersgdPadReshapeOp : public OpKernel {
 public:
  explicit PowersgdPadReshapeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("rows", &rows_));
    OP_REQUIRES_OK(context, context->GetAttr("cols", &cols_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    OP_REQUIRES(context, input.dims() == 1,
                tensorflow::errors::InvalidArgument("input must be 1-D"));
    const int64_t n = input.dim_size(0);
    OP_REQUIRES(context, n <= rows_ * cols_,
                tensorflow::errors::InvalidArgument(n, " values do not fit a ", rows_, " x ",
                                                    cols_, " matrix"));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({rows_, cols_}), &output));
    PowersgdPadReshapeFunctor<Device>()(context, input.flat<float>().data(), n, rows_ * cols_,
                                        output->flat<float>().data());
  }

 private:
  int64_t rows_;
  int64_t cols_;
};

template <typename Device>
class PowersgdOrthonormalizeOp : public OpKernel {
 public:
  explicit PowersgdOrthonormalizeOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    OP_REQUIRES(context, input.dims() == 2,
                tensorflow::errors::InvalidArgument("matrix must be 2-D"));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, input.shape(), &output));
    PowersgdOrthonormalizeFunctor<Device>()(context, input.flat<float>().data(),
                                            input.dim_size(0), input.dim_size(1),
                                            output->flat<float>().data());
  }
};

REGISTER_KERNEL_BUILDER(Name("MergecompPowersgdPadReshape").Device(tensorflow::DEVICE_CPU),
                        PowersgdPadReshapeOp<CPUDevice>);
REGISTER_KERNEL_BUILDER(Name("MergecompPowersgdOrthonormalize").Device(tensorflow::DEVICE_CPU),
                        PowersgdOrthonormalizeOp<CPUDevice>);

#if GOOGLE_CUDA
using GPUDevice = Eigen::GpuDevice;
// Specialised in powersgd_op_gpu.cu.cc.
template <>
void PowersgdPadReshapeFunctor<GPUDevice>::operator()(OpKernelContext* context,
                                                      const float* input, int64_t n,
                                                      int64_t total, float* output);
template <>
void PowersgdOrthonormalizeFunctor<GPUDevice>::operator()(OpKernelContext* context,
                                                          const float* input, int64_t rows,
                                                          int64_t rank, float* output);
REGISTER_KERNEL_BUILDER(Name("MergecompPowersgdPadReshape").Device(tensorflow::DEVICE_GPU),
                        PowersgdPadReshapeOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("MergecompPowersgdOrthonormalize").Device(tensorflow::DEVICE_GPU),
                        PowersgdOrthonormalizeOp<GPUDevice>);
#endif  // GOOGLE_CUDA

}  // namespace tf_mergecomp
