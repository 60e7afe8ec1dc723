#include "cc/ops/dense_shapes.h"
#include "tensorflow/core/framework/op.h"

REGISTER_OP("MergecompTerngradEncode")
    .Input("input: float")
    .Input("seed: int64")
    .Output("payload: uint8")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      return tf_mergecomp::EncodedVectorShape(c, [](int64_t n) { return 4 + (n + 3) / 4; });
    })
    .Doc(R"doc(
TernGrad: float32 m = max|x| (NaN if any element is NaN), then 2 bits per
element at bits 2*(i%4) of byte i/4: bit 0 = sent (u < |x|/m), bit 1 = negative.
4 + ceil(n/4) bytes.
)doc");

REGISTER_OP("MergecompTerngradDecode")
    .Input("payload: uint8")
    .Attr("n: int >= 0")
    .Output("output: float")
    .SetShapeFn(tf_mergecomp::DecodedVectorShape)
    .Doc("Mean over the W payload rows of m * t, t in {-1, 0, +1}.");
