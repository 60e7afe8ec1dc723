// CPU kernels of MergecompGroupEncode and MergecompGroupDecode (see
// group_op.h), and the group codec registry.
#include "cc/kernels/group_op.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <cstring>
#include <map>
#include <memory>

#include "cc/kernels/dense_cpu.h"
#include "cc/kernels/finite.h"
#include "cc/kernels/payload_size.h"
#include "cc/kernels/state_variables.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace tf_mergecomp {

using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;

int64_t GroupLayout::TensorAt(int64_t flat_index) const {
  // The last tensor starting at or before flat_index; empty tensors starting
  // at the same offset come before it and are skipped.
  const auto after = std::upper_bound(offsets_.begin(), offsets_.end(), flat_index);
  return std::max<int64_t>(0, (after - offsets_.begin()) - 1);
}

namespace {

std::map<std::string, GroupCodecFactory>& Registry() {
  static auto* registry = new std::map<std::string, GroupCodecFactory>();
  return *registry;
}

}  // namespace

GroupCodecRegistrar::GroupCodecRegistrar(const char* name, GroupCodecFactory factory) {
  Registry()[name] = std::move(factory);
}

std::unique_ptr<GroupCodec> MakeGroupCodec(const std::string& name) {
  const auto found = Registry().find(name);
  return found == Registry().end() ? nullptr : found->second();
}

std::string GroupCodecNames() {
  std::string names;
  for (const auto& entry : Registry()) names += (names.empty() ? "" : ", ") + entry.first;
  return names;
}

void CopyToContiguous(OpKernelContext* context, const BlockInput& input, int64_t n, float* data) {
  ForEachBlock(context, NumBlocks(n), kBlockElements, [&](int64_t block) {
    const int64_t begin = block * kBlockElements;
    const int64_t count = std::min(kBlockElements, n - begin);
    const float* values = input.Block(begin, count);
    if (values != data + begin) memcpy(data + begin, values, count * sizeof(float));
  });
}

void CopyFromContiguous(OpKernelContext* context, const float* data, int64_t n,
                        const BlockOutput& output) {
  ForEachBlock(context, NumBlocks(n), kBlockElements, [&](int64_t block) {
    const int64_t begin = block * kBlockElements;
    const int64_t count = std::min(kBlockElements, n - begin);
    float* destination = output.Begin(begin, count);
    if (destination != data + begin) memcpy(destination, data + begin, count * sizeof(float));
    output.Commit(begin, count, destination);
  });
}

const float* SparseGroupInput::Block(int64_t begin, int64_t count) const {
  const int64_t t = layout_.TensorAt(begin);
  if (begin + count <= layout_.offset(t + 1)) return runs_[t] + (begin - layout_.offset(t));
  float* block = ThreadBlockBuffer(0);
  ForEachRun(begin, begin + count, [&](const float* values, int64_t flat_begin, int64_t n) {
    memcpy(block + (flat_begin - begin), values, n * sizeof(float));
  });
  return block;
}

