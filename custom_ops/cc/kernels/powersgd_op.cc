// CPU kernels of MergecompPowersgdGroupP, MergecompPowersgdGroupQ and
// MergecompPowersgdGroupFinish (see powersgd_op.h).
//
// The matrix products are Eigen's (row-major Eigen::Map views of the flat
// buffers, no copies). Each product is cut into chunks of rows (or of
// columns, for M^T P, so that every output element is one thread's sum) of
// about kChunkElements elements of M, and the chunks of all the group's
// tensors are sharded over TensorFlow's intra-op pool together: many small
// tensors and one large tensor both use every thread, and results do not
// depend on the thread count.
#include "cc/kernels/powersgd_op.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "cc/kernels/dense_cpu.h"
#include "cc/kernels/finite.h"
#include "cc/kernels/state_variables.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tf_mergecomp {
namespace {

using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMajorMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix>;
// Some columns of a row-major matrix: rows keep the whole matrix's stride.
using ConstColumnsMap = Eigen::Map<const RowMajorMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;

// Elements of M per unit of parallel work: enough to amortise the pool's
// dispatch, few enough that one large tensor spreads over every thread.
constexpr int64_t kChunkElements = int64_t{1} << 16;
// A column chunk reads at least this many consecutive floats (four 64-byte
// cache lines) of each of M's rows, so the strided reads of M^T P stream.
constexpr int64_t kColumnAlignment = 64;

// Rows, columns or elements [begin, end) of one tensor.
struct Chunk {
  int64_t tensor;
  int64_t begin;
  int64_t end;
};

enum class ChunkOver { kElements, kRows, kColumns };

std::vector<Chunk> MakeChunks(const PowersgdGroupLayout& layout, ChunkOver over) {
  std::vector<Chunk> chunks;
  for (int64_t i = 0; i < layout.num_tensors(); ++i) {
    const PowersgdTensor& t = layout.tensor(i);
    int64_t extent = 0;
    int64_t step = 1;
    if (over == ChunkOver::kElements) {
      extent = t.size;
      step = kChunkElements;
    } else if (!t.low_rank) {
      continue;
    } else if (over == ChunkOver::kRows) {
      extent = t.rows;
      step = std::max<int64_t>(1, kChunkElements / t.cols);
    } else {
      extent = t.cols;
      step = std::max(kColumnAlignment,
                      kChunkElements / t.rows / kColumnAlignment * kColumnAlignment);
    }
    for (int64_t begin = 0; begin < extent; begin += step) {
      chunks.push_back({i, begin, std::min(extent, begin + step)});
    }
  }
  return chunks;
}

// Calls fn(chunk) for every chunk, sharded over the intra-op pool;
// cost_per_element in the pool's units (~cycles per element of M).
void ForEachChunk(OpKernelContext* context, const std::vector<Chunk>& chunks,
                  int64_t cost_per_element, const std::function<void(const Chunk&)>& fn) {
  ForEachBlock(context, static_cast<int64_t>(chunks.size()), kChunkElements * cost_per_element,
               [&](int64_t c) { fn(chunks[c]); });
}

// A per-thread float buffer of at least `size` elements, reused across calls:
// a chunk's intermediate products stay in cache instead of being allocated
// (and, above malloc's mmap threshold, page-faulted) every time.
float* ThreadScratch(int64_t size) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < size) scratch.resize(size);
  return scratch.data();
}

// Gram-Schmidt, applied twice ("twice is enough"), on the r columns of a
// rows x r row-major matrix, in place. Dot products and norms accumulate in
// double; a column whose norm is below kPowersgdMinNorm (or NaN) becomes
// zero times itself, so zeros stay zero and NaN propagates.
void Orthonormalize(float* p, int64_t rows, int64_t rank) {
  for (int64_t j = 0; j < rank; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t previous = 0; previous < j; ++previous) {
        double dot = 0.0;
        for (int64_t i = 0; i < rows; ++i) {
          dot += static_cast<double>(p[i * rank + previous]) * p[i * rank + j];
        }
        const float projection = static_cast<float>(dot);
        for (int64_t i = 0; i < rows; ++i) p[i * rank + j] -= projection * p[i * rank + previous];
      }
    }
    double squares = 0.0;
    for (int64_t i = 0; i < rows; ++i) {
      squares += static_cast<double>(p[i * rank + j]) * p[i * rank + j];
    }
    const double norm = std::sqrt(squares);
    const float scale = norm > kPowersgdMinNorm ? static_cast<float>(1.0 / norm) : 0.0f;
    for (int64_t i = 0; i < rows; ++i) p[i * rank + j] *= scale;
  }
}

