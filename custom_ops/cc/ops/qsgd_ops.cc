#include "cc/kernels/dense_bits.h"
#include "cc/ops/dense_shapes.h"
#include "tensorflow/core/framework/op.h"

REGISTER_OP("MergecompQsgdEncode")
    .Input("input: float")
    .Input("seed: int64")
    .Attr("levels: int >= 1")
    .Output("payload: uint8")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int64_t levels;
      TF_RETURN_IF_ERROR(c->GetAttr("levels", &levels));
      const int bits = tf_mergecomp::QsgdCodeBits(levels);
      return tf_mergecomp::EncodedVectorShape(
          c, [bits](int64_t n) { return 4 + (n * bits + 7) / 8; });
    })
    .Doc(R"doc(
QSGD with s = levels: float32 norm = ||x||_2, then per element the b-bit code
sign * l + s, b = ceil(log2(2s + 1)), l = floor(|x| * (s / norm) + u) clamped
to [0, s], u uniform in [0, 1) from random.h (seed, element index).
4 + ceil(n * b / 8) bytes.
)doc");

REGISTER_OP("MergecompQsgdDecode")
    .Input("payload: uint8")
    .Attr("n: int >= 0")
    .Attr("levels: int >= 1")
    .Output("output: float")
    .SetShapeFn(tf_mergecomp::DecodedVectorShape)
    .Doc("Mean over the W payload rows of (code - s) * (norm / s).");
