"""Shared pieces of the Keras 3 workers: a quiet one-thread TensorFlow, Keras 3 asserted."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

if int(keras.__version__.split(".")[0]) < 3 or tf.keras.__name__.startswith("tf_keras"):
    raise SystemExit("these workers need Keras 3 as tf.keras (TF_USE_LEGACY_KERAS unset); "
                     "got keras %s, tf.keras %s" % (keras.__version__, tf.keras.__name__))


def small_classifier(seed=1, width=16, dtype=None):
    """A small MLP with identical initial weights on every rank."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(width, activation="relu", dtype=dtype),
        keras.layers.Dense(width, activation="relu", dtype=dtype),
        keras.layers.Dense(4, dtype=dtype),
    ])


def classification_data(rank, n=256):
    """A learnable 4-class problem; each rank gets its own samples."""
    rng = np.random.RandomState(100 + rank)
    x = rng.randn(n, 8).astype("float32")
    w = np.random.RandomState(7).randn(8, 4).astype("float32")
    return x, np.argmax(x @ w, axis=1)


def weights_checksum(model):
    return float(sum(np.float64(np.asarray(w)).sum() * (i + 1)
                     for i, w in enumerate(model.trainable_variables)))


def loss_fn():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
