// GPU kernels of MergecompPowersgdGroupP, MergecompPowersgdGroupQ and
// MergecompPowersgdGroupFinish (ops in cc/ops/powersgd_ops.cc; CPU kernels
// in powersgd_op.cc). They call the CUDA launchers of
// powersgd_gpu_launchers.h (powersgd_op_gpu.cu.cc) on the op's stream:
//
//   P       compensation M = g (+ e) with the cast to float32, the state's Q_i
//           packed, P_i = M_i Q_i (one grouped product);
//   Q       Gram-Schmidt on every P_i (one block per matrix), Qlocal_i =
//           M_i^T P_i (one grouped product);
//   Finish  flags, P_i Qmean_i^T cast into each gradient's dtype, residual
//           and Q updated in the state variables.
//
// Each step is a few launches for the whole group, never one per tensor.
// The products are the grouped launcher's, not cuBLAS per tensor: that
// would be one launch, with its fixed cost, per tensor, the per-tensor cost
// MergeComp exists to remove, and with ranks of 1 to 4 the products are
// memory-bound (one pass over M for a few flops per element), where a GEMM
// library gains nothing over streaming dot products.
//
// Per step, the group's layout tables (offsets, shapes, dtypes) and its
// pointer tables are packed into one buffer of pinned host memory from
// TensorFlow's allocator and copied to the device with one asynchronous copy
// on the op's stream, released by a host callback once the stream has passed
// it (gpu_op_support.h's PinnedTables, as in group_op_gpu.cc). Nothing waits
// for the stream; the state variables' buffers are on the device.
//
// Compiled only with GOOGLE_CUDA (setup.py, CUDA builds).
#if GOOGLE_CUDA
#define EIGEN_USE_GPU

#include <cstdint>
#include <memory>
#include <vector>

#include "cc/kernels/gpu_op_support.h"
#include "cc/kernels/group_gpu_launchers.h"
#include "cc/kernels/powersgd_gpu_launchers.h"
#include "cc/kernels/powersgd_op.h"
#include "cc/kernels/state_variables.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tf_mergecomp {
namespace {

int64_t CastKind(DataType dtype) {
  switch (dtype) {
    case tensorflow::DT_HALF: return MERGECOMP_CAST_HALF;
    case tensorflow::DT_BFLOAT16: return MERGECOMP_CAST_BFLOAT16;
    case tensorflow::DT_DOUBLE: return MERGECOMP_CAST_DOUBLE;
    default: return 0;  // float32
  }
}

// The group's layout as MergecompPowersgdGpuGroup tables. Reserve, then
// (after the tables' Allocate) Fill, then Group.
class GroupTables {
 public:
  GroupTables(const PowersgdGroupLayout& layout, bool residual, PinnedTables* tables)
      : layout_(layout), residual_(residual), tables_(tables) {
    const int64_t n = layout.num_tensors();
    offsets_ = tables->Reserve(n + 1);
    m_offsets_ = tables->Reserve(n);
    p_offsets_ = tables->Reserve(n);
    q_offsets_ = tables->Reserve(n + 1);
    cols_ = tables->Reserve(n);
    ranks_ = tables->Reserve(n);
    kinds_ = tables->Reserve(n);
    gradients_ = tables->Reserve(n);
    outputs_ = tables->Reserve(n);
    state_ = tables->Reserve(n);
  }

  // dtypes: the gradients' (empty: all float32); the pointers: null or one per tensor.
  void Fill(const std::vector<DataType>& dtypes, const std::vector<const void*>& gradients,
            const std::vector<void*>& outputs, const LockedStateVariables* state) {
    const int64_t n = layout_.num_tensors();
    int64_t q_offset = 0;
    tables_->host(offsets_)[0] = 0;
    for (int64_t i = 0; i < n; ++i) {
      const PowersgdTensor& t = layout_.tensor(i);
      tables_->host(offsets_)[i + 1] = tables_->host(offsets_)[i] + t.size;
      tables_->host(m_offsets_)[i] = t.m_offset;
      tables_->host(p_offsets_)[i] = t.p_offset;
      // Not low-rank: an empty range where the next Q would start.
      tables_->host(q_offsets_)[i] = t.low_rank ? t.q_offset : q_offset;
      if (t.low_rank) q_offset = t.q_offset + t.cols * t.rank;
      tables_->host(cols_)[i] = t.low_rank ? t.cols : 0;
      tables_->host(ranks_)[i] = t.low_rank ? t.rank : 0;
      tables_->host(kinds_)[i] = dtypes.empty() ? 0 : CastKind(dtypes[i]);
      if (!gradients.empty()) tables_->set_pointer(gradients_ + i, gradients[i]);
      if (!outputs.empty()) tables_->set_pointer(outputs_ + i, outputs[i]);
      if (state != nullptr) tables_->set_pointer(state_ + i, state->buffer(i));
    }
    tables_->host(q_offsets_)[n] = q_offset;
    has_gradients_ = !gradients.empty();
    has_outputs_ = !outputs.empty();
    // The table, even of null buffers (no variables): the launchers read
    // only the buffers of tensors that keep state.
    has_state_ = state != nullptr;
  }

