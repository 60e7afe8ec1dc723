"""The Keras 2 that models use here: ``tf.keras`` where it is Keras 2, else ``tf_keras``.

Horovod 0.28.1's Keras wrappers support Keras 2 only; from TensorFlow 2.16 ``tf.keras`` is
Keras 2 only with ``TF_USE_LEGACY_KERAS=1`` (docs/stack.md, "Keras"). The library, its
benchmarks and your scripts take their Keras classes from here
(``from tf_mergecomp.keras2 import keras``), so that they are the ones the
model uses; this module decides which that is without importing any other
Keras.
"""

import importlib.metadata
import importlib.util
import os
import re

# The values TensorFlow accepts for TF_USE_LEGACY_KERAS.
_TRUE_VALUES = ("true", "True", "1")


def legacy_keras_requested(environ=None):
    """Whether ``TF_USE_LEGACY_KERAS`` asks TensorFlow for tf_keras as ``tf.keras``."""
    environ = os.environ if environ is None else environ
    return environ.get("TF_USE_LEGACY_KERAS") in _TRUE_VALUES


def child_environ(environ=None, **extra):
    """An environment for a Python process this project starts: ``environ`` (default
    ``os.environ``) plus ``extra``, with ``TF_USE_LEGACY_KERAS=1`` where tf_keras is
    installed (TensorFlow >= 2.16), unless it is set already. Needs no TensorFlow."""
    environ = dict(os.environ if environ is None else environ, **extra)
    if importlib.util.find_spec("tf_keras") is not None:
        environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    return environ


def _tensorflow_version():
    import tensorflow as tf

    major, minor = re.match(r"(\d+)\.(\d+)", tf.__version__).groups()
    return int(major), int(minor)


def _major_version(distribution):
    try:
        return int(importlib.metadata.version(distribution).split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def keras_package_is_keras2():
    """Whether the ``keras`` package is installed and is Keras 2 (TensorFlow <= 2.15's)."""
    return _major_version("keras") == 2


def tf_keras_is_keras2():
    """Whether ``tf.keras`` is (or, when first used, will be) Keras 2; loads no Keras."""
    import tensorflow as tf

    # TensorFlow >= 2.16 records its choice once tf.keras has been used.
    decided = vars(tf.keras).get("_tfll_keras_version")
    if decided is not None:
        return decided != "keras_3"
    if legacy_keras_requested() or _tensorflow_version() < (2, 16):
        return True
    # TensorFlow >= 2.16 without the variable: tf.keras is the keras package.
    return keras_package_is_keras2()


def keras_module():
    """The Keras 2 module in use: ``tf.keras`` when it is Keras 2, else ``tf_keras``."""
    import tensorflow as tf

    if legacy_keras_requested() and importlib.util.find_spec("tf_keras") is None:
        raise ImportError(
            "TF_USE_LEGACY_KERAS is set, but tf_keras is not installed: "
            "pip install 'tf-keras~=%d.%d.0'" % _tensorflow_version()
        )
    if tf_keras_is_keras2():
        return tf.keras
    try:
        import tf_keras
    except ImportError as exc:
        raise ImportError(
            "TensorFlow %s's tf.keras is Keras 3, which Horovod does not support. Install "
            "Keras 2 (pip install 'tf-keras~=%d.%d.0') and set TF_USE_LEGACY_KERAS=1 before "
            "TensorFlow is imported (docs/stack.md)." % ((tf.__version__,) + _tensorflow_version())
        ) from exc
    return tf_keras


def fix_horovod_keras_backend():
    """Points Horovod's Keras wrappers at the backend of the Keras 2 in use.

    horovod.tensorflow.keras 0.28.1 (and its callbacks) take Keras backend functions
    (constant, get_value, set_value, ...) from the ``keras`` package, which from
    TensorFlow 2.16 is Keras 3 and lacks them (docs/stack.md, "Keras"). Where the
    keras package is Keras 2 this changes nothing.
    """
    if keras_package_is_keras2() or not tf_keras_is_keras2():
        return
    import horovod.tensorflow.keras as hvd_keras
    import horovod.tensorflow.keras.callbacks as hvd_callbacks

    backend = keras_module().backend
    for module in (hvd_keras, hvd_callbacks):
        if getattr(module, "K", None) is not None:
            module.K = backend


def __getattr__(name):
    # ``from tf_mergecomp.keras2 import keras`` resolves on first use only, so that
    # importing this module for the functions above loads no Keras.
    if name == "keras":
        return keras_module()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