namespace {

// Runs fn(tensor, begin, end) over every tensor part of the group's flat
// space, in blocks sharded over the intra-op pool.
template <typename Fn>
void ForEachPartInParallel(OpKernelContext* context, const GroupLayout& layout,
                           int64_t cost_per_element, const Fn& fn) {
  ForEachBlock(context, NumBlocks(layout.total()), kBlockElements * cost_per_element,
               [&](int64_t block) {
                 const int64_t begin = block * kBlockElements;
                 layout.ForEachPart(begin, std::min(begin + kBlockElements, layout.total()), fn);
               });
}

enum class Memory { kNone, kResidual, kMomentum, kDgc };

int StateBuffers(Memory memory) {
  return memory == Memory::kNone ? 0 : (memory == Memory::kDgc ? 2 : 1);
}

// Compensation written into the state, for elements [begin, end) of one
// tensor: the compensated group p then lives in the state (SIGNUM's m, DGC's
// v; for codecs sending entries also the residual, e <- g + e, from which the
// sent entries are subtracted afterwards) and is read from there. A non-null
// copy receives p too. Each float operation rounds once, as the plain-TF
// memories do, so the two agree bit for bit.
template <typename T>
void CompensateInState(Memory memory, float decay, float gradient_scale, const T* g,
                       float* state, int64_t n, int64_t begin, int64_t end, float* copy) {
  switch (memory) {
    case Memory::kNone:
      if (copy) for (int64_t j = begin; j < end; ++j) copy[j] = static_cast<float>(g[j]);
      return;
    case Memory::kResidual:
      for (int64_t j = begin; j < end; ++j) {
        state[j] = static_cast<float>(g[j]) + state[j];
        if (copy) copy[j] = state[j];
      }
      return;
    case Memory::kMomentum:
      for (int64_t j = begin; j < end; ++j) {
        const float decayed = decay * state[j];
        state[j] = decayed + gradient_scale * static_cast<float>(g[j]);
        if (copy) copy[j] = state[j];
      }
      return;
    case Memory::kDgc: {
      float* u = state;
      float* v = state + n;
      for (int64_t j = begin; j < end; ++j) {
        u[j] = decay * u[j] + static_cast<float>(g[j]);
        v[j] = v[j] + u[j];
        if (copy) copy[j] = v[j];
      }
      return;
    }
  }
}

// The tensor's compensated values as they stand in the state after
// CompensateInState (none: the gradient when it is float32), or null.
const float* CompensatedInState(Memory memory, const Tensor& gradient, float* state, int64_t n) {
  switch (memory) {
    case Memory::kNone:
      return gradient.dtype() == tensorflow::DT_FLOAT ? static_cast<const float*>(gradient.data())
                                                      : nullptr;
    case Memory::kResidual:
    case Memory::kMomentum: return state;
    case Memory::kDgc: return state + n;
  }
  return nullptr;
}

// p = compensate(g, state) at element j of one tensor, computed as
// CompensateInState computes it (same operations, same roundings), without
// writing anything.
template <typename T>
float CompensatedValue(Memory memory, float decay, float gradient_scale, const T* g,
                       const float* state, int64_t n, int64_t j) {
  const float gradient = static_cast<float>(g[j]);
  switch (memory) {
    case Memory::kNone: return gradient;
    case Memory::kResidual: return gradient + state[j];
    case Memory::kMomentum: {
      const float decayed = decay * state[j];
      return decayed + gradient_scale * gradient;
    }
    case Memory::kDgc: {
      const float u = decay * state[j] + gradient;
      return state[n + j] + u;
    }
  }
  return gradient;
}

// The sparse codecs' SparseGroupInput over the op's gradients and state.
class CompensatedSparseInput : public SparseGroupInput {
 public:
  CompensatedSparseInput(const GroupLayout& layout, const std::vector<Tensor>& gradients,
                         Memory memory, float decay, float gradient_scale,
                         const LockedStateVariables& state, float* scratch)
      : SparseGroupInput(layout), gradients_(gradients), memory_(memory), decay_(decay),
        gradient_scale_(gradient_scale), state_(state), copies_(layout.num_tensors(), nullptr) {
    for (int64_t t = 0; t < layout.num_tensors(); ++t) {
      runs_[t] = CompensatedInState(memory, gradients[t], state.buffer(t), layout.size(t));
      if (runs_[t] == nullptr) {
        copies_[t] = scratch + layout.offset(t);
        runs_[t] = copies_[t];
      }
    }
  }

  // Elements of the group that the compensation must copy (memory none,
  // tensors not float32): the scratch the constructor needs.
  static int64_t ScratchSize(const GroupLayout& layout, const std::vector<Tensor>& gradients,
                             Memory memory) {
    if (memory != Memory::kNone) return 0;
    for (const Tensor& g : gradients) {
      if (g.dtype() != tensorflow::DT_FLOAT) return layout.total();
    }
    return 0;
  }

  void TakeSent(int64_t t, int64_t j, float sent) const override {
    float* buffer = state_.buffer(t);
    if (memory_ == Memory::kResidual) {
      buffer[j] = buffer[j] - sent;
    } else if (memory_ == Memory::kDgc) {
      float* v = buffer + layout_.size(t);
      v[j] = v[j] - sent;
      buffer[j] = buffer[j] * (sent == 0.0f ? 1.0f : 0.0f);
    }
  }

  float ValueBefore(int64_t flat_index) const override {
    const int64_t t = layout_.TensorAt(flat_index);
    float value = 0.0f;
    DispatchFloatType(gradients_[t].dtype(), [&](auto type_tag) {
      using T = decltype(type_tag);
      value = CompensatedValue<T>(memory_, decay_, gradient_scale_,
                                  static_cast<const T*>(gradients_[t].data()), state_.buffer(t),
                                  layout_.size(t), flat_index - layout_.offset(t));
    });
    return value;
  }

