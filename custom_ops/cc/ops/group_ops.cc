// The group codec ops (kernels in cc/kernels/group_op.{h,cc}; each codec's
// group adapter in its own cc/kernels/<codec>_op.cc).
#include <string>

#include "cc/kernels/group_op.h"
#include "cc/ops/dense_shapes.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/types.h"

namespace tf_mergecomp {
namespace {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// Attributes shared by the encode and decode ops: which codec, its
// parameters (each codec reads its own; see group_op.h), the payload's dtype.
#define MERGECOMP_GROUP_CODEC_ATTRS                        \
  Attr("codec: string")                                    \
      .Attr("payload_type: {uint8, half, float}")          \
      .Attr("levels: int = 0")                             \
      .Attr("k: int = 0")                                  \
      .Attr("tensor_k: list(int) = []")                    \
      .Attr("sample_size: int = 0")                        \
      .Attr("scale: bool = false")

tensorflow::Status EncodeShape(InferenceContext* c) {
  std::unique_ptr<GroupCodec> codec;
  GroupCodecParams params;
  tensorflow::DataType payload_type;
  TF_RETURN_IF_ERROR(ReadGroupCodecAttrs(c, &codec, &params, &payload_type));
  const int64_t element_bytes = tensorflow::DataTypeSize(payload_type);
  std::vector<int64_t> sizes;
  std::vector<tensorflow::DataType> dtypes;
  TF_RETURN_IF_ERROR(c->GetAttr("T", &dtypes));
  for (size_t i = 0; i < dtypes.size(); ++i) {
    const ShapeHandle shape = c->input(static_cast<int>(i));
    if (!c->RankKnown(shape)) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return tensorflow::OkStatus();
    }
    const auto elements = c->NumElements(shape);
    if (!c->ValueKnown(elements)) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return tensorflow::OkStatus();
    }
    sizes.push_back(c->Value(elements));
  }
  const GroupLayout layout(sizes);
  // The codec's payload, then one non-finite marker element per tensor.
  c->set_output(0, c->Vector(codec->PayloadBytes(layout, params) / element_bytes +
                             layout.num_tensors()));
  c->set_output(1, c->Vector(codec->ContextSize(layout, params)));
  return tensorflow::OkStatus();
}


}  // namespace

REGISTER_OP("MergecompGroupEncode")
    .Input("gradients: T")
    .Input("state: num_state * resource")
    .Input("seed: int64")
    .Output("payload: payload_type")
    .Output("codec_context: int32")
    .Attr("T: list({half, bfloat16, float, double}) >= 1")
    .Attr("num_state: int >= 0")
    .Attr("memory: {'none', 'residual', 'momentum', 'dgc'}")
    .Attr("decay: float = 0.0")
    .Attr("gradient_scale: float = 1.0")
    .MERGECOMP_GROUP_CODEC_ATTRS
    .SetIsStateful()
    .SetShapeFn(EncodeShape)
    .Doc(R"doc(
Compensates a group's gradients with their error-feedback state, encodes the
group's one payload, and updates the state from this worker's own payload.

state: one float32 resource variable per gradient tensor (none when memory is
  'none'), holding the memory's buffers back to back: residual e (residual),
  momentum m (momentum), momentum u then accumulation v (dgc); updated in place.
  With p the compensated group and s = decode(own payload):
  none p = g; residual p = g + e, e <- p - s; momentum m <- decay*m +
  gradient_scale*g, p = m; dgc u <- decay*u + g, v <- v + u, p = v,
  v <- p - s, u <- u * (s == 0).
seed: this worker's seed of the step and group (bits 12-23: the group's first
  tensor index).
payload: the codec's payload, then one marker per tensor (1: this worker's
  tensor held an inf or a NaN and was encoded as zeros, the state left as it
  was; else 0).
codec_context: what the decoder needs besides the payload (random-k's positions).
)doc");

REGISTER_OP("MergecompGroupDecode")
    .Input("rows: payload_type")
    .Input("codec_context: int32")
    .Output("gradients: T")
    .Output("nonfinite: int32")
    .Attr("T: list({half, bfloat16, float, double}) >= 1")
    .Attr("shapes: list(shape)")
    .Attr("num_rows: int >= 1")
    .MERGECOMP_GROUP_CODEC_ATTRS
    .SetShapeFn(ShapesAttrAndFlagOutputs)
    .Doc(R"doc(
The combined gradients of a group from what its collective returned: num_rows
payloads back to back (every worker's, after an allgather; the averaged one,
after an allreduce), written into tensors of the given shapes and dtypes.
nonfinite: 1 for each tensor that some worker marked non-finite (its output is
  then all NaN), else 0.
)doc");

}  // namespace tf_mergecomp
