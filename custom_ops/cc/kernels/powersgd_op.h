// PowerSGD over a merged group, one low-rank matrix per tensor (Vogels,
// Karimireddy & Jaggi 2019; tf_mergecomp/compressors/powersgd.py has the
// algorithm). Three CPU kernels surround the group's two allreduces:
//
//   MergecompPowersgdGroupP       M_i = g_i (+ e_i); P_i = M_i Q_i
//                                 -> the P payload, and the low-rank M_i as a
//                                 flat scratch buffer
//   (allreduce-mean of the P payload)
//   MergecompPowersgdGroupQ       P_i <- orthonormalise(P_i); Qlocal_i = M_i^T P_i
//   (allreduce-mean of the Q payload)
//   MergecompPowersgdGroupFinish  out_i = P_i Qmean_i^T; Q_i <- Qmean_i;
//                                 e_i <- M_i - P_i Qlocal_i^T
//
// Tensor i of rank >= 2 with n_i > 0 is the rows_i x cols_i row-major matrix
// with cols_i = its last dimension (TensorFlow's kernel layouts put output
// channels last) and effective rank r_i = min(rank, rows_i, cols_i). Other
// tensors (rank <= 1, or empty) are sent as they are.
//
// Buffers (float32, tensors in group order):
//   compensated  M_i (n_i each) of every low-rank tensor;
//   P payload    P_i (rows_i x r_i) of every low-rank tensor, then the raw
//                values M_i of every other tensor (written there directly);
//   Q payload    Q_i (cols_i x r_i) of every low-rank tensor;
//   state i      one resource variable per tensor: [e_i (n_i, only with the
//                residual memory), Q_i (cols_i x r_i, only if low-rank)].
#ifndef TF_MERGECOMP_POWERSGD_OP_H_
#define TF_MERGECOMP_POWERSGD_OP_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "cc/kernels/state_variables.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tf_mergecomp {

// Gram-Schmidt leaves a column whose norm after projection is below this at
// zero, so a rank-deficient (or all-zero) P stays finite.
constexpr double kPowersgdMinNorm = 1e-30;

struct PowersgdTensor {
  int64_t size = 0;        // n_i
  bool low_rank = false;   // compressed as a matrix
  int64_t rows = 0;        // the matrix view and its effective rank; 0 when not low-rank
  int64_t cols = 0;
  int64_t rank = 0;
  int64_t m_offset = 0;    // in the compensated buffer; 0 when not low-rank
  int64_t p_offset = 0;    // in the P payload: P_i, or the raw values
  int64_t q_offset = 0;    // in the Q payload
};

class PowersgdGroupLayout {
 public:
  // dims: every tensor's dimensions (fully known); rank: the requested rank.
  PowersgdGroupLayout(const std::vector<std::vector<int64_t>>& dims, int64_t rank) {
    tensors_.resize(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) {
      PowersgdTensor& t = tensors_[i];
      t.size = 1;
      for (int64_t d : dims[i]) t.size *= d;
      t.low_rank = dims[i].size() >= 2 && t.size > 0;
      if (t.low_rank) {
        t.cols = dims[i].back();
        t.rows = t.size / t.cols;
        t.rank = std::min(rank, std::min(t.rows, t.cols));
      }
      if (t.low_rank) {
        t.m_offset = compensated_size_;
        compensated_size_ += t.size;
        t.p_offset = p_size_;
        p_size_ += t.rows * t.rank;
        t.q_offset = q_size_;
        q_size_ += t.cols * t.rank;
      }
    }
    // Uncompressed values follow every P_i.
    p_size_with_values_ = p_size_;
    for (PowersgdTensor& t : tensors_) {
      if (t.low_rank) continue;
      t.p_offset = p_size_with_values_;
      p_size_with_values_ += t.size;
    }
  }

  int64_t num_tensors() const { return static_cast<int64_t>(tensors_.size()); }
  const PowersgdTensor& tensor(int64_t i) const { return tensors_[i]; }
  int64_t compensated_size() const { return compensated_size_; }
  int64_t p_payload_size() const { return p_size_with_values_; }
  int64_t q_payload_size() const { return q_size_; }