class PowersgdGroupPOp : public PowersgdKernel<PowersgdPAttrs> {
 public:
  using PowersgdKernel::PowersgdKernel;

  void Compute(OpKernelContext* context) override {
    tensorflow::OpInputList gradients;
    OP_REQUIRES_OK(context, context->input_list("gradients", &gradients));
    const PowersgdGroupLayout layout(PowersgdGradientDims(gradients), attrs_.rank);
    LockedStateVariables state;
    OP_REQUIRES_OK(context, PowersgdAcquireState(context, layout, attrs_.residual,
                                                 /*exclusive=*/false, &state));

    Tensor* p_tensor = nullptr;
    Tensor* m_tensor = nullptr;
    OP_REQUIRES_OK(context, PowersgdAllocatePOutputs(context, layout, &p_tensor, &m_tensor));
    float* p = p_tensor->flat<float>().data();
    float* m = m_tensor->flat<float>().data();

    // M = g (+ e) over elements [begin, end) of tensor i, into out (M_i's start).
    auto compensate = [&](int64_t i, int64_t begin, int64_t end, float* out) {
      const float* e = attrs_.residual ? state.buffer(i) : nullptr;
      DispatchFloatType(gradients[i].dtype(), [&](auto type_tag) {
        using T = decltype(type_tag);
        const T* g = static_cast<const T*>(gradients[i].data());
        if (e != nullptr) {
          for (int64_t j = begin; j < end; ++j) out[j] = static_cast<float>(g[j]) + e[j];
        } else {
          for (int64_t j = begin; j < end; ++j) out[j] = static_cast<float>(g[j]);
        }
      });
    };

    // Low-rank tensors, by blocks of rows: the block of M, then its rows of
    // P_i = M_i Q_i while the block is still in cache.
    ForEachChunk(context, MakeChunks(layout, ChunkOver::kRows), 2 * attrs_.rank + 3,
                 [&](const Chunk& c) {
                   const PowersgdTensor& t = layout.tensor(c.tensor);
                   compensate(c.tensor, c.begin * t.cols, c.end * t.cols, m + t.m_offset);
                   const float* q = state.buffer(c.tensor) +
                                    layout.q_state_offset(c.tensor, attrs_.residual);
                   const int64_t rows = c.end - c.begin;
                   MatrixMap(p + t.p_offset + c.begin * t.rank, rows, t.rank).noalias() =
                       ConstMatrixMap(m + t.m_offset + c.begin * t.cols, rows, t.cols) *
                       ConstMatrixMap(q, t.cols, t.rank);
                 });

    // The other tensors' M go into the payload as they are.
    ForEachChunk(context, MakeChunks(layout, ChunkOver::kElements), 3, [&](const Chunk& c) {
      const PowersgdTensor& t = layout.tensor(c.tensor);
      if (!t.low_rank) compensate(c.tensor, c.begin, c.end, p + t.p_offset);
    });
  }
};

class PowersgdGroupQOp : public PowersgdKernel<PowersgdShapesAttrs> {
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
    float* q = q_tensor->flat<float>().data();
    const float* m = compensated.flat<float>().data();
    if (layout.p_payload_size() > 0 && p != p_mean.flat<float>().data()) {
      std::memcpy(p, p_mean.flat<float>().data(), sizeof(float) * layout.p_payload_size());
    }

    ForEachBlock(context, layout.num_tensors(), 64 * kChunkElements, [&](int64_t i) {
      const PowersgdTensor& t = layout.tensor(i);
      if (t.low_rank) Orthonormalize(p + t.p_offset, t.rows, t.rank);
    });

    // Qlocal_i = M_i^T P_i, by blocks of columns.
    ForEachChunk(context, MakeChunks(layout, ChunkOver::kColumns), 2 * attrs_.rank,
                 [&](const Chunk& c) {
                   const PowersgdTensor& t = layout.tensor(c.tensor);
                   const int64_t cols = c.end - c.begin;
                   MatrixMap(q + t.q_offset + c.begin * t.rank, cols, t.rank).noalias() =
                       ConstColumnsMap(m + t.m_offset + c.begin, t.rows, cols,
                                       Eigen::OuterStride<>(t.cols))
                           .transpose() *
                       ConstMatrixMap(p + t.p_offset, t.rows, t.rank);
                 });
  }
};

