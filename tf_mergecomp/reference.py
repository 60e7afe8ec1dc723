"""The plain-TensorFlow reference of every codec: the tests' oracle, and the route
for a codec or a memory of your own.

It runs a group as the fused group ops do (fused_groups.py), one step at a time:

    flat = concat(group's gradients)          (a non-finite tensor zeroed)
    compensated, state = memory.compensate(flat, state)
    averaged, sent = codec.reduce(compensated, seed, communicator)
    state = memory.update(compensated, sent, state)   (kept if a tensor was non-finite)
    outputs = split(averaged)                 (a non-finite tensor's output all NaN)

The tests hold the fused ops to it: bit for bit for the dense codecs, the same
selection for the sparse ones. ``plain(codec)`` gives a built-in codec that runs this
path (same parameters, same seeds); PowerSGD, which reduces its groups itself, then runs
its own plain-TF path. A codec of your own (a ``Compressor`` subclass without a
``group_codec``) always runs here, one payload and one collective per group; a memory of
your own needs ``plain(codec)`` or a codec of your own (docs/design.md, "A codec of your
own").
"""

import copy

import tensorflow as tf

from tf_mergecomp import grouping

PLAIN_BACKEND = "reference"


def plain(codec):
    """A copy of ``codec`` (a built-in ``Compressor``) that runs the plain-TF path."""
    copied = copy.copy(codec)
    copied.backend = PLAIN_BACKEND
    return copied


def runs_fused_ops(codec):
    """Whether the engine reduces ``codec``'s groups through the fused group ops."""
    return codec.group_codec is not None and codec.backend != PLAIN_BACKEND


def reduce_group(codec, memory, grads, state_vars, seed, communicator, key):
    """One group in plain TF: the reduced gradients and an int32 vector, 1 for
    each tensor that some rank held non-finite (its output is then all NaN),
    with the fused ops' handling of non-finite tensors (the group's state is
    kept as it was on the rank that held one)."""
    sizes = [g.shape.num_elements() for g in grads]
    local_nonfinite, flat = _finite_flat(grads)
    old_state = {
        name: grouping.flatten([v[b * n:(b + 1) * n] for v, n in zip(state_vars, sizes)])
        for b, name in enumerate(memory.state_names)
    }
    compensated, state = memory.compensate(flat, old_state)
    averaged, sent, marked = codec.reduce(compensated, seed, communicator, key,
                                          sizes=sizes, nonfinite=local_nonfinite)
    if memory.needs_sent:
        state = memory.update(compensated, sent(), state)
    if state:
        keep = tf.reduce_any(local_nonfinite)
        state = {name: tf.where(keep, old_state[name], state[name]) for name in state}
        per_name = [tf.split(state[name], sizes) if len(sizes) > 1 else [state[name]]
                    for name in memory.state_names]
        for variable, buffers in zip(state_vars, zip(*per_name)):
            variable.assign(tf.concat(buffers, 0) if len(buffers) > 1 else buffers[0])
    return _marked_outputs(averaged, marked, grads)


def encode_group(codec, grads, seed):
    """This rank's payload of a group with no memory, as ``reduce_group`` sends it (its
    non-finite markers after it), and its context: the first half of ``reduce_group``
    for a collective run elsewhere (a two-level vote, tf_mergecomp/hierarchical.py)."""
    local_nonfinite, flat = _finite_flat(grads)
    payload, ctx = codec.compress_group(flat, seed, [g.shape.num_elements() for g in grads])
    return codec.marked_wire(payload, local_nonfinite), ctx


def decode_group(codec, collected, ctx, num_rows, grads):
    """The second half: ``num_rows`` rows of ``encode_group`` to (outputs shaped as
    ``grads``, the tensors some rank marked)."""
    averaged, marked = codec.combine_marked(collected, ctx, num_rows, len(grads))
    return _marked_outputs(averaged, marked, grads)


def _finite_flat(grads):
    """(which tensors are non-finite here, the group flattened with those zeroed)."""
    local_nonfinite = tf.stack([tf.logical_not(tf.reduce_all(tf.math.is_finite(g)))
                                for g in grads])
    return local_nonfinite, grouping.flatten(
        [tf.where(local_nonfinite[i], tf.zeros_like(g), g) for i, g in enumerate(grads)])


def _marked_outputs(averaged, marked, grads):
    outputs = grouping.unflatten(averaged, [g.shape for g in grads], [g.dtype for g in grads])
    outputs = [tf.where(marked[i], tf.fill(tf.shape(o), tf.constant(float("nan"), o.dtype)), o)
               for i, o in enumerate(outputs)]
    return outputs, tf.cast(marked, tf.int32)
