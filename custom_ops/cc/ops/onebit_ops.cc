#include "cc/ops/dense_shapes.h"
#include "tensorflow/core/framework/op.h"

REGISTER_OP("MergecompOnebitEncode")
    .Input("input: float")
    .Output("payload: uint8")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      return tf_mergecomp::EncodedVectorShape(c, [](int64_t n) { return 8 + (n + 7) / 8; });
    })
    .Doc(R"doc(
1-bit SGD payload, 8 + ceil(n/8) bytes: float32 mu+ (mean of elements with
!(x < 0), 0 if none), float32 mu- (mean of elements x < 0, 0 if none), then
the sign bits as MergecompSignsgdEncode.
)doc");

REGISTER_OP("MergecompOnebitDecode")
    .Input("payload: uint8")
    .Attr("n: int >= 0")
    .Output("output: float")
    .SetShapeFn(tf_mergecomp::DecodedVectorShape)
    .Doc("Mean over the W rows of [W, 8 + ceil(n/8)] of (bit ? mu+ : mu-).");
