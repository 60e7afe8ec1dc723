// Op definitions of PowerSGD's matrix helpers.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

using tensorflow::shape_inference::InferenceContext;

REGISTER_OP("MergecompPowersgdPadReshape")
    .Input("input: float")
    .Output("matrix: float")
    .Attr("rows: int >= 0")
    .Attr("cols: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      int64_t rows, cols;
      TF_RETURN_IF_ERROR(c->GetAttr("rows", &rows));
      TF_RETURN_IF_ERROR(c->GetAttr("cols", &cols));
      tensorflow::shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      c->set_output(0, c->Matrix(rows, cols));
      return tensorflow::OkStatus();
    })
    .Doc("The flat input as a rows x cols row-major matrix, zero-padded.");

REGISTER_OP("MergecompPowersgdOrthonormalize")
    .Input("matrix: float")
    .Output("orthonormal: float")
    .SetShapeFn([](InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle matrix;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &matrix));
      c->set_output(0, matrix);
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
Gram-Schmidt, applied twice, on the columns of a rows x r matrix; columns with
norm below 1e-30 after projection become zero.
)doc");
