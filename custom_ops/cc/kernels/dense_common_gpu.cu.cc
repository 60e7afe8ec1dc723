// Shared entry point of the dense codecs' CUDA launchers.
#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/dense_gpu_launchers.h"

extern "C" int64_t mergecomp_dense_scratch_bytes(void) { return tf_mergecomp::gpu::kScratchBytes; }
