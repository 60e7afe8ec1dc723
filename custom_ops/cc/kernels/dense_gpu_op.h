// TensorFlow side of the dense codecs' GPU kernels: the GPU functors in
// <codec>_op_gpu.cu.cc call their codec's extern "C" launcher (see
// dense_gpu_launchers.h) through these helpers. Included only under
// GOOGLE_CUDA, after EIGEN_USE_GPU is defined.
#ifndef TF_MERGECOMP_DENSE_GPU_OP_H_
#define TF_MERGECOMP_DENSE_GPU_OP_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/kernels/dense_gpu.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_mergecomp {

using GPUDevice = Eigen::GpuDevice;

namespace gpu {

// Calls launch(stream) with the op's CUDA stream (as void*) and fails the op
// with Internal("<what>: <CUDA error string>") when the launcher returns a
// nonzero cudaError_t.
template <typename Launch>
void RunLauncher(tensorflow::OpKernelContext* context, const char* what, Launch launch) {
  void* stream = context->eigen_device<GPUDevice>().stream();
  const int error = launch(stream);
  OP_REQUIRES(context, error == 0,
              tensorflow::errors::Internal(what, ": ", cudaGetErrorString(cudaError_t(error))));
}

// RunLauncher for launchers that take reduction scratch: calls
// launch(scratch, stream) with kScratchBytes of temporary device memory.
template <typename Launch>
void RunLauncherWithScratch(tensorflow::OpKernelContext* context, const char* what,
                            Launch launch) {
  tensorflow::Tensor scratch;
  OP_REQUIRES_OK(context, context->allocate_temp(tensorflow::DT_UINT8,
                                                 tensorflow::TensorShape({kScratchBytes}),
                                                 &scratch));
  void* scratch_data = scratch.flat<uint8_t>().data();
  RunLauncher(context, what, [&](void* stream) { return launch(scratch_data, stream); });
}

}  // namespace gpu
}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_DENSE_GPU_OP_H_
