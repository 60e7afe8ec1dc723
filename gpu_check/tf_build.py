"""`make gpu-build`: the op library with its GPU kernels, built and checked without a GPU.

Run with the python of the GPU venv (.venv-gpu: the CUDA wheel of TensorFlow and
CUDA packages from PyPI, see the Makefile). It

1. builds the op library with CUDA kernels (setup.py, TF_MERGECOMP_CUDA=1) into
   build/gpu-ops/, leaving the package's own (CPU) library alone;
2. loads it into the CUDA TensorFlow in a fresh process (no GPU needed);
3. reads TensorFlow's kernel registry: every group op (MergecompGroupEncode,
   MergecompGroupDecode and PowerSGD's three) must have a GPU kernel for every
   gradient dtype its ``T`` attribute declares (float32 for an op without
   one); "CPU only:" lists those that do not, and must read "none";

and prints one summary line (exit status 1 if anything is missing).

The toolchain, all from PyPI (docs/gpu.md, "Building"): the C++ sources
(the TensorFlow kernels, with GOOGLE_CUDA=1) compile against CUDA 12.2's
headers (nvidia-cuda-runtime-cu12, nvidia-cuda-nvcc-cu12's crt/, cccl) and
the library links CUDA 12's libcudart.so.12, as TensorFlow 2.15's CUDA build
does. PyPI has no CUDA 12 nvcc driver (nvidia-cuda-nvcc-cu12 ships ptxas,
libnvvm and headers only), so the .cu.cc sources are compiled by the nvcc
of PyPI's CUDA 13 package (nvidia-cuda-nvcc, never the machine's
/usr/local/cuda); set NVCC / CUDA_INCLUDE_DIR (or CUDA_HOME) to a CUDA 12
toolkit where one is installed.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "build" / "gpu-ops"

# Every group op: each must have a GPU kernel for every dtype it declares
# (an op without a ``T`` attribute, MergecompPowersgdGroupQ, takes float32
# only). Any op missing one is listed under "CPU only" and fails the check.
GPU_OPS = ("MergecompGroupEncode", "MergecompGroupDecode", "MergecompPowersgdGroupP",
           "MergecompPowersgdGroupQ", "MergecompPowersgdGroupFinish")


def _package_dir(name):
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def toolchain_env():
    """The environment for setup.py: CUDA 12 headers and runtime, an nvcc."""
    env = dict(os.environ)
    env["TF_MERGECOMP_CUDA"] = "1"
    env["TF_MERGECOMP_OUT_OF_TREE"] = "1"
    runtime = _package_dir("nvidia.cuda_runtime")
    nvcc12 = _package_dir("nvidia.cuda_nvcc")
    cccl = _package_dir("nvidia.cuda_cccl")
    cu13 = _package_dir("nvidia.cu13")
    missing = [name for name, found in (("nvidia-cuda-runtime-cu12", runtime),
                                        ("nvidia-cuda-nvcc-cu12", nvcc12)) if found is None]
    if missing:
        sys.exit("gpu-build: %s not installed in %s (make gpu-build installs them)"
                 % (", ".join(missing), sys.prefix))
    includes = [runtime / "include", nvcc12 / "include"] + ([cccl / "include"] if cccl else [])
    env["CUDA_CXX_INCLUDE_DIRS"] = os.pathsep.join(str(d) for d in includes)
    env["CUDA_LIB_DIR"] = str(runtime / "lib")
    env["CUDA_RUNTIME_LIB"] = ":libcudart.so.12"
    if not env.get("NVCC") and not env.get("CUDA_HOME"):
        if cu13 is None or not (cu13 / "bin" / "nvcc").exists():
            sys.exit("gpu-build: no nvcc: install nvidia-cuda-nvcc (PyPI) or set NVCC / CUDA_HOME")
        env["NVCC"] = str(cu13 / "bin" / "nvcc")
        env["CUDA_INCLUDE_DIR"] = str(cu13 / "include")
    return env


def build(env):
    command = [sys.executable, "setup.py", "--quiet", "build_ext",
               "--build-lib", str(OUT_DIR), "--build-temp", str(ROOT / "build" / "gpu-ops-tmp")]
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    libraries = sorted(OUT_DIR.glob("tf_mergecomp/_mergecomp_ops*.so"))
    if not libraries:
        sys.exit("gpu-build: setup.py built no library under %s" % OUT_DIR)
    return libraries[0]


_CHECK = r"""
import json, sys
import tensorflow as tf
from tensorflow.python.framework import kernels, op_def_registry
lib = tf.load_op_library(sys.argv[1])
report = {"tensorflow": tf.__version__, "is_cuda_build": tf.test.is_built_with_cuda(),
          "cuda_version": tf.sysconfig.get_build_info().get("cuda_version"), "ops": {}}
for name in json.loads(sys.argv[2]):
    op_def = op_def_registry.get(name)
    if op_def is None:
        report["ops"][name] = None
        continue
    typed = any(attr.name == "T" for attr in op_def.attr)
    declared = [tf.dtypes.as_dtype(t).name
                for attr in op_def.attr if attr.name == "T"
                for t in attr.allowed_values.list.type] if typed else ["float32"]
    gpu = [k for k in kernels.get_registered_kernels_for_op(name).kernel if k.device_type == "GPU"]
    covered = set()
    for kernel in gpu:
        constraint = [c for c in kernel.constraint if c.name == "T"]
        if not constraint:
            covered.update(declared)
        else:
            covered.update(tf.dtypes.as_dtype(t).name
                           for t in constraint[0].allowed_values.list.type)
    devices = sorted({k.device_type for k in kernels.get_registered_kernels_for_op(name).kernel})
    report["ops"][name] = {"declared": declared, "gpu": sorted(covered & set(declared)),
                           "devices": devices,
                           "host_memory": sorted({m for k in gpu for m in k.host_memory_arg})}
print(json.dumps(report))
"""


def check(library):
    ops = list(GPU_OPS)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-c", _CHECK, str(library), json.dumps(ops)],
                            capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.stderr.write(result.stderr[-4000:])
        sys.exit("gpu-build: FAILED: the library did not load into CUDA TensorFlow")
    return json.loads(result.stdout.strip().splitlines()[-1])


def summarise(report, library, seconds):
    problems, covered, cpu_only = [], [], []
    for name in GPU_OPS:
        entry = report["ops"].get(name)
        if entry is None:
            problems.append("%s not registered" % name)
            continue
        missing = [t for t in entry["declared"] if t not in entry["gpu"]]
        if missing:
            problems.append("%s has no GPU kernel for %s" % (name, ",".join(missing)))
            cpu_only.append(name)
        if entry["gpu"]:
            covered.append("%s[%s]" % (name, ",".join(entry["gpu"])))
    if not report["is_cuda_build"]:
        problems.append("TensorFlow is not a CUDA build")
    status = "OK" if not problems else "FAILED"
    line = ("gpu-build: %s: GPU kernels %s; CPU only: %s; TensorFlow %s (CUDA %s); %s; %.0f s%s"
            % (status, " ".join(covered), ",".join(cpu_only) or "none", report["tensorflow"],
               report["cuda_version"], os.path.relpath(library, ROOT), seconds,
               "" if not problems else "; " + "; ".join(problems)))
    return status == "OK", line


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the registry report here")
    args = parser.parse_args(argv)
    start = time.time()
    library = build(toolchain_env())
    report = check(library)
    ok, line = summarise(report, library, time.time() - start)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