  // Floats of tensor i's state variable, and where its Q starts in it.
  int64_t state_size(int64_t i, bool residual) const {
    const PowersgdTensor& t = tensors_[i];
    return q_state_offset(i, residual) + t.cols * t.rank;
  }
  int64_t q_state_offset(int64_t i, bool residual) const {
    return residual ? tensors_[i].size : 0;
  }

 private:
  std::vector<PowersgdTensor> tensors_;
  int64_t compensated_size_ = 0;
  int64_t p_size_ = 0;
  int64_t p_size_with_values_ = 0;
  int64_t q_size_ = 0;
};

// What the CPU kernels (powersgd_op.cc) and the GPU kernels
// (powersgd_op_gpu.cc) share around the layout; defined in powersgd_op.cc,
// which every build compiles.

// Every gradient's dimensions, as PowersgdGroupLayout takes them.
std::vector<std::vector<int64_t>> PowersgdGradientDims(const tensorflow::OpInputList& gradients);

// The attributes of the P op: rank and residual.
struct PowersgdPAttrs {
  int64_t rank = 1;
  bool residual = false;

  tensorflow::Status Read(tensorflow::OpKernelConstruction* context);
};

// The attributes of the Q and Finish ops: rank, and the layout of `shapes`
// (fully defined, kept in `shapes`); Finish also has residual and T.
struct PowersgdShapesAttrs {
  int64_t rank = 1;
  std::vector<tensorflow::TensorShape> shapes;
  std::unique_ptr<PowersgdGroupLayout> layout;

  tensorflow::Status Read(tensorflow::OpKernelConstruction* context);

 protected:
  // shapes and layout, from `shapes` and rank.
  tensorflow::Status ReadShapes(tensorflow::OpKernelConstruction* context);
};

struct PowersgdFinishAttrs : PowersgdShapesAttrs {
  bool residual = false;
  std::vector<tensorflow::DataType> dtypes;

  // rank, residual, T, then shapes, which must be as many as T.
  tensorflow::Status Read(tensorflow::OpKernelConstruction* context);
};

// The base of the CPU and GPU kernels: the op's attributes (one of the
// structs above), read at construction.
template <typename Attrs>
class PowersgdKernel : public tensorflow::OpKernel {
 public:
  explicit PowersgdKernel(tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, attrs_.Read(context));
  }

 protected:
  Attrs attrs_;
};

// The P op's outputs: the P payload (0) and the compensated buffer M (1).
tensorflow::Status PowersgdAllocatePOutputs(tensorflow::OpKernelContext* context,
                                            const PowersgdGroupLayout& layout,
                                            tensorflow::Tensor** p, tensorflow::Tensor** m);

// The Q op's inputs p_mean (0) and compensated (1) checked against the
// layout, and its outputs: P (0, p_mean's shape) and Qlocal (1).
tensorflow::Status PowersgdQInputsAndOutputs(tensorflow::OpKernelContext* context,
                                             const PowersgdGroupLayout& layout,
                                             tensorflow::Tensor** p, tensorflow::Tensor** q);

// The Finish op's inputs p_orthonormal, q_local, q_mean and compensated
// (0 to 3) checked against the layout.
tensorflow::Status PowersgdCheckFinishInputs(tensorflow::OpKernelContext* context,
                                             const PowersgdGroupLayout& layout);

// The Finish op's outputs: the gradients (shapes) and nonfinite.
tensorflow::Status PowersgdAllocateFinishOutputs(tensorflow::OpKernelContext* context,
                                                 const PowersgdShapesAttrs& attrs,
                                                 std::vector<tensorflow::Tensor*>* gradients,
                                                 tensorflow::Tensor** nonfinite);

// Locks the group's state variables (the layout above); the engine may pass
// none when no tensor of the group keeps anything. copy: as
// LockedStateVariables::Acquire's (the GPU kernels' device copy).
tensorflow::Status PowersgdAcquireState(tensorflow::OpKernelContext* context,
                                        const PowersgdGroupLayout& layout, bool residual,
                                        bool exclusive, LockedStateVariables* state,
                                        const LockedStateVariables::DeviceCopy* copy = nullptr);

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_POWERSGD_OP_H_
