"""Build and install tf_mergecomp.

The custom ops in ``custom_ops/`` are compiled into one shared library per
TensorFlow version, ``tf_mergecomp/_mergecomp_ops_tf<version>*.so`` (and its build
record ``_mergecomp_ops_tf<version>.json``; ``tf_mergecomp.ops.library_stem``), against
the TensorFlow installed in the running interpreter (so TensorFlow must be installed
first and the build must run without build isolation:
``pip install --no-build-isolation -e .``). Venvs with different TensorFlow releases
share one checkout: each loads its own library.

CPU kernels (``*.cc``) are always built. CUDA kernels (``*.cu.cc``) are built
only when all of these hold: TensorFlow is a CUDA build, ``nvcc`` runs, the CUDA
headers (``cuda_runtime.h``) are found, and nvcc's CUDA major version is the one
TensorFlow was built with. Only then are the CPU kernels compiled with
``GOOGLE_CUDA=1`` (which registers the GPU kernels), and always together with the
CUDA include path. The build prints one line saying which it builds and why.

Environment:
  TF_MERGECOMP_CUDA   ``auto`` (default) as above; ``0`` CPU-only; ``1`` CUDA
                      kernels even if the CUDA versions differ (fails if nvcc or
                      the headers are missing).
  CUDA_HOME           the CUDA toolkit (nvcc in bin/, headers in include/);
                      otherwise ``nvcc`` on PATH, else /usr/local/cuda.
  NVCC, CUDA_INCLUDE_DIR   override nvcc and the header directory one by one.
  CUDA_CXX_INCLUDE_DIRS  the CUDA header directories (os.pathsep-separated) for the
                      C++ sources compiled with GOOGLE_CUDA=1, when they are not
                      nvcc's (``make gpu-build``: CUDA 12's from PyPI packages).
  CUDA_LIB_DIR, CUDA_RUNTIME_LIB   where libcudart is and its -l name (default
                      ``cudart``; e.g. ``:libcudart.so.12``); CUDA_LIB_DIR is also
                      the library's run path.
"""

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
OPS_DIR = ROOT / "custom_ops"
LIBRARY_NAME = "tf_mergecomp._mergecomp_ops"


def _library_stem(tf_version):
    """The library's name for a TensorFlow version: tf_mergecomp.ops.library_stem's."""
    return "_mergecomp_ops_tf" + re.sub(r"[^0-9A-Za-z]", "_", tf_version)


def _tensorflow_build_flags():
    try:
        import tensorflow as tf
    except ImportError as exc:  # pragma: no cover - exercised only on broken set-ups
        sys.exit(
            "tf_mergecomp: TensorFlow must be installed before building the ops "
            "(and pip must run with --no-build-isolation): %s" % exc
        )
    return (
        tf.__version__,
        tf.sysconfig.get_compile_flags(),
        tf.sysconfig.get_link_flags(),
        dict(tf.sysconfig.get_build_info()),
    )


def _nvcc_toolkit(nvcc):
    """What nvcc reports of itself: {"release": "12.3", "root", "includes", "libs"}, or None
    if it does not run. nvcc may be a wrapper script, so its own dry run says where the
    toolkit is."""
    try:
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
        dryrun = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    release = re.search(r"release (\d+\.\d+)", version.stdout)
    if version.returncode != 0 or not release:
        return None
    text = dryrun.stdout + dryrun.stderr
    top = re.search(r"^#\$ TOP=(.*)$", text, re.M)
    root = Path(os.path.normpath(top.group(1).strip())) if top else Path(nvcc).resolve().parent.parent
    flags = re.findall(r'"?-([IL])([^"\s]+)"?', " ".join(
        line for line in text.splitlines() if line.startswith(("#$ INCLUDES=", "#$ LIBRARIES="))))
    includes = [root / "include"] + [Path(os.path.normpath(p)) for kind, p in flags if kind == "I"]
    libs = [root / "lib64"] + [Path(os.path.normpath(p)) for kind, p in flags
                               if kind == "L" and not p.rstrip("/").endswith("stubs")]
    return {"release": release.group(1), "root": root, "includes": includes, "libs": libs}


