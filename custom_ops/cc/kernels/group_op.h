// Group codecs: one encode and one decode kernel per merged group, over the
// group's gradient tensors as a list.
//
// MergecompGroupEncode takes the group's gradients (any float dtypes and
// shapes) and each tensor's error-feedback state (one float32 resource
// variable per tensor), and in one kernel compensates the gradients with the
// state, encodes the one wire payload, decodes this worker's own payload and
// updates the state in place. MergecompGroupDecode turns what the collective
// returned into the averaged gradients, written straight into per-tensor
// outputs of the original shapes and dtypes. No concat, split, cast or assign
// op is left in the traced step.
//
// The group is seen as one flat float32 index space: tensor i holds
// [offset(i), offset(i + 1)). Each codec implements GroupCodec over that
// space and registers itself by name (REGISTER_GROUP_CODEC, in its own
// <codec>_op.cc), so the kernels here are the same for every codec.
#ifndef TF_MERGECOMP_GROUP_OP_H_
#define TF_MERGECOMP_GROUP_OP_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cc/kernels/dense_cpu.h"
#include "cc/kernels/sparse_select.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_mergecomp {

// Element offsets of the group's tensors in its flat index space.
class GroupLayout {
 public:
  GroupLayout() : offsets_{0} {}
  explicit GroupLayout(const std::vector<int64_t>& sizes) : offsets_{0} {
    for (int64_t size : sizes) offsets_.push_back(offsets_.back() + size);
  }
  int64_t num_tensors() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  int64_t total() const { return offsets_.back(); }
  int64_t offset(int64_t i) const { return offsets_[i]; }
  int64_t size(int64_t i) const { return offsets_[i + 1] - offsets_[i]; }

  // The tensor holding flat index flat_index (for flat_index < total()).
  int64_t TensorAt(int64_t flat_index) const;

  // Calls fn(tensor, begin, end) for each tensor's part of the flat range
  // [flat_begin, flat_end), with begin/end local to the tensor.
  template <typename Fn>
  void ForEachPart(int64_t flat_begin, int64_t flat_end, const Fn& fn) const {
    int64_t i = TensorAt(flat_begin);
    for (; i < num_tensors() && offsets_[i] < flat_end; ++i) {
      const int64_t begin = std::max(flat_begin, offsets_[i]) - offsets_[i];
      const int64_t end = std::min(flat_end, offsets_[i + 1]) - offsets_[i];
      if (end > begin) fn(i, begin, end);
    }
  }

 private:
  std::vector<int64_t> offsets_;  // num_tensors + 1 entries
};

// The compensated group of a codec sending entries (GroupCodec::SendsEntries),
// as one float32 array per tensor: the state buffer the compensation writes
// (residual e, DGC's v, SIGNUM's m), the gradient itself (memory none,
// float32), or a scratch array (memory none, other dtypes). Selection then
// reads the group where it lies, with no copy into one array.
//
// The codec's Encode calls Compensate exactly once; before it, ValueBefore
// gives single compensated values without writing anything (a sample of the
// group from which a threshold can be chosen before the one pass over it).
class SparseGroupInput : public BlockInput {
 public:
  // visit(block, values, flat_begin, count): values[0, count) are the
  // compensated values at flat_begin.., in one part of one block; called from
  // the block's thread as soon as the part is compensated.
  using RunVisitor = std::function<void(int64_t, const float*, int64_t, int64_t)>;

  SparseGroupInput(const GroupLayout& layout) : layout_(layout), runs_(layout.num_tensors()) {}

  const GroupLayout& layout() const { return layout_; }
  virtual float ValueBefore(int64_t flat_index) const = 0;
  // Compensates the whole group, blocks of `blocks` sharded over the intra-op
  // pool; visit may be null.
  virtual void Compensate(tensorflow::OpKernelContext* context, const sparse::Blocks& blocks,
                          const RunVisitor* visit) const = 0;

