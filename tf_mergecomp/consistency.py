"""Checks that every rank is about to run the same collectives.

Ranks that disagree on the gradient list, the codec or the partition would
issue different collectives and hang. Each time the engine traces its reduce
function it allgathers a small JSON description of what it will do, and every
rank compares all descriptions: a mismatch raises ``RankMismatchError`` naming
the field and both values, on every rank, before any gradient collective.

The check runs eagerly at trace time (lifted out of the function being traced
with ``tf.init_scope``), so it costs nothing per step; the engine runs it once
per distinct description (mergecomp.py), so that a rank re-tracing alone runs
no collective. Under TF1-style graph execution it falls back to comparing a
hash inside the graph.
"""

import hashlib
import json

import numpy as np
import tensorflow as tf


class RankMismatchError(ValueError):
    """Ranks disagree on what to communicate."""

    # With Exception's own __init__, autograph re-raises this error from a
    # traced function as itself (with the source location added) instead of
    # wrapping it in a StagingError, so ``except RankMismatchError`` works.
    __init__ = Exception.__init__


def fingerprint(description):
    """A short stable hash of a JSON-able description."""
    text = json.dumps(description, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def first_difference(reference, other):
    """(field, reference value, other value) of the first field that differs, else None."""
    for field in sorted(set(reference) | set(other)):
        if reference.get(field) != other.get(field):
            return field, reference.get(field), other.get(field)
    return None


def _abbreviate(value, limit=400):
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "...(%d chars)" % len(text)


def mismatch_message(descriptions):
    """None when all descriptions agree, else a message naming who differs in what."""
    for rank, description in enumerate(descriptions[1:], start=1):
        difference = first_difference(descriptions[0], description)
        if difference is not None:
            field, ours, theirs = difference
            return (
                "tf_mergecomp: ranks disagree on %r: rank 0 has %s, rank %d has %s. Every rank "
                "must build the same model (same trainable variables, shapes and dtypes, in the "
                "same order) and the same MergeComp settings."
                % (field, _abbreviate(ours), rank, _abbreviate(theirs))
            )
    return None


def check_ranks_agree(description, process_set, name="mergecomp.consistency"):
    """Raises RankMismatchError on every rank if any rank's description differs.

    Returns a list of ops to depend on in graph mode (empty when checked eagerly).
    """
    import horovod.tensorflow as hvd

    payload = np.frombuffer(json.dumps(description, sort_keys=True).encode(), dtype=np.uint8)
    with tf.init_scope():
        if tf.executing_eagerly():
            lengths = hvd.allgather(
                tf.constant([payload.size], tf.int32), name=name + ".lengths", process_set=process_set
            ).numpy()
            gathered = hvd.allgather(
                tf.constant(payload), name=name + ".payload", process_set=process_set
            ).numpy()
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            descriptions = [
                json.loads(gathered[offsets[i]:offsets[i + 1]].tobytes().decode())
                for i in range(len(lengths))
            ]
            message = mismatch_message(descriptions)
            if message is not None:
                raise RankMismatchError(message)
            return []
    digest = int(fingerprint(description), 16) & ((1 << 62) - 1)
    ours = tf.constant([digest], tf.int64)
    everyone = hvd.allgather(ours, name=name + ".digest", process_set=process_set)
    return [
        tf.debugging.assert_equal(
            everyone,
            tf.broadcast_to(ours, tf.shape(everyone)),
            message="tf_mergecomp: ranks disagree on the gradient list or MergeComp settings "
            "(fingerprints of all ranks shown)",
        )
    ]
