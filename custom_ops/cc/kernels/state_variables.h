// The per-tensor state variables of the group kernels (error-feedback
// buffers, PowerSGD's Q): resource variable inputs updated in place, as
// TensorFlow's fused ResourceApply* optimizer kernels update theirs.
#ifndef TF_MERGECOMP_STATE_VARIABLES_H_
#define TF_MERGECOMP_STATE_VARIABLES_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/types.h"

namespace tf_mergecomp {

// Calls fn(T()) with T the C++ type of a float dtype.
template <typename Fn>
void DispatchFloatType(tensorflow::DataType dtype, const Fn& fn) {
  switch (dtype) {
    case tensorflow::DT_HALF: return fn(Eigen::half());
    case tensorflow::DT_BFLOAT16: return fn(Eigen::bfloat16());
    case tensorflow::DT_FLOAT: return fn(float());
    case tensorflow::DT_DOUBLE: return fn(double());
    default: return;  // the ops' type constraints admit no other dtype
  }
}

// The float32 state variables passed to a kernel as the list input "state",
// locked for the kernel's duration in address order (so two kernels sharing
// variables cannot deadlock): exclusively to update them, each then with a
// buffer of its own (one still shared with a tensor that read the variable
// earlier is copied first), or shared to read them.
class LockedStateVariables {
 public:
  // Copies bytes between two buffers of the kernel's device (a GPU kernel's
  // asynchronous copy on its stream); null: memcpy (host memory).
  using DeviceCopy = std::function<tensorflow::Status(void*, const void*, size_t)>;

  // expected_sizes[i]: the elements variable i must hold; layout_hint names
  // what they are, for the error message.
  tensorflow::Status Acquire(tensorflow::OpKernelContext* context,
                             const std::vector<int64_t>& expected_sizes,
                             const std::string& layout_hint, bool exclusive,
                             const DeviceCopy* copy = nullptr);
  ~LockedStateVariables();

  // Variable i's buffer; nullptr when there are no variables.
  float* buffer(int64_t i) const { return buffers_.empty() ? nullptr : buffers_[i]; }

 private:
  bool exclusive_ = false;
  std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>> variables_;
  std::vector<tensorflow::Var*> locked_;
  std::vector<float*> buffers_;
};

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_STATE_VARIABLES_H_
