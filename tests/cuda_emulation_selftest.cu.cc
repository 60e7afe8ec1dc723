// Kernels that pin down the CUDA emulation's semantics (gpu_check/emulation),
// called through their extern "C" entry points by tests/test_cuda_emulation.py.
// Plain CUDA: block barriers and their votes, per-block shared memory (static
// and dynamic), threads leaving a block early, warp intrinsics, atomics, the
// rounded float intrinsics, __half conversions, 3-D indices, grid-stride
// loops over large grids, launch configuration errors and the runtime API.
// Two kernels are wrong on purpose (a data race, a misaligned load): the
// sanitizer builds must report them.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace {

constexpr int kBlock = 128;

// Each block reverses its slice through shared memory.
__global__ void ReverseKernel(const int* in, int* out) {
  __shared__ int tile[kBlock];
  const int base = blockIdx.x * blockDim.x;
  tile[threadIdx.x] = in[base + threadIdx.x];
  __syncthreads();
  out[base + threadIdx.x] = tile[blockDim.x - 1 - threadIdx.x];
}

// Blocks overlap in time; each must see only its own shared variables.
__global__ void SharedPerBlockKernel(int rounds, int* mismatches) {
  __shared__ int owner;
  __shared__ int slots[kBlock];
  for (int r = 0; r < rounds; ++r) {
    if (threadIdx.x == 0) owner = blockIdx.x * 1000 + r;
    slots[threadIdx.x] = blockIdx.x + r;
    __syncthreads();
    if (owner != static_cast<int>(blockIdx.x) * 1000 + r ||
        slots[(threadIdx.x + 1) % blockDim.x] != static_cast<int>(blockIdx.x) + r) {
      atomicAdd(mismatches, 1);
    }
    __syncthreads();
  }
}

// results[4 b + 0..2]: or, and, count of the block's predicates; [4 b + 3]:
// threads that saw another result than thread 0.
__global__ void VotesKernel(const int* predicates, int* results) {
  const int p = predicates[blockIdx.x * blockDim.x + threadIdx.x];
  const int any = __syncthreads_or(p);
  const int all = __syncthreads_and(p);
  const int count = __syncthreads_count(p);
  __shared__ int seen[3];
  if (threadIdx.x == 0) {
    seen[0] = any;
    seen[1] = all;
    seen[2] = count;
    results[4 * blockIdx.x] = any;
    results[4 * blockIdx.x + 1] = all;
    results[4 * blockIdx.x + 2] = count;
  }
  __syncthreads();
  if (seen[0] != any || seen[1] != all || seen[2] != count) {
    atomicAdd(&results[4 * blockIdx.x + 3], 1);
  }
}

// Threads from `live` on leave at once; the others still meet at barriers.
__global__ void EarlyExitKernel(int live, int* sums) {
  __shared__ int values[kBlock];
  if (static_cast<int>(threadIdx.x) >= live) return;
  values[threadIdx.x] = threadIdx.x + 1 + blockIdx.x;
  __syncthreads();
  if (threadIdx.x == 0) {
    int sum = 0;
    for (int i = 0; i < live; ++i) sum += values[i];
    sums[blockIdx.x] = sum;
  }
  __syncthreads();
}

// Per thread of a block of two full warps: 8 results.
__global__ void WarpKernel(int* out) {
  const int t = threadIdx.x;
  const unsigned int all = 0xffffffffu;
  const int v = t * 3 + 1;
  int sum = v;
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(all, sum, offset);
  int* mine = out + 8 * t;
  mine[0] = __shfl_sync(all, v, 5);
  mine[1] = __shfl_down_sync(all, v, 1);
  mine[2] = __shfl_up_sync(all, v, 2);
  mine[3] = __shfl_xor_sync(all, v, 1);
  mine[4] = sum;
  mine[5] = static_cast<int>(__ballot_sync(all, v % 4 == 1));
  mine[6] = __any_sync(all, t == 40) + 2 * __all_sync(all, v > 0);
  mine[7] = __shfl_sync(all, v, 3, 8);  // lane 3 of each group of 8
}

// A block of 48 threads: its second warp has 16 lanes.
__global__ void PartialWarpKernel(unsigned int* out) {
  const unsigned int active = __activemask();
  const unsigned int ballot = __ballot_sync(active, threadIdx.x % 2 == 0);
  __syncwarp(active);
  out[2 * threadIdx.x] = active;
  out[2 * threadIdx.x + 1] = ballot;
}

