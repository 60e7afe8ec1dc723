// Casts of a group's tensors of other float dtypes (float16, bfloat16,
// float64) to and from float32 on a CUDA device, for the GPU kernels of the
// group ops (group_op_gpu.cc): declared in group_gpu_launchers.h. One launch
// over the whole group (tiles of the flat index space, dense_gpu.h), not one
// per tensor: the per-tensor cost merging removes. The element casts are
// float_cast_gpu.cu.h's (rounding as the CPU kernels' static_casts).
#include <cuda_runtime.h>

#include <cstdint>

#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/float_cast_gpu.cu.h"
#include "cc/kernels/group_gpu_launchers.h"

namespace tf_mergecomp {
namespace group_cast_gpu {
namespace {

template <bool kToFloat>
__global__ void GroupCastKernel(int64_t num_tensors, int64_t total, const int64_t* offsets,
                                const int64_t* kinds, const void* const* sources,
                                void* const* targets) {
  gpu::SegmentCursor c;
  const gpu::TileRange tiles = gpu::TilesOfBlock(total);
  for (int64_t tile = tiles.begin; tile < tiles.end; ++tile) {
    for (int u = 0; u < gpu::kUnroll; ++u) {
#pragma unroll
      for (int e = 0; e < gpu::kVector; ++e) {
        const int64_t i = gpu::TileVector(tile, u) + e;
        if (i >= total) continue;
        c.Seek(offsets, num_tensors, i);
        const int kind = static_cast<int>(kinds[c.t]);
        if (kind == 0) continue;
        const int64_t j = i - c.begin;
        if (kToFloat) {
          static_cast<float*>(targets[c.t])[j] = gpu::LoadAsFloat(kind, sources[c.t], j);
        } else {
          gpu::StoreFromFloat(kind, targets[c.t], j, static_cast<const float*>(sources[c.t])[j]);
        }
      }
    }
  }
}

// 0 when the group's tables are usable; else MERGECOMP_GPU_BAD_ARGUMENT.
int CheckGroup(const MergecompGpuGroup* group) {
  if (group == nullptr || group->num_tensors < 0 || group->host_offsets == nullptr) {
    return MERGECOMP_GPU_BAD_ARGUMENT;
  }
  return group->num_tensors > 0 && group->offsets == nullptr ? MERGECOMP_GPU_BAD_ARGUMENT : 0;
}

template <bool kToFloat>
int LaunchGroupCast(const MergecompGpuGroup* group, const int64_t* kinds, const void* const* sources,
                    void* const* targets, void* stream) {
  const int error = CheckGroup(group);
  if (error != 0) return error;
  const int64_t total = group->host_offsets[group->num_tensors];
  if (total == 0) return 0;
  if (kinds == nullptr || sources == nullptr || targets == nullptr) {
    return MERGECOMP_GPU_BAD_ARGUMENT;
  }
  return gpu::LaunchTiles(total, stream, GroupCastKernel<kToFloat>, group->num_tensors, total,
                          group->offsets, kinds, sources, targets);
}

}  // namespace
}  // namespace group_cast_gpu
}  // namespace tf_mergecomp

extern "C" int mergecomp_group_cast_to_float_gpu(const MergecompGpuGroup* group,
                                                 const int64_t* kinds, const void* const* sources,
                                                 float* const* targets, void* stream) {
  return tf_mergecomp::group_cast_gpu::LaunchGroupCast<true>(
      group, kinds, sources, reinterpret_cast<void* const*>(targets), stream);
}

extern "C" int mergecomp_group_cast_from_float_gpu(const MergecompGpuGroup* group,
                                                   const int64_t* kinds,
                                                   const float* const* sources,
                                                   void* const* targets, void* stream) {
  return tf_mergecomp::group_cast_gpu::LaunchGroupCast<false>(
      group, kinds, reinterpret_cast<const void* const*>(sources), targets, stream);
}
