"""Every CUDA source under custom_ops/ compiles with nvcc, without TensorFlow,
into one shared library that exports every ``extern "C"`` launcher, and the
group launchers' payload sizes are the CPU group ops' (no GPU needed).

The ``*_gpu.cu.cc`` files keep their kernels and launchers outside
``#if GOOGLE_CUDA``, so they build (and can be driven through ctypes) on a
machine without a CUDA TensorFlow: one nvcc invocation, as gpu_check builds
them. Skipped where nvcc is absent.
"""

import ctypes
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from gpu_check import launchers

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(launchers.find_nvcc() is None, reason="nvcc not found")


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    out = tmp_path_factory.mktemp("cuda_lib") / "libmergecomp_gpu.so"
    # -O1: this checks compilation and the exported symbols, not speed.
    return launchers.build(out, arch="", optimize="-O1", force=True)


def test_there_are_cuda_sources():
    names = {s.name for s in launchers.sources()}
    for codec in ("fp16", "signsgd", "onebit", "efsignsgd", "qsgd", "terngrad", "topk", "dgc",
                  "randomk", "group", "powersgd"):
        assert codec + "_op_gpu.cu.cc" in names


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm not found")
def test_library_exports_every_launcher(library):
    exported = launchers.exported_symbols(library)
    missing = sorted(set(launchers.EXPECTED_SYMBOLS) - exported)
    assert not missing, "not exported: %s" % ", ".join(missing)
    # Nothing else leaks out under the launchers' prefix unannounced.
    extra = sorted(s for s in exported
                   if s.startswith("mergecomp_") and s not in launchers.EXPECTED_SYMBOLS)
    assert not extra, "undocumented launchers: %s" % ", ".join(extra)


def _host_group(sizes):
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    c_offsets = (ctypes.c_int64 * len(offsets))(*offsets)
    group = launchers.GpuGroup(num_tensors=len(sizes),
                               host_offsets=ctypes.cast(c_offsets, ctypes.POINTER(ctypes.c_int64)))
    return group, c_offsets


def test_group_payload_sizes_are_the_cpu_ops(library):
    """Row bytes and codec-context sizes of the launchers equal what the CPU
    group ops produced (tests/data/group_golden.npz) for every case."""
    lib = launchers.load(library)
    golden = np.load(ROOT / "tests" / "data" / "group_golden.npz")
    cases = json.loads(str(golden["cases"]))
    assert len(cases) >= 10
    for case in cases:
        meta = json.loads(str(golden[case + "__meta"]))
        group, _keep = _host_group([int(n) for n in golden[case + "__sizes"]])
        codec, _keep_k = launchers.make_codec(
            meta["codec"], memory=meta["memory"], marker_bytes=meta["marker_bytes"],
            levels=meta["levels"], k=meta["k"], sample_size=meta["sample_size"],
            tensor_k=meta["tensor_k"] if meta["codec"] == "randomk" else None)
        row_bytes = meta["row_bytes"]  # digest cases store no rows
        assert (case + "__row0") not in golden.files or golden[case + "__row0"].size == row_bytes
        assert lib.mergecomp_group_row_bytes(codec, group) == row_bytes, case
        assert lib.mergecomp_group_context_size(codec, group) == (
            golden[case + "__context0"].size), case
        payload = lib.mergecomp_group_payload_bytes(codec, group)
        markers = golden[case + "__sizes"].size * meta["marker_bytes"]
        assert payload == row_bytes - markers, case
        assert lib.mergecomp_group_workspace_bytes(codec, group) > 0


def test_bad_group_arguments_are_refused(library):
    lib = launchers.load(library)
    group, _keep = _host_group([10, 0, 5])
    for name, params in [("nosuchcodec", {}), ("qsgd", {"levels": 0}), ("topk", {"k": 16}),
                         ("randomk", {"tensor_k": [11, 0, 1]})]:
        codec, _keep_k = launchers.make_codec(name, **params)
        assert lib.mergecomp_group_payload_bytes(codec, group) == -1, name
    codec, _ = launchers.make_codec("topk", k=15)
    assert lib.mergecomp_group_payload_bytes(codec, group) == 8 * 15
    names = lib.mergecomp_group_codec_names().decode().split(",")
    assert names == launchers.GROUP_CODECS