  // After Compensate: fn(values, flat_begin, count) for each tensor part of
  // the flat range [begin, end), in order.
  template <typename Fn>
  void ForEachRun(int64_t begin, int64_t end, const Fn& fn) const {
    layout_.ForEachPart(begin, end, [&](int64_t t, int64_t part_begin, int64_t part_end) {
      fn(runs_[t] + part_begin, layout_.offset(t) + part_begin, part_end - part_begin);
    });
  }
  // After Compensate: the compensated value at a flat index.
  float ValueAt(int64_t flat_index) const {
    const int64_t t = layout_.TensorAt(flat_index);
    return runs_[t][flat_index - layout_.offset(t)];
  }
  // Once the entry at index j of tensor t is compensated: takes `sent` (the
  // entry as Decode adds it) out of the state, as the encode op otherwise
  // does after Encode (residual: e <- p - sent; dgc: v <- p - sent, u <- u *
  // (sent == 0); the other memories keep nothing of it).
  virtual void TakeSent(int64_t t, int64_t j, float sent) const = 0;

  const float* Block(int64_t begin, int64_t count) const override;
  const float* Contiguous() const override {
    return layout_.num_tensors() == 1 ? runs_[0] : nullptr;
  }

 protected:
  const GroupLayout& layout_;
  std::vector<const float*> runs_;  // tensor t's compensated values
};

// The decoded group as per-tensor float32 arrays, for the sparse decoders
// that zero and scatter: a float32 output tensor is written in place, any
// other through a scratch array that CastScratch casts into it.
class GroupTensorsOutput : public BlockOutput {
 public:
  const GroupTensorsOutput* AsGroupTensors() const override { return this; }
  // Tensor t's float32 array, for every t.
  virtual tensorflow::Status TensorArrays(tensorflow::OpKernelContext* context,
                                          std::vector<float*>* arrays) const = 0;
  virtual void CastScratch(tensorflow::OpKernelContext* context) const = 0;
};

// Maps ascending flat indices to (tensor, index in the tensor) in amortised
// constant time; an index below the current tensor is looked up afresh.
class TensorCursor {
 public:
  explicit TensorCursor(const GroupLayout& layout) : layout_(layout) {}
  // Starting at the tensor holding first_flat_index (< layout.total()).
  TensorCursor(const GroupLayout& layout, int64_t first_flat_index)
      : layout_(layout), tensor_(layout.TensorAt(first_flat_index)) {}
  // The tensor holding flat_index < layout.total(); *local receives its index there.
  int64_t Locate(int64_t flat_index, int64_t* local) {
    if (flat_index < layout_.offset(tensor_)) {
      tensor_ = layout_.TensorAt(flat_index);
    } else {
      while (flat_index >= layout_.offset(tensor_ + 1)) ++tensor_;
    }
    *local = flat_index - layout_.offset(tensor_);
    return tensor_;
  }

 private:
  const GroupLayout& layout_;
  int64_t tensor_ = 0;
};

// Codec parameters, from the ops' attributes (each codec reads its own).
struct GroupCodecParams {
  int64_t levels = 0;                   // qsgd's s
  int64_t k = 0;                        // topk, dgc: slots of the group
  std::vector<int64_t> tensor_k;        // randomk: k_i per tensor
  int64_t sample_size = 0;              // dgc
  bool scale = false;                   // randomk: decode multiplies by n_i / k_i
};

class GroupCodec {
 public:
  virtual ~GroupCodec() = default;

  // Bytes one worker puts on the wire for the group. The only definition of
  // each codec's payload size: the shape function and the kernels use it.
  virtual int64_t PayloadBytes(const GroupLayout& layout, const GroupCodecParams& params) const = 0;

  // int32 entries the decoder needs besides the payload (random-k's positions).
  virtual int64_t ContextSize(const GroupLayout&, const GroupCodecParams&) const { return 0; }

  // True for the codecs that send selected entries of the group (topk, dgc,
  // randomk): their Encode gets a SparseGroupInput (and calls its Compensate
  // once), and the error-feedback state is updated at the sent entries only
  // (by the encode op from ForEachSent, or by Encode itself), not from a
  // decode of the whole payload.
  virtual bool SendsEntries() const { return false; }
  // True for a codec sending entries whose Encode takes them out of the state
  // itself (SparseGroupInput::TakeSent) while each block is in cache.
  virtual bool TakesSentWhileEncoding() const { return false; }

