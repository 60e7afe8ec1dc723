"""Build and install tf_mergecomp.

The custom ops in ``custom_ops/`` are compiled into one shared library,
``tf_mergecomp/_mergecomp_ops.so``, against the TensorFlow installed in the
running interpreter (so TensorFlow must be installed first and the build must
run without build isolation: ``pip install --no-build-isolation -e .``).

CPU kernels (``*.cc``) are always built. CUDA kernels (``*.cu.cc``) are built
only when TensorFlow is a CUDA build and ``nvcc`` is found; otherwise the build
says, in one line, that it is CPU-only.
"""

import fcntl
import json
import os
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
BUILD_INFO = "_mergecomp_ops_build.json"


def _tensorflow_build_flags():
    try:
        import tensorflow as tf
    except ImportError as exc:  # pragma: no cover - exercised only on broken set-ups
        sys.exit(
            "tf_mergecomp: TensorFlow must be installed before building the ops "
            "(and pip must run with --no-build-isolation): %s" % exc
        )
    info = tf.sysconfig.get_build_info()
    return (
        tf.__version__,
        tf.sysconfig.get_compile_flags(),
        tf.sysconfig.get_link_flags(),
        bool(info.get("is_cuda_build", False)),
    )


def _newer(source, target):
    return not target.exists() or source.stat().st_mtime > target.stat().st_mtime


class BuildTensorFlowOps(build_ext):
    """Compiles custom_ops/ with TensorFlow's flags, in parallel, incrementally."""

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
        tf_version, compile_flags, link_flags, is_cuda_build = _tensorflow_build_flags()
        object_dir = ROOT / "build" / ("ops-tf" + tf_version)
        object_dir.mkdir(parents=True, exist_ok=True)
        headers = sorted(OPS_DIR.rglob("*.h"))
        newest_header = max((h.stat().st_mtime for h in headers), default=0.0)
        cxx = os.environ.get("CXX", "g++")
        # No fused multiply-add contraction: kernels match the plain-TF references bit for bit.
        common = ["-std=c++17", "-fPIC", "-O3", "-ffp-contract=off", "-I" + str(OPS_DIR)] + compile_flags

        nvcc = shutil.which("nvcc") or (
            "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
        )
        build_cuda = is_cuda_build and nvcc is not None
        if not build_cuda:
            why = "TensorFlow is not a CUDA build" if not is_cuda_build else "nvcc was not found"
            print("tf_mergecomp: building CPU-only ops (%s)" % why, flush=True)

        jobs = []
        for source in sorted(OPS_DIR.rglob("*.cc")):
            is_cuda = source.name.endswith(".cu.cc")
            if is_cuda and not build_cuda:
                continue
            rel = source.relative_to(OPS_DIR).with_suffix(".o")
            target = object_dir / str(rel).replace(os.sep, "__")
            if is_cuda:
                command = [nvcc, "-std=c++17", "-x", "cu", "-c", str(source), "-o", str(target),
                           "-Xcompiler", "-fPIC", "-O3", "-I" + str(OPS_DIR),
                           "-DGOOGLE_CUDA=1", "--expt-relaxed-constexpr"] + compile_flags
            else:
                command = [cxx, "-c", str(source), "-o", str(target)] + common
                if build_cuda:
                    command.append("-DGOOGLE_CUDA=1")
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
            cuda_lib = Path(nvcc).resolve().parent.parent / "lib64"
            link += ["-L" + str(cuda_lib), "-lcudart"]
        if any(_newer(Path(o), output) for o in objects) or not output.exists():
            subprocess.run(link, check=True)
        info = json.dumps({"tensorflow_version": tf_version, "cuda": build_cuda}) + "\n"
        # With --inplace (and editable installs) setuptools builds under build/
        # and copies only the library into the package: write the build info
        # beside both.
        for directory in {output.parent, ROOT / "tf_mergecomp"}:
            # Atomic, so a process loading the library never reads a half-written file.
            partial = directory / (BUILD_INFO + ".partial")
            partial.write_text(info)
            os.replace(partial, directory / BUILD_INFO)


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
