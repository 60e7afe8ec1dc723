"""The custom-op library: loaded once, lazily, the one built for the running TensorFlow.

Every codec reaches its ops through ``load()`` (``load().mergecomp_group_encode(...)``).
``setup.py`` builds one library per TensorFlow version, named for it (docs/stack.md, "The op
library"). A library for another version would fail with an obscure undefined-symbol error:
``OpLibraryError`` names what was found instead.
"""

import glob
import importlib.machinery
import json
import os
import re
import threading

import tensorflow as tf

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_REBUILD_HINT = (
    "Rebuild it with `make build` in the repository root "
    "(or `pip install --no-build-isolation -e .` in the environment that runs TensorFlow)."
)

_lock = threading.Lock()
_library = None


class OpLibraryError(ImportError):
    """The custom-op library is missing, stale, or cannot be loaded."""


def library_stem(tf_version=None):
    """The library's file name without its suffix for a TensorFlow version (the running one by
    default): ``_mergecomp_ops_tf2_15_1``. setup.py names the library and its build json so."""
    return "_mergecomp_ops_tf" + re.sub(r"[^0-9A-Za-z]", "_", tf_version or tf.__version__)


def library_path():
    stem = library_stem()
    candidates = sorted(glob.glob(os.path.join(_PACKAGE_DIR, stem + ".*so")))
    if not candidates:
        found = sorted(os.path.basename(p) for p in glob.glob(os.path.join(_PACKAGE_DIR, "_mergecomp_ops*.so")))
        raise OpLibraryError(
            "tf_mergecomp's op library for TensorFlow %s (%s*.so) was not found in %s (found: %s). %s"
            % (tf.__version__, stem, _PACKAGE_DIR, ", ".join(found) or "none", _REBUILD_HINT)
        )
    # Builds for several Pythons may sit side by side: this interpreter's is preferred.
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        own = os.path.join(_PACKAGE_DIR, stem + suffix)
        if own in candidates:
            return own
    return candidates[0]


def build_info():
    """What the library was built against: {'tensorflow_version': ..., 'cuda': bool}."""
    try:
        with open(os.path.join(_PACKAGE_DIR, library_stem() + ".json")) as f:
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
                    "tf_mergecomp's op library %s was built against TensorFlow %s, "
                    "but TensorFlow %s is running. %s" % (path, built_for, tf.__version__, _REBUILD_HINT)
                )
            try:
                _library = tf.load_op_library(path)
            except (tf.errors.NotFoundError, OSError) as exc:
                raise OpLibraryError(
                    "tf_mergecomp's op library %s could not be loaded (%s). %s"
                    % (path, exc, _REBUILD_HINT)
                ) from exc
    return _library
