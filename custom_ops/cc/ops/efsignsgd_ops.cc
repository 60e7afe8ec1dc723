#include "cc/ops/dense_shapes.h"
#include "tensorflow/core/framework/op.h"

REGISTER_OP("MergecompEfsignsgdEncode")
    .Input("input: float")
    .Output("payload: uint8")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      return tf_mergecomp::EncodedVectorShape(c, [](int64_t n) { return 4 + (n + 7) / 8; });
    })
    .Doc(R"doc(
EF-SignSGD payload, 4 + ceil(n/8) bytes: float32 scale = sum|x|/n (0 when
n = 0), then the sign bits as MergecompSignsgdEncode.
)doc");

REGISTER_OP("MergecompEfsignsgdDecode")
    .Input("payload: uint8")
    .Attr("n: int >= 0")
    .Output("output: float")
    .SetShapeFn(tf_mergecomp::DecodedVectorShape)
    .Doc("Mean over the W rows of [W, 4 + ceil(n/8)] of (bit ? scale : -scale).");
