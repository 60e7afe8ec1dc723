"""Test-session set-up that must happen before any test module imports TensorFlow."""

import importlib.util
import os

# TensorFlow >= 2.16: tf.keras must be Keras 2, the tf_keras package, for Horovod
# (docs/stack.md). The horovodrun workers inherit it (tests/horovodrun.py).
if importlib.util.find_spec("tf_keras") is not None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "multiworker: starts real Horovod ranks (horovodrun -np 2 or 3 over Gloo, 4 as "
        "2 machines x 2, "
        "or ranks in network namespaces); `make test-quick` leaves them out")
