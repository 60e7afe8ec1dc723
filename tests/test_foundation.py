"""The stack: op library loading, and real multi-worker Horovod over Gloo."""

import numpy as np
import pytest
import tensorflow as tf

from tests import horovodrun
from tf_mergecomp import ops


def test_op_library_loads_once_and_matches_tensorflow():
    library = ops.load()
    assert ops.load() is library
    assert ops.build_info()["tensorflow_version"] == tf.__version__


def test_an_op_computes_the_right_thing():
    # The group encode op with the fp16 codec on one tensor is the simplest real
    # op: its payload must be a float16 cast.
    from tf_mergecomp import compressors

    x = tf.constant([0.0, 1.5, -2.25, 65504.0, 1e-8], tf.float32)
    payload, _ = compressors.get("fp16").op_encode(x, 0)
    assert payload.dtype == tf.float16
    np.testing.assert_array_equal(payload.numpy(), x.numpy().astype(np.float16))


def test_missing_library_error_says_how_to_rebuild(monkeypatch, tmp_path):
    monkeypatch.setattr(ops, "_PACKAGE_DIR", str(tmp_path))
    with pytest.raises(ops.OpLibraryError, match="make build"):
        ops.library_path()


def test_each_tensorflow_version_has_its_own_library(monkeypatch, tmp_path):
    # The running TensorFlow's library is picked among others; a checkout holding only
    # another version's fails naming what it found.
    other = tmp_path / (ops.library_stem("2.99.0") + ".cpython-311-x86_64-linux-gnu.so")
    other.write_bytes(b"")
    monkeypatch.setattr(ops, "_PACKAGE_DIR", str(tmp_path))
    with pytest.raises(ops.OpLibraryError, match=r"TensorFlow %s.*found: %s" % (
            tf.__version__.replace(".", r"\."), other.name.replace(".", r"\."))):
        ops.library_path()
    mine = tmp_path / (ops.library_stem() + ".cpython-311-x86_64-linux-gnu.so")
    mine.write_bytes(b"")
    assert ops.library_path() == str(mine)
    assert ops.library_stem("2.15.1") == "_mergecomp_ops_tf2_15_1"


def test_stale_library_error_names_both_versions(monkeypatch):
    monkeypatch.setattr(ops, "_library", None)
    monkeypatch.setattr(ops, "build_info", lambda: {"tensorflow_version": "0.0.1"})
    with pytest.raises(ops.OpLibraryError, match=r"0\.0\.1.*%s" % tf.__version__.replace(".", r"\.")):
        ops.load()


@pytest.mark.multiworker
def test_two_workers_allreduce_a_known_tensor():
    results, _ = horovodrun.run("allreduce_smoke.py", np=2, timeout=120)
    for rank in (0, 1):
        (result,) = results[rank]
        assert result["size"] == 2
        assert result["summed"] == [3.0] * 5
