// Op definitions of PowerSGD's group kernels (cc/kernels/powersgd_op.{h,cc}).
#include <vector>

#include "cc/kernels/powersgd_op.h"
#include "cc/ops/dense_shapes.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_mergecomp {
namespace {

using tensorflow::PartialTensorShape;
using tensorflow::Status;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// The layout from the `shapes` attribute; false (and nothing set) when a shape
// is not fully defined.
Status LayoutFromShapesAttr(InferenceContext* c, std::vector<std::vector<int64_t>>* dims,
                            bool* known) {
  std::vector<PartialTensorShape> shapes;
  TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
  *known = true;
  for (const auto& shape : shapes) {
    if (!shape.IsFullyDefined()) {
      *known = false;
      return tensorflow::OkStatus();
    }
    const auto sizes = shape.dim_sizes();
    dims->emplace_back(sizes.begin(), sizes.end());
  }
  return tensorflow::OkStatus();
}

Status PShape(InferenceContext* c) {
  std::vector<tensorflow::DataType> dtypes;
  TF_RETURN_IF_ERROR(c->GetAttr("T", &dtypes));
  int64_t rank;
  TF_RETURN_IF_ERROR(c->GetAttr("rank", &rank));
  std::vector<std::vector<int64_t>> dims;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    const ShapeHandle shape = c->input(static_cast<int>(i));
    if (!c->FullyDefined(shape)) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return tensorflow::OkStatus();
    }
    std::vector<int64_t> tensor_dims;
    for (int d = 0; d < c->Rank(shape); ++d) tensor_dims.push_back(c->Value(c->Dim(shape, d)));
    dims.push_back(tensor_dims);
  }
  const PowersgdGroupLayout layout(dims, rank);
  c->set_output(0, c->Vector(layout.p_payload_size()));
  c->set_output(1, c->Vector(layout.compensated_size()));
  return tensorflow::OkStatus();
}

Status QShape(InferenceContext* c) {
  int64_t rank;
  TF_RETURN_IF_ERROR(c->GetAttr("rank", &rank));
  std::vector<std::vector<int64_t>> dims;
  bool known;
  TF_RETURN_IF_ERROR(LayoutFromShapesAttr(c, &dims, &known));
  ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
  if (!known) {
    c->set_output(0, c->Vector(c->UnknownDim()));
    c->set_output(1, c->Vector(c->UnknownDim()));
    return tensorflow::OkStatus();
  }
  const PowersgdGroupLayout layout(dims, rank);
  c->set_output(0, c->Vector(layout.p_payload_size()));
  c->set_output(1, c->Vector(layout.q_payload_size()));
  return tensorflow::OkStatus();
}


}  // namespace

REGISTER_OP("MergecompPowersgdGroupP")
    .Input("gradients: T")
    .Input("state: num_state * resource")
    .Output("p: float")
    .Output("compensated: float")
    .Attr("T: list({half, bfloat16, float, double}) >= 1")
    .Attr("num_state: int >= 0")
    .Attr("rank: int >= 1")
    .Attr("residual: bool")
    .SetIsStateful()
    .SetShapeFn(PShape)
    .Doc(R"doc(
PowerSGD's first step over a group: M_i = g_i + e_i (residual) or g_i, and
P_i = M_i Q_i for every tensor of rank >= 2 (rows_i x cols_i, cols_i its last
dimension), Q_i read from the tensor's state.

state: one float32 resource variable per tensor, [e_i (residual only),
  Q_i (cols_i x r_i, tensors of rank >= 2 only)]; none when all are empty.
p: every P_i (rows_i x r_i, row-major), then the raw M values of the other
  tensors; the payload of the first allreduce.
compensated: M_i of every low-rank tensor, flat, for MergecompPowersgdGroupQ and
  Finish (the other tensors' M_i are their raw values in p).
)doc");

REGISTER_OP("MergecompPowersgdGroupQ")
    .Input("p_mean: float")
    .Input("compensated: float")
    .Output("p_orthonormal: float")
    .Output("q_local: float")
    .Attr("shapes: list(shape) >= 1")
    .Attr("rank: int >= 1")
    .SetShapeFn(QShape)
    .Doc(R"doc(
PowerSGD's second step: orthonormalises each averaged P_i (Gram-Schmidt
twice; a column of norm below 1e-30 becomes zero) and computes
Qlocal_i = M_i^T P_i, the payload of the second allreduce.

p_orthonormal: p_mean with each P_i orthonormalised (raw values copied).
)doc");

REGISTER_OP("MergecompPowersgdGroupFinish")
    .Input("p_orthonormal: float")
    .Input("q_local: float")
    .Input("q_mean: float")
    .Input("compensated: float")
    .Input("state: num_state * resource")
    .Output("gradients: T")
    .Output("nonfinite: int32")
    .Attr("T: list({half, bfloat16, float, double}) >= 1")
    .Attr("shapes: list(shape) >= 1")
    .Attr("num_state: int >= 0")
    .Attr("rank: int >= 1")
    .Attr("residual: bool")
    .SetIsStateful()
    .SetShapeFn(ShapesAttrAndFlagOutputs)
    .Doc(R"doc(
PowerSGD's last step: gradient i = P_i Qmean_i^T (the averaged raw values for
the other tensors) in its shape and dtype; updates the state in place:
Q_i <- Qmean_i, and with the residual memory e_i <- M_i - P_i Qlocal_i^T
(zero for the tensors sent as they are). A tensor whose averaged P_i or
Qmean_i is not finite (some worker's M_i was not) comes out all NaN, flagged
in nonfinite, and keeps its residual and Q.
)doc");

}  // namespace tf_mergecomp
