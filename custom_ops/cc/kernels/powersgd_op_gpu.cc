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
// it (as group_op_gpu.cc does). Nothing waits for the stream; the state
// variables' buffers are on the device.
//
// Compiled only with GOOGLE_CUDA (setup.py, CUDA builds).
#if GOOGLE_CUDA
#define EIGEN_USE_GPU

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

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

using tensorflow::AllocatorAttributes;
using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;

cudaStream_t StreamOf(OpKernelContext* context) {
  return context->eigen_device<Eigen::GpuDevice>().stream();
}

Status LauncherStatus(const char* what, int code) {
  if (code == 0) return tensorflow::OkStatus();
  return tensorflow::errors::Internal(what, ": ", mergecomp_group_error_string(code));
}

int64_t CastKind(DataType dtype) {
  switch (dtype) {
    case tensorflow::DT_HALF: return MERGECOMP_CAST_HALF;
    case tensorflow::DT_BFLOAT16: return MERGECOMP_CAST_BFLOAT16;
    case tensorflow::DT_DOUBLE: return MERGECOMP_CAST_DOUBLE;
    default: return 0;  // float32
  }
}

// One step's tables: 8-byte words (int64 values or device pointers) filled
// on the host in a pinned buffer, then copied to the device at once.
class PinnedTables {
 public:
  // Words [Reserve(n), + n); all reserved before Allocate.
  int64_t Reserve(int64_t words) {
    const int64_t start = words_;
    words_ += words;
    return start;
  }

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

  Status CopyToDevice(cudaStream_t stream) {
    const cudaError_t copied = cudaMemcpyAsync(device_.data(), host_.data(), host_.TotalBytes(),
                                               cudaMemcpyHostToDevice, stream);
    if (copied != cudaSuccess) {
      return tensorflow::errors::Internal("copying PowerSGD's tables to the device: ",
                                          cudaGetErrorString(copied));
    }
    auto* held = new Tensor(host_);
    const cudaError_t queued = cudaLaunchHostFunc(
        stream, [](void* tensor) { delete static_cast<Tensor*>(tensor); }, held);
    if (queued != cudaSuccess) {
      // The callback never runs: keep the buffer rather than free it under the copy.
      return tensorflow::errors::Internal("queueing the release of PowerSGD's tables: ",
                                          cudaGetErrorString(queued));
    }
    return tensorflow::OkStatus();
  }

 private:
  int64_t words_ = 0;
  Tensor host_;
  Tensor device_;
};

// The group's layout as MergecompPowersgdGpuGroup tables. Reserve, then
// (after the tables' Allocate) Fill, then Group.
class GroupTables {
 public:
  GroupTables(const PowersgdGroupLayout& layout, bool residual, PinnedTables* tables)
      : layout_(layout), residual_(residual), tables_(tables) {
    const int64_t n = layout.num_tensors();
    m_offsets_ = tables->Reserve(n + 1);
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
    for (int64_t i = 0; i < n; ++i) {
      const PowersgdTensor& t = layout_.tensor(i);
      tables_->host(m_offsets_)[i] = t.m_offset;
      tables_->host(m_offsets_)[i + 1] = t.m_offset + t.size;
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
    group.host_m_offsets = tables_->host(m_offsets_);
    group.host_q_size = layout_.q_payload_size();
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
  int64_t m_offsets_, p_offsets_, q_offsets_, cols_, ranks_, kinds_, gradients_, outputs_, state_;
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

// Locks the group's state variables as the CPU kernels do (powersgd_op.h's
// layout; none when no tensor of the group keeps anything); a variable still
// shared with a reader is copied on the device before an exclusive update.
Status AcquireState(OpKernelContext* context, const PowersgdGroupLayout& layout, bool residual,
                    bool exclusive, LockedStateVariables* state) {
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (int64_t i = 0; i < layout.num_tensors(); ++i) {
    sizes.push_back(layout.state_size(i, residual));
    total += sizes.back();
  }
  int first, end;
  TF_RETURN_IF_ERROR(context->op_kernel().InputRange("state", &first, &end));
  if (total == 0 && end == first) sizes.clear();
  const cudaStream_t stream = StreamOf(context);
  const LockedStateVariables::DeviceCopy copy = [stream](void* to, const void* from,
                                                         size_t bytes) {
    const cudaError_t error = cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream);
    return error == cudaSuccess ? tensorflow::OkStatus()
                                : tensorflow::errors::Internal("copying a state variable: ",
                                                               cudaGetErrorString(error));
  };
  return state->Acquire(context, sizes,
                        residual ? "the residual, then Q: cols x rank" : "Q: cols x rank",
                        exclusive, &copy);
}

Status LayoutFromShapesAttr(OpKernelConstruction* context, int64_t rank,
                            std::vector<TensorShape>* shapes,
                            std::unique_ptr<PowersgdGroupLayout>* layout) {
  std::vector<tensorflow::PartialTensorShape> partial;
  TF_RETURN_IF_ERROR(context->GetAttr("shapes", &partial));
  std::vector<std::vector<int64_t>> dims;
  for (const auto& shape : partial) {
    TensorShape full;
    if (!shape.AsTensorShape(&full)) {
      return tensorflow::errors::InvalidArgument("shapes must be fully defined, got ",
                                                 shape.DebugString());
    }
    shapes->push_back(full);
    const auto sizes = full.dim_sizes();
    dims.emplace_back(sizes.begin(), sizes.end());
  }
  layout->reset(new PowersgdGroupLayout(dims, rank));
  return tensorflow::OkStatus();
}

Status CheckFlat(const Tensor& tensor, const char* name, int64_t expected) {
  if (tensor.dims() != 1 || tensor.NumElements() != expected) {
    return tensorflow::errors::InvalidArgument(name, " must be a vector of ", expected,
                                               " floats for this group, got shape ",
                                               tensor.shape().DebugString());
  }
  return tensorflow::OkStatus();
}

class PowersgdGroupPGpuOp : public OpKernel {
 public:
  explicit PowersgdGroupPGpuOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("rank", &rank_));
    OP_REQUIRES_OK(context, context->GetAttr("residual", &residual_));
  }

