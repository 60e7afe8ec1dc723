// Framework-free C entry points (named mergecomp_<codec>_<what>_gpu, like
// every launcher) of the sparse codecs' single-buffer CUDA
// kernels (topk_op_gpu.cu.cc, dgc_op_gpu.cu.cc, randomk_op_gpu.cu.cc), also
// called by the group launchers (group_op_gpu.cu.cc). Pointers are device
// pointers; each returns the cudaError_t of its launches (0 on success).
#ifndef TF_MERGECOMP_SPARSE_GPU_LAUNCHERS_H_
#define TF_MERGECOMP_SPARSE_GPU_LAUNCHERS_H_

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#define MERGECOMP_SPARSE_BAD_INDEX 10001  // = MERGECOMP_GPU_BAD_INDEX

extern "C" {

size_t mergecomp_topk_workspace_bytes(int64_t n);
// The k largest |input| (NaN as +inf, ties to the lower index) as an 8k-byte
// payload: k float32 values, then k int32 indices, in ascending index order.
int mergecomp_topk_encode_gpu(const float* input, int64_t n, int64_t k, uint8_t* payload,
                                 void* workspace, cudaStream_t stream);
// Adds `workers` payloads of k slots into output[n] (zeroed first), worker by
// worker, then divides by workers. An index outside [0, n) makes it return
// MERGECOMP_SPARSE_BAD_INDEX (as the CPU op fails); it waits for the stream.
int mergecomp_sparse_scatter_mean_gpu(const uint8_t* payloads, int64_t workers, int64_t k,
                                         int64_t n, float* output, cudaStream_t stream);

size_t mergecomp_dgc_workspace_bytes(int64_t n, int64_t sample_size);
int mergecomp_dgc_encode_gpu(const float* input, int64_t n, int64_t seed, int64_t k,
                                int64_t sample_size, uint8_t* payload, void* workspace,
                                cudaStream_t stream);

size_t mergecomp_randomk_workspace_bytes(int64_t n);
int mergecomp_randomk_indices_gpu(int64_t seed, int64_t n, int64_t k, int32_t* indices,
                                     void* workspace, cudaStream_t stream);

}  // extern "C"

#endif  // TF_MERGECOMP_SPARSE_GPU_LAUNCHERS_H_
