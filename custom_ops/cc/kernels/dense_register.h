// The one registration of a dense codec's CPU kernels (signsgd, onebit,
// efsignsgd, qsgd, terngrad): its block kernels
//   void <Codec>EncodeBlocks(OpKernelContext*, const BlockInput&, int64_t n,
//                            int64_t seed, int64_t levels, uint8_t* payload);
//   void <Codec>DecodeBlocks(OpKernelContext*, const uint8_t* payload,
//                            int64_t world_size, int64_t n, int64_t levels,
//                            const BlockOutput&);
// serve both the single-buffer ops Mergecomp<Codec>Encode/Decode (through the
// functors of dense_op.h, which the CUDA kernels specialise too) and the
// group codec `name` of MergecompGroupEncode/Decode.
#ifndef TF_MERGECOMP_DENSE_REGISTER_H_
#define TF_MERGECOMP_DENSE_REGISTER_H_

#include "cc/kernels/dense_cpu.h"
#include "cc/kernels/dense_op.h"
#include "cc/kernels/group_op.h"

#define MERGECOMP_REGISTER_DENSE_CPU_CODEC(Codec, name)                                       \
  template <>                                                                                 \
  void Codec##EncodeFunctor<Eigen::ThreadPoolDevice>::operator()(                             \
      tensorflow::OpKernelContext* context, const float* input, int64_t n, int64_t seed,      \
      int64_t levels, uint8_t* payload) {                                                     \
    Codec##EncodeBlocks(context, ContiguousInput(input), n, seed, levels, payload);           \
  }                                                                                           \
  template <>                                                                                 \
  void Codec##DecodeFunctor<Eigen::ThreadPoolDevice>::operator()(                             \
      tensorflow::OpKernelContext* context, const uint8_t* payload, int64_t world_size,       \
      int64_t n, int64_t levels, float* output) {                                             \
    Codec##DecodeBlocks(context, payload, world_size, n, levels, ContiguousOutput(output));   \
  }                                                                                           \
  REGISTER_KERNEL_BUILDER(Name("Mergecomp" #Codec "Encode").Device(tensorflow::DEVICE_CPU),   \
                          DenseEncodeOp<Codec##EncodeFunctor<Eigen::ThreadPoolDevice>>);      \
  REGISTER_KERNEL_BUILDER(Name("Mergecomp" #Codec "Decode").Device(tensorflow::DEVICE_CPU),   \
                          DenseDecodeOp<Codec##DecodeFunctor<Eigen::ThreadPoolDevice>>);      \
  using Codec##GroupCodec =                                                                   \
      DenseGroupCodec<Codec##EncodeFunctor<Eigen::ThreadPoolDevice>::PayloadBytes,            \
                      Codec##EncodeBlocks, Codec##DecodeBlocks>;                              \
  REGISTER_GROUP_CODEC(name, Codec##GroupCodec)

#endif  // TF_MERGECOMP_DENSE_REGISTER_H_
