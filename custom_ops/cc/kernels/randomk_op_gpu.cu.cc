// Random-k's CUDA draw (algorithm in randomk_op.h): its launcher, also used by
// the group launchers (group_op_gpu.cu.cc).
//
// Framework-free entry points (raw device pointers, a cudaStream_t):
//   size_t mergecomp_randomk_workspace_bytes(int64_t n);
//   int mergecomp_randomk_indices_gpu(int64_t seed, int64_t n, int64_t k,
//                                        int32_t* indices, void* workspace, cudaStream_t);
// Returns the cudaError_t of the last launch. Same indices as the CPU kernel.
#include <cuda_runtime.h>

#include <cstdint>

#include "cc/kernels/random.h"
#include "cc/kernels/sparse_gpu_launchers.h"
#include "cc/kernels/sparse_select_gpu.cu.h"

namespace tf_mergecomp {
namespace {

struct IndexEmit {
  int32_t* indices;
  __device__ void operator()(int64_t i, long long position) const {
    indices[position] = static_cast<int32_t>(i);
  }
};

}  // namespace
}  // namespace tf_mergecomp

extern "C" size_t mergecomp_randomk_workspace_bytes(int64_t n) {
  return tf_mergecomp::gpu_select::WorkspaceBytes(n);
}

extern "C" int mergecomp_randomk_indices_gpu(int64_t seed, int64_t n, int64_t k,
                                                int32_t* indices, void* workspace,
                                                cudaStream_t stream) {
  using namespace tf_mergecomp;
  if (k <= 0) return 0;
  gpu_select::Workspace ws(workspace, n);
  gpu_select::RandomBitsKey key{MakeSeedKey(seed)};
  gpu_select::LaunchSelect(n, k, key, ws, stream);
  gpu_select::LaunchEmit(n, key, IndexEmit{indices}, ws, stream);
  return static_cast<int>(cudaGetLastError());
}
