"""Loads the custom-op library once, lazily, and checks it matches TensorFlow.

Every codec calls ``load()`` to reach its ops (``load().qsgd_encode(...)``).
The library is built by ``setup.py`` (``make build``) against one TensorFlow
version; one built against another version would fail with an obscure
undefined-symbol error, so that case is detected and explained instead.
"""

import glob
import json
import os
import threading

import tensorflow as tf

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_BUILD_INFO = os.path.join(_PACKAGE_DIR, "_mergecomp_ops_build.json")
_REBUILD_HINT = (
    "Rebuild it with `make build` in the repository root "
    "(or `pip install --no-build-isolation -e .` in the environment that runs TensorFlow)."
)

_lock = threading.Lock()
_library = None


class OpLibraryError(ImportError):
    """The custom-op library is missing, stale, or cannot be loaded."""


def library_path():
    candidates = sorted(glob.glob(os.path.join(_PACKAGE_DIR, "_mergecomp_ops*.so")))
    if not candidates:
        raise OpLibraryError(
            "tf_mergecomp's op library (_mergecomp_ops*.so) was not found in %s. %s"
            % (_PACKAGE_DIR, _REBUILD_HINT)
        )
    return candidates[0]


def build_info():
    """What the library was built against: {'tensorflow_version': ..., 'cuda': bool}."""
    try:
        with open(_BUILD_INFO) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def load():
    """Returns the loaded op module (one Python function per op)."""
    global _library
    if _library is not None:
        return _library
    with _lock:
        if _library is None:
            path = library_path()
            built_for = build_info().get("tensorflow_version")
            if built_for is not None and built_for != tf.__version__:
                raise OpLibraryError(
                    "tf_mergecomp's op library was built against TensorFlow %s, "
                    "but TensorFlow %s is running. %s" % (built_for, tf.__version__, _REBUILD_HINT)
                )
            try:
                _library = tf.load_op_library(path)
            except (tf.errors.NotFoundError, OSError) as exc:
                raise OpLibraryError(
                    "tf_mergecomp's op library %s could not be loaded (%s). %s"
                    % (path, exc, _REBUILD_HINT)
                ) from exc
    return _library
