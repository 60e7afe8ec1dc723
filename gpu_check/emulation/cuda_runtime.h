// <cuda_runtime.h> of the CUDA emulation (gpu_check/emulation, docs/gpu.md):
// CUDA C++ compiled by a host compiler. Kernels run as host code, one host
// thread per CUDA thread; launches (rewritten by rewrite.py) run the whole
// grid synchronously.
#ifndef CUDA_EMULATION_CUDA_RUNTIME_H_
#define CUDA_EMULATION_CUDA_RUNTIME_H_

#include "cuda_emulation/atomics.h"
#include "cuda_emulation/block.h"
#include "cuda_emulation/builtin_variables.h"
#include "cuda_emulation/intrinsics.h"
#include "cuda_emulation/launch.h"
#include "cuda_emulation/qualifiers.h"
#include "cuda_emulation/types.h"
#include "cuda_emulation/warp.h"
#include "cuda_runtime_api.h"

#endif  // CUDA_EMULATION_CUDA_RUNTIME_H_
