"""Every CUDA source under custom_ops/ compiles with nvcc, without TensorFlow.

The ``*_gpu.cu.cc`` files keep their kernels and ``extern "C"`` launchers
outside ``#if GOOGLE_CUDA``, so they build (and can be driven through ctypes)
on a machine without a CUDA TensorFlow. This test proves that part compiles
and exports C symbols named ``mergecomp_*``; it is skipped where nvcc is absent.
"""

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "custom_ops").rglob("*_gpu.cu.cc"))
NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
)

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found")


def _compile(source, out_dir):
    target = out_dir / (source.name + ".o")
    command = [NVCC, "-std=c++17", "-x", "cu", "-c", str(source), "-o", str(target),
               "-I" + str(ROOT / "custom_ops"), "-Xcompiler", "-fPIC", "-O1"]
    result = subprocess.run(command, capture_output=True, text=True)
    return source, target, result


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("cuda_objects")
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda s: _compile(s, out_dir), SOURCES))


def test_there_are_cuda_sources():
    names = {s.name for s in SOURCES}
    for codec in ("fp16", "signsgd", "onebit", "efsignsgd", "qsgd", "terngrad"):
        assert codec + "_op_gpu.cu.cc" in names


def test_every_cuda_source_compiles_without_tensorflow(compiled):
    failures = ["%s:\n%s" % (s.relative_to(ROOT), r.stderr[-2000:])
                for s, _, r in compiled if r.returncode != 0]
    assert not failures, "\n".join(failures)


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm not found")
def test_cuda_sources_export_c_launchers(compiled):
    for source, target, result in compiled:
        if result.returncode != 0:
            continue  # reported by the compile test
        symbols = subprocess.run(["nm", "--defined-only", "-g", str(target)],
                                 capture_output=True, text=True, check=True).stdout.split()
        assert any(s.startswith("mergecomp_") for s in symbols), source.name
