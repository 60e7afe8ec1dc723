"""Where a benchmark writes: checked before it starts work, so that a path it cannot
write fails in a second, naming the path, not after minutes of measuring. No TensorFlow."""

import os
import tempfile


def _writable_folder(folder, out):
    """Creates ``folder`` if missing and writes a file there (and removes it); raises
    ValueError naming ``out`` (the --out given) when that fails."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError("cannot write --out %s: %s is a file, not a folder" % (out, folder))
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise ValueError("cannot write --out %s: %s" % (out, error.strerror or error)) from None


def check_folder(path):
    """``path`` as a folder to write files into (created if missing). Returns ``path``;
    raises ValueError naming it."""
    _writable_folder(path, path)
    return path


def check_file(path, default_name):
    """``path`` as a file to write: a folder (an existing one, or a path ending in a
    separator) stands for ``default_name`` inside it. Returns the file's path; raises
    ValueError naming it."""
    if os.path.isdir(path) or path.endswith((os.sep, "/")):
        path = os.path.join(path, default_name)
    _writable_folder(os.path.dirname(path) or ".", path)
    if os.path.isdir(path) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError("cannot write --out %s: %s" % (
            path, "a folder is there" if os.path.isdir(path) else "not writable"))
    return path
