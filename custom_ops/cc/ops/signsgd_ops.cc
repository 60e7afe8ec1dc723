#include "cc/ops/dense_shapes.h"
#include "tensorflow/core/framework/op.h"

REGISTER_OP("MergecompSignsgdEncode")
    .Input("input: float")
    .Output("payload: uint8")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      return tf_mergecomp::EncodedVectorShape(c, [](int64_t n) { return (n + 7) / 8; });
    })
    .Doc(R"doc(
Sign bits, ceil(n/8) bytes: bit i%8 of byte i/8 is 1 when !(input[i] < 0)
(so 0, -0 and NaN count as +).
)doc");

REGISTER_OP("MergecompSignsgdDecode")
    .Input("payload: uint8")
    .Attr("n: int >= 0")
    .Output("output: float")
    .SetShapeFn(tf_mergecomp::DecodedVectorShape)
    .Doc(R"doc(
Majority vote of W sign payloads ([W, ceil(n/8)]): +1.0 where at least half
the workers sent +, else -1.0 (a tie votes +1).
)doc");