  MergecompPowersgdGpuGroup Group() const {
    MergecompPowersgdGpuGroup group;
    group.num_tensors = layout_.num_tensors();
    group.residual = residual_ ? 1 : 0;
    group.host_offsets = tables_->host(offsets_);
    group.host_q_size = layout_.q_payload_size();
    group.offsets = tables_->device<const int64_t>(offsets_);
    group.m_offsets = tables_->device<const int64_t>(m_offsets_);
    group.p_offsets = tables_->device<const int64_t>(p_offsets_);
    group.q_offsets = tables_->device<const int64_t>(q_offsets_);
    group.cols = tables_->device<const int64_t>(cols_);
    group.ranks = tables_->device<const int64_t>(ranks_);
    group.kinds = tables_->device<const int64_t>(kinds_);
    group.gradients = has_gradients_ ? tables_->device<const void* const>(gradients_) : nullptr;
    group.outputs = has_outputs_ ? tables_->device<void* const>(outputs_) : nullptr;
    group.state = has_state_ ? tables_->device<float* const>(state_) : nullptr;
    return group;
  }

 private:
  const PowersgdGroupLayout& layout_;
  bool residual_;
  PinnedTables* tables_;
  int64_t offsets_, m_offsets_, p_offsets_, q_offsets_, cols_, ranks_, kinds_;
  int64_t gradients_, outputs_, state_;
  bool has_gradients_ = false, has_outputs_ = false, has_state_ = false;
};

// The grouped product over the low-rank tensors: P_i = M_i Q_i (kP) or
// Qlocal_i = M_i^T P_i (kQLocal), as MergecompGpuMatrices tables.
enum class Product { kP, kQLocal };

class MatrixTables {
 public:
  MatrixTables(const PowersgdGroupLayout& layout, Product product, PinnedTables* tables)
      : layout_(layout), product_(product), tables_(tables) {
    for (int64_t i = 0; i < layout.num_tensors(); ++i) count_ += layout.tensor(i).low_rank;
    c_offsets_ = tables->Reserve(count_ + 1);
    m_ = tables->Reserve(count_);
    k_ = tables->Reserve(count_);
    r_ = tables->Reserve(count_);
    a_offsets_ = tables->Reserve(count_);
    b_offsets_ = tables->Reserve(count_);
  }

  void Fill() {
    int64_t c = 0;
    for (int64_t i = 0; i < layout_.num_tensors(); ++i) {
      const PowersgdTensor& t = layout_.tensor(i);
      if (!t.low_rank) continue;
      const bool p = product_ == Product::kP;
      // P_i = M_i Q_i: (rows x cols)(cols x r) at the P payload's offsets;
      // Qlocal_i = M_i^T P_i: (cols x rows)(rows x r), M_i stored rows x cols.
      tables_->host(m_)[c] = p ? t.rows : t.cols;
      tables_->host(k_)[c] = p ? t.cols : t.rows;
      tables_->host(r_)[c] = t.rank;
      tables_->host(a_offsets_)[c] = t.m_offset;
      tables_->host(b_offsets_)[c] = p ? t.q_offset : t.p_offset;
      tables_->host(c_offsets_)[c] = p ? t.p_offset : t.q_offset;
      const int64_t entries = (p ? t.rows : t.cols) * t.rank;
      tables_->host(c_offsets_)[c + 1] = tables_->host(c_offsets_)[c] + entries;
      ++c;
    }
  }