# The GPUs the CUDA kernels are compiled for: Volta (sm_70; CUDA 13 no longer
# compiles for it, so from CUDA 13 Turing's sm_75 is the oldest), Ampere (sm_80),
# Hopper (sm_90), and sm_90's PTX, which the driver compiles for newer GPUs.
# TF_MERGECOMP_CUDA_ARCHS="80,90" (compute capabilities without the dot) overrides.
def cuda_arch_flags(release):
    archs = os.environ.get("TF_MERGECOMP_CUDA_ARCHS", "").strip()
    if archs:
        numbers = [a.strip() for a in archs.split(",") if a.strip()]
        if not all(a.isdigit() for a in numbers) or not numbers:
            sys.exit("tf_mergecomp: TF_MERGECOMP_CUDA_ARCHS must be compute capabilities such as "
                     "\"70,80,90\", not %r" % archs)
    else:
        major = int(release.split(".")[0]) if release else 12
        numbers = ["75" if major >= 13 else "70", "80", "90"]
    flags = []
    for arch in numbers:
        flags += ["-gencode", "arch=compute_%s,code=sm_%s" % (arch, arch)]
    return flags + ["-gencode", "arch=compute_%s,code=compute_%s" % (numbers[-1], numbers[-1])]


def _cuda_toolkit(tf_version, tf_build_info):
    """Decides whether to build the CUDA kernels.

    Returns (toolkit, reason): toolkit is None for a CPU-only build, else a dict
    with "nvcc", "include" and "lib" (directories); reason says why, in words.
    """
    mode = os.environ.get("TF_MERGECOMP_CUDA", "auto").strip().lower()
    if mode in ("0", "no", "off", "false"):
        return None, "TF_MERGECOMP_CUDA=0"
    forced = mode in ("1", "yes", "on", "true")
    if mode != "auto" and not forced:
        sys.exit("tf_mergecomp: TF_MERGECOMP_CUDA must be auto, 0 or 1, not %r" % mode)
    if not tf_build_info.get("is_cuda_build", False):
        return None, "TensorFlow %s is not a CUDA build" % tf_version

    def unusable(reason):
        if forced:
            sys.exit("tf_mergecomp: TF_MERGECOMP_CUDA=1, but %s" % reason)
        return None, reason

    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = os.environ.get("NVCC")
    if not nvcc and cuda_home:
        nvcc = os.path.join(cuda_home, "bin", "nvcc")
    if not nvcc:
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    found = _nvcc_toolkit(nvcc)
    if found is None:
        return unusable("nvcc (%s) was not found or does not run" % nvcc)
    if os.environ.get("CUDA_INCLUDE_DIR"):
        candidates = [Path(os.environ["CUDA_INCLUDE_DIR"])]
    else:
        candidates = ([Path(cuda_home) / "include"] if cuda_home else []) + found["includes"]
    include = next((d for d in candidates if (d / "cuda_runtime.h").exists()), None)
    if include is None:
        return unusable("the CUDA headers were not found (no cuda_runtime.h in %s; set "
                        "CUDA_HOME or CUDA_INCLUDE_DIR)" % ", ".join(map(str, candidates)))
    release = found["release"]
    tf_cuda = str(tf_build_info.get("cuda_version", ""))
    if tf_cuda and tf_cuda.split(".")[0] != release.split(".")[0] and not forced:
        return None, ("nvcc %s is CUDA %s, but TensorFlow %s was built with CUDA %s"
                      % (nvcc, release, tf_version, tf_cuda))
    lib = next((d for d in found["libs"] if d.is_dir()), found["libs"][0])
    toolkit = {"nvcc": nvcc, "include": str(include), "lib": str(lib), "release": release}
    return toolkit, "nvcc %s is CUDA %s, headers in %s, TensorFlow %s built with CUDA %s" % (
        nvcc, release, include, tf_version, tf_cuda or "?")


def _newer(source, target):
    return not target.exists() or source.stat().st_mtime > target.stat().st_mtime


