// GPU kernels of MergecompGroupEncode and MergecompGroupDecode (ops in
// cc/ops/group_ops.cc; CPU kernels in group_op.cc). They call the CUDA group
// launchers (group_gpu_launchers.h, group_op_gpu.cu.cc) on the op's stream.
//
// Per step, everything a launcher needs on the device (the flat offsets,
// random-k's k_i, the tables of gradient, output and state pointers) is
// packed into one small buffer of pinned host memory from TensorFlow's
// allocator and copied to the device with one asynchronous copy on the op's
// stream; TensorFlow's EventMgr releases the pinned buffer once the stream
// has passed the copy. Nothing here waits for the stream: no gradient,
// payload or state crosses to the host. Gradients that are not float32
// (float16, bfloat16, float64) are cast on the device into a float32 scratch
// that the launchers read, and decoded through one that is cast into them,
// all of a group's casts in one launch; the casts round as the CPU kernels'
// static_casts do.
//
// Compiled only with GOOGLE_CUDA (setup.py, CUDA builds).
#if GOOGLE_CUDA
#define EIGEN_USE_GPU

#include <cstdint>
#include <string>
#include <vector>

#include "cc/kernels/gpu_op_support.h"
#include "cc/kernels/group_gpu_launchers.h"
#include "cc/kernels/state_variables.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tf_mergecomp {
namespace {

// The float dtypes' codes of the cast launchers (group_cast_gpu.cu.cc); 0
// for float32, which is not cast.
int64_t CastKind(DataType dtype) {
  switch (dtype) {
    case tensorflow::DT_HALF: return MERGECOMP_CAST_HALF;
    case tensorflow::DT_BFLOAT16: return MERGECOMP_CAST_BFLOAT16;
    case tensorflow::DT_DOUBLE: return MERGECOMP_CAST_DOUBLE;
    default: return 0;
  }
}

// One step's device tables (gpu_op_support.h's PinnedTables): int64
// offsets[n + 1], int64 tensor_k[n], int64 cast kinds[n], then four tables
// of n device pointers (inputs, outputs, state, and the tensors of another
// dtype as they lie: the gradients before the cast or the outputs after it).
class DeviceTables {
 public:
  explicit DeviceTables(int64_t num_tensors)
      : tables_("the group's tables"),
        offsets_(tables_.Reserve(num_tensors + 1)),
        tensor_k_(tables_.Reserve(num_tensors)),
        kinds_(tables_.Reserve(num_tensors)),
        inputs_(tables_.Reserve(num_tensors)),
        outputs_(tables_.Reserve(num_tensors)),
        state_(tables_.Reserve(num_tensors)),
        originals_(tables_.Reserve(num_tensors)) {}

  Status Allocate(OpKernelContext* context) { return tables_.Allocate(context); }

  int64_t* host_offsets() { return tables_.host(offsets_); }
  int64_t* host_tensor_k() { return tables_.host(tensor_k_); }
  void set_input(int64_t i, const float* p) { tables_.set_pointer(inputs_ + i, p); }
  void set_output(int64_t i, float* p) { tables_.set_pointer(outputs_ + i, p); }
  void set_state(int64_t i, float* p) { tables_.set_pointer(state_ + i, p); }
  // Tensor i as it lies in its own dtype (cast kind 0: float32, not cast).
  void set_original(int64_t i, int64_t kind, const void* p) {
    *tables_.host(kinds_ + i) = kind;
    tables_.set_pointer(originals_ + i, p);
  }

  const int64_t* offsets() const { return tables_.device<const int64_t>(offsets_); }
  const int64_t* tensor_k() const { return tables_.device<const int64_t>(tensor_k_); }
  const float* const* inputs() const { return tables_.device<const float* const>(inputs_); }
  float* const* outputs() const { return tables_.device<float* const>(outputs_); }
  float* const* state() const { return tables_.device<float* const>(state_); }
  const int64_t* kinds() const { return tables_.device<const int64_t>(kinds_); }
  void* const* originals() const { return tables_.device<void* const>(originals_); }

  Status CopyToDevice(OpKernelContext* context, cudaStream_t stream) {
    return tables_.CopyToDevice(context, stream);
  }

 private:
  PinnedTables tables_;
  int64_t offsets_, tensor_k_, kinds_, inputs_, outputs_, state_, originals_;
};

// The ops' codec attributes as the launchers take them.
struct CodecAttrs {
  std::string name;
  DataType payload_type;
  int64_t levels = 0, k = 0, sample_size = 0;
  std::vector<int64_t> tensor_k;
  bool scale = false;