struct AtomicsOut {
  float float_sum;
  double double_sum;
  unsigned long long index_sum;
  int max;
  int min;
  unsigned int bits_or;
  unsigned int bits_and;
  int cas_winner;
  unsigned int wrapped;
  int exchanged;
};

__global__ void AtomicsKernel(AtomicsOut* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(&out->float_sum, 1.0f);
  atomicAdd(&out->double_sum, 0.5);
  atomicAdd(&out->index_sum, static_cast<unsigned long long>(i));
  atomicMax(&out->max, i);
  atomicMin(&out->min, -i);
  atomicOr(&out->bits_or, 1u << (i % 32));
  if (i % 32 < 8) atomicAnd(&out->bits_and, ~(1u << (i % 32)));
  atomicCAS(&out->cas_winner, -1, i);
  atomicInc(&out->wrapped, 9u);
  atomicExch(&out->exchanged, 7);
}

__global__ void HalfKernel(const float* in, int64_t n, unsigned short* bits,
                           const unsigned short* halves, float* widened) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    bits[i] = __half_as_ushort(__float2half_rn(in[i]));
    if (i < 65536) widened[i] = __half2float(__ushort_as_half(halves[i]));
  }
}

__global__ void RoundingKernel(const float* a, const float* b, const float* c, int64_t n,
                               float* mul_add, float* fused, float* quotient) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    mul_add[i] = __fadd_rn(__fmul_rn(a[i], b[i]), c[i]);
    fused[i] = __fmaf_rn(a[i], b[i], c[i]);
    quotient[i] = __fdiv_rn(__fsub_rn(a[i], c[i]), b[i]);
  }
}

__global__ void IndexKernel(int* out) {
  const int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int threads = blockDim.x * blockDim.y * blockDim.z;
  const int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  out[block * threads + thread] = (blockIdx.z << 20) | (blockIdx.y << 16) | (blockIdx.x << 12) |
                                  (threadIdx.z << 8) | (threadIdx.y << 4) | threadIdx.x;
}

__global__ void ScaleKernel(const float* in, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    out[i] = __fmul_rn(in[i], 2.0f);
  }
}

__global__ void DynamicSharedKernel(int* out) {
  extern __shared__ int dynamic[];
  dynamic[threadIdx.x] = 2 * threadIdx.x + blockIdx.x;
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = dynamic[blockDim.x - 1 - threadIdx.x];
}

__global__ void FlagKernel(int* flag) { *flag = 1; }

// Wrong on purpose: every thread adds to one counter without an atomic.
__global__ void RacyKernel(int* counter) { *counter = *counter + 1; }

// Wrong on purpose: a float loaded from an address that is not 4-byte aligned.
__global__ void MisalignedKernel(const unsigned char* bytes, float* out) {
  *out = *reinterpret_cast<const float*>(bytes + 1);
}

int LastError() { return static_cast<int>(cudaGetLastError()); }

}  // namespace

