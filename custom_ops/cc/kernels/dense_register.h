// The one registration of a dense codec (signsgd, onebit, efsignsgd, qsgd,
// terngrad) as the group codec `name` of MergecompGroupEncode/Decode: its
// block kernels
//   void <Codec>EncodeBlocks(OpKernelContext*, const BlockInput&, int64_t n,
//                            int64_t seed, int64_t levels, uint8_t* payload);
//   void <Codec>DecodeBlocks(OpKernelContext*, const uint8_t* payload,
//                            int64_t world_size, int64_t n, int64_t levels,
//                            const BlockOutput&);
// and its payload size <Codec>PayloadBytes(n, levels) (<codec>_op.h).
#ifndef TF_MERGECOMP_DENSE_REGISTER_H_
#define TF_MERGECOMP_DENSE_REGISTER_H_

#include "cc/kernels/dense_cpu.h"
#include "cc/kernels/group_op.h"

#define MERGECOMP_REGISTER_DENSE_GROUP_CODEC(Codec, name)                                    \
  using Codec##GroupCodec =                                                                 \
      DenseGroupCodec<Codec##PayloadBytes, Codec##EncodeBlocks, Codec##DecodeBlocks>;       \
  REGISTER_GROUP_CODEC(name, Codec##GroupCodec)

#endif  // TF_MERGECOMP_DENSE_REGISTER_H_
