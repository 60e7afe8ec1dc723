// Framework-free C entry points of the group codecs' CUDA kernels: the GPU
// twin of MergecompGroupEncode / MergecompGroupDecode (group_op.h), over a
// group of float32 tensors given as device tables of pointers and offsets
// (multi-tensor-apply style: one launch per pass over the whole group, not
// one per tensor).
//
// The payload is byte for byte the CPU group op's: the codec's payload over
// the group's flat index space (tensor i holds [offsets[i], offsets[i+1])),
// then one non-finite marker per tensor of `marker_bytes` bytes (the payload
// dtype: 1 = uint8 flag, 2 = float16 1.0/0.0, 4 = float32 1.0/0.0). A tensor
// holding an inf or a NaN is encoded as zeros and the whole group's state is
// left as it was; the decoder fills every tensor any row marked with NaN and
// reports it in `nonfinite`.
//
// Every function returns 0 on success, a cudaError_t of a failed launch, or
// one of the MERGECOMP_GPU_* codes below (mergecomp_group_error_string says
// which). All launches go to `stream` (a cudaStream_t; NULL = default
// stream); nothing synchronises the host except the sparse decoders, which
// wait for the stream to report a bad index as an error, as the CPU does.
//
// Codecs: the CPU registry's group codecs "none", "fp16", "signsgd" (SIGNUM =
// signsgd with memory momentum), "onebit", "efsignsgd", "qsgd", "terngrad",
// "topk", "dgc", "randomk", with any memory. PowerSGD is not a group codec:
// its own group ops have launchers of their own (powersgd_gpu_launchers.h).
#ifndef TF_MERGECOMP_GROUP_GPU_LAUNCHERS_H_
#define TF_MERGECOMP_GROUP_GPU_LAUNCHERS_H_

#include <stdint.h>

#define MERGECOMP_GPU_BAD_INDEX 10001     // a sparse payload holds an index outside the group
#define MERGECOMP_GPU_BAD_ARGUMENT 10002  // unknown codec or memory, bad k / levels / tables

// Memories (the `memory` attribute of MergecompGroupEncode).
#define MERGECOMP_MEMORY_NONE 0
#define MERGECOMP_MEMORY_RESIDUAL 1  // state e:      p = g + e,  e <- p - s
#define MERGECOMP_MEMORY_MOMENTUM 2  // state m:      m <- decay*m + gradient_scale*g, p = m
#define MERGECOMP_MEMORY_DGC 3       // state u, v:   u <- decay*u + g, v <- v + u, p = v,
                                     //               v <- p - s, u <- u * (s == 0)

extern "C" {

// A group of tensors. Device tables hold device pointers; host_offsets is
// the host copy of offsets (sizes drive grid sizes and random-k's per-tensor
// selection).
typedef struct MergecompGpuGroup {
  int64_t num_tensors;
  const int64_t* host_offsets;  // host: num_tensors + 1 flat offsets, host_offsets[0] = 0
  const int64_t* offsets;       // device copy of host_offsets
  const float* const* inputs;   // device table: tensor i's float32 gradient (encode)
  float* const* outputs;        // device table: tensor i's float32 result (decode)
  float* const* state;          // device table: tensor i's memory buffers back to back
                                // (none: NULL; dgc: u then v, 2 * size floats)
} MergecompGpuGroup;

// A codec and its memory, as the group ops' attributes give them.
typedef struct MergecompGpuCodec {
  const char* name;          // a group codec name (see above)
  int32_t memory;            // MERGECOMP_MEMORY_*
  float decay;               // momentum / dgc
  float gradient_scale;      // momentum
  int32_t marker_bytes;      // 1, 2 or 4: the payload dtype's size
  int32_t scale;             // randomk: decode multiplies tensor i by n_i / k_i
  int64_t levels;            // qsgd
  int64_t k;                 // topk, dgc: slots of the group
  int64_t sample_size;       // dgc
  const int64_t* host_tensor_k;  // randomk: k_i per tensor (host)
  const int64_t* tensor_k;       // randomk: device copy
} MergecompGpuCodec;

// Bytes of the codec's payload (without the markers), or -1 for bad arguments.
int64_t mergecomp_group_payload_bytes(const MergecompGpuCodec* codec,
                                      const MergecompGpuGroup* group);
// Bytes of one row: payload then markers.
int64_t mergecomp_group_row_bytes(const MergecompGpuCodec* codec, const MergecompGpuGroup* group);
// int32 entries of codec_context (random-k's positions; else 0).
int64_t mergecomp_group_context_size(const MergecompGpuCodec* codec,
                                     const MergecompGpuGroup* group);
// Device workspace bytes that encode and decode need.
int64_t mergecomp_group_workspace_bytes(const MergecompGpuCodec* codec,
                                        const MergecompGpuGroup* group);

// Compensates the group with its state, writes one row (payload + markers)
// and the codec context, and updates the state in place.
int mergecomp_group_encode_gpu(const MergecompGpuCodec* codec, const MergecompGpuGroup* group,
                               int64_t seed, uint8_t* row, int32_t* codec_context,
                               void* workspace, void* stream);

// Combines num_rows rows back to back (allgather) or the one averaged row
// (allreduce codecs: fp16, none, randomk) into the group's outputs; sets
// nonfinite[i] (device int32[num_tensors]) to 1 where any row marked tensor i.
int mergecomp_group_decode_gpu(const MergecompGpuCodec* codec, const MergecompGpuGroup* group,
                               const uint8_t* rows, int64_t num_rows,
                               const int32_t* codec_context, int32_t* nonfinite,
                               void* workspace, void* stream);

// mergecomp_group_decode_gpu without its one wait: a sparse payload's index
// outside the group is skipped, not reported (as TensorFlow's GPU gather
// treats a bad index), so nothing synchronises the host. The TensorFlow GPU
// kernel of MergecompGroupDecode calls this one.
int mergecomp_group_decode_gpu_async(const MergecompGpuCodec* codec,
                                     const MergecompGpuGroup* group, const uint8_t* rows,
                                     int64_t num_rows, const int32_t* codec_context,
                                     int32_t* nonfinite, void* workspace, void* stream);

// Casts the group's tensors of another float dtype between their dtype and
// float32 on the device (group_cast_gpu.cu.cc), all of them in one launch
// over the group, rounding as the CPU kernels' static_casts do (to nearest
// even; bfloat16 NaN -> quiet NaN). kinds (device int64[num_tensors]):
// MERGECOMP_CAST_* per tensor, 0 for a float32 tensor (left alone). Only the
// group's sizes and device offsets are read from `group`.
#define MERGECOMP_CAST_HALF 1
#define MERGECOMP_CAST_BFLOAT16 2
#define MERGECOMP_CAST_DOUBLE 3
// sources[i] (kind's dtype) -> targets[i] (float32).
int mergecomp_group_cast_to_float_gpu(const MergecompGpuGroup* group, const int64_t* kinds,
                                      const void* const* sources, float* const* targets,
                                      void* stream);
// sources[i] (float32) -> targets[i] (kind's dtype).
int mergecomp_group_cast_from_float_gpu(const MergecompGpuGroup* group, const int64_t* kinds,
                                        const float* const* sources, void* const* targets,
                                        void* stream);

// A message for a return code of the functions above.
const char* mergecomp_group_error_string(int code);
// The codec names, comma-separated.
const char* mergecomp_group_codec_names(void);

}  // extern "C"

#endif  // TF_MERGECOMP_GROUP_GPU_LAUNCHERS_H_