  // Calls sent(flat_index, value) for every entry of this worker's payload as
  // Decode would add it (padding slots included), in slot order; needed
  // unless TakesSentWhileEncoding.
  virtual void ForEachSent(const uint8_t* /*payload*/, const int32_t* /*codec_context*/,
                           const GroupLayout& /*layout*/, const GroupCodecParams& /*params*/,
                           const std::function<void(int64_t, float)>& /*sent*/) const {}

  // input: the compensated float32 group, read block by block. seed: this
  // worker's seed of the step and group; tensor i of a codec drawing per
  // tensor uses TensorSeed(seed, i).
  virtual tensorflow::Status Encode(tensorflow::OpKernelContext* context, const BlockInput& input,
                                    const GroupLayout& layout, const GroupCodecParams& params,
                                    int64_t seed, uint8_t* payload, int32_t* codec_context) const = 0;

  // rows: `num_rows` payloads back to back (the allgather of every worker's,
  // or the one averaged payload of an allreduce); writes the combined float32
  // group into output, block by block.
  virtual tensorflow::Status Decode(tensorflow::OpKernelContext* context, const uint8_t* rows,
                                    int64_t num_rows, const int32_t* codec_context,
                                    const GroupLayout& layout, const GroupCodecParams& params,
                                    const BlockOutput& output) const = 0;
};

// TensorSeed (tensor i's seed within a group): cc/kernels/random.h.

using GroupCodecFactory = std::function<std::unique_ptr<GroupCodec>()>;

// The codec registered under `name`, or nullptr.
std::unique_ptr<GroupCodec> MakeGroupCodec(const std::string& name);
// The registered names, comma-separated, for error messages.
std::string GroupCodecNames();

struct GroupCodecRegistrar {
  GroupCodecRegistrar(const char* name, GroupCodecFactory factory);
};

#define MERGECOMP_CONCAT_INNER(a, b) a##b
#define MERGECOMP_CONCAT(a, b) MERGECOMP_CONCAT_INNER(a, b)
#define REGISTER_GROUP_CODEC(name, Codec)                                                  \
  static ::tf_mergecomp::GroupCodecRegistrar MERGECOMP_CONCAT(group_codec_registrar_,      \
                                                              __COUNTER__)(                \
      name, [] { return std::unique_ptr<::tf_mergecomp::GroupCodec>(new Codec()); })

// Reads the codec attributes of the group ops (OpKernelConstruction or the
// shape function's InferenceContext): the codec, its parameters and the
// payload's dtype.
template <typename AttrSource>
tensorflow::Status ReadGroupCodecAttrs(AttrSource* source, std::unique_ptr<GroupCodec>* codec,
                                       GroupCodecParams* params,
                                       tensorflow::DataType* payload_type) {
  std::string name;
  TF_RETURN_IF_ERROR(source->GetAttr("codec", &name));
  *codec = MakeGroupCodec(name);
  if (*codec == nullptr) {
    return tensorflow::errors::InvalidArgument("unknown group codec '", name,
                                               "'; valid choices: ", GroupCodecNames());
  }
  TF_RETURN_IF_ERROR(source->GetAttr("payload_type", payload_type));
  TF_RETURN_IF_ERROR(source->GetAttr("levels", &params->levels));
  TF_RETURN_IF_ERROR(source->GetAttr("k", &params->k));
  TF_RETURN_IF_ERROR(source->GetAttr("tensor_k", &params->tensor_k));
  TF_RETURN_IF_ERROR(source->GetAttr("sample_size", &params->sample_size));
  TF_RETURN_IF_ERROR(source->GetAttr("scale", &params->scale));
  return tensorflow::OkStatus();
}

// Copies every block of input into data[0, n).
void CopyToContiguous(tensorflow::OpKernelContext* context, const BlockInput& input, int64_t n,
                      float* data);
// Writes data[0, n) to output block by block.
void CopyFromContiguous(tensorflow::OpKernelContext* context, const float* data, int64_t n,
                        const BlockOutput& output);