extern "C" {

int cuda_emulation_test_reverse(const int* in, int* out, int blocks) {
  ReverseKernel<<<blocks, kBlock>>>(in, out);
  return LastError();
}

int cuda_emulation_test_shared_per_block(int blocks, int rounds, int* mismatches) {
  SharedPerBlockKernel<<<blocks, kBlock>>>(rounds, mismatches);
  return LastError();
}

int cuda_emulation_test_votes(const int* predicates, int blocks, int* results) {
  VotesKernel<<<blocks, kBlock>>>(predicates, results);
  return LastError();
}

int cuda_emulation_test_early_exit(int blocks, int live, int* sums) {
  EarlyExitKernel<<<blocks, kBlock>>>(live, sums);
  return LastError();
}

int cuda_emulation_test_warp(int* out) {
  WarpKernel<<<1, 64>>>(out);
  return LastError();
}

int cuda_emulation_test_partial_warp(unsigned int* out) {
  PartialWarpKernel<<<1, 48>>>(out);
  return LastError();
}

int cuda_emulation_test_atomics(void* out, int blocks, int threads) {
  AtomicsKernel<<<blocks, threads>>>(static_cast<AtomicsOut*>(out));
  return LastError();
}

int64_t cuda_emulation_test_atomics_bytes() { return sizeof(AtomicsOut); }

int cuda_emulation_test_half(const float* in, int64_t n, unsigned short* bits,
                             const unsigned short* halves, float* widened) {
  HalfKernel<<<64, 256>>>(in, n, bits, halves, widened);
  return LastError();
}

int cuda_emulation_test_rounding(const float* a, const float* b, const float* c, int64_t n,
                                 float* mul_add, float* fused, float* quotient) {
  RoundingKernel<<<16, 256>>>(a, b, c, n, mul_add, fused, quotient);
  return LastError();
}

int cuda_emulation_test_indices(int* out) {
  IndexKernel<<<dim3(3, 2, 2), dim3(4, 3, 2)>>>(out);
  return LastError();
}

int cuda_emulation_test_scale(const float* in, int64_t n, float* out, int blocks, int threads) {
  ScaleKernel<<<blocks, threads, 0, nullptr>>>(in, n, out);
  return LastError();
}

int cuda_emulation_test_dynamic_shared(int* out, int blocks, int threads) {
  DynamicSharedKernel<<<blocks, threads, threads * sizeof(int)>>>(out);
  return LastError();
}

// A launch with a bad configuration: returns 1000 * cudaGetLastError() + 1
// if the kernel ran anyway.
int cuda_emulation_test_bad_launch(int which, int* flag) {
  cudaGetLastError();
  *flag = 0;
  switch (which) {
    case 0: FlagKernel<<<1, 1025>>>(flag); break;
    case 1: FlagKernel<<<0, 32>>>(flag); break;
    case 2: FlagKernel<<<dim3(1, 65536), 1>>>(flag); break;
    case 3: FlagKernel<<<dim3(1, 1), dim3(1, 1, 65)>>>(flag); break;
    case 4: FlagKernel<<<1, 32, 64 * 1024>>>(flag); break;
    default: FlagKernel<<<1, 32>>>(flag); break;  // a good one
  }
  const int peeked = static_cast<int>(cudaPeekAtLastError());
  const int error = LastError();
  if (peeked != error || cudaGetLastError() != cudaSuccess) return -1;  // cleared once read
  return 1000 * error + *flag;
}

// The runtime API: fills `out` (16 ints) with what the checks read.
int cuda_emulation_test_runtime_api(int* out) {
  int index = 0;
  cudaDeviceGetAttribute(&out[index++], cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&out[index++], cudaDevAttrWarpSize, 0);
  cudaGetDeviceCount(&out[index++]);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&out[index++], FlagKernel, 256, 0);
  int* device = nullptr;
  out[index++] = cudaMalloc(&device, 1000);
  out[index++] = static_cast<int>(reinterpret_cast<uintptr_t>(device) % 256);
  cudaStream_t stream = nullptr;
  cudaStreamCreate(&stream);
  cudaMemsetAsync(device, 0x01, 1000, stream);
  int host[250];
  cudaMemcpyAsync(host, device, sizeof(host), cudaMemcpyDeviceToHost, stream);
  out[index++] = cudaStreamSynchronize(stream) == cudaSuccess && host[249] == 0x01010101;
  out[index++] = cudaFree(device);
  out[index++] = cudaFree(device);  // twice: an error
  out[index++] = cudaGetLastError();  // that error, then cleared
  out[index++] = cudaGetLastError();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, stream);
  cudaEventRecord(stop, stream);
  float milliseconds = -1.0f;
  out[index++] = cudaEventElapsedTime(&milliseconds, start, stop) == cudaSuccess &&
                 milliseconds >= 0.0f;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  out[index++] = cudaMemcpy(host, host, 4, static_cast<cudaMemcpyKind>(7));
  cudaGetLastError();
  int called = 0;
  cudaLaunchHostFunc(stream, [](void* flag) { *static_cast<int*>(flag) = 1; }, &called);
  out[index++] = called;
  out[index++] = cudaStreamDestroy(stream);
  out[index++] = std::strcmp(cudaGetErrorString(cudaErrorMisalignedAddress), "misaligned address");
  return index;
}

int cuda_emulation_test_race(int* counter, int threads) {
  RacyKernel<<<1, threads>>>(counter);
  return LastError();
}

int cuda_emulation_test_misaligned(const unsigned char* bytes, float* out) {
  MisalignedKernel<<<1, 1>>>(bytes, out);
  return LastError();
}

}  // extern "C"