def _read_build_info(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class BuildTensorFlowOps(build_ext):
    """Compiles custom_ops/ with TensorFlow's flags, in parallel, incrementally."""

    def get_ext_filename(self, fullname):
        # The library is named for the TensorFlow it is built against (both the build
        # and the copy --inplace makes ask for the name here).
        name = super().get_ext_filename(fullname)
        if fullname.split(".")[-1] == LIBRARY_NAME.split(".")[-1]:
            tf_version = _tensorflow_build_flags()[0]
            name = name.replace("_mergecomp_ops.", _library_stem(tf_version) + ".", 1)
        return name

    def build_extension(self, ext):
        output = Path(self.get_ext_fullpath(ext.name))
        output.parent.mkdir(parents=True, exist_ok=True)
        lock_path = ROOT / "build" / ".ops.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        # Concurrent builds (two shells, pip plus make) would interleave writes to
        # the same objects and library: serialise them.
        with open(lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._build_locked(output)

    def _build_locked(self, output):
        tf_version, compile_flags, link_flags, tf_build_info = _tensorflow_build_flags()
        toolkit, why = _cuda_toolkit(tf_version, tf_build_info)
        build_cuda = toolkit is not None
        if build_cuda:
            print("tf_mergecomp: building ops with CUDA kernels (%s)" % why, flush=True)
        else:
            print("tf_mergecomp: building CPU-only ops (%s)" % why, flush=True)
        # Objects are kept per TensorFlow version and per kind of build.
        object_dir = ROOT / "build" / ("ops-tf" + tf_version + ("-cuda" if build_cuda else ""))
        object_dir.mkdir(parents=True, exist_ok=True)
        headers = sorted(OPS_DIR.rglob("*.h"))
        newest_header = max((h.stat().st_mtime for h in headers), default=0.0)
        cxx = os.environ.get("CXX", "g++")
        # No fused multiply-add contraction: kernels match the plain-TF references bit for bit.
        common = ["-std=c++17", "-fPIC", "-O3", "-ffp-contract=off", "-I" + str(OPS_DIR)] + compile_flags
        if build_cuda:
            # GOOGLE_CUDA makes TensorFlow's and Eigen's headers include CUDA's:
            # never one without the other.
            cxx_includes = [d for d in os.environ.get("CUDA_CXX_INCLUDE_DIRS", "").split(os.pathsep)
                            if d] or [toolkit["include"]]
            common += ["-DGOOGLE_CUDA=1"] + ["-I" + d for d in cxx_includes]

        jobs = []
        for source in sorted(OPS_DIR.rglob("*.cc")):
            is_cuda = source.name.endswith(".cu.cc")
            if is_cuda and not build_cuda:
                continue
            rel = source.relative_to(OPS_DIR).with_suffix(".o")
            target = object_dir / str(rel).replace(os.sep, "__")
            if is_cuda:
                command = [toolkit["nvcc"], "-std=c++17", "-x", "cu", "-c", str(source),
                           "-o", str(target), "-Xcompiler", "-fPIC", "-O3", "-I" + str(OPS_DIR),
                           "-I" + toolkit["include"], "-DGOOGLE_CUDA=1",
                           "--expt-relaxed-constexpr"] + cuda_arch_flags(toolkit["release"]) + compile_flags
            else:
                command = [cxx, "-c", str(source), "-o", str(target)] + common
            stale = _newer(source, target) or newest_header > target.stat().st_mtime
            jobs.append((source, target, command, stale))

        def compile_one(job):
            source, target, command, stale = job
            if stale:
                print("tf_mergecomp: compiling %s" % source.relative_to(ROOT), flush=True)
                subprocess.run(command, check=True)

        workers = max(1, min(len(jobs), os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(compile_one, jobs))

        objects = [str(target) for _, target, _, _ in jobs]
        link = [cxx, "-shared", "-o", str(output)] + objects + link_flags
        if build_cuda:
            lib_dir = os.environ.get("CUDA_LIB_DIR") or toolkit["lib"]
            link += ["-L" + lib_dir, "-l" + os.environ.get("CUDA_RUNTIME_LIB", "cudart")]
            if os.environ.get("CUDA_LIB_DIR"):
                link += ["-Wl,-rpath," + lib_dir]
        built = {"tensorflow_version": tf_version, "cuda": build_cuda}
        build_info = _library_stem(tf_version) + ".json"
        # Relink when the library was last linked for another kind of build (CPU, CUDA).
        if (not output.exists() or any(_newer(Path(o), output) for o in objects)
                or _read_build_info(output.parent / build_info) != built):
            subprocess.run(link, check=True)
        info = json.dumps(built) + "\n"
        # With --inplace (and editable installs) setuptools builds under build/
        # and copies only the library into the package: write the build info
        # beside both.
        # Not into the package for a library built out of tree
        # (TF_MERGECOMP_OUT_OF_TREE=1: `make gpu-build`'s, under build/gpu-ops/).
        directories = {output.parent}
        if os.environ.get("TF_MERGECOMP_OUT_OF_TREE") != "1":
            directories.add(ROOT / "tf_mergecomp")
        for directory in directories:
            # Atomic, so a process loading the library never reads a half-written file.
            partial = directory / (build_info + ".partial")
            partial.write_text(info)
            os.replace(partial, directory / build_info)


setup(
    name="tf_mergecomp",
    version="0.1.0",
    description="MergeComp: a gradient compression scheduler for TensorFlow/Keras on Horovod",
    packages=find_packages(include=["tf_mergecomp", "tf_mergecomp.*"]),
    python_requires=">=3.9",
    # TensorFlow itself is not listed: tensorflow-cpu and tensorflow (CUDA) are
    # different distributions of the same package, and the ops build against
    # whichever is already installed (see the Makefile).
    install_requires=["numpy<2"],
    ext_modules=[Extension(LIBRARY_NAME, sources=[])],
    cmdclass={"build_ext": BuildTensorFlowOps},
    zip_safe=False,
)
