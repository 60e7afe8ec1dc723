// Framework-free C entry points of the dense codecs' CUDA kernels. Pointers
// are device pointers; `stream` is a cudaStream_t (0 for the default
// stream); `scratch` is device memory of mergecomp_dense_scratch_bytes()
// bytes. Each returns the cudaError_t of its launches (0 on success). Payload
// layouts are those of the CPU ops (see cc/ops/<codec>_ops.cc); decoders
// take world_size payload rows back to back and write the combined float[n].
#ifndef TF_MERGECOMP_DENSE_GPU_LAUNCHERS_H_
#define TF_MERGECOMP_DENSE_GPU_LAUNCHERS_H_

#include <cstdint>

extern "C" {

int64_t mergecomp_dense_scratch_bytes(void);

int mergecomp_fp16_encode_gpu(const float* input, int64_t n, uint16_t* output, void* stream);
int mergecomp_fp16_decode_gpu(const uint16_t* input, int64_t n, float* output, void* stream);

int mergecomp_signsgd_encode_gpu(const float* input, int64_t n, uint8_t* payload, void* stream);
int mergecomp_signsgd_decode_gpu(const uint8_t* payload, int64_t world_size, int64_t n,
                                 float* output, void* stream);

int mergecomp_onebit_encode_gpu(const float* input, int64_t n, uint8_t* payload, void* scratch,
                                void* stream);
int mergecomp_onebit_decode_gpu(const uint8_t* payload, int64_t world_size, int64_t n,
                                float* output, void* stream);

int mergecomp_efsignsgd_encode_gpu(const float* input, int64_t n, uint8_t* payload,
                                   void* scratch, void* stream);
int mergecomp_efsignsgd_decode_gpu(const uint8_t* payload, int64_t world_size, int64_t n,
                                   float* output, void* stream);

int mergecomp_qsgd_encode_gpu(const float* input, int64_t n, int64_t seed, int64_t levels,
                              uint8_t* payload, void* scratch, void* stream);
int mergecomp_qsgd_decode_gpu(const uint8_t* payload, int64_t world_size, int64_t n,
                              int64_t levels, float* output, void* stream);

int mergecomp_terngrad_encode_gpu(const float* input, int64_t n, int64_t seed, uint8_t* payload,
                                  void* scratch, void* stream);
int mergecomp_terngrad_decode_gpu(const uint8_t* payload, int64_t world_size, int64_t n,
                                  float* output, void* stream);

}  // extern "C"

#endif  // TF_MERGECOMP_DENSE_GPU_LAUNCHERS_H_
