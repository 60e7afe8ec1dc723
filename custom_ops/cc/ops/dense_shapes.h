// Shape functions shared by the dense codecs' op registrations.
#ifndef TF_MERGECOMP_DENSE_SHAPES_H_
#define TF_MERGECOMP_DENSE_SHAPES_H_

#include <functional>
#include <vector>

#include "tensorflow/core/framework/shape_inference.h"

namespace tf_mergecomp {

// Encoders: a 1-D input of n elements becomes a 1-D payload of bytes(n).
inline tensorflow::Status EncodedVectorShape(tensorflow::shape_inference::InferenceContext* c,
                                             const std::function<int64_t(int64_t)>& bytes) {
  tensorflow::shape_inference::ShapeHandle input;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &input));
  const auto n = c->Dim(input, 0);
  c->set_output(0, c->ValueKnown(n) ? c->Vector(bytes(c->Value(n))) : c->Vector(c->UnknownDim()));
  return tensorflow::OkStatus();
}

// Decoders: a [W, bytes] payload batch becomes a 1-D output of attr n elements.
inline tensorflow::Status DecodedVectorShape(tensorflow::shape_inference::InferenceContext* c) {
  tensorflow::shape_inference::ShapeHandle payload;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &payload));
  int64_t n;
  TF_RETURN_IF_ERROR(c->GetAttr("n", &n));
  c->set_output(0, c->Vector(n));
  return tensorflow::OkStatus();
}

// Ops whose outputs are a tensor list of the shapes in their "shapes" attribute.
inline tensorflow::Status ShapesAttrOutputs(tensorflow::shape_inference::InferenceContext* c) {
  std::vector<tensorflow::PartialTensorShape> shapes;
  TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
  for (size_t i = 0; i < shapes.size(); ++i) {
    tensorflow::shape_inference::ShapeHandle shape;
    TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &shape));
    c->set_output(static_cast<int>(i), shape);
  }
  return tensorflow::OkStatus();
}

// The same list, then one int32 vector of a flag per tensor (the group ops' nonfinite).
inline tensorflow::Status ShapesAttrAndFlagOutputs(tensorflow::shape_inference::InferenceContext* c) {
  TF_RETURN_IF_ERROR(ShapesAttrOutputs(c));
  std::vector<tensorflow::PartialTensorShape> shapes;
  TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
  c->set_output(static_cast<int>(shapes.size()), c->Vector(static_cast<int64_t>(shapes.size())));
  return tensorflow::OkStatus();
}

}  // namespace tf_mergecomp

#endif  // TF_MERGECOMP_DENSE_SHAPES_H_
