// SignSGD / SIGNUM CPU kernels: sign bits out, majority vote back.
#include "cc/kernels/signsgd_op.h"

#include <vector>

#include "cc/kernels/dense_cpu.h"
#include "cc/kernels/dense_register.h"

namespace tf_mergecomp {

void SignsgdEncodeBlocks(tensorflow::OpKernelContext* context, const BlockInput& input, int64_t n,
                         int64_t, int64_t, uint8_t* payload) {
  ForEachBlock(context, NumBlocks(n), kBlockElements, [&](int64_t block) {
    const int64_t begin = block * kBlockElements;
    const int64_t count = std::min(kBlockElements, n - begin);
    PackSignBits(input.Block(begin, count), count, payload + begin / 8);
  });
}

void SignsgdDecodeBlocks(tensorflow::OpKernelContext* context, const uint8_t* payload,
                         int64_t world_size, int64_t n, int64_t, const BlockOutput& output) {
  const std::vector<float> plus(world_size, 1.0f), minus(world_size, -1.0f);
  DecodeTwoLevel(context, payload, world_size, CeilDiv(n, 8), 0, plus.data(), minus.data(), n,
                 TwoLevelCombine::kMajority, output);
}

MERGECOMP_REGISTER_DENSE_GROUP_CODEC(Signsgd, "signsgd");

}  // namespace tf_mergecomp