  Status Read(OpKernelConstruction* context) {
    TF_RETURN_IF_ERROR(context->GetAttr("codec", &name));
    TF_RETURN_IF_ERROR(context->GetAttr("payload_type", &payload_type));
    TF_RETURN_IF_ERROR(context->GetAttr("levels", &levels));
    TF_RETURN_IF_ERROR(context->GetAttr("k", &k));
    TF_RETURN_IF_ERROR(context->GetAttr("tensor_k", &tensor_k));
    TF_RETURN_IF_ERROR(context->GetAttr("sample_size", &sample_size));
    TF_RETURN_IF_ERROR(context->GetAttr("scale", &scale));
    const std::string names = mergecomp_group_codec_names();
    if (("," + names + ",").find("," + name + ",") == std::string::npos) {
      return tensorflow::errors::InvalidArgument("unknown group codec '", name,
                                                 "'; the GPU kernels have: ", names);
    }
    return tensorflow::OkStatus();
  }

  // tensor_k must be stored in `tables` before the codec is used.
  MergecompGpuCodec Codec(int32_t memory, float decay, float gradient_scale,
                          const DeviceTables& tables, int64_t* host_tensor_k) const {
    MergecompGpuCodec codec;
    codec.name = name.c_str();
    codec.memory = memory;
    codec.decay = decay;
    codec.gradient_scale = gradient_scale;
    codec.marker_bytes = tensorflow::DataTypeSize(payload_type);
    codec.scale = scale ? 1 : 0;
    codec.levels = levels;
    codec.k = k;
    codec.sample_size = sample_size;
    codec.host_tensor_k = host_tensor_k;
    codec.tensor_k = tables.tensor_k();
    return codec;
  }

  // Random-k's k_i into the tables (checked against the group's size).
  Status FillTensorK(int64_t num_tensors, int64_t* host_tensor_k) const {
    if (name != "randomk") return tensorflow::OkStatus();
    if (static_cast<int64_t>(tensor_k.size()) != num_tensors) {
      return tensorflow::errors::InvalidArgument("randomk: tensor_k has ", tensor_k.size(),
                                                 " entries for ", num_tensors, " tensors");
    }
    for (int64_t i = 0; i < num_tensors; ++i) host_tensor_k[i] = tensor_k[i];
    return tensorflow::OkStatus();
  }
};

// A float32 scratch holding the group's tensors of other dtypes, each at its
// flat offset (tensors already float32 are used where they lie).
Status AllocateScratch(OpKernelContext* context, const std::vector<DataType>& dtypes,
                       const std::vector<int64_t>& offsets, Tensor* scratch) {
  int64_t elements = 0;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (dtypes[i] != tensorflow::DT_FLOAT) elements = offsets[i + 1];
  }
  return context->allocate_temp(tensorflow::DT_FLOAT, TensorShape({elements}), scratch);
}