  MergecompGpuMatrices Matrices() const {
    return MergecompGpuMatrices{count_,
                                tables_->host(c_offsets_),
                                tables_->device<const int64_t>(c_offsets_),
                                tables_->device<const int64_t>(m_),
                                tables_->device<const int64_t>(k_),
                                tables_->device<const int64_t>(r_),
                                tables_->device<const int64_t>(a_offsets_),
                                tables_->device<const int64_t>(b_offsets_)};
  }

 private:
  const PowersgdGroupLayout& layout_;
  Product product_;
  PinnedTables* tables_;
  int64_t count_ = 0;
  int64_t c_offsets_, m_, k_, r_, a_offsets_, b_offsets_;
};

class PowersgdGroupPGpuOp : public PowersgdKernel<PowersgdPAttrs> {
 public:
  using PowersgdKernel::PowersgdKernel;

  void Compute(OpKernelContext* context) override {
    tensorflow::OpInputList gradients;
    OP_REQUIRES_OK(context, context->input_list("gradients", &gradients));
    std::vector<DataType> dtypes;
    std::vector<const void*> pointers;
    for (const Tensor& g : gradients) {
      dtypes.push_back(g.dtype());
      pointers.push_back(g.data());
    }
    const PowersgdGroupLayout layout(PowersgdGradientDims(gradients), attrs_.rank);
    const cudaStream_t stream = StreamOf(context);
    const LockedStateVariables::DeviceCopy copy = DeviceCopyOn(stream);
    LockedStateVariables state;
    OP_REQUIRES_OK(context, PowersgdAcquireState(context, layout, attrs_.residual,
                                                 /*exclusive=*/false, &state, &copy));

    Tensor* p_tensor = nullptr;
    Tensor* m_tensor = nullptr;
    OP_REQUIRES_OK(context, PowersgdAllocatePOutputs(context, layout, &p_tensor, &m_tensor));
    Tensor q_packed;
    OP_REQUIRES_OK(context, context->allocate_temp(
                                tensorflow::DT_FLOAT, TensorShape({layout.q_payload_size()}),
                                &q_packed));

    PinnedTables tables("PowerSGD's tables");
    GroupTables group_tables(layout, attrs_.residual, &tables);
    MatrixTables matrix_tables(layout, Product::kP, &tables);
    OP_REQUIRES_OK(context, tables.Allocate(context));
    group_tables.Fill(dtypes, pointers, {}, &state);
    matrix_tables.Fill();
    OP_REQUIRES_OK(context, tables.CopyToDevice(context, stream));
    const MergecompPowersgdGpuGroup group = group_tables.Group();
    const MergecompGpuMatrices matrices = matrix_tables.Matrices();
    float* p = p_tensor->flat<float>().data();
    float* m = m_tensor->flat<float>().data();
    float* q = q_packed.flat<float>().data();
    OP_REQUIRES_OK(context, LauncherStatus("MergecompPowersgdGroupP (GPU): the Q state",
                                           mergecomp_powersgd_gather_q_gpu(&group, q, stream)));
    OP_REQUIRES_OK(context,
                   LauncherStatus("MergecompPowersgdGroupP (GPU): the compensation",
                                  mergecomp_powersgd_compensate_gpu(&group, m, p, stream)));
    OP_REQUIRES_OK(context, LauncherStatus("MergecompPowersgdGroupP (GPU): P = M Q",
                                           mergecomp_grouped_matmul_gpu(&matrices, m, 0, q, p,
                                                                        stream)));
  }
};

class PowersgdGroupQGpuOp : public PowersgdKernel<PowersgdShapesAttrs> {
 public:
  using PowersgdKernel::PowersgdKernel;