  void Compute(OpKernelContext* context) override {
    tensorflow::OpInputList gradients;
    OP_REQUIRES_OK(context, context->input_list("gradients", &gradients));
    std::vector<std::vector<int64_t>> dims;
    std::vector<DataType> dtypes;
    std::vector<const void*> pointers;
    for (const Tensor& g : gradients) {
      const auto sizes = g.shape().dim_sizes();
      dims.emplace_back(sizes.begin(), sizes.end());
      dtypes.push_back(g.dtype());
      pointers.push_back(g.data());
    }
    const PowersgdGroupLayout layout(dims, rank_);
    LockedStateVariables state;
    OP_REQUIRES_OK(context, AcquireState(context, layout, residual_, /*exclusive=*/false, &state));

    Tensor* p_tensor = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({layout.p_payload_size()}),
                                                     &p_tensor));
    Tensor* m_tensor = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                1, TensorShape({layout.compensated_size()}), &m_tensor));
    Tensor q_packed;
    OP_REQUIRES_OK(context, context->allocate_temp(
                                tensorflow::DT_FLOAT, TensorShape({layout.q_payload_size()}),
                                &q_packed));

    PinnedTables tables;
    GroupTables group_tables(layout, residual_, &tables);
    MatrixTables matrix_tables(layout, Product::kP, &tables);
    OP_REQUIRES_OK(context, tables.Allocate(context));
    group_tables.Fill(dtypes, pointers, {}, &state);
    matrix_tables.Fill();
    const cudaStream_t stream = StreamOf(context);
    OP_REQUIRES_OK(context, tables.CopyToDevice(stream));
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

 private:
  int64_t rank_ = 1;
  bool residual_ = false;
};