class GroupEncodeGpuOp : public OpKernel {
 public:
  explicit GroupEncodeGpuOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, attrs_.Read(context));
    std::string memory;
    OP_REQUIRES_OK(context, context->GetAttr("memory", &memory));
    memory_ = memory == "residual"   ? MERGECOMP_MEMORY_RESIDUAL
              : memory == "momentum" ? MERGECOMP_MEMORY_MOMENTUM
              : memory == "dgc"      ? MERGECOMP_MEMORY_DGC
                                     : MERGECOMP_MEMORY_NONE;
    OP_REQUIRES_OK(context, context->GetAttr("decay", &decay_));
    OP_REQUIRES_OK(context, context->GetAttr("gradient_scale", &gradient_scale_));
  }

  void Compute(OpKernelContext* context) override {
    tensorflow::OpInputList gradients;
    OP_REQUIRES_OK(context, context->input_list("gradients", &gradients));
    const int64_t n = gradients.size();
    const Tensor& seed_tensor = context->input(context->num_inputs() - 1);
    OP_REQUIRES(context, tensorflow::TensorShapeUtils::IsScalar(seed_tensor.shape()),
                tensorflow::errors::InvalidArgument("seed must be a scalar"));
    const int64_t seed = seed_tensor.scalar<int64_t>()();
    const cudaStream_t stream = StreamOf(context);

    DeviceTables tables(n);
    OP_REQUIRES_OK(context, tables.Allocate(context));
    int64_t* offsets = tables.host_offsets();
    std::vector<DataType> dtypes(n);
    for (int64_t i = 0; i < n; ++i) {
      offsets[i + 1] = offsets[i] + gradients[i].NumElements();
      dtypes[i] = gradients[i].dtype();
    }
    OP_REQUIRES_OK(context, attrs_.FillTensorK(n, tables.host_tensor_k()));

    const int buffers = memory_ == MERGECOMP_MEMORY_NONE ? 0 : (memory_ == MERGECOMP_MEMORY_DGC ? 2 : 1);
    std::vector<int64_t> state_sizes;
    for (int64_t i = 0; buffers > 0 && i < n; ++i) {
      state_sizes.push_back(buffers * (offsets[i + 1] - offsets[i]));
    }
    LockedStateVariables state;
    const LockedStateVariables::DeviceCopy copy = DeviceCopyOn(stream);
    OP_REQUIRES_OK(context, state.Acquire(context, state_sizes,
                                          "the memory's buffers of the tensor, back to back",
                                          /*exclusive=*/true, &copy));

    std::vector<int64_t> host_offsets(offsets, offsets + n + 1);
    Tensor scratch;
    OP_REQUIRES_OK(context, AllocateScratch(context, dtypes, host_offsets, &scratch));
    bool any_cast = false;
    for (int64_t i = 0; i < n; ++i) {
      const bool cast = dtypes[i] != tensorflow::DT_FLOAT;
      any_cast |= cast;
      tables.set_input(i, cast ? scratch.flat<float>().data() + host_offsets[i]
                               : gradients[i].flat<float>().data());
      tables.set_original(i, CastKind(dtypes[i]), gradients[i].data());
      if (buffers > 0) tables.set_state(i, state.buffer(i));
    }

    const MergecompGpuCodec codec =
        attrs_.Codec(memory_, decay_, gradient_scale_, tables, tables.host_tensor_k());
    const MergecompGpuGroup group{n, host_offsets.data(), tables.offsets(), tables.inputs(),
                                  nullptr, buffers > 0 ? tables.state() : nullptr};
    const int64_t row_bytes = mergecomp_group_row_bytes(&codec, &group);
    OP_REQUIRES(context, row_bytes >= 0,
                tensorflow::errors::InvalidArgument(
                    "MergecompGroupEncode (GPU): ",
                    mergecomp_group_error_string(MERGECOMP_GPU_BAD_ARGUMENT)));
    const int64_t element_bytes = tensorflow::DataTypeSize(attrs_.payload_type);
    Tensor* payload = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({row_bytes / element_bytes}),
                                                     &payload));
    Tensor* codec_context = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                1, TensorShape({mergecomp_group_context_size(&codec, &group)}),
                                &codec_context));
    Tensor workspace;
    OP_REQUIRES_OK(context, context->allocate_temp(
                                tensorflow::DT_INT8,
                                TensorShape({mergecomp_group_workspace_bytes(&codec, &group)}),
                                &workspace));
    OP_REQUIRES_OK(context, tables.CopyToDevice(context, stream));
    if (any_cast) {
      // The group's float16/bfloat16/float64 gradients into the float32 scratch.
      OP_REQUIRES_OK(context, LauncherStatus("casting the gradients to float32",
                                             mergecomp_group_cast_to_float_gpu(
                                                 &group, tables.kinds(), tables.originals(),
                                                 const_cast<float* const*>(tables.inputs()),
                                                 stream)));
    }
    OP_REQUIRES_OK(context,
                   LauncherStatus("MergecompGroupEncode (GPU)",
                                  mergecomp_group_encode_gpu(
                                      &codec, &group, seed, static_cast<uint8_t*>(payload->data()),
                                      codec_context->flat<int32_t>().data(), workspace.data(),
                                      stream)));
  }

 private:
  CodecAttrs attrs_;
  int32_t memory_ = MERGECOMP_MEMORY_NONE;
  float decay_ = 0.0f;
  float gradient_scale_ = 1.0f;
};

