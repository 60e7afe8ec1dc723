// The CUDA runtime API of cuda_runtime_api.h as synchronous host work.
#include "cuda_runtime_api.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "runtime/grid.h"

struct CUstream_st {
  unsigned int flags;
};

struct CUevent_st {
  std::chrono::steady_clock::time_point time;
  bool recorded;
};

namespace cuda_emulation {
namespace {

thread_local cudaError_t last_error = cudaSuccess;

constexpr std::size_t kAllocationAlignment = 256;  // as cudaMalloc's

// Live allocations of cudaMalloc / cudaMallocAsync / cudaMallocHost: freeing
// anything else is an error, as on the device.
class Allocations {
 public:
  void* Allocate(std::size_t bytes) {
    const std::size_t rounded =
        (bytes + kAllocationAlignment - 1) / kAllocationAlignment * kAllocationAlignment;
    void* pointer = std::aligned_alloc(kAllocationAlignment, rounded == 0 ? kAllocationAlignment
                                                                          : rounded);
    if (pointer != nullptr) {
      std::lock_guard<std::mutex> lock(mutex_);
      live_[pointer] = bytes;
    }
    return pointer;
  }
  bool Free(void* pointer) {
    if (pointer == nullptr) return true;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (live_.erase(pointer) == 0) return false;
    }
    std::free(pointer);
    return true;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<void*, std::size_t> live_;
};

Allocations& TheAllocations() {
  static Allocations* allocations = new Allocations();
  return *allocations;
}

cudaError_t Result(cudaError_t error) {
  if (error != cudaSuccess) last_error = error;
  return error;
}

cudaError_t Allocate(void** pointer, std::size_t bytes) {
  if (pointer == nullptr) return Result(cudaErrorInvalidValue);
  *pointer = TheAllocations().Allocate(bytes);
  return Result(*pointer == nullptr ? cudaErrorMemoryAllocation : cudaSuccess);
}

cudaError_t Release(void* pointer) {
  return Result(TheAllocations().Free(pointer) ? cudaSuccess : cudaErrorInvalidValue);
}

cudaError_t Copy(void* destination, const void* source, std::size_t bytes, cudaMemcpyKind kind) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    return Result(cudaErrorInvalidMemcpyDirection);
  }
  if (bytes == 0) return cudaSuccess;
  if (destination == nullptr || source == nullptr) return Result(cudaErrorInvalidValue);
  std::memmove(destination, source, bytes);
  return cudaSuccess;
}

cudaError_t Set(void* pointer, int value, std::size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (pointer == nullptr) return Result(cudaErrorInvalidValue);
  std::memset(pointer, value, bytes);
  return cudaSuccess;
}

}  // namespace

void RecordError(cudaError_t error) { Result(error); }

}  // namespace cuda_emulation

using cuda_emulation::Result;

cudaError_t cudaGetLastError() {
  const cudaError_t error = cuda_emulation::last_error;
  cuda_emulation::last_error = cudaSuccess;
  return error;
}

cudaError_t cudaPeekAtLastError() { return cuda_emulation::last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorUnknown: return "cudaErrorUnknown";
  }
  return "unrecognized error code";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorUnknown: return "unknown error";
  }
  return "unrecognized error code";
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return Result(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return Result(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  return Result(device == 0 ? cudaSuccess : cudaErrorInvalidDevice);
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  if (value == nullptr) return Result(cudaErrorInvalidValue);
  if (device != 0) return Result(cudaErrorInvalidDevice);
  switch (attribute) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxBlockDimX: *value = 1024; break;
    case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = 0x7fffffff; break;
    case cudaDevAttrMaxGridDimY: *value = 65535; break;
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = 2048; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = 228 * 1024; break;
    default: return Result(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaMalloc(void** pointer, std::size_t bytes) {
  return cuda_emulation::Allocate(pointer, bytes);
}
cudaError_t cudaFree(void* pointer) { return cuda_emulation::Release(pointer); }
cudaError_t cudaMallocHost(void** pointer, std::size_t bytes) {
  return cuda_emulation::Allocate(pointer, bytes);
}
cudaError_t cudaFreeHost(void* pointer) { return cuda_emulation::Release(pointer); }
cudaError_t cudaMallocAsync(void** pointer, std::size_t bytes, cudaStream_t) {
  return cuda_emulation::Allocate(pointer, bytes);
}
cudaError_t cudaFreeAsync(void* pointer, cudaStream_t) {
  return cuda_emulation::Release(pointer);
}

cudaError_t cudaMemset(void* pointer, int value, std::size_t bytes) {
  return cuda_emulation::Set(pointer, value, bytes);
}
cudaError_t cudaMemsetAsync(void* pointer, int value, std::size_t bytes, cudaStream_t) {
  return cuda_emulation::Set(pointer, value, bytes);
}
cudaError_t cudaMemcpy(void* destination, const void* source, std::size_t bytes,
                       cudaMemcpyKind kind) {
  return cuda_emulation::Copy(destination, source, bytes, kind);
}
cudaError_t cudaMemcpyAsync(void* destination, const void* source, std::size_t bytes,
                            cudaMemcpyKind kind, cudaStream_t) {
  return cuda_emulation::Copy(destination, source, bytes, kind);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr) return Result(cudaErrorInvalidValue);
  *stream = new CUstream_st{flags};
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return Result(cudaErrorInvalidResourceHandle);
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned int) {
  return Result(event == nullptr ? cudaErrorInvalidResourceHandle : cudaSuccess);
}
cudaError_t cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t function, void* user_data) {
  if (function == nullptr) return Result(cudaErrorInvalidValue);
  function(user_data);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  if (event == nullptr) return Result(cudaErrorInvalidValue);
  *event = new CUevent_st{std::chrono::steady_clock::now(), false};
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return Result(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  if (event == nullptr) return Result(cudaErrorInvalidResourceHandle);
  event->time = std::chrono::steady_clock::now();
  event->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return Result(event == nullptr ? cudaErrorInvalidResourceHandle : cudaSuccess);
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  return Result(event == nullptr ? cudaErrorInvalidResourceHandle : cudaSuccess);
}
cudaError_t cudaEventElapsedTime(float* milliseconds, cudaEvent_t start, cudaEvent_t end) {
  if (milliseconds == nullptr) return Result(cudaErrorInvalidValue);
  if (start == nullptr || end == nullptr) return Result(cudaErrorInvalidResourceHandle);
  if (!start->recorded || !end->recorded) return Result(cudaErrorInvalidResourceHandle);
  *milliseconds = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorForSize(int* blocks, int block_size,
                                                                 std::size_t shared_bytes) {
  if (blocks == nullptr || block_size <= 0 || block_size > 1024) {
    return Result(cudaErrorInvalidValue);
  }
  int count = 2048 / block_size;
  count = count > 32 ? 32 : count;
  if (shared_bytes > 0) {
    const int by_shared = static_cast<int>((228 * 1024) / shared_bytes);
    count = by_shared < count ? by_shared : count;
  }
  *blocks = count;
  return cudaSuccess;
}
