// Op definition of Deep Gradient Compression's encoder.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

using tensorflow::shape_inference::InferenceContext;

REGISTER_OP("MergecompDgcEncode")
    .Input("input: float")
    .Input("seed: int64")
    .Output("payload: uint8")
    .Attr("k: int >= 0")
    .Attr("sample_size: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      int64_t k;
      TF_RETURN_IF_ERROR(c->GetAttr("k", &k));
      tensorflow::shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      c->set_output(0, c->Vector(8 * k));
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
Deep Gradient Compression's selection: a threshold estimated from a seeded
sample of |input| (sample_size draws), halved up to 3 times while it selects
fewer than k; payload of exactly k slots (8k bytes: float32 values, then int32
indices), the k largest candidates or all candidates padded with (0, index 0).
)doc");