class GroupDecodeGpuOp : public OpKernel {
 public:
  explicit GroupDecodeGpuOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, attrs_.Read(context));
    OP_REQUIRES_OK(context, context->GetAttr("num_rows", &num_rows_));
    tensorflow::DataTypeVector dtypes;
    OP_REQUIRES_OK(context, context->GetAttr("T", &dtypes));
    dtypes_.assign(dtypes.begin(), dtypes.end());
    std::vector<tensorflow::PartialTensorShape> shapes;
    OP_REQUIRES_OK(context, context->GetAttr("shapes", &shapes));
    OP_REQUIRES(context, shapes.size() == dtypes_.size(),
                tensorflow::errors::InvalidArgument("shapes and T must have the same length"));
    offsets_.push_back(0);
    for (const auto& shape : shapes) {
      TensorShape full;
      OP_REQUIRES(context, shape.AsTensorShape(&full),
                  tensorflow::errors::InvalidArgument("shapes must be fully defined, got ",
                                                      shape.DebugString()));
      shapes_.push_back(full);
      offsets_.push_back(offsets_.back() + full.num_elements());
    }
  }

  void Compute(OpKernelContext* context) override {
    const int64_t n = shapes_.size();
    const Tensor& rows = context->input(0);
    const Tensor& codec_context = context->input(1);
    const cudaStream_t stream = StreamOf(context);

    DeviceTables tables(n);
    OP_REQUIRES_OK(context, tables.Allocate(context));
    std::copy(offsets_.begin(), offsets_.end(), tables.host_offsets());
    OP_REQUIRES_OK(context, attrs_.FillTensorK(n, tables.host_tensor_k()));
    const MergecompGpuCodec codec = attrs_.Codec(MERGECOMP_MEMORY_NONE, 0.0f, 1.0f, tables,
                                                 tables.host_tensor_k());
    const MergecompGpuGroup shape_only{n, offsets_.data(), tables.offsets(), nullptr, nullptr,
                                       nullptr};
    const int64_t row_bytes = mergecomp_group_row_bytes(&codec, &shape_only);
    OP_REQUIRES(context, row_bytes >= 0,
                tensorflow::errors::InvalidArgument(
                    "MergecompGroupDecode (GPU): ",
                    mergecomp_group_error_string(MERGECOMP_GPU_BAD_ARGUMENT)));
    OP_REQUIRES(context, rows.TotalBytes() == static_cast<size_t>(num_rows_ * row_bytes),
                tensorflow::errors::InvalidArgument(
                    "the collected payloads hold ", rows.TotalBytes(), " bytes; expected ",
                    num_rows_, " row(s) of ", row_bytes, " bytes"));
    const int64_t context_size = mergecomp_group_context_size(&codec, &shape_only);
    OP_REQUIRES(context, codec_context.NumElements() == context_size,
                tensorflow::errors::InvalidArgument("codec_context has ",
                                                    codec_context.NumElements(),
                                                    " entries; expected ", context_size));

    tensorflow::OpOutputList outputs;
    OP_REQUIRES_OK(context, context->output_list("gradients", &outputs));
    std::vector<Tensor*> tensors(n);
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES_OK(context, outputs.allocate(i, shapes_[i], &tensors[i]));
    }
    Tensor* nonfinite = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output("nonfinite", TensorShape({n}), &nonfinite));
    Tensor scratch;
    OP_REQUIRES_OK(context, AllocateScratch(context, dtypes_, offsets_, &scratch));
    bool any_cast = false;
    for (int64_t i = 0; i < n; ++i) {
      const bool cast = dtypes_[i] != tensorflow::DT_FLOAT;
      any_cast |= cast;
      tables.set_output(i, cast ? scratch.flat<float>().data() + offsets_[i]
                                : tensors[i]->flat<float>().data());
      tables.set_original(i, CastKind(dtypes_[i]), tensors[i]->data());
    }
    Tensor workspace;
    OP_REQUIRES_OK(context, context->allocate_temp(
                                tensorflow::DT_INT8,
                                TensorShape({mergecomp_group_workspace_bytes(&codec, &shape_only)}),
                                &workspace));
    OP_REQUIRES_OK(context, tables.CopyToDevice(context, stream));
    const MergecompGpuGroup group{n, offsets_.data(), tables.offsets(), nullptr, tables.outputs(),
                                  nullptr};
    OP_REQUIRES_OK(context,
                   LauncherStatus("MergecompGroupDecode (GPU)",
                                  mergecomp_group_decode_gpu_async(
                                      &codec, &group, static_cast<const uint8_t*>(rows.data()),
                                      num_rows_, codec_context.flat<int32_t>().data(),
                                      nonfinite->flat<int32_t>().data(), workspace.data(),
                                      stream)));
    if (any_cast) {
      // The decoded float32 scratch into the float16/bfloat16/float64 outputs.
      OP_REQUIRES_OK(context, LauncherStatus("casting the decoded gradients from float32",
                                             mergecomp_group_cast_from_float_gpu(
                                                 &group, tables.kinds(), tables.outputs(),
                                                 tables.originals(), stream)));
    }
  }

 private:
  CodecAttrs attrs_;
  int64_t num_rows_ = 1;
  std::vector<DataType> dtypes_;
  std::vector<TensorShape> shapes_;
  std::vector<int64_t> offsets_;
};

}  // namespace

// No type constraint on T: the kernels take every gradient dtype the ops
// declare (float16, bfloat16, float32, float64). The seed is a host scalar;
// the state resource handles are host memory, their buffers on the device.
REGISTER_KERNEL_BUILDER(
    Name("MergecompGroupEncode").Device(tensorflow::DEVICE_GPU).HostMemory("seed"),
    GroupEncodeGpuOp);
REGISTER_KERNEL_BUILDER(Name("MergecompGroupDecode").Device(tensorflow::DEVICE_GPU),
                        GroupDecodeGpuOp);

}  // namespace tf_mergecomp

#endif  // GOOGLE_CUDA