class PowersgdGroupFinishOp : public PowersgdKernel<PowersgdFinishAttrs> {
 public:
  using PowersgdKernel::PowersgdKernel;

  void Compute(OpKernelContext* context) override {
    const PowersgdGroupLayout& layout = *attrs_.layout;
    const Tensor& p_tensor = context->input(0);
    const Tensor& q_local_tensor = context->input(1);
    const Tensor& q_mean_tensor = context->input(2);
    const Tensor& m_tensor = context->input(3);
    OP_REQUIRES_OK(context, PowersgdCheckFinishInputs(context, layout));
    LockedStateVariables state;
    OP_REQUIRES_OK(context, PowersgdAcquireState(context, layout, attrs_.residual,
                                                 /*exclusive=*/true, &state));
    std::vector<Tensor*> out;
    Tensor* nonfinite_tensor = nullptr;
    OP_REQUIRES_OK(context,
                   PowersgdAllocateFinishOutputs(context, attrs_, &out, &nonfinite_tensor));
    const float* p = p_tensor.flat<float>().data();
    const float* q_local = q_local_tensor.flat<float>().data();
    const float* q_mean = q_mean_tensor.flat<float>().data();
    const float* m = m_tensor.flat<float>().data();

    // A tensor that some worker could not send finitely has a non-finite
    // averaged P_i (or Qmean_i), the same on every worker: its output is all
    // NaN and its residual and Q stay as they were. The low-rank tensors' P_i
    // and Qmean_i are small; the other tensors' values are checked below,
    // chunk by chunk as they are copied out.
    auto nonfinite = nonfinite_tensor->flat<int32_t>();
    for (int64_t i = 0; i < layout.num_tensors(); ++i) {
      const PowersgdTensor& t = layout.tensor(i);
      nonfinite(i) = t.low_rank && !(AllFinite(p + t.p_offset, 0, t.rows * t.rank) &&
                                     AllFinite(q_mean + t.q_offset, 0, t.cols * t.rank));
    }

    // Low-rank tensors, by blocks of rows: out = P Qmean^T, e = M - P Qlocal^T.
    const int64_t rank = attrs_.rank;
    ForEachChunk(context, MakeChunks(layout, ChunkOver::kRows), 4 * rank, [&](const Chunk& c) {
      const int64_t i = c.tensor;
      const PowersgdTensor& t = layout.tensor(i);
      const int64_t rows = c.end - c.begin;
      const ConstMatrixMap p_block(p + t.p_offset + c.begin * t.rank, rows, t.rank);
      if (attrs_.dtypes[i] == tensorflow::DT_FLOAT) {
        MatrixMap(out[i]->flat<float>().data() + c.begin * t.cols, rows, t.cols).noalias() =
            p_block * ConstMatrixMap(q_mean + t.q_offset, t.cols, t.rank).transpose();
      } else {
        MatrixMap product(ThreadScratch(rows * t.cols), rows, t.cols);
        product.noalias() = p_block * ConstMatrixMap(q_mean + t.q_offset, t.cols, t.rank).transpose();
        DispatchFloatType(attrs_.dtypes[i], [&](auto type_tag) {
          using T = decltype(type_tag);
          T* target = static_cast<T*>(out[i]->data()) + c.begin * t.cols;
          const float* source = product.data();
          for (int64_t j = 0; j < rows * t.cols; ++j) target[j] = static_cast<T>(source[j]);
        });
      }
      if (attrs_.residual && !nonfinite(i)) {
        // What this worker sent, in cache, then e = M - sent.
        MatrixMap sent(ThreadScratch(rows * t.cols), rows, t.cols);
        sent.noalias() = p_block * ConstMatrixMap(q_local + t.q_offset, t.cols, t.rank).transpose();
        MatrixMap(state.buffer(i) + c.begin * t.cols, rows, t.cols) =
            ConstMatrixMap(m + t.m_offset + c.begin * t.cols, rows, t.cols) - sent;
      }
    });

    // The other tensors: the averaged values, each chunk checked while in cache.
    const std::vector<Chunk> element_chunks = MakeChunks(layout, ChunkOver::kElements);
    std::vector<char> chunk_nonfinite(element_chunks.size(), 0);
    ForEachChunk(context, element_chunks, 3, [&](const Chunk& c) {
      const int64_t i = c.tensor;
      const PowersgdTensor& t = layout.tensor(i);
      if (t.low_rank) return;
      const float* values = p + t.p_offset;
      chunk_nonfinite[&c - element_chunks.data()] = !AllFinite(values, c.begin, c.end);
      DispatchFloatType(attrs_.dtypes[i], [&](auto type_tag) {
        using T = decltype(type_tag);
        T* target = static_cast<T*>(out[i]->data());
        for (int64_t j = c.begin; j < c.end; ++j) target[j] = static_cast<T>(values[j]);
      });
    });
    for (size_t c = 0; c < element_chunks.size(); ++c) {
      if (chunk_nonfinite[c]) nonfinite(element_chunks[c].tensor) = 1;
    }
    if (attrs_.residual) {
      // What was sent is M itself: e = M - M, which is +0 for every finite
      // value (and a finite average means this worker's M was finite).
      ForEachChunk(context, element_chunks, 1, [&](const Chunk& c) {
        if (layout.tensor(c.tensor).low_rank || nonfinite(c.tensor)) return;
        float* e = state.buffer(c.tensor);
        std::fill(e + c.begin, e + c.end, 0.0f);
      });
    }

    // Warm start: the averaged Q is next step's Q.
    for (int64_t i = 0; i < layout.num_tensors(); ++i) {
      const PowersgdTensor& t = layout.tensor(i);
      if (!t.low_rank || nonfinite(i)) continue;
      std::memcpy(state.buffer(i) + layout.q_state_offset(i, attrs_.residual), q_mean + t.q_offset,
                  sizeof(float) * t.cols * t.rank);
    }
    for (int64_t i = 0; i < layout.num_tensors(); ++i) {
      if (!nonfinite(i)) continue;
      DispatchFloatType(attrs_.dtypes[i], [&](auto type_tag) {
        using T = decltype(type_tag);
        T* values = static_cast<T*>(out[i]->data());
        std::fill(values, values + out[i]->NumElements(),
                  static_cast<T>(std::numeric_limits<float>::quiet_NaN()));
      });
    }
  }
};

}  // namespace

