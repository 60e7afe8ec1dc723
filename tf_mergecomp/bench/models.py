"""The cluster benchmark's workloads, on synthetic data.

- resnet50, vgg16: ``keras.applications`` at 32x32x3, weights None, 10 classes
  (214 and 32 gradient tensors, 94 and 135 MB of fp32 gradients).
- transformer: a 4-layer encoder (width 64, 4 heads, feed-forward 128,
  sequence 32) over token ids, mean-pooled into 10 classes: 67 small gradient
  tensors (0.3 M parameters), the case where layer-wise compression pays a
  fixed cost per tensor many times. Throughput counts sequences as images.
"""

import numpy as np
import tensorflow as tf

from tf_mergecomp._keras import keras

MODELS = ("resnet50", "vgg16", "transformer")
NUM_CLASSES = 10
IMAGE_SHAPE = (32, 32, 3)
SEQUENCE_LENGTH = 32
VOCABULARY = 2000


def check_model(name):
    if name not in MODELS:
        raise ValueError("unknown model %r; valid choices: %s" % (name, ", ".join(MODELS)))
    return name


def _transformer(layers=4, width=64, heads=4, hidden_width=128):
    tokens = keras.Input((SEQUENCE_LENGTH,), dtype=tf.int32)
    x = keras.layers.Embedding(VOCABULARY, width)(tokens)
    positions = keras.layers.Embedding(SEQUENCE_LENGTH, width)(tf.range(SEQUENCE_LENGTH))
    x = x + positions
    for _ in range(layers):
        attended = keras.layers.MultiHeadAttention(heads, width // heads)(x, x)
        x = keras.layers.LayerNormalization()(x + attended)
        hidden = keras.layers.Dense(hidden_width, activation="relu")(x)
        x = keras.layers.LayerNormalization()(x + keras.layers.Dense(width)(hidden))
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, keras.layers.Dense(NUM_CLASSES)(x), name="transformer")


def build_model(name):
    check_model(name)
    if name == "resnet50":
        return keras.applications.ResNet50(
            weights=None, input_shape=IMAGE_SHAPE, classes=NUM_CLASSES, classifier_activation=None
        )
    if name == "vgg16":
        return keras.applications.VGG16(
            weights=None, input_shape=IMAGE_SHAPE, classes=NUM_CLASSES, classifier_activation=None
        )
    return _transformer()


def synthetic_dataset(name, batch_size, seed=0):
    """One fixed random batch repeated forever (input pipeline cost ~0)."""
    check_model(name)
    rng = np.random.default_rng(seed)
    if name == "transformer":
        features = rng.integers(0, VOCABULARY, size=(batch_size, SEQUENCE_LENGTH), dtype=np.int32)
    else:
        features = rng.standard_normal((batch_size,) + IMAGE_SHAPE).astype(np.float32)
    labels = rng.integers(0, NUM_CLASSES, size=(batch_size,), dtype=np.int32)
    return tf.data.Dataset.from_tensors((features, labels)).repeat()
