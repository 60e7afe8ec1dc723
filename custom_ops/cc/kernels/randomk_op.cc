// CPU kernel of MergecompRandomkIndices (algorithm in randomk_op.h).
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif
#include "cc/kernels/randomk_op.h"

#include "cc/kernels/random.h"
#include "cc/kernels/sparse_select.h"
#include "cc/kernels/topk_op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_mergecomp {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using CPUDevice = Eigen::ThreadPoolDevice;

template <>
Status RandomkIndicesFunctor<CPUDevice>::operator()(OpKernelContext* context, int64_t seed,
                                                    int64_t n, int64_t k, int32_t* indices) {
  if (k == 0) return tensorflow::OkStatus();
  const SeedKey seed_key = MakeSeedKey(seed);
  auto key = [seed_key](int64_t i) { return RandomBits(seed_key, static_cast<uint32_t>(i)); };
  CpuBlockRunner run(context, sparse::MakeBlocks(n).size * 8);
  sparse::SelectAndEmitLargest(
      n, k, key,
      [indices](int64_t i, int64_t position) { indices[position] = static_cast<int32_t>(i); },
      run);
  return tensorflow::OkStatus();
}

template <typename Device>
class RandomkIndicesOp : public OpKernel {
 public:
  explicit RandomkIndicesOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("n", &n_));
    OP_REQUIRES_OK(context, context->GetAttr("k", &k_));
    OP_REQUIRES(context, k_ <= n_ && n_ <= INT32_MAX,
                tensorflow::errors::InvalidArgument("need 0 <= k <= n <= 2^31 - 1"));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& seed = context->input(0);
    OP_REQUIRES(context, seed.dims() == 0,
                tensorflow::errors::InvalidArgument("seed must be a scalar"));
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({k_}), &indices));
    OP_REQUIRES_OK(context, RandomkIndicesFunctor<Device>()(context, seed.scalar<int64_t>()(), n_,
                                                            k_, indices->flat<int32_t>().data()));
  }

 private:
  int64_t n_;
  int64_t k_;
};

REGISTER_KERNEL_BUILDER(Name("MergecompRandomkIndices").Device(tensorflow::DEVICE_CPU),
                        RandomkIndicesOp<CPUDevice>);

#if GOOGLE_CUDA
using GPUDevice = Eigen::GpuDevice;
// Specialised in randomk_op_gpu.cu.cc.
template <>
Status RandomkIndicesFunctor<GPUDevice>::operator()(OpKernelContext* context, int64_t seed,
                                                    int64_t n, int64_t k, int32_t* indices);
REGISTER_KERNEL_BUILDER(Name("MergecompRandomkIndices").Device(tensorflow::DEVICE_GPU).HostMemory("seed"),
                        RandomkIndicesOp<GPUDevice>);
#endif  // GOOGLE_CUDA

}  // namespace tf_mergecomp
