// Shape functions shared by the group ops' registrations (group_ops.cc,
// powersgd_ops.cc).
#ifndef TF_MERGECOMP_DENSE_SHAPES_H_
#define TF_MERGECOMP_DENSE_SHAPES_H_

#include <vector>

#include "tensorflow/core/framework/shape_inference.h"

namespace tf_mergecomp {

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