// Calls write(float* values) for an array of n values, then hands them to
// output: the output's own array when it has one, else a temporary one.
template <typename Write>
tensorflow::Status WriteThroughContiguous(tensorflow::OpKernelContext* context, int64_t n,
                                          const BlockOutput& output, const Write& write) {
  if (float* direct = output.Contiguous()) return write(direct);
  tensorflow::Tensor storage;
  TF_RETURN_IF_ERROR(context->allocate_temp(tensorflow::DT_FLOAT, tensorflow::TensorShape({n}),
                                            &storage));
  float* values = storage.flat<float>().data();
  TF_RETURN_IF_ERROR(write(values));
  CopyFromContiguous(context, values, n, output);
  return tensorflow::OkStatus();
}

// The sparse codecs' decode, block by block of the group's flat space (the
// blocks sharded over the intra-op pool): zeroes the block in the group's
// per-tensor float32 arrays and at once calls scatter(arrays, begin, end),
// which adds or sets the sent entries whose flat index lies in [begin, end),
// so that each block is zeroed and scattered into while it is in cache (a
// merged group is decoded as layer-wise tensors are). The arrays then go to
// output (in place where the output tensors are float32). scatter cannot
// fail: the codec checks its entries before.
template <typename Scatter>
tensorflow::Status ZeroAndScatter(tensorflow::OpKernelContext* context, const GroupLayout& layout,
                                  const BlockOutput& output, const Scatter& scatter) {
  auto zero_and_scatter = [&](const std::vector<float*>& arrays) {
    ForEachBlock(context, NumBlocks(layout.total()), 2 * kBlockElements, [&](int64_t block) {
      const int64_t begin = block * kBlockElements;
      const int64_t end = std::min(begin + kBlockElements, layout.total());
      layout.ForEachPart(begin, end, [&](int64_t t, int64_t part_begin, int64_t part_end) {
        memset(arrays[t] + part_begin, 0, (part_end - part_begin) * sizeof(float));
      });
      scatter(arrays, begin, end);
    });
  };
  if (const GroupTensorsOutput* tensors = output.AsGroupTensors()) {
    std::vector<float*> arrays;
    TF_RETURN_IF_ERROR(tensors->TensorArrays(context, &arrays));
    zero_and_scatter(arrays);
    tensors->CastScratch(context);
    return tensorflow::OkStatus();
  }
  return WriteThroughContiguous(context, layout.total(), output, [&](float* values) {
    std::vector<float*> arrays(layout.num_tensors());
    for (int64_t t = 0; t < layout.num_tensors(); ++t) arrays[t] = values + layout.offset(t);
    zero_and_scatter(arrays);
    return tensorflow::OkStatus();
  });
}

// Adapts a dense codec's block kernels (an encode reading a BlockInput, a
// decode averaging W rows into a BlockOutput, and the payload size
// PayloadBytes(n, levels)) to a GroupCodec over the whole group's flat space.
using DenseEncodeBlocksFn = void (*)(tensorflow::OpKernelContext*, const BlockInput&, int64_t n,
                                     int64_t seed, int64_t levels, uint8_t* payload);
using DenseDecodeBlocksFn = void (*)(tensorflow::OpKernelContext*, const uint8_t* payload,
                                     int64_t world_size, int64_t n, int64_t levels,
                                     const BlockOutput&);

template <int64_t (*PayloadBytesFn)(int64_t, int64_t), DenseEncodeBlocksFn EncodeFn,
          DenseDecodeBlocksFn DecodeFn>
class DenseGroupCodec : public GroupCodec {
 public:
  int64_t PayloadBytes(const GroupLayout& layout, const GroupCodecParams& params) const override {
    return PayloadBytesFn(layout.total(), params.levels);
  }
  tensorflow::Status Encode(tensorflow::OpKernelContext* context, const BlockInput& input,
                            const GroupLayout& layout, const GroupCodecParams& params,
                            int64_t seed, uint8_t* payload, int32_t*) const override {
    EncodeFn(context, input, layout.total(), seed, params.levels, payload);
    return tensorflow::OkStatus();
  }
  tensorflow::Status Decode(tensorflow::OpKernelContext* context, const uint8_t* rows,
                            int64_t num_rows, const int32_t*, const GroupLayout& layout,
                            const GroupCodecParams& params,
                            const BlockOutput& output) const override {
    DecodeFn(context, rows, num_rows, layout.total(), params.levels, output);
    return tensorflow::OkStatus();
  }
};

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_GROUP_OP_H_
