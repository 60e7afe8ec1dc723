"""The Keras 2 in use: tf.keras on TensorFlow 2.15, tf_keras on 2.16+ (tf_mergecomp/keras2.py).

On TensorFlow >= 2.16 the project runs with TF_USE_LEGACY_KERAS=1 (tests/conftest.py),
so tf.keras is tf_keras; MergeComp's Keras classes and Horovod's Keras wrappers must
all be that Keras 2.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from tf_mergecomp import keras2
from tf_mergecomp.callback import MergeCompCallback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TF_MINOR = tuple(int(part) for part in tf.__version__.split(".")[:2])
TF_KERAS_INSTALLED = importlib.util.find_spec("tf_keras") is not None


def _is_keras2_backend(backend):
    # Keras 2's backend has the TF1-style helpers Horovod's callbacks call; Keras 3's has not.
    return all(hasattr(backend, name) for name in ("constant", "get_value", "set_value"))


def test_the_keras_in_use_is_tf_keras_and_keras2():
    keras = keras2.keras_module()
    assert _is_keras2_backend(keras.backend)
    assert keras.callbacks.Callback is tf.keras.callbacks.Callback
    assert issubclass(MergeCompCallback, tf.keras.callbacks.Callback)


def test_legacy_keras_is_set_exactly_where_tf_keras_is_installed():
    if TF_MINOR >= (2, 16):
        assert TF_KERAS_INSTALLED, "TensorFlow >= 2.16 needs tf_keras (make setup installs it)"
    assert keras2.legacy_keras_requested() == TF_KERAS_INSTALLED
    environ = keras2.child_environ({}, A="1")
    assert environ["A"] == "1"
    assert ("TF_USE_LEGACY_KERAS" in environ) == TF_KERAS_INSTALLED
    assert keras2.child_environ({"TF_USE_LEGACY_KERAS": "0"})["TF_USE_LEGACY_KERAS"] == "0"


def test_horovod_keras_wrappers_use_the_keras2_backend():
    import horovod.tensorflow.keras as hvd
    import horovod.tensorflow.keras.callbacks as hvd_callbacks

    assert hasattr(hvd.DistributedOptimizer, "_tf_mergecomp_original")  # wrapped by the hook
    for module in (hvd, hvd_callbacks):
        assert _is_keras2_backend(module.K), module.K


_CHILD = """
import json, sys
import tensorflow as tf
import tf_mergecomp
from tf_mergecomp import keras2
from tf_mergecomp.callback import MergeCompCallback
import tf_keras
print(json.dumps({
    "base_is_tf_keras": issubclass(MergeCompCallback, tf_keras.callbacks.Callback),
    "tf_keras_is_keras2": keras2.tf_keras_is_keras2(),
    "horovod_keras_imported": "horovod.tensorflow.keras" in sys.modules,
    "horovod_standalone_keras_imported": "horovod.keras" in sys.modules,
}))
"""


@pytest.mark.skipif(TF_MINOR < (2, 16) or not TF_KERAS_INSTALLED,
                    reason="tf.keras is Keras 2 on TensorFlow <= 2.15")
def test_without_the_variable_tf_keras_is_used_directly():
    """A script on TensorFlow >= 2.16 that uses tf_keras without TF_USE_LEGACY_KERAS:
    MergeComp's callback is a tf_keras callback, and Horovod's wrappers of tf.keras
    (Keras 3 there) are left alone."""
    environ = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    environ.update(PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", _CHILD], env=environ, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"base_is_tf_keras": True, "tf_keras_is_keras2": False,
                      "horovod_keras_imported": False, "horovod_standalone_keras_imported": False}
