// LockedStateVariables (see state_variables.h).
#include "cc/kernels/state_variables.h"

#include <algorithm>
#include <cstring>

#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_mergecomp {

tensorflow::Status LockedStateVariables::Acquire(tensorflow::OpKernelContext* context,
                                                 const std::vector<int64_t>& expected_sizes,
                                                 const std::string& layout_hint, bool exclusive,
                                                 const DeviceCopy* device_copy) {
  exclusive_ = exclusive;
  int first, end;
  TF_RETURN_IF_ERROR(context->op_kernel().InputRange("state", &first, &end));
  const int count = end - first;
  if (count != static_cast<int>(expected_sizes.size())) {
    return tensorflow::errors::InvalidArgument("expected ", expected_sizes.size(),
                                               " state variables (one per tensor), got ", count);
  }
  variables_.resize(count);
  for (int i = 0; i < count; ++i) {
    TF_RETURN_IF_ERROR(tensorflow::LookupResource(
        context, tensorflow::HandleFromInput(context, first + i), &variables_[i]));
  }
  std::vector<tensorflow::Var*> order;
  for (auto& variable : variables_) order.push_back(variable.get());
  std::sort(order.begin(), order.end());
  order.erase(std::unique(order.begin(), order.end()), order.end());
  if (order.size() != variables_.size()) {
    return tensorflow::errors::InvalidArgument("a state variable is passed twice");
  }
  for (auto* variable : order) {
    if (exclusive_) {
      variable->mu()->lock();
    } else {
      variable->mu()->lock_shared();
    }
    locked_.push_back(variable);
  }
  buffers_.resize(count);
  for (int i = 0; i < count; ++i) {
    tensorflow::Tensor* tensor = variables_[i]->tensor();
    if (!variables_[i]->is_initialized || tensor->dtype() != tensorflow::DT_FLOAT ||
        tensor->NumElements() != expected_sizes[i]) {
      return tensorflow::errors::InvalidArgument(
          "state variable ", i, " must be an initialized float32 variable of ",
          expected_sizes[i], " elements (", layout_hint, "), got ",
          tensorflow::DataTypeString(tensor->dtype()), " ", tensor->shape().DebugString());
    }
    if (exclusive_ && !variables_[i]->copy_on_read_mode.load() && !tensor->RefCountIsOne()) {
      tensorflow::Tensor copy;
      TF_RETURN_IF_ERROR(context->allocate_temp(tensorflow::DT_FLOAT, tensor->shape(), &copy));
      if (device_copy != nullptr) {
        TF_RETURN_IF_ERROR((*device_copy)(copy.data(), tensor->data(), tensor->TotalBytes()));
      } else {
        memcpy(copy.data(), tensor->data(), tensor->TotalBytes());
      }
      *tensor = copy;
    }
    buffers_[i] = tensor->flat<float>().data();
  }
  return tensorflow::OkStatus();
}

LockedStateVariables::~LockedStateVariables() {
  for (auto* variable : locked_) {
    if (exclusive_) {
      variable->mu()->unlock();
    } else {
      variable->mu()->unlock_shared();
    }
  }
}

}  // namespace tf_mergecomp
