// Top-k's CUDA selection and scatter-mean: their launchers, the selection also
// used by the group launchers (group_op_gpu.cu.cc).
//
// Framework-free entry points (raw device pointers, a cudaStream_t; callable
// through ctypes with CuPy arrays):
//   size_t mergecomp_topk_workspace_bytes(int64_t n);
//   int mergecomp_topk_encode_gpu(const float* input, int64_t n, int64_t k,
//                                    uint8_t* payload, void* workspace, cudaStream_t);
//   int mergecomp_sparse_scatter_mean_gpu(const uint8_t* payloads, int64_t workers,
//                                            int64_t k, int64_t n, float* output,
//                                            cudaStream_t);
// They return the cudaError_t of the last launch. Payload layout: topk_op.h.
// The decoder adds worker by worker (one launch each), so the sum order over
// workers matches the CPU kernel; an out-of-range index is an error, as on the CPU.
#include <cuda_runtime.h>

#include <cstdint>

#include "cc/kernels/dense_gpu.h"

#include "cc/kernels/sparse_gpu_launchers.h"
#include "cc/kernels/sparse_select_gpu.cu.h"

namespace tf_mergecomp {
namespace {

__global__ void ScatterAddKernel(const uint8_t* payload, int64_t k, int64_t n, float* output,
                                 int32_t* bad_index) {
  const float* values = reinterpret_cast<const float*>(payload);
  const int32_t* indices = reinterpret_cast<const int32_t*>(payload + 4 * k);
  gpu::ForEachIndex(k, [&](int64_t j) {
    const int32_t index = indices[j];
    // Within one payload indices are distinct except dgc's padding slots,
    // which add 0: the atomics do not make the result order-dependent.
    if (index >= 0 && index < n) {
      atomicAdd(&output[index], values[j]);
    } else {
      *bad_index = 1;
    }
  });
}

__global__ void DivideKernel(float* output, int64_t n, float divisor) {
  gpu::ForEachIndex(n, [&](int64_t i) {
    output[i] /= divisor;
  });
}

}  // namespace
}  // namespace tf_mergecomp

extern "C" size_t mergecomp_topk_workspace_bytes(int64_t n) {
  return tf_mergecomp::gpu_select::WorkspaceBytes(n);
}

extern "C" int mergecomp_topk_encode_gpu(const float* input, int64_t n, int64_t k,
                                            uint8_t* payload, void* workspace,
                                            cudaStream_t stream) {
  using namespace tf_mergecomp::gpu_select;
  if (k <= 0) return 0;
  Workspace ws(workspace, n);
  MagnitudeKey key{input};
  LaunchSelect(n, k, key, ws, stream);
  ValueIndexEmit emit{input, reinterpret_cast<float*>(payload),
                      reinterpret_cast<int32_t*>(payload + 4 * k)};
  LaunchEmit(n, key, emit, ws, stream);
  return static_cast<int>(cudaGetLastError());
}

#define MERGECOMP_RETURN_IF_ERROR(expr)         \
  do {                                          \
    const int error_ = static_cast<int>(expr);  \
    if (error_ != 0) return error_;             \
  } while (0)

extern "C" int mergecomp_sparse_scatter_mean_gpu(const uint8_t* payloads, int64_t workers,
                                                    int64_t k, int64_t n, float* output,
                                                    cudaStream_t stream) {
  using namespace tf_mergecomp;
  MERGECOMP_RETURN_IF_ERROR(cudaMemsetAsync(output, 0, sizeof(float) * n, stream));
  if (workers < 1 || k <= 0) return 0;
  int32_t* bad_index = nullptr;
  MERGECOMP_RETURN_IF_ERROR(cudaMallocAsync(reinterpret_cast<void**>(&bad_index),
                                            sizeof(int32_t), stream));
  int error = cudaMemsetAsync(bad_index, 0, sizeof(int32_t), stream);
  for (int64_t w = 0; w < workers && error == 0; ++w) {
    ScatterAddKernel<<<gpu::GridFor(k), gpu::kThreads, 0, stream>>>(payloads + w * 8 * k, k, n,
                                                                     output, bad_index);
    error = cudaGetLastError();
  }
  if (error == 0 && workers > 1 && n > 0) {
    DivideKernel<<<gpu::GridFor(n), gpu::kThreads, 0, stream>>>(output, n,
                                                                static_cast<float>(workers));
    error = cudaGetLastError();
  }
  // A bad index is an error, as on the CPU: wait for the stream to know.
  int32_t found = 0;
  if (error == 0) {
    error = cudaMemcpyAsync(&found, bad_index, sizeof(found), cudaMemcpyDeviceToHost, stream);
  }
  const int freed = cudaFreeAsync(bad_index, stream);
  if (error == 0) error = cudaStreamSynchronize(stream);
  if (error == 0) error = freed;
  return error != 0 ? error : (found ? MERGECOMP_SPARSE_BAD_INDEX : 0);
}
