"""The dense codecs' CUDA kernels reproduce the CPU ops (needs a GPU and CuPy).

The kernels are built straight from custom_ops/ with nvcc into a plain shared
library and called through their ``extern "C"`` launchers with CuPy arrays,
so this runs on a GPU host without TensorFlow. Expected bytes come from the
CPU ops (tests/data/dense_golden.npz, written by make_dense_golden.py).

Exact everywhere except the float64 sums behind the onebit/efsignsgd/qsgd
headers, which the GPU adds in another order: those may differ in the last
float32 bit, and so may a QSGD level that sits on a rounding boundary.
"""

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "custom_ops" / "cc" / "kernels"
SOURCES = ["dense_common", "fp16_op", "signsgd_op", "onebit_op", "efsignsgd_op", "qsgd_op",
           "terngrad_op"]
NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
)
N = 5003
WORLD = 3


def _has_gpu():
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # CuPy without a driver raises its own runtime errors
        return False


pytestmark = [
    pytest.mark.skipif(NVCC is None, reason="nvcc not found"),
    pytest.mark.skipif(not _has_gpu(), reason="no CUDA device"),
]

P, I64 = ctypes.c_void_p, ctypes.c_int64


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("cuda_lib") / "libmergecomp_dense_gpu.so"
    command = [NVCC, "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-O3", "-o", str(out),
               "-I" + str(ROOT / "custom_ops")]
    command += ["-x", "cu"] + [str(KERNELS / (s + "_gpu.cu.cc")) for s in SOURCES]
    subprocess.run(command, check=True)
    library = ctypes.CDLL(str(out))
    library.mergecomp_dense_scratch_bytes.restype = I64
    return library


@pytest.fixture(scope="module")
def golden():
    return np.load(ROOT / "tests" / "data" / "dense_golden.npz")


def inputs():
    return [np.random.default_rng(w).standard_normal(N).astype(np.float32) for w in range(WORLD)]


def _call(fn, *args):
    converted = [a.data.ptr if isinstance(a, cp.ndarray) else a for a in args]
    fn.restype = ctypes.c_int
    fn.argtypes = [P if isinstance(a, cp.ndarray) or a is None else I64 for a in args]
    assert fn(*converted) == 0
    cp.cuda.runtime.deviceSynchronize()


def _encode(lib, key, x, seed):
    scratch = cp.empty(lib.mergecomp_dense_scratch_bytes(), cp.uint8)
    payload = None
    if key == "fp16":
        payload = cp.empty(N, cp.uint16)
        _call(lib.mergecomp_fp16_encode_gpu, x, N, payload, None)
        return payload.get().view(np.float16)
    sizes = {"signsgd": (N + 7) // 8, "onebit": 8 + (N + 7) // 8,
             "efsignsgd": 4 + (N + 7) // 8, "qsgd64": 4 + N, "qsgd5": 4 + (N * 4 + 7) // 8,
             "terngrad": 4 + (N + 3) // 4}
    payload = cp.empty(sizes[key], cp.uint8)
    if key == "signsgd":
        _call(lib.mergecomp_signsgd_encode_gpu, x, N, payload, None)
    elif key in ("onebit", "efsignsgd"):
        _call(getattr(lib, "mergecomp_%s_encode_gpu" % key), x, N, payload, scratch, None)
    elif key.startswith("qsgd"):
        _call(lib.mergecomp_qsgd_encode_gpu, x, N, seed, int(key[4:]), payload, scratch, None)
    else:
        _call(lib.mergecomp_terngrad_encode_gpu, x, N, seed, payload, scratch, None)
    return payload.get()


def _decode(lib, key, rows):
    out = cp.empty(N, cp.float32)
    batch = cp.asarray(np.concatenate(rows))
    if key.startswith("qsgd"):
        _call(lib.mergecomp_qsgd_decode_gpu, batch, len(rows), N, int(key[4:]), out, None)
    else:
        _call(getattr(lib, "mergecomp_%s_decode_gpu" % key), batch, len(rows), N, out, None)
    return out.get()


@pytest.mark.parametrize("key", ["fp16", "signsgd", "terngrad", "onebit", "efsignsgd",
                                 "qsgd64", "qsgd5"])
def test_gpu_encode_matches_cpu_op(lib, golden, key):
    header = {"onebit": 8, "efsignsgd": 4, "qsgd64": 4, "qsgd5": 4}.get(key, 0)
    for w, x in enumerate(inputs()):
        got = _encode(lib, key, cp.asarray(x), w + 11)
        expected = golden["%s_payload%d" % (key, w)]
        if header == 0:
            np.testing.assert_array_equal(got, expected)
            continue
        np.testing.assert_allclose(got[:header].view(np.float32),
                                   expected[:header].view(np.float32), rtol=2e-7)
        same = np.mean(got[header:] == expected[header:])
        assert same == 1.0 if key in ("onebit", "efsignsgd") else same > 0.999


@pytest.mark.parametrize("key", ["signsgd", "terngrad", "onebit", "efsignsgd", "qsgd64", "qsgd5"])
def test_gpu_decode_matches_cpu_op(lib, golden, key):
    rows = [golden["%s_payload%d" % (key, w)] for w in range(WORLD)]
    np.testing.assert_array_equal(_decode(lib, key, rows), golden["%s_combined" % key])


def test_gpu_fp16_decode_is_exact(lib):
    values = np.random.default_rng(5).standard_normal(N).astype(np.float16)
    out = cp.empty(N, cp.float32)
    _call(lib.mergecomp_fp16_decode_gpu, cp.asarray(values.view(np.uint16)), N, out, None)
    np.testing.assert_array_equal(out.get(), values.astype(np.float32))
