#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"

REGISTER_OP("MergecompFp16Encode")
    .Input("input: float")
    .Output("payload: half")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc(R"doc(
Rounds float32 to float16 (round to nearest even); |x| >= 65520 becomes +-inf,
NaN stays NaN.
)doc");

REGISTER_OP("MergecompFp16Decode")
    .Input("payload: half")
    .Output("output: float")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc("Widens float16 to float32 (exact).");