  void Compensate(OpKernelContext* context, const sparse::Blocks& blocks,
                  const RunVisitor* visit) const override {
    ForEachBlock(context, blocks.count, blocks.size * 4, [&](int64_t block) {
      const int64_t begin = blocks.begin(block);
      layout_.ForEachPart(begin, blocks.end(block), [&](int64_t t, int64_t part_begin,
                                                        int64_t part_end) {
        if (memory_ != Memory::kNone || copies_[t] != nullptr) {
          DispatchFloatType(gradients_[t].dtype(), [&](auto type_tag) {
            using T = decltype(type_tag);
            CompensateInState<T>(memory_, decay_, gradient_scale_,
                                 static_cast<const T*>(gradients_[t].data()), state_.buffer(t),
                                 layout_.size(t), part_begin, part_end, copies_[t]);
          });
        }
        if (visit != nullptr) {
          (*visit)(block, runs_[t] + part_begin, layout_.offset(t) + part_begin,
                   part_end - part_begin);
        }
      });
    });
  }

 private:
  const std::vector<Tensor>& gradients_;
  Memory memory_;
  float decay_;
  float gradient_scale_;
  const LockedStateVariables& state_;
  std::vector<float*> copies_;  // where the compensation copies tensor t, or null
};

// Which tensors of the group hold an inf or a NaN, checked a block at a time
// and at most once. The dense codecs' encode reads every block before it
// writes any state when the memory is none or residual, so the check can ride
// on that read: CheckCompensated looks at the block's compensated float32
// values (g, or g + e) as the encoder gets them, while they are in cache,
// instead of a pass of its own over the gradients, and the payload is thrown
// away in the rare step that is not finite (as e is finite, g + e is not
// finite exactly where g is not, or where their sum overflows, which the
// residual could not keep either). Finish checks the gradients themselves
// in every block not checked yet: all of them for the other encodes, before
// they write state. Each block is checked by one thread at a time, as the
// encoders read them.
class FiniteWatch {
 public:
  FiniteWatch(const GroupLayout& layout, const std::vector<Tensor>& gradients)
      : layout_(layout), gradients_(gradients), found_(layout.num_tensors()),
        checked_(NumBlocks(layout.total()), 0) {
    for (auto& flag : found_) flag.store(0, std::memory_order_relaxed);
  }

  // values: the compensated block [begin, begin + count), begin a multiple of kBlockElements.
  void CheckCompensated(int64_t begin, int64_t count, const float* values) const {
    const int64_t block = begin / kBlockElements;
    if (checked_[block]) return;
    layout_.ForEachPart(begin, begin + count, [&](int64_t t, int64_t part_begin, int64_t part_end) {
      const float* part = values + (layout_.offset(t) - begin);
      if (!AllFinite(part, part_begin, part_end)) found_[t].store(1, std::memory_order_relaxed);
    });
    checked_[block] = 1;
  }

  // Checks the gradients of the blocks not checked yet; then 1 for each tensor
  // holding an inf or a NaN, else 0.
  std::vector<uint8_t> Finish(OpKernelContext* context) const {
    ForEachBlock(context, NumBlocks(layout_.total()), kBlockElements, [&](int64_t block) {
      if (checked_[block]) return;
      const int64_t begin = block * kBlockElements;
      layout_.ForEachPart(begin, std::min(begin + kBlockElements, layout_.total()),
                          [&](int64_t t, int64_t part_begin, int64_t part_end) {
                            DispatchFloatType(gradients_[t].dtype(), [&](auto type_tag) {
                              using T = decltype(type_tag);
                              if (!AllFinite(static_cast<const T*>(gradients_[t].data()),
                                             part_begin, part_end)) {
                                found_[t].store(1, std::memory_order_relaxed);
                              }
                            });
                          });
      checked_[block] = 1;
    });
    std::vector<uint8_t> flags(found_.size());
    for (size_t i = 0; i < found_.size(); ++i) flags[i] = found_[i].load(std::memory_order_relaxed);
    return flags;
  }

 private:
  const GroupLayout& layout_;
  const std::vector<Tensor>& gradients_;
  mutable std::vector<std::atomic<uint8_t>> found_;
  mutable std::vector<char> checked_;
};

// The compensated group p of the dense codecs, block by block: g (memory
// none), g + e (residual, computed as it is read, the state being updated
// after the encode), or the state that the compensation writes (momentum: m;
// dgc: v), compensated the first time a block is read, so that compensation
// and the encode's first pass are one pass over the data. A block inside one
// tensor whose p is a float32 array is read in place. Encoders read each
// block from one thread at a time, so the per-block flags need no lock.
class CompensatedInput : public BlockInput {
 public:
  // watch: checks each block's compensated values as the encoder first reads
  // them (only where that writes no state).
  CompensatedInput(const GroupLayout& layout, const std::vector<Tensor>& gradients,
                   Memory memory, float decay, float gradient_scale, const LockedStateVariables& state,
                   const FiniteWatch* watch = nullptr)
      : layout_(layout), gradients_(gradients), memory_(memory), decay_(decay),
        gradient_scale_(gradient_scale), state_(state), watch_(watch),
        compensated_(NumBlocks(layout.total()), WritesState() ? 0 : 1) {}

