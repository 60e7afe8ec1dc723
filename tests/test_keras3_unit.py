"""tf_mergecomp.keras's refusals, in one Keras 3 process (no horovodrun); and the backend check."""

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

from tests.horovodrun import REPO

try:
    KERAS_MAJOR = int(importlib.metadata.version("keras").split(".")[0])
except importlib.metadata.PackageNotFoundError:
    KERAS_MAJOR = 0
pytestmark = pytest.mark.skipif(KERAS_MAJOR < 3, reason="needs Keras 3 (TensorFlow >= 2.16)")


def _run(args, **extra_env):
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", **extra_env)
    env.pop("TF_USE_LEGACY_KERAS", None)
    return subprocess.run([sys.executable] + args, cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=240)


def test_bad_input_is_refused_at_construction():
    done = _run(["tests/workers/keras3_errors.py"])
    assert done.returncode == 0, done.stdout + done.stderr
    line = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    errors = result["errors"]
    assert errors["compression"].startswith("TypeError") and "MergeComp" in errors["compression"]
    assert errors["optimizer"].startswith("TypeError")
    assert "already" in errors["twice"]
    assert errors["lso_outside"] is None  # built; refused when compiled or applied
    assert "other way" in errors["wrap_lso_outside"]
    assert errors["jit"].startswith("ValueError") and "jit_compile=False" in errors["jit"]
    assert errors["jit_set_later"].startswith("ValueError") and "XLA" in errors["jit_set_later"]
    assert "not the one" in errors["callback_other_mergecomp"]
    assert result["auto_jit"] is False
    assert result["class_name"] == "SGD" and result["plain_untouched"]
    assert "jit_compile='auto' -> False" in done.stderr


def test_other_backends_are_refused():
    # Keras 3's numpy backend needs no other package; JAX and PyTorch go the same way.
    done = _run(["-c", "import tf_mergecomp.keras"], KERAS_BACKEND="numpy")
    assert done.returncode != 0
    assert "TensorFlow backend" in done.stderr and "'numpy'" in done.stderr