class PowersgdGroupQGpuOp : public OpKernel {
 public:
  explicit PowersgdGroupQGpuOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("rank", &rank_));
    std::vector<TensorShape> shapes;
    OP_REQUIRES_OK(context, LayoutFromShapesAttr(context, rank_, &shapes, &layout_));
  }

  void Compute(OpKernelContext* context) override {
    const PowersgdGroupLayout& layout = *layout_;
    const Tensor& p_mean = context->input(0);
    const Tensor& compensated = context->input(1);
    OP_REQUIRES_OK(context, CheckFlat(p_mean, "p_mean", layout.p_payload_size()));
    OP_REQUIRES_OK(context, CheckFlat(compensated, "compensated", layout.compensated_size()));
    Tensor* p_tensor = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, p_mean.shape(), &p_tensor));
    Tensor* q_tensor = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({layout.q_payload_size()}),
                                                     &q_tensor));
    float* p = p_tensor->flat<float>().data();
    const cudaStream_t stream = StreamOf(context);
    if (layout.p_payload_size() > 0) {
      const cudaError_t copied =
          cudaMemcpyAsync(p, p_mean.flat<float>().data(), sizeof(float) * layout.p_payload_size(),
                          cudaMemcpyDeviceToDevice, stream);
      OP_REQUIRES(context, copied == cudaSuccess,
                  tensorflow::errors::Internal("MergecompPowersgdGroupQ (GPU): copying P: ",
                                               cudaGetErrorString(copied)));
    }

    PinnedTables tables;
    GroupTables group_tables(layout, /*residual=*/false, &tables);
    MatrixTables matrix_tables(layout, Product::kQLocal, &tables);
    OP_REQUIRES_OK(context, tables.Allocate(context));
    group_tables.Fill({}, {}, {}, nullptr);
    matrix_tables.Fill();
    OP_REQUIRES_OK(context, tables.CopyToDevice(stream));
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

 private:
  int64_t rank_ = 1;
  std::unique_ptr<PowersgdGroupLayout> layout_;
};

class PowersgdGroupFinishGpuOp : public OpKernel {
 public:
  explicit PowersgdGroupFinishGpuOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("rank", &rank_));
    OP_REQUIRES_OK(context, context->GetAttr("residual", &residual_));
    tensorflow::DataTypeVector dtypes;
    OP_REQUIRES_OK(context, context->GetAttr("T", &dtypes));
    dtypes_.assign(dtypes.begin(), dtypes.end());
    OP_REQUIRES_OK(context, LayoutFromShapesAttr(context, rank_, &shapes_, &layout_));
    OP_REQUIRES(context, shapes_.size() == dtypes_.size(),
                tensorflow::errors::InvalidArgument("shapes and T must have the same length, got ",
                                                    shapes_.size(), " and ", dtypes_.size()));
  }

  void Compute(OpKernelContext* context) override {
    const PowersgdGroupLayout& layout = *layout_;
    const Tensor& p_tensor = context->input(0);
    const Tensor& q_local = context->input(1);
    const Tensor& q_mean = context->input(2);
    const Tensor& m_tensor = context->input(3);
    OP_REQUIRES_OK(context, CheckFlat(p_tensor, "p_orthonormal", layout.p_payload_size()));
    OP_REQUIRES_OK(context, CheckFlat(q_local, "q_local", layout.q_payload_size()));
    OP_REQUIRES_OK(context, CheckFlat(q_mean, "q_mean", layout.q_payload_size()));
    OP_REQUIRES_OK(context, CheckFlat(m_tensor, "compensated", layout.compensated_size()));
    LockedStateVariables state;
    OP_REQUIRES_OK(context, AcquireState(context, layout, residual_, /*exclusive=*/true, &state));
    tensorflow::OpOutputList outputs;
    OP_REQUIRES_OK(context, context->output_list("gradients", &outputs));
    std::vector<void*> out(shapes_.size());
    for (size_t i = 0; i < shapes_.size(); ++i) {
      Tensor* tensor = nullptr;
      OP_REQUIRES_OK(context, outputs.allocate(i, shapes_[i], &tensor));
      out[i] = tensor->data();
    }
    Tensor* nonfinite = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                "nonfinite", TensorShape({layout.num_tensors()}), &nonfinite));

    PinnedTables tables;
    GroupTables group_tables(layout, residual_, &tables);
    OP_REQUIRES_OK(context, tables.Allocate(context));
    group_tables.Fill(dtypes_, {}, out, &state);
    const cudaStream_t stream = StreamOf(context);
    OP_REQUIRES_OK(context, tables.CopyToDevice(stream));
    const MergecompPowersgdGpuGroup group = group_tables.Group();
    OP_REQUIRES_OK(context, LauncherStatus("MergecompPowersgdGroupFinish (GPU)",
                                           mergecomp_powersgd_finish_gpu(
                                               &group, p_tensor.flat<float>().data(),
                                               q_local.flat<float>().data(),
                                               q_mean.flat<float>().data(),
                                               m_tensor.flat<float>().data(),
                                               nonfinite->flat<int32_t>().data(), stream)));
  }

 private:
  int64_t rank_ = 1;
  bool residual_ = false;
  std::vector<DataType> dtypes_;
  std::vector<TensorShape> shapes_;
  std::unique_ptr<PowersgdGroupLayout> layout_;
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