  static bool WritesState(Memory memory) {
    return memory == Memory::kMomentum || memory == Memory::kDgc;
  }

  const float* Block(int64_t begin, int64_t count) const override {
    const float* values = Compensated(begin, count);
    if (watch_ != nullptr) watch_->CheckCompensated(begin, count, values);
    return values;
  }

  // Compensates the blocks the encoder did not read (the state must move for all).
  void CompensateRest(OpKernelContext* context) const {
    ForEachBlock(context, NumBlocks(layout_.total()), 4 * kBlockElements,
                 [&](int64_t block) { CompensateBlock(block); });
  }

 private:
  const float* Compensated(int64_t begin, int64_t count) const {
    CompensateBlock(begin / kBlockElements);
    const int64_t i = layout_.TensorAt(begin);
    if (begin + count <= layout_.offset(i + 1)) {
      if (const float* values = InPlace(i)) return values + (begin - layout_.offset(i));
    }
    float* block = ThreadBlockBuffer(0);
    layout_.ForEachPart(begin, begin + count, [&](int64_t t, int64_t part_begin, int64_t part_end) {
      float* p = block + (layout_.offset(t) - begin);
      if (const float* values = InPlace(t)) {
        memcpy(p + part_begin, values + part_begin, (part_end - part_begin) * sizeof(float));
        return;
      }
      const float* e = memory_ == Memory::kResidual ? state_.buffer(t) : nullptr;
      DispatchFloatType(gradients_[t].dtype(), [&](auto type_tag) {
        using T = decltype(type_tag);
        const T* g = static_cast<const T*>(gradients_[t].data());
        for (int64_t j = part_begin; j < part_end; ++j) {
          p[j] = e ? static_cast<float>(g[j]) + e[j] : static_cast<float>(g[j]);
        }
      });
    });
    return block;
  }

  bool WritesState() const { return WritesState(memory_); }

  void CompensateBlock(int64_t block) const {
    if (compensated_[block]) return;
    const int64_t begin = block * kBlockElements;
    const int64_t end = std::min(begin + kBlockElements, layout_.total());
    layout_.ForEachPart(begin, end, [&](int64_t t, int64_t part_begin, int64_t part_end) {
      DispatchFloatType(gradients_[t].dtype(), [&](auto type_tag) {
        using T = decltype(type_tag);
        CompensateInState<T>(memory_, decay_, gradient_scale_,
                             static_cast<const T*>(gradients_[t].data()), state_.buffer(t),
                             layout_.size(t), part_begin, part_end, nullptr);
      });
    });
    compensated_[block] = 1;
  }

  const float* InPlace(int64_t i) const {
    if (memory_ == Memory::kResidual) return nullptr;  // g + e exists nowhere yet
    return CompensatedInState(memory_, gradients_[i], state_.buffer(i), layout_.size(i));
  }

  const GroupLayout& layout_;
  const std::vector<Tensor>& gradients_;
  Memory memory_;
  float decay_;
  float gradient_scale_;
  const LockedStateVariables& state_;
  const FiniteWatch* watch_;
  mutable std::vector<char> compensated_;
};

// Receives s = decode(this worker's own payload) block by block and updates
// the state: residual e <- p - s; dgc v <- p - s and u <- u * (s == 0)
// (momentum-factor masking).
class StateUpdateOutput : public BlockOutput {
 public:
  StateUpdateOutput(const GroupLayout& layout, const BlockInput& compensated, Memory memory,
                    const LockedStateVariables& state)
      : layout_(layout), compensated_(compensated), memory_(memory), state_(state) {}

  float* Begin(int64_t, int64_t) const override { return ThreadBlockBuffer(1); }
  bool SecondPass() const override { return true; }

  void Commit(int64_t begin, int64_t count, float* sent) const override {
    const float* p = compensated_.Block(begin, count);
    layout_.ForEachPart(begin, begin + count, [&](int64_t t, int64_t part_begin, int64_t part_end) {
      const int64_t shift = layout_.offset(t) - begin;
      const float* p_t = p + shift;
      const float* s_t = sent + shift;
      float* state = state_.buffer(t);
      if (memory_ == Memory::kResidual) {
        for (int64_t j = part_begin; j < part_end; ++j) state[j] = p_t[j] - s_t[j];
        return;
      }
      float* u = state;
      float* v = state + layout_.size(t);
      for (int64_t j = part_begin; j < part_end; ++j) {
        v[j] = p_t[j] - s_t[j];
        u[j] = u[j] * (s_t[j] == 0.0f ? 1.0f : 0.0f);
      }
    });
  }

