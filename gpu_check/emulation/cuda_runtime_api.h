// The CUDA runtime API for the emulation: synchronous host work on host
// memory ("device" memory is host memory, 256-byte aligned as cudaMalloc's).
// Every call returns at once with its work done, so streams and events only
// order what is already finished. Errors of a call also become the calling
// thread's last error (cudaGetLastError / cudaPeekAtLastError), as in CUDA.
// One emulated device: 132 SMs, compute capability 9.0, CUDA's limits.
#ifndef CUDA_EMULATION_CUDA_RUNTIME_API_H_
#define CUDA_EMULATION_CUDA_RUNTIME_API_H_

#include <cstddef>

#include "cuda_emulation/types.h"

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device);
cudaError_t cudaDeviceSynchronize();

cudaError_t cudaMalloc(void** pointer, std::size_t bytes);
cudaError_t cudaFree(void* pointer);
cudaError_t cudaMallocHost(void** pointer, std::size_t bytes);
cudaError_t cudaFreeHost(void* pointer);
cudaError_t cudaMallocAsync(void** pointer, std::size_t bytes, cudaStream_t stream);
cudaError_t cudaFreeAsync(void* pointer, cudaStream_t stream);

cudaError_t cudaMemset(void* pointer, int value, std::size_t bytes);
cudaError_t cudaMemsetAsync(void* pointer, int value, std::size_t bytes, cudaStream_t stream);
cudaError_t cudaMemcpy(void* destination, const void* source, std::size_t bytes,
                       cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* destination, const void* source, std::size_t bytes,
                            cudaMemcpyKind kind, cudaStream_t stream);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t function, void* user_data);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* milliseconds, cudaEvent_t start, cudaEvent_t end);

// Resident blocks per SM of `block_size` threads: 2048 threads per SM, at
// most 32 blocks, shared memory within 228 KB per SM.
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorForSize(int* blocks, int block_size,
                                                                 std::size_t shared_bytes);

template <typename Kernel>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel,
                                                                 int block_size,
                                                                 std::size_t shared_bytes) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessorForSize(blocks, block_size, shared_bytes);
}

template <typename T>
inline cudaError_t cudaMalloc(T** pointer, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(pointer), bytes);
}
template <typename T>
inline cudaError_t cudaMallocAsync(T** pointer, std::size_t bytes, cudaStream_t stream) {
  return cudaMallocAsync(reinterpret_cast<void**>(pointer), bytes, stream);
}
template <typename T>
inline cudaError_t cudaMallocHost(T** pointer, std::size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(pointer), bytes);
}

#endif  // CUDA_EMULATION_CUDA_RUNTIME_API_H_