std::vector<std::vector<int64_t>> PowersgdGradientDims(const tensorflow::OpInputList& gradients) {
  std::vector<std::vector<int64_t>> dims;
  for (const Tensor& g : gradients) {
    const auto sizes = g.shape().dim_sizes();
    dims.emplace_back(sizes.begin(), sizes.end());
  }
  return dims;
}

Status PowersgdPAttrs::Read(OpKernelConstruction* context) {
  TF_RETURN_IF_ERROR(context->GetAttr("rank", &rank));
  return context->GetAttr("residual", &residual);
}

Status PowersgdShapesAttrs::Read(OpKernelConstruction* context) {
  TF_RETURN_IF_ERROR(context->GetAttr("rank", &rank));
  return ReadShapes(context);
}

Status PowersgdShapesAttrs::ReadShapes(OpKernelConstruction* context) {
  std::vector<tensorflow::PartialTensorShape> partial;
  TF_RETURN_IF_ERROR(context->GetAttr("shapes", &partial));
  std::vector<std::vector<int64_t>> dims;
  for (const auto& shape : partial) {
    TensorShape full;
    if (!shape.AsTensorShape(&full)) {
      return tensorflow::errors::InvalidArgument("shapes must be fully defined, got ",
                                                 shape.DebugString());
    }
    shapes.push_back(full);
    const auto sizes = full.dim_sizes();
    dims.emplace_back(sizes.begin(), sizes.end());
  }
  layout.reset(new PowersgdGroupLayout(dims, rank));
  return tensorflow::OkStatus();
}

Status PowersgdFinishAttrs::Read(OpKernelConstruction* context) {
  TF_RETURN_IF_ERROR(context->GetAttr("rank", &rank));
  TF_RETURN_IF_ERROR(context->GetAttr("residual", &residual));
  tensorflow::DataTypeVector types;
  TF_RETURN_IF_ERROR(context->GetAttr("T", &types));
  dtypes.assign(types.begin(), types.end());
  TF_RETURN_IF_ERROR(ReadShapes(context));
  if (shapes.size() != dtypes.size()) {
    return tensorflow::errors::InvalidArgument("shapes and T must have the same length, got ",
                                               shapes.size(), " and ", dtypes.size());
  }
  return tensorflow::OkStatus();
}

