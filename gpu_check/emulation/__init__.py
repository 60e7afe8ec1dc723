"""A small emulation of CUDA's execution model for host C++ (docs/gpu.md,
"The CUDA emulation").

The unmodified CUDA sources of custom_ops/ are rewritten (rewrite.py: launch
syntax, __shared__ declarations) and compiled by g++ against the headers in
this directory (``cuda_runtime.h``, ``cuda_runtime_api.h``, ``cuda_fp16.h``,
``cuda_emulation/``) and the runtime in ``runtime/`` (build.py), into a
library exporting the same ``extern "C"`` launchers as the nvcc build. Kernels
run on the host, one host thread per CUDA thread, with real barriers;
sanitize.py runs the launcher tests under UBSan and ThreadSanitizer.
"""
