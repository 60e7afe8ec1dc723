// fp16 CPU kernels: F16C conversions (8 per instruction) when the CPU has
// them, Eigen's scalar round-to-nearest-even conversion otherwise; both give
// IEEE results, so they agree bit for bit on every finite and infinite value.
#include "cc/kernels/group_op.h"
#include "cc/kernels/payload_size.h"

#include <cstring>

#include "cc/kernels/dense_cpu.h"
#include "tensorflow/core/framework/types.h"

namespace tf_mergecomp {
namespace {

void ToHalfScalar(const float* x, int64_t count, uint16_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    const Eigen::half h(x[i]);
    memcpy(out + i, &h, sizeof(h));
  }
}

void FromHalfScalar(const uint16_t* x, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    Eigen::half h;
    memcpy(&h, x + i, sizeof(h));
    out[i] = static_cast<float>(h);
  }
}

#if MERGECOMP_X86
bool CpuHasF16c() {
  static const bool has_f16c = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return has_f16c;
}

__attribute__((target("avx,f16c"))) void ToHalfF16c(const float* x, int64_t count,
                                                      uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
  ToHalfScalar(x + i, count - i, out + i);
}

__attribute__((target("avx,f16c"))) void FromHalfF16c(const uint16_t* x, int64_t count,
                                                        float* out) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(out + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  }
  FromHalfScalar(x + i, count - i, out + i);
}
#endif

}  // namespace

void Fp16EncodeBlocks(tensorflow::OpKernelContext* context, const BlockInput& input, int64_t n,
                      uint16_t* output) {
  ForEachBlock(context, NumBlocks(n), kBlockElements, [&](int64_t block) {
    const int64_t begin = block * kBlockElements;
    const int64_t count = std::min(kBlockElements, n - begin);
    const float* block_input = input.Block(begin, count);
#if MERGECOMP_X86
    if (CpuHasF16c()) return ToHalfF16c(block_input, count, output + begin);
#endif
    ToHalfScalar(block_input, count, output + begin);
  });
}

void Fp16DecodeBlocks(tensorflow::OpKernelContext* context, const uint16_t* input, int64_t n,
                      const BlockOutput& output) {
  ForEachBlock(context, NumBlocks(n), kBlockElements, [&](int64_t block) {
    const int64_t begin = block * kBlockElements;
    const int64_t count = std::min(kBlockElements, n - begin);
    float* block_output = output.Begin(begin, count);
#if MERGECOMP_X86
    if (CpuHasF16c()) {
      FromHalfF16c(input + begin, count, block_output);
    } else {
      FromHalfScalar(input + begin, count, block_output);
    }
#else
    FromHalfScalar(input + begin, count, block_output);
#endif
    output.Commit(begin, count, block_output);
  });
}

using tensorflow::OpKernelContext;
using tensorflow::Status;

// The group as one float16 buffer (2 bytes per element), averaged by allreduce.
class Fp16GroupCodec : public GroupCodec {
 public:
  int64_t PayloadBytes(const GroupLayout& layout, const GroupCodecParams&) const override {
    return payload_size::Fp16(layout.total());
  }
  Status Encode(OpKernelContext* context, const BlockInput& input, const GroupLayout& layout,
                const GroupCodecParams&, int64_t, uint8_t* payload, int32_t*) const override {
    Fp16EncodeBlocks(context, input, layout.total(), reinterpret_cast<uint16_t*>(payload));
    return tensorflow::OkStatus();
  }
  Status Decode(OpKernelContext* context, const uint8_t* rows, int64_t, const int32_t*,
                const GroupLayout& layout, const GroupCodecParams&,
                const BlockOutput& output) const override {
    Fp16DecodeBlocks(context, reinterpret_cast<const uint16_t*>(rows), layout.total(), output);
    return tensorflow::OkStatus();
  }
};
REGISTER_GROUP_CODEC("fp16", Fp16GroupCodec);

// No compression: the payload is the compensated float32 group itself.
class NoneGroupCodec : public GroupCodec {
 public:
  int64_t PayloadBytes(const GroupLayout& layout, const GroupCodecParams&) const override {
    return payload_size::None(layout.total());
  }
  Status Encode(OpKernelContext* context, const BlockInput& input, const GroupLayout& layout,
                const GroupCodecParams&, int64_t, uint8_t* payload, int32_t*) const override {
    CopyToContiguous(context, input, layout.total(), reinterpret_cast<float*>(payload));
    return tensorflow::OkStatus();
  }
  Status Decode(OpKernelContext* context, const uint8_t* rows, int64_t, const int32_t*,
                const GroupLayout& layout, const GroupCodecParams&,
                const BlockOutput& output) const override {
    CopyFromContiguous(context, reinterpret_cast<const float*>(rows), layout.total(), output);
    return tensorflow::OkStatus();
  }
};
REGISTER_GROUP_CODEC("none", NoneGroupCodec);

}  // namespace tf_mergecomp
