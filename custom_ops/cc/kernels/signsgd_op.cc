// SignSGD / SIGNUM CPU kernels: sign bits out, majority vote back.
#include "cc/kernels/signsgd_op.h"
#include "cc/kernels/group_op.h"

#include <vector>

#include "cc/kernels/dense_cpu.h"

namespace tf_mergecomp {

using CPUDevice = Eigen::ThreadPoolDevice;

template <>
void SignsgdEncodeFunctor<CPUDevice>::operator()(tensorflow::OpKernelContext* context,
                                                 const float* input, int64_t n, int64_t,
                                                 int64_t, uint8_t* payload) {
  ForEachBlock(context, NumBlocks(n), kBlockElements, [&](int64_t block) {
    const int64_t begin = block * kBlockElements;
    PackSignBits(input + begin, std::min(kBlockElements, n - begin), payload + begin / 8);
  });
}

template <>
void SignsgdDecodeFunctor<CPUDevice>::operator()(tensorflow::OpKernelContext* context,
                                                 const uint8_t* payload, int64_t world_size,
                                                 int64_t n, int64_t, float* output) {
  const std::vector<float> plus(world_size, 1.0f), minus(world_size, -1.0f);
  DecodeTwoLevel(context, payload, world_size, CeilDiv(n, 8), 0, plus.data(), minus.data(), n,
                 TwoLevelCombine::kMajority, output);
}

REGISTER_KERNEL_BUILDER(Name("MergecompSignsgdEncode").Device(tensorflow::DEVICE_CPU),
                        DenseEncodeOp<SignsgdEncodeFunctor<CPUDevice>>);
REGISTER_KERNEL_BUILDER(Name("MergecompSignsgdDecode").Device(tensorflow::DEVICE_CPU),
                        DenseDecodeOp<SignsgdDecodeFunctor<CPUDevice>>);

using SignsgdGroupCodec =
    DenseGroupCodec<SignsgdEncodeFunctor<CPUDevice>, SignsgdDecodeFunctor<CPUDevice>>;
REGISTER_GROUP_CODEC("signsgd", SignsgdGroupCodec);

}  // namespace tf_mergecomp
