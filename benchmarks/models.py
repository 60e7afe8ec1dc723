"""The cluster benchmark's workloads, on synthetic data.

- resnet50, vgg16: ``keras.applications`` at 32x32x3, weights None, 10 classes
  (214 and 32 gradient tensors, 94 and 135 MB of fp32 gradients).
- transformer: a 4-layer encoder (width 64, 4 heads, feed-forward 128,
  sequence 32) over token ids, mean-pooled into 10 classes: 67 small gradient
  tensors (0.3 M parameters), the case where layer-wise compression pays a
  fixed cost per tensor many times. Throughput counts sequences as images.
- mlp: 32x32x3 images flattened through three 2048-wide ReLU layers: 8
  gradient tensors, 59 MB of fp32 gradients, 14.7 M parameters whose step is
  little more than reading them (0.2 s on one core here). The case where the
  gradients' bytes, not the compute or the tensor count, set the step: on a
  2-core host it is what ResNet50 is on one of faster convolutions. Not in the
  benchmarks' default set.
"""

import numpy as np
import tensorflow as tf

from tf_mergecomp.keras2 import keras

MODELS = ("resnet50", "vgg16", "transformer", "mlp")
DEFAULT_MODELS = ("resnet50", "vgg16", "transformer")
NUM_CLASSES = 10
IMAGE_SHAPE = (32, 32, 3)
MLP_WIDTH = 2048
MLP_LAYERS = 3
SEQUENCE_LENGTH = 32
VOCABULARY = 2000


def check_model(name):
    if name not in MODELS:
        raise ValueError("unknown model %r; valid choices: %s" % (name, ", ".join(MODELS)))
    return name


def check_profile_model(name):
    """A model the profile can record: one of MODELS, ``package.module:function``
    (a function of no arguments returning a built Keras model with one input and
    class logits as output) or a ``keras.applications`` model's name."""
    if name in MODELS:
        return name
    if ":" in name:
        module, _, function = name.partition(":")
        if module and function.isidentifier():
            return name
    elif name in _applications():
        return name
    raise ValueError("unknown model %r; valid choices: %s, a keras.applications model "
                     "(e.g. MobileNetV2, DenseNet121) or package.module:function"
                     % (name, ", ".join(MODELS)))


def _applications():
    return sorted(n for n in dir(keras.applications)
                  if n[:1].isupper() and callable(getattr(keras.applications, n)))


def _custom_model(name):
    if ":" in name:
        import importlib

        module, _, function = name.partition(":")
        model = getattr(importlib.import_module(module), function)()
    else:
        import inspect

        build = getattr(keras.applications, name)
        options = dict(weights=None, input_shape=IMAGE_SHAPE, classes=NUM_CLASSES)
        if "classifier_activation" in inspect.signature(build).parameters:
            options["classifier_activation"] = None  # logits, as the built-in models give
        model = build(**options)
    if not isinstance(model, keras.Model):
        raise ValueError("%s returned %r, not a Keras model" % (name, type(model).__name__))
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ValueError("%s: the profile needs a model with one input and one output "
                         "(class scores), got %d and %d" % (name, len(model.inputs),
                                                           len(model.outputs)))
    return model


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


def _mlp(width=MLP_WIDTH, layers=MLP_LAYERS):
    images = keras.Input(IMAGE_SHAPE)
    x = keras.layers.Flatten()(images)
    for _ in range(layers):
        x = keras.layers.Dense(width, activation="relu")(x)
    return keras.Model(images, keras.layers.Dense(NUM_CLASSES)(x), name="mlp")


def build_model(name):
    if name not in MODELS:
        return _custom_model(check_profile_model(name))
    if name == "resnet50":
        return keras.applications.ResNet50(
            weights=None, input_shape=IMAGE_SHAPE, classes=NUM_CLASSES, classifier_activation=None
        )
    if name == "vgg16":
        return keras.applications.VGG16(
            weights=None, input_shape=IMAGE_SHAPE, classes=NUM_CLASSES, classifier_activation=None
        )
    if name == "mlp":
        return _mlp()
    return _transformer()


def synthetic_dataset(name, batch_size, seed=0, model=None):
    """One fixed random batch repeated forever (input pipeline cost ~0). A model
    outside MODELS gets a batch of its (built) ``model``'s input shape and dtype
    (integer inputs: ids 0 and 1) and labels for its output's last dimension."""
    rng = np.random.default_rng(seed)
    if name not in MODELS:
        if model is None:
            raise ValueError("synthetic data for %r needs its built model" % name)
        shape = (batch_size,) + tuple(int(d) for d in model.inputs[0].shape[1:])
        dtype = model.inputs[0].dtype
        if dtype.is_integer:
            features = rng.integers(0, 2, size=shape).astype(dtype.as_numpy_dtype)
        else:
            features = rng.standard_normal(shape).astype(dtype.as_numpy_dtype)
        classes = int(model.outputs[0].shape[-1])
        labels = rng.integers(0, classes, size=(batch_size,), dtype=np.int32)
        return tf.data.Dataset.from_tensors((features, labels)).repeat()
    if name == "transformer":
        features = rng.integers(0, VOCABULARY, size=(batch_size, SEQUENCE_LENGTH), dtype=np.int32)
    else:
        features = rng.standard_normal((batch_size,) + IMAGE_SHAPE).astype(np.float32)
    labels = rng.integers(0, NUM_CLASSES, size=(batch_size,), dtype=np.int32)
    return tf.data.Dataset.from_tensors((features, labels)).repeat()


def tape_train_step(model, optimizer, loss_fn, compression):
    """One training step through Horovod's DistributedGradientTape with ``compression``
    (not traced: wrap it in tf.function, or in a search driver's ``function``)."""
    import horovod.tensorflow as hvd

    def train_step(features, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return train_step
