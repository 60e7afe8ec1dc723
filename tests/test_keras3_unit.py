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


_SMALL_CHECKS = """
import gc, json, weakref
import tensorflow as tf
import horovod.tensorflow as hvd
import tf_mergecomp.keras as mck
from tf_mergecomp import MergeComp

result = {"root_rank": {}}
for bad in (True, False, -1, 1.0):
    try:
        mck.BroadcastGlobalVariablesCallback(bad)
    except ValueError as exc:
        result["root_rank"][repr(bad)] = str(exc)
result["root_rank_ok"] = mck.BroadcastGlobalVariablesCallback(1).root_rank
try:
    mck.save_rank_state("sgd", "ckpt")
except TypeError as exc:
    result["owner"] = str(exc)
hvd.init()
grads = [tf.ones([2]), tf.ones([3])]
try:
    mck.reduce_gradients(grads, iter([tf.Variable([0.0, 0.0])]))
except ValueError as exc:
    result["count"] = str(exc)
variables = iter([tf.Variable([0.0, 0.0]), tf.Variable([0.0, 0.0, 0.0])])
result["plain"] = [g.numpy().tolist() for g in mck.reduce_gradients(grads, variables)]
mc = MergeComp("fp16")
for _ in range(3):
    result["mergecomp"] = [g.numpy().tolist() for g in mck.reduce_gradients(grads, None, mc)]
result["traces"] = mc._eager_reduce.experimental_get_tracing_count()
dropped = weakref.ref(mc)
del mc
gc.collect()
result["collected"] = dropped() is None
print("RESULT " + json.dumps(result))
"""


def test_small_checks_reduce_gradients_and_rank_state_owner():
    # One Horovod rank (hvd.init() without horovodrun).
    done = _run(["-c", _SMALL_CHECKS])
    assert done.returncode == 0, done.stdout + done.stderr
    line = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    # root_rank: an int >= 0; True and False are refused though bool is an int.
    assert sorted(result["root_rank"]) == ["-1", "1.0", "False", "True"]
    assert result["root_rank"]["True"] == (
        "root_rank must be a rank (an int >= 0, not a bool), got True")
    assert result["root_rank_ok"] == 1
    assert result["owner"] == (
        "expected a MergeComp, or a Keras 3 optimizer or model compiled with "
        "tf_mergecomp.keras.DistributedOptimizer(..., compression=MergeComp(...)); got 'sgd'")
    # Variables given as an iterator are counted once.
    assert result["count"] == "reduce_gradients got 2 gradients and 1 variables"
    assert result["plain"] == result["mergecomp"] == [[1.0, 1.0], [1.0, 1.0, 1.0]]
    # A MergeComp's reduce function is not kept: traced once, collected once dropped.
    assert result["traces"] == 1
    assert result["collected"] is True