 private:
  const GroupLayout& layout_;
  const BlockInput& compensated_;
  Memory memory_;
  const LockedStateVariables& state_;
};

// The decoded group written into the op's per-tensor outputs: in place for a
// block inside one float32 tensor, else through a buffer cast into each.
class TensorListOutput : public GroupTensorsOutput {
 public:
  TensorListOutput(const GroupLayout& layout, const std::vector<Tensor*>& tensors)
      : layout_(layout), tensors_(tensors) {}

  Status TensorArrays(OpKernelContext* context, std::vector<float*>* arrays) const override {
    arrays->resize(tensors_.size());
    scratch_.resize(tensors_.size());
    for (size_t t = 0; t < tensors_.size(); ++t) {
      if (tensors_[t]->dtype() == tensorflow::DT_FLOAT) {
        (*arrays)[t] = static_cast<float*>(tensors_[t]->data());
        continue;
      }
      TF_RETURN_IF_ERROR(context->allocate_temp(tensorflow::DT_FLOAT,
                                                TensorShape({layout_.size(t)}), &scratch_[t]));
      (*arrays)[t] = scratch_[t].flat<float>().data();
    }
    return tensorflow::OkStatus();
  }

  void CastScratch(OpKernelContext* context) const override {
    ForEachPartInParallel(context, layout_, 2, [&](int64_t t, int64_t begin, int64_t end) {
      if (tensors_[t]->dtype() == tensorflow::DT_FLOAT) return;
      const float* values = scratch_[t].flat<float>().data();
      DispatchFloatType(tensors_[t]->dtype(), [&](auto type_tag) {
        using T = decltype(type_tag);
        T* out = static_cast<T*>(tensors_[t]->data());
        for (int64_t j = begin; j < end; ++j) out[j] = static_cast<T>(values[j]);
      });
    });
  }

  float* Begin(int64_t begin, int64_t count) const override {
    const int64_t i = layout_.TensorAt(begin);
    if (begin + count <= layout_.offset(i + 1) && tensors_[i]->dtype() == tensorflow::DT_FLOAT) {
      return static_cast<float*>(tensors_[i]->data()) + (begin - layout_.offset(i));
    }
    return ThreadBlockBuffer(1);
  }

  void Commit(int64_t begin, int64_t count, float* written) const override {
    if (written != ThreadBlockBuffer(1)) return;  // written in place
    layout_.ForEachPart(begin, begin + count, [&](int64_t t, int64_t part_begin, int64_t part_end) {
      const float* values = written + (layout_.offset(t) - begin);
      DispatchFloatType(tensors_[t]->dtype(), [&](auto type_tag) {
        using T = decltype(type_tag);
        T* out = static_cast<T*>(tensors_[t]->data());
        for (int64_t j = part_begin; j < part_end; ++j) out[j] = static_cast<T>(values[j]);
      });
    });
  }

  float* Contiguous() const override {
    return tensors_.size() == 1 && tensors_[0]->dtype() == tensorflow::DT_FLOAT
               ? static_cast<float*>(tensors_[0]->data())
               : nullptr;
  }

