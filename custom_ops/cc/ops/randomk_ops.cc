// Op definition of random-k index selection.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

using tensorflow::shape_inference::InferenceContext;

REGISTER_OP("MergecompRandomkIndices")
    .Input("seed: int64")
    .Output("indices: int32")
    .Attr("n: int >= 0")
    .Attr("k: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      int64_t k;
      TF_RETURN_IF_ERROR(c->GetAttr("k", &k));
      tensorflow::shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      c->set_output(0, c->Vector(k));
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
k distinct positions in [0, n), uniformly at random from the seed, ascending:
the k largest counter-based random keys RandomBits(seed, i), ties to the lower
index.
)doc");
