// fp16 CUDA kernels: round-to-nearest-even float32 -> float16 and back.
#include <cuda_fp16.h>

#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/dense_gpu_launchers.h"

namespace tf_mergecomp {
namespace {

__global__ void ToHalfKernel(const float* input, int64_t n, uint16_t* output) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    output[i] = __half_as_ushort(__float2half_rn(input[i]));
  }
}

__global__ void FromHalfKernel(const uint16_t* input, int64_t n, float* output) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    output[i] = __half2float(__ushort_as_half(input[i]));
  }
}

}  // namespace
}  // namespace tf_mergecomp

using tf_mergecomp::gpu::GridFor;
using tf_mergecomp::gpu::kThreads;

extern "C" int mergecomp_fp16_encode_gpu(const float* input, int64_t n, uint16_t* output,
                                         void* stream) {
  if (n == 0) return 0;
  tf_mergecomp::ToHalfKernel<<<GridFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      input, n, output);
  return tf_mergecomp::gpu::ErrorCode();
}

extern "C" int mergecomp_fp16_decode_gpu(const uint16_t* input, int64_t n, float* output,
                                         void* stream) {
  if (n == 0) return 0;
  tf_mergecomp::FromHalfKernel<<<GridFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      input, n, output);
  return tf_mergecomp::gpu::ErrorCode();
}

#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#include "cc/kernels/fp16_op.h"

namespace tf_mergecomp {

using GPUDevice = Eigen::GpuDevice;

template <>
void Fp16EncodeFunctor<GPUDevice>::operator()(tensorflow::OpKernelContext* context,
                                              const float* input, int64_t n, uint16_t* output) {
  const int error =
      mergecomp_fp16_encode_gpu(input, n, output, context->eigen_device<GPUDevice>().stream());
  OP_REQUIRES(context, error == 0,
              tensorflow::errors::Internal("fp16 encode: ", cudaGetErrorString(cudaError_t(error))));
}

template <>
void Fp16DecodeFunctor<GPUDevice>::operator()(tensorflow::OpKernelContext* context,
                                              const uint16_t* input, int64_t n, float* output) {
  const int error =
      mergecomp_fp16_decode_gpu(input, n, output, context->eigen_device<GPUDevice>().stream());
  OP_REQUIRES(context, error == 0,
              tensorflow::errors::Internal("fp16 decode: ", cudaGetErrorString(cudaError_t(error))));
}

REGISTER_KERNEL_BUILDER(Name("MergecompFp16Encode").Device(tensorflow::DEVICE_GPU),
                        Fp16EncodeOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("MergecompFp16Decode").Device(tensorflow::DEVICE_GPU),
                        Fp16DecodeOp<GPUDevice>);

}  // namespace tf_mergecomp
#endif  // GOOGLE_CUDA
