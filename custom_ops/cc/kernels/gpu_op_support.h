// What the GPU op kernels (group_op_gpu.cc, powersgd_op_gpu.cc) share: the
// op's stream, a launcher's error code as a Status, the device copy for
// LockedStateVariables::Acquire, and one step's tables in pinned host memory
// copied to the device with one asynchronous copy, the pinned buffer held
// until the stream has passed the copy (TensorFlow's EventMgr, as its own
// GpuDeviceArrayOnHost does: no host callback on the stream).
//
// For GOOGLE_CUDA builds only; a kernel file defines EIGEN_USE_GPU before any
// TensorFlow header and includes this one inside its own #if GOOGLE_CUDA.
#ifndef TF_MERGECOMP_GPU_OP_SUPPORT_H_
#define TF_MERGECOMP_GPU_OP_SUPPORT_H_

#if GOOGLE_CUDA
#ifndef EIGEN_USE_GPU
#define EIGEN_USE_GPU
#endif

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "cc/kernels/group_gpu_launchers.h"
#include "cc/kernels/state_variables.h"
#include "tensorflow/core/common_runtime/device/device_event_mgr.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tf_mergecomp {

using tensorflow::AllocatorAttributes;
using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;

inline cudaStream_t StreamOf(OpKernelContext* context) {
  return context->eigen_device<Eigen::GpuDevice>().stream();
}

inline Status LauncherStatus(const char* what, int code) {
  if (code == 0) return tensorflow::OkStatus();
  return tensorflow::errors::Internal(what, ": ", mergecomp_group_error_string(code));
}

// A state variable still shared with a reader, copied on the stream before
// an exclusive update (LockedStateVariables::Acquire's copy).
inline LockedStateVariables::DeviceCopy DeviceCopyOn(cudaStream_t stream) {
  return [stream](void* to, const void* from, size_t bytes) {
    const cudaError_t error = cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream);
    return error == cudaSuccess ? tensorflow::OkStatus()
                                : tensorflow::errors::Internal("copying a state variable: ",
                                                               cudaGetErrorString(error));
  };
}

// One step's tables: 8-byte words (int64 values or device pointers) filled
// on the host in a pinned buffer from TensorFlow's allocator, then copied to
// the device with one asynchronous copy on the op's stream; the pinned
// buffer is released by TensorFlow's EventMgr once the stream has passed
// the copy.
class PinnedTables {
 public:
  // what: the tables in error messages ("the group's tables").
  explicit PinnedTables(std::string what) : what_(std::move(what)) {}

  // Words [Reserve(n), + n); all reserved before Allocate.
  int64_t Reserve(int64_t words) {
    const int64_t start = words_;
    words_ += words;
    return start;
  }

  // The buffers, the host's zeroed.
  Status Allocate(OpKernelContext* context) {
    const int64_t bytes = 8 * (words_ > 0 ? words_ : 1);
    AllocatorAttributes pinned;
    pinned.set_on_host(true);
    pinned.set_gpu_compatible(true);
    TF_RETURN_IF_ERROR(
        context->allocate_temp(tensorflow::DT_INT8, TensorShape({bytes}), &host_, pinned));
    TF_RETURN_IF_ERROR(
        context->allocate_temp(tensorflow::DT_INT8, TensorShape({bytes}), &device_));
    memset(host_.data(), 0, bytes);
    return tensorflow::OkStatus();
  }

  int64_t* host(int64_t word) { return static_cast<int64_t*>(host_.data()) + word; }
  template <typename T>
  T* device(int64_t word) const {
    return reinterpret_cast<T*>(static_cast<int64_t*>(const_cast<Tensor&>(device_).data()) +
                                word);
  }
  void set_pointer(int64_t word, const void* pointer) {
    memcpy(host(word), &pointer, sizeof(pointer));
  }

  // Queues the copy to the device on the op's stream; the pinned buffer is
  // held (a reference in an EventMgr callback) until the stream has passed it.
  Status CopyToDevice(OpKernelContext* context, cudaStream_t stream) {
    const auto* device_info = context->device()->tensorflow_accelerator_device_info();
    auto* device_context = context->op_device_context();
    if (device_info == nullptr || device_info->event_mgr == nullptr ||
        device_context == nullptr || device_context->stream() == nullptr) {
      return tensorflow::errors::Internal("copying ", what_,
                                          ": the op has no GPU stream and event manager");
    }
    const cudaError_t copied = cudaMemcpyAsync(device_.data(), host_.data(), host_.TotalBytes(),
                                               cudaMemcpyHostToDevice, stream);
    if (copied != cudaSuccess) {
      return tensorflow::errors::Internal("copying ", what_, " to the device: ",
                                          cudaGetErrorString(copied));
    }
    const Tensor held = host_;  // a reference to the pinned buffer
    device_info->event_mgr->ThenExecute(device_context->stream(), [held]() {});
    return tensorflow::OkStatus();
  }

 private:
  std::string what_;
  int64_t words_ = 0;
  Tensor host_;
  Tensor device_;
};

}  // namespace tf_mergecomp

#endif  // GOOGLE_CUDA
#endif  // TF_MERGECOMP_GPU_OP_SUPPORT_H_