 private:
  const GroupLayout& layout_;
  const std::vector<Tensor*>& tensors_;
  mutable std::vector<Tensor> scratch_;  // float32 values of the tensors of other dtypes
};

// Non-finite gradients. A tensor holding an inf or a NaN on this worker (or
// whose g + e overflows float32, FiniteWatch) is encoded as zeros and the
// group's state is left exactly as it was; one
// marker element per tensor after the codec's payload says which tensors
// were not finite (0 or 1; after an allreduce their mean, still > 0 where any
// worker marked). The decoder fills every tensor that any worker marked with
// NaN and reports it, so all workers see the same non-finite gradients (a
// loss-scale optimizer then skips the step on every worker) and nothing
// non-finite reaches a residual or a momentum.

// Writes the markers (0 or 1 per tensor) as payload elements of `type`.
void WriteMarkers(DataType type, const std::vector<uint8_t>& nonfinite, uint8_t* markers) {
  for (size_t i = 0; i < nonfinite.size(); ++i) {
    switch (type) {
      case tensorflow::DT_HALF:
        reinterpret_cast<Eigen::half*>(markers)[i] = Eigen::half(nonfinite[i] ? 1.0f : 0.0f);
        break;
      case tensorflow::DT_FLOAT:
        reinterpret_cast<float*>(markers)[i] = nonfinite[i] ? 1.0f : 0.0f;
        break;
      default: markers[i] = nonfinite[i]; break;
    }
  }
}

// True when marker i of a row (or of the averaged row) is set.
bool MarkerSet(DataType type, const uint8_t* markers, int64_t i) {
  switch (type) {
    case tensorflow::DT_HALF:
      return static_cast<float>(reinterpret_cast<const Eigen::half*>(markers)[i]) != 0.0f;
    case tensorflow::DT_FLOAT: return reinterpret_cast<const float*>(markers)[i] != 0.0f;
    default: return markers[i] != 0;
  }
}

// Bytes of the markers after the codec's payload in each row.
int64_t MarkerBytes(DataType payload_type, const GroupLayout& layout) {
  return payload_size::Markers(layout.num_tensors(), tensorflow::DataTypeSize(payload_type));
}

class GroupEncodeOp : public OpKernel {
 public:
  explicit GroupEncodeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, ReadGroupCodecAttrs(context, &codec_, &params_, &payload_type_));
    std::string memory;
    OP_REQUIRES_OK(context, context->GetAttr("memory", &memory));
    memory_ = memory == "residual"   ? Memory::kResidual
              : memory == "momentum" ? Memory::kMomentum
              : memory == "dgc"      ? Memory::kDgc
                                     : Memory::kNone;
    OP_REQUIRES_OK(context, context->GetAttr("decay", &decay_));
    OP_REQUIRES_OK(context, context->GetAttr("gradient_scale", &gradient_scale_));
  }

  void Compute(OpKernelContext* context) override {
    tensorflow::OpInputList gradients;
    OP_REQUIRES_OK(context, context->input_list("gradients", &gradients));
    std::vector<int64_t> sizes;
    for (const Tensor& g : gradients) sizes.push_back(g.NumElements());
    const GroupLayout layout(sizes);
    const Tensor& seed_tensor = context->input(context->num_inputs() - 1);
    OP_REQUIRES(context, tensorflow::TensorShapeUtils::IsScalar(seed_tensor.shape()),
                tensorflow::errors::InvalidArgument("seed must be a scalar"));
    const int64_t seed = seed_tensor.scalar<int64_t>()();

    std::vector<int64_t> state_sizes;
    for (int64_t i = 0; memory_ != Memory::kNone && i < layout.num_tensors(); ++i) {
      state_sizes.push_back(StateBuffers(memory_) * layout.size(i));
    }
    LockedStateVariables state;
    OP_REQUIRES_OK(context, state.Acquire(context, state_sizes,
                                          "the memory's buffers of the tensor, back to back",
                                          /*exclusive=*/true));

    const int64_t payload_bytes = codec_->PayloadBytes(layout, params_);
    const int64_t element_bytes = tensorflow::DataTypeSize(payload_type_);
    Tensor* payload_tensor = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(
                       0, TensorShape({(payload_bytes + MarkerBytes(payload_type_, layout)) /
                                       element_bytes}),
                       &payload_tensor));
    Tensor* context_tensor = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                1, TensorShape({codec_->ContextSize(layout, params_)}),
                                &context_tensor));
    auto* payload = static_cast<uint8_t*>(payload_tensor->data());
    int32_t* codec_context = context_tensor->flat<int32_t>().data();

    std::vector<Tensor> inputs;
    for (int i = 0; i < gradients.size(); ++i) inputs.push_back(gradients[i]);
    const FiniteWatch watch(layout, inputs);
    // Dense codecs whose encode writes no state encode first, checking as they read.
    std::unique_ptr<CompensatedInput> encoded;
    if (!codec_->SendsEntries() && !CompensatedInput::WritesState(memory_)) {
      encoded.reset(new CompensatedInput(layout, inputs, memory_, decay_, gradient_scale_, state,
                                         &watch));
      OP_REQUIRES_OK(context, codec_->Encode(context, *encoded, layout, params_, seed, payload,
                                             codec_context));
    }
    const std::vector<uint8_t> nonfinite = watch.Finish(context);
    WriteMarkers(payload_type_, nonfinite, payload + payload_bytes);
    if (std::find(nonfinite.begin(), nonfinite.end(), 1) == nonfinite.end()) {
      OP_REQUIRES_OK(context,
                     encoded ? UpdateState(context, layout, *encoded, state, payload, codec_context)
                             : Encode(context, layout, inputs, state, seed, payload, codec_context));
      return;
    }
    // Rare: encode with the non-finite tensors as zeros, then put the state back.
    for (int64_t i = 0; i < layout.num_tensors(); ++i) {
      if (!nonfinite[i]) continue;
      Tensor zeros;
      OP_REQUIRES_OK(context, context->allocate_temp(inputs[i].dtype(), inputs[i].shape(), &zeros));
      memset(zeros.data(), 0, zeros.TotalBytes());
      inputs[i] = zeros;
    }
    std::vector<std::vector<float>> saved(state_sizes.size());
    for (size_t i = 0; i < state_sizes.size(); ++i) {
      saved[i].assign(state.buffer(i), state.buffer(i) + state_sizes[i]);
    }
    OP_REQUIRES_OK(context, Encode(context, layout, inputs, state, seed, payload, codec_context));
    for (size_t i = 0; i < state_sizes.size(); ++i) {
      std::copy(saved[i].begin(), saved[i].end(), state.buffer(i));
    }
  }

 private:
  Status Encode(OpKernelContext* context, const GroupLayout& layout,
                const std::vector<Tensor>& gradients, const LockedStateVariables& state,
                int64_t seed, uint8_t* payload, int32_t* codec_context) const {
    if (codec_->SendsEntries()) {
      return EncodeEntries(context, layout, gradients, state, seed, payload, codec_context);
    }
    const CompensatedInput compensated(layout, gradients, memory_, decay_, gradient_scale_, state);
    TF_RETURN_IF_ERROR(
        codec_->Encode(context, compensated, layout, params_, seed, payload, codec_context));
    return UpdateState(context, layout, compensated, state, payload, codec_context);
  }

  // After a dense codec's Encode: the state moves for every element.
  Status UpdateState(OpKernelContext* context, const GroupLayout& layout,
                     const CompensatedInput& compensated, const LockedStateVariables& state,
                     const uint8_t* payload, const int32_t* codec_context) const {
    compensated.CompensateRest(context);
    if (memory_ == Memory::kResidual || memory_ == Memory::kDgc) {
      const StateUpdateOutput update(layout, compensated, memory_, state);
      TF_RETURN_IF_ERROR(
          codec_->Decode(context, payload, 1, codec_context, layout, params_, update));
    }
    return tensorflow::OkStatus();
  }

  // The sparse codecs: the codec compensates into the state (or, for
  // gradients it cannot read as float32 arrays, into a scratch copy) in one
  // pass that it may fuse with its own, and selects from there; the state is
  // then corrected at the sent entries only (e <- p - sent; dgc: v <- p -
  // sent, u masked where something non-zero was sent).
  Status EncodeEntries(OpKernelContext* context, const GroupLayout& layout,
                       const std::vector<Tensor>& gradients, const LockedStateVariables& state,
                       int64_t seed, uint8_t* payload, int32_t* codec_context) const {
    Tensor scratch;
    const int64_t scratch_size = CompensatedSparseInput::ScratchSize(layout, gradients, memory_);
    if (scratch_size > 0) {
      TF_RETURN_IF_ERROR(
          context->allocate_temp(tensorflow::DT_FLOAT, TensorShape({scratch_size}), &scratch));
    }
    const CompensatedSparseInput compensated(
        layout, gradients, memory_, decay_, gradient_scale_, state,
        scratch_size > 0 ? scratch.flat<float>().data() : nullptr);
    TF_RETURN_IF_ERROR(codec_->Encode(context, compensated, layout, params_, seed, payload,
                                      codec_context));
    if ((memory_ != Memory::kResidual && memory_ != Memory::kDgc) ||
        codec_->TakesSentWhileEncoding()) {
      return tensorflow::OkStatus();
    }
    // Sent entries come in ascending flat order (but for DGC's padding).
    TensorCursor cursor(layout);
    codec_->ForEachSent(payload, codec_context, layout, params_, [&](int64_t index, float value) {
      int64_t j = 0;
      const int64_t t = cursor.Locate(index, &j);
      compensated.TakeSent(t, j, value);
    });
    return tensorflow::OkStatus();
  }

  std::unique_ptr<GroupCodec> codec_;
  GroupCodecParams params_;
  DataType payload_type_;
  Memory memory_ = Memory::kNone;
  float decay_ = 0.0f;
  float gradient_scale_ = 1.0f;
};

