// Op definitions of top-k sparsification and the sparse payload decoder.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

using tensorflow::shape_inference::InferenceContext;

REGISTER_OP("MergecompTopkEncode")
    .Input("input: float")
    .Output("payload: uint8")
    .Attr("k: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      int64_t k;
      TF_RETURN_IF_ERROR(c->GetAttr("k", &k));
      tensorflow::shape_inference::ShapeHandle input;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &input));
      c->set_output(0, c->Vector(8 * k));
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
The k largest |input| (NaN counts as +inf; ties go to the lower index) as one
byte payload of 8k bytes: k float32 values, then their k int32 indices, in
ascending index order.
)doc");

REGISTER_OP("MergecompSparseScatterMean")
    .Input("collected: uint8")
    .Output("output: float")
    .Attr("n: int >= 0")
    .Attr("k: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      int64_t n;
      TF_RETURN_IF_ERROR(c->GetAttr("n", &n));
      tensorflow::shape_inference::ShapeHandle collected;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &collected));
      c->set_output(0, c->Vector(n));
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
Decodes W sparse payloads of k slots each, concatenated (W * 8k bytes): the
values are added into zeros worker by worker at their indices, then divided by
W. W = 1 decodes a single payload.
)doc");
