// CUDA kernels of MergecompPowersgdPadReshape and MergecompPowersgdOrthonormalize.
//
// Framework-free entry points (raw device pointers, a cudaStream_t):
//   int mergecomp_powersgd_pad_reshape_launch(const float* input, int64_t n, int64_t total,
//                                             float* output, cudaStream_t);
//   int mergecomp_powersgd_orthonormalize_launch(const float* input, int64_t rows,
//                                                int64_t rank, float* output, cudaStream_t);
// Returns the cudaError_t of the last launch. Algorithm: powersgd_op.h (one
// thread block; dot products reduced in double in shared memory).
#include <cuda_runtime.h>

#include <cstdint>

namespace tf_mergecomp {
namespace {

constexpr int kThreads = 256;
constexpr double kMinNorm = 1e-30;  // kPowersgdMinNorm in powersgd_op.h

__global__ void PadKernel(const float* input, int64_t n, int64_t total, float* output) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    output[i] = i < n ? input[i] : 0.0f;
  }
}

__device__ double BlockSum(double value, double* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) scratch[threadIdx.x] += scratch[threadIdx.x + stride];
    __syncthreads();
  }
  const double total = scratch[0];
  __syncthreads();
  return total;
}

__global__ void OrthonormalizeKernel(float* m, int64_t rows, int64_t rank) {
  __shared__ double scratch[kThreads];
  for (int64_t j = 0; j < rank; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t p = 0; p < j; ++p) {
        double dot = 0.0;
        for (int64_t i = threadIdx.x; i < rows; i += kThreads) {
          dot += static_cast<double>(m[i * rank + p]) * m[i * rank + j];
        }
        const float projection = static_cast<float>(BlockSum(dot, scratch));
        for (int64_t i = threadIdx.x; i < rows; i += kThreads) {
          m[i * rank + j] -= projection * m[i * rank + p];
        }
        __syncthreads();
      }
    }
    double squares = 0.0;
    for (int64_t i = threadIdx.x; i < rows; i += kThreads) {
      squares += static_cast<double>(m[i * rank + j]) * m[i * rank + j];
    }
    const double norm = sqrt(BlockSum(squares, scratch));
    const float scale = norm > kMinNorm ? static_cast<float>(1.0 / norm) : 0.0f;
    for (int64_t i = threadIdx.x; i < rows; i += kThreads) m[i * rank + j] *= scale;
    __syncthreads();
  }
}

int GridFor(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 4096 ? 4096 : blocks));
}

}  // namespace
}  // namespace tf_mergecomp

extern "C" int mergecomp_powersgd_pad_reshape_launch(const float* input, int64_t n,
                                                     int64_t total, float* output,
                                                     cudaStream_t stream) {
  if (total > 0) {
    tf_mergecomp::PadKernel<<<tf_mergecomp::GridFor(total), 256, 0, stream>>>(input, n, total,
                                                                            output);
  }
  return static_cast<int>(cudaGetLastError());
}

extern "C" int mergecomp_powersgd_orthonormalize_launch(const float* input, int64_t rows,
                                                        int64_t rank, float* output,
                                                        cudaStream_t stream) {
  if (rows * rank == 0) return 0;
  if (output != input) {
    cudaMemcpyAsync(output, input, sizeof(float) * rows * rank, cudaMemcpyDeviceToDevice,
                    stream);
  }
  tf_mergecomp::OrthonormalizeKernel<<<1, tf_mergecomp::kThreads, 0, stream>>>(output, rows,
                                                                               rank);
  return static_cast<int>(cudaGetLastError());
}

#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#include "cc/kernels/powersgd_op.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_mergecomp {

template <>
void PowersgdPadReshapeFunctor<Eigen::GpuDevice>::operator()(
    tensorflow::OpKernelContext* context, const float* input, int64_t n, int64_t total,
    float* output) {
  mergecomp_powersgd_pad_reshape_launch(input, n, total, output,
                                        context->eigen_gpu_device().stream());
}

template <>
void PowersgdOrthonormalizeFunctor<Eigen::GpuDevice>::operator()(
    tensorflow::OpKernelContext* context, const float* input, int64_t rows, int64_t rank,
    float* output) {
  mergecomp_powersgd_orthonormalize_launch(input, rows, rank, output,
                                           context->eigen_gpu_device().stream());
}

}  // namespace tf_mergecomp
#endif  // GOOGLE_CUDA