namespace {

Status CheckFlat(const Tensor& tensor, const char* name, int64_t expected) {
  if (tensor.dims() != 1 || tensor.NumElements() != expected) {
    return tensorflow::errors::InvalidArgument(name, " must be a vector of ", expected,
                                               " floats for this group, got shape ",
                                               tensor.shape().DebugString());
  }
  return tensorflow::OkStatus();
}

}  // namespace

Status PowersgdAllocatePOutputs(OpKernelContext* context, const PowersgdGroupLayout& layout,
                                Tensor** p, Tensor** m) {
  TF_RETURN_IF_ERROR(context->allocate_output(0, TensorShape({layout.p_payload_size()}), p));
  return context->allocate_output(1, TensorShape({layout.compensated_size()}), m);
}

Status PowersgdQInputsAndOutputs(OpKernelContext* context, const PowersgdGroupLayout& layout,
                                 Tensor** p, Tensor** q) {
  const Tensor& p_mean = context->input(0);
  TF_RETURN_IF_ERROR(CheckFlat(p_mean, "p_mean", layout.p_payload_size()));
  TF_RETURN_IF_ERROR(CheckFlat(context->input(1), "compensated", layout.compensated_size()));
  // P is orthonormalised in p_mean's own buffer where no other op reads it.
  TF_RETURN_IF_ERROR(context->forward_input_or_allocate_output({0}, 0, p_mean.shape(), p));
  return context->allocate_output(1, TensorShape({layout.q_payload_size()}), q);
}

Status PowersgdCheckFinishInputs(OpKernelContext* context, const PowersgdGroupLayout& layout) {
  TF_RETURN_IF_ERROR(CheckFlat(context->input(0), "p_orthonormal", layout.p_payload_size()));
  TF_RETURN_IF_ERROR(CheckFlat(context->input(1), "q_local", layout.q_payload_size()));
  TF_RETURN_IF_ERROR(CheckFlat(context->input(2), "q_mean", layout.q_payload_size()));
  return CheckFlat(context->input(3), "compensated", layout.compensated_size());
}

Status PowersgdAllocateFinishOutputs(OpKernelContext* context, const PowersgdShapesAttrs& attrs,
                                     std::vector<Tensor*>* gradients, Tensor** nonfinite) {
  tensorflow::OpOutputList outputs;
  TF_RETURN_IF_ERROR(context->output_list("gradients", &outputs));
  gradients->assign(attrs.shapes.size(), nullptr);
  for (size_t i = 0; i < attrs.shapes.size(); ++i) {
    TF_RETURN_IF_ERROR(outputs.allocate(i, attrs.shapes[i], &(*gradients)[i]));
  }
  return context->allocate_output("nonfinite", TensorShape({attrs.layout->num_tensors()}),
                                  nonfinite);
}

Status PowersgdAcquireState(OpKernelContext* context, const PowersgdGroupLayout& layout,
                            bool residual, bool exclusive, LockedStateVariables* state,
                            const LockedStateVariables::DeviceCopy* copy) {
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (int64_t i = 0; i < layout.num_tensors(); ++i) {
    sizes.push_back(layout.state_size(i, residual));
    total += sizes.back();
  }
  int first, end;
  TF_RETURN_IF_ERROR(context->op_kernel().InputRange("state", &first, &end));
  if (total == 0 && end == first) sizes.clear();
  return state->Acquire(context, sizes,
                        residual ? "the residual, then Q: cols x rank" : "Q: cols x rank",
                        exclusive, copy);
}

REGISTER_KERNEL_BUILDER(Name("MergecompPowersgdGroupP").Device(tensorflow::DEVICE_CPU),
                        PowersgdGroupPOp);
REGISTER_KERNEL_BUILDER(Name("MergecompPowersgdGroupQ").Device(tensorflow::DEVICE_CPU),
                        PowersgdGroupQOp);
REGISTER_KERNEL_BUILDER(Name("MergecompPowersgdGroupFinish").Device(tensorflow::DEVICE_CPU),
                        PowersgdGroupFinishOp);

}  // namespace tf_mergecomp