  void Compute(OpKernelContext* context) override {
    const PowersgdGroupLayout& layout = *attrs_.layout;
    const Tensor& p_mean = context->input(0);
    const Tensor& compensated = context->input(1);
    Tensor* p_tensor = nullptr;
    Tensor* q_tensor = nullptr;
    OP_REQUIRES_OK(context, PowersgdQInputsAndOutputs(context, layout, &p_tensor, &q_tensor));
    float* p = p_tensor->flat<float>().data();
    const cudaStream_t stream = StreamOf(context);
    if (layout.p_payload_size() > 0 && p != p_mean.flat<float>().data()) {
      const cudaError_t copied =
          cudaMemcpyAsync(p, p_mean.flat<float>().data(), sizeof(float) * layout.p_payload_size(),
                          cudaMemcpyDeviceToDevice, stream);
      OP_REQUIRES(context, copied == cudaSuccess,
                  tensorflow::errors::Internal("MergecompPowersgdGroupQ (GPU): copying P: ",
                                               cudaGetErrorString(copied)));
    }

    PinnedTables tables("PowerSGD's tables");
    GroupTables group_tables(layout, /*residual=*/false, &tables);
    MatrixTables matrix_tables(layout, Product::kQLocal, &tables);
    OP_REQUIRES_OK(context, tables.Allocate(context));
    group_tables.Fill({}, {}, {}, nullptr);
    matrix_tables.Fill();
    OP_REQUIRES_OK(context, tables.CopyToDevice(context, stream));
    const MergecompPowersgdGpuGroup group = group_tables.Group();
    const MergecompGpuMatrices matrices = matrix_tables.Matrices();
    OP_REQUIRES_OK(context, LauncherStatus("MergecompPowersgdGroupQ (GPU): Gram-Schmidt",
                                           mergecomp_powersgd_orthonormalize_gpu(&group, p,
                                                                                 stream)));
    OP_REQUIRES_OK(context,
                   LauncherStatus("MergecompPowersgdGroupQ (GPU): Qlocal = M^T P",
                                  mergecomp_grouped_matmul_gpu(
                                      &matrices, compensated.flat<float>().data(), 1, p,
                                      q_tensor->flat<float>().data(), stream)));
  }
};

class PowersgdGroupFinishGpuOp : public PowersgdKernel<PowersgdFinishAttrs> {
 public:
  using PowersgdKernel::PowersgdKernel;

  void Compute(OpKernelContext* context) override {
    const PowersgdGroupLayout& layout = *attrs_.layout;
    const Tensor& p_tensor = context->input(0);
    const Tensor& q_local = context->input(1);
    const Tensor& q_mean = context->input(2);
    const Tensor& m_tensor = context->input(3);
    OP_REQUIRES_OK(context, PowersgdCheckFinishInputs(context, layout));
    const cudaStream_t stream = StreamOf(context);
    const LockedStateVariables::DeviceCopy copy = DeviceCopyOn(stream);
    LockedStateVariables state;
    OP_REQUIRES_OK(context, PowersgdAcquireState(context, layout, attrs_.residual,
                                                 /*exclusive=*/true, &state, &copy));
    std::vector<Tensor*> tensors;
    Tensor* nonfinite = nullptr;
    OP_REQUIRES_OK(context, PowersgdAllocateFinishOutputs(context, attrs_, &tensors, &nonfinite));
    std::vector<void*> out;
    for (Tensor* tensor : tensors) out.push_back(tensor->data());

    PinnedTables tables("PowerSGD's tables");
    GroupTables group_tables(layout, attrs_.residual, &tables);
    OP_REQUIRES_OK(context, tables.Allocate(context));
    group_tables.Fill(attrs_.dtypes, {}, out, &state);
    OP_REQUIRES_OK(context, tables.CopyToDevice(context, stream));
    const MergecompPowersgdGpuGroup group = group_tables.Group();
    OP_REQUIRES_OK(context, LauncherStatus("MergecompPowersgdGroupFinish (GPU)",
                                           mergecomp_powersgd_finish_gpu(
                                               &group, p_tensor.flat<float>().data(),
                                               q_local.flat<float>().data(),
                                               q_mean.flat<float>().data(),
                                               m_tensor.flat<float>().data(),
                                               nonfinite->flat<int32_t>().data(), stream)));
  }
};

}  // namespace

// No type constraint on T: the kernels take every gradient dtype the ops
// declare (float16, bfloat16, float32, float64). The state resource handles
// are host memory, their buffers on the device; nonfinite stays on the device.
REGISTER_KERNEL_BUILDER(Name("MergecompPowersgdGroupP").Device(tensorflow::DEVICE_GPU),
                        PowersgdGroupPGpuOp);
REGISTER_KERNEL_BUILDER(Name("MergecompPowersgdGroupQ").Device(tensorflow::DEVICE_GPU),
                        PowersgdGroupQGpuOp);
REGISTER_KERNEL_BUILDER(Name("MergecompPowersgdGroupFinish").Device(tensorflow::DEVICE_GPU),
                        PowersgdGroupFinishGpuOp);

}  // namespace tf_mergecomp

#endif  // GOOGLE_CUDA
