"""Shared pieces of the multi-worker test scripts: a quiet, one-thread TF and small models."""

import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

from benchmarks.models import tape_train_step  # noqa: E402,F401 (the workers' step)


def small_classifier(seed=1):
    """A small MLP with identical initial weights on every rank."""
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([
        tf.keras.layers.Dense(16, activation="relu", input_shape=(8,)),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(4),
    ])


def classification_data(rank, n=256):
    """A learnable 4-class problem; each rank gets its own samples."""
    rng = np.random.RandomState(100 + rank)
    x = rng.randn(n, 8).astype("float32")
    w = np.random.RandomState(7).randn(8, 4).astype("float32")
    y = np.argmax(x @ w, axis=1)
    return x, y


def weights_checksum(model):
    """Of the trainable weights: these must agree across ranks (batch-norm
    statistics, computed from each rank's own data, need not)."""
    return float(sum(np.float64(w.numpy()).sum() * (i + 1)
                     for i, w in enumerate(model.trainable_variables)))


class _WarningRecorder(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def capture_warnings():
    """Records tf_mergecomp's warnings: ``capture_warnings().messages``."""
    recorder = _WarningRecorder()
    logging.getLogger("tf_mergecomp").addHandler(recorder)
    return recorder