class GroupDecodeOp : public OpKernel {
 public:
  explicit GroupDecodeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, ReadGroupCodecAttrs(context, &codec_, &params_, &payload_type_));
    OP_REQUIRES_OK(context, context->GetAttr("num_rows", &num_rows_));
    OP_REQUIRES_OK(context, context->GetAttr("T", &dtypes_));
    std::vector<tensorflow::PartialTensorShape> shapes;
    OP_REQUIRES_OK(context, context->GetAttr("shapes", &shapes));
    OP_REQUIRES(context, shapes.size() == dtypes_.size(),
                tensorflow::errors::InvalidArgument("shapes and T must have the same length"));
    std::vector<int64_t> sizes;
    for (const auto& shape : shapes) {
      TensorShape full;
      OP_REQUIRES(context, shape.AsTensorShape(&full),
                  tensorflow::errors::InvalidArgument("shapes must be fully defined, got ",
                                                      shape.DebugString()));
      shapes_.push_back(full);
      sizes.push_back(full.num_elements());
    }
    layout_ = GroupLayout(sizes);
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& rows = context->input(0);
    const Tensor& context_tensor = context->input(1);
    const int64_t payload_bytes = codec_->PayloadBytes(layout_, params_);
    const int64_t row_bytes = payload_bytes + MarkerBytes(payload_type_, layout_);
    OP_REQUIRES(context, rows.TotalBytes() == static_cast<size_t>(num_rows_ * row_bytes),
                tensorflow::errors::InvalidArgument(
                    "the collected payloads hold ", rows.TotalBytes(), " bytes; expected ",
                    num_rows_, " row(s) of ", row_bytes, " bytes"));
    OP_REQUIRES(context, context_tensor.NumElements() == codec_->ContextSize(layout_, params_),
                tensorflow::errors::InvalidArgument("codec_context has ", context_tensor.NumElements(),
                                                    " entries; expected ",
                                                    codec_->ContextSize(layout_, params_)));
    tensorflow::OpOutputList outputs;
    OP_REQUIRES_OK(context, context->output_list("gradients", &outputs));
    std::vector<Tensor*> tensors(shapes_.size());
    for (size_t i = 0; i < shapes_.size(); ++i) {
      OP_REQUIRES_OK(context, outputs.allocate(i, shapes_[i], &tensors[i]));
    }
    Tensor* nonfinite_tensor = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output("nonfinite", TensorShape({layout_.num_tensors()}),
                                                     &nonfinite_tensor));
    auto nonfinite = nonfinite_tensor->flat<int32_t>();
    const auto* collected = static_cast<const uint8_t*>(rows.data());
    for (int64_t i = 0; i < layout_.num_tensors(); ++i) {
      nonfinite(i) = 0;
      for (int64_t row = 0; row < num_rows_; ++row) {
        if (MarkerSet(payload_type_, collected + row * row_bytes + payload_bytes, i)) nonfinite(i) = 1;
      }
    }

    // The codecs read rows of payload_bytes back to back: gathered rows lose
    // their markers in a copy (of compressed payloads: small next to the output).
    Tensor packed;
    if (num_rows_ > 1) {
      OP_REQUIRES_OK(context, context->allocate_temp(tensorflow::DT_UINT8,
                                                     TensorShape({num_rows_ * payload_bytes}),
                                                     &packed));
      auto* destination = static_cast<uint8_t*>(packed.data());
      for (int64_t row = 0; row < num_rows_; ++row) {
        memcpy(destination + row * payload_bytes, collected + row * row_bytes, payload_bytes);
      }
      collected = destination;
    }
    const TensorListOutput output(layout_, tensors);
    OP_REQUIRES_OK(context, codec_->Decode(context, collected, num_rows_,
                                           context_tensor.flat<int32_t>().data(), layout_,
                                           params_, output));
    for (int64_t i = 0; i < layout_.num_tensors(); ++i) {
      if (!nonfinite(i)) continue;
      DispatchFloatType(tensors[i]->dtype(), [&](auto type_tag) {
        using T = decltype(type_tag);
        T* values = static_cast<T*>(tensors[i]->data());
        std::fill(values, values + layout_.size(i),
                  static_cast<T>(std::numeric_limits<float>::quiet_NaN()));
      });
    }
  }

 private:
  std::unique_ptr<GroupCodec> codec_;
  GroupCodecParams params_;
  DataType payload_type_;
  int64_t num_rows_ = 1;
  tensorflow::DataTypeVector dtypes_;
  std::vector<TensorShape> shapes_;
  GroupLayout layout_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("MergecompGroupEncode").Device(tensorflow::DEVICE_CPU),
                        GroupEncodeOp);
REGISTER_KERNEL_BUILDER(Name("MergecompGroupDecode").Device(tensorflow::DEVICE_CPU),
                        GroupDecodeOp);

}  // namespace tf_mergecomp
