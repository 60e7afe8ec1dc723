"""What a step does with a gradient tensor that holds an inf or a NaN.

Each group's decode op returns one flag per tensor, 1 when some rank held it
non-finite (its output is then all NaN on every rank, and the group's state is
left as it was; ``none`` groups flag only with ``"raise"``: plain_groups.py).
Every rank has the same flags, so each rank decides alike:

- the step counter advances only on a step without any flag, so every rank
  keeps drawing what it would have drawn without that step;
- ``"propagate"``: nothing more (a loss-scale optimizer sees the NaNs and
  skips the step everywhere);
- ``"raise"``: every rank raises ``InvalidArgumentError`` naming the tensors,
  once the step's collectives are done (so no rank waits for another).
"""

import tensorflow as tf

CHOICES = ("propagate", "raise")


def check_choice(nonfinite):
    if nonfinite not in CHOICES:
        raise ValueError("nonfinite must be one of %s, got %r" % (", ".join(CHOICES), nonfinite))
    return nonfinite


def join_flags(group_flags):
    """The groups' flags as one int64 vector, in tensor order. int64, which
    TensorFlow's GPU kernels keep on the device (its int32 tensors live in
    host memory): gathered and reduced where the group ops ran, so one int64
    per step reaches the host step counter."""
    flags = [tf.cast(f, tf.int64) for f in group_flags]
    return tf.concat(flags, 0) if len(flags) > 1 else flags[0]


def step_increment(flags):
    """1 for a step without a non-finite gradient on any rank, else 0."""
    return 1 - tf.cast(tf.reduce_max(flags) > 0, tf.int64)


def raise_if_flagged(reduced, flags, names):
    """The reduced gradients, made to wait for a check that fails on every rank
    alike once all collectives are done, naming the flagged tensors."""
    labels = tf.constant(names)
    check = tf.debugging.Assert(
        tf.reduce_all(flags == 0),
        ["tf_mergecomp: non-finite gradient (inf or NaN) on some rank for:",
         tf.boolean_mask(labels, flags > 0)],
        summarize=len(names))
    with tf.control_dependencies([check]):
        return [tf.identity(r) for r in reduced]
