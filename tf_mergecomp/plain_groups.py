"""Groups sent plain instead of compressed, and their error-feedback state.

A layout is the partition's cuts plus a codec per group: the user's compressor, or a
plain codec (``none``: a float32 allreduce, exact; ``fp16``: half the bytes). Plain codecs
keep no state, so the engine handles the state of a plain group's tensors around it,
never inside a codec (``StateFlush``; docs/search.md, "Per-group codecs and plain
Horovod"):

- every plain step sends, added to the gradient, what the compressor had not sent (the
  memory's ``pending``: the residual e; DGC's accumulation v plus its momentum term
  mu * u), then zeroes the memory's buffers: the flush needs no record of the previous
  layout and holds after a restore, and a group that switches back to the compressor
  starts from a zero memory;
- SIGNUM's momentum (an average of gradients already sent) holds nothing pending and is
  zeroed too; the codec's own state (PowerSGD's Q, a warm start) is kept;
- on a rank that holds a non-finite gradient in the group, the state stays as it was
  and nothing pending is sent.

A ``none`` group (and the compressor ``none`` without memory) goes to Horovod's grouped
collectives as its own tensors (``goes_to_horovods_groups``; why: docs/design.md, "One
group, three ops"; on two levels: hierarchical.py's ``reduce_group_by_horovod``).
"""

import numbers

from tf_mergecomp import memory as memories

PLAIN_CODECS = ("none", "fp16")
HOROVOD_GROUPED_CODEC = "none"  # see goes_to_horovods_groups
NO_MEMORY = memories.get("none")


def check_group_codecs_spec(spec, choices):
    """Validates a ``group_codecs`` argument: None, or a sequence of codec names
    each in ``choices`` (the compressor's name first). Returns a tuple or None."""
    if spec is None:
        return None
    if isinstance(spec, (str, bytes)) or not hasattr(spec, "__iter__"):
        raise ValueError("group_codecs must be a list of codec names, one per group, got %r"
                         % (spec,))
    spec = tuple(spec)
    for name in spec:
        if name not in choices:
            hint = ""
            if name in PLAIN_CODECS and not any(c in PLAIN_CODECS for c in choices):
                hint = " (plain groups are off: MergeComp(..., plain_groups=False))"
            raise ValueError("group codec %r is not one of %s%s"
                             % (name, ", ".join(choices), hint))
    if not spec:
        raise ValueError("group_codecs is empty: give one codec name per group")
    return spec


def resolve_group_codecs(spec, groups, choices):
    """One codec name per group: ``spec`` checked against the number of groups,
    or the compressor (``choices[0]``) everywhere when ``spec`` is None."""
    if not isinstance(groups, numbers.Integral) or groups < 1:
        raise ValueError("groups must be a positive integer, got %r" % (groups,))
    if spec is None:
        return (choices[0],) * int(groups)
    if len(spec) != groups:
        raise ValueError("group_codecs names %d codecs for %d groups: %r"
                         % (len(spec), groups, list(spec)))
    return tuple(spec)


class StateFlush:
    """The state flush of one plain group (module docstring): ``gradients_to_send()``
    before its collective, ``clear_sent_state()`` after it; a no-op with no state."""

    def __init__(self, memory, state_vars, grads):
        import tensorflow as tf

        self._tf = tf
        self.memory = memory
        self.grads = list(grads)
        self.state_vars = list(state_vars)
        self._buffers = len(memory.state_names)
        self._reads = []
        if self._buffers and self.state_vars:
            # What this rank holds non-finite keeps its state and sends nothing extra.
            self._keep = tf.reduce_any(tf.stack(
                [tf.logical_not(tf.reduce_all(tf.math.is_finite(g))) for g in self.grads]))
            self._reads = [v.read_value() for v in self.state_vars]

    def gradients_to_send(self):
        tf = self._tf
        if not self._reads:
            return self.grads
        sent = []
        for grad, value in zip(self.grads, self._reads):
            n = grad.shape.num_elements()
            state = {name: value[b * n:(b + 1) * n]
                     for b, name in enumerate(self.memory.state_names)}
            pending = self.memory.pending(state)
            if pending is None:
                sent.append(grad)
                continue
            pending = tf.where(self._keep, tf.zeros_like(pending), pending)
            sent.append(grad + tf.cast(tf.reshape(pending, tf.shape(grad)), grad.dtype))
        return sent

    def clear_sent_state(self):
        """The assignments that zero the memory's buffers (a list of ops)."""
        tf = self._tf
        updates = []
        for grad, value, variable in zip(self.grads, self._reads, self.state_vars):
            memory_size = self._buffers * grad.shape.num_elements()
            old = value[:memory_size]
            cleared = tf.where(self._keep, old, tf.zeros_like(old))
            updates.append(variable.assign(tf.concat([cleared, value[memory_size:]], 0)))
        return updates


def goes_to_horovods_groups(codec_name, grads):
    """Whether a group of ``codec_name`` goes to Horovod's grouped collectives (module
    docstring): ``none``, over tensors of one dtype (a grouped collective takes one)."""
    return codec_name == HOROVOD_GROUPED_CODEC and len({g.dtype for g in grads}) == 1


def reduce_by_horovod(grads, communicator, key, check_finite):
    """(the ranks' average of ``grads`` by one grouped allreduce, ``nonfinite_flags``)."""
    outputs = communicator.grouped_allreduce_mean(grads, key)
    return outputs, nonfinite_flags(outputs, check_finite)


def nonfinite_flags(outputs, check_finite):
    """int32, one per reduced tensor of a group Horovod reduced, identical on every rank.
    With ``check_finite`` (``nonfinite="raise"``): 1 where the output is non-finite, as
    one that some rank held non-finite is. Without (``"propagate"``): all 0, checking
    nothing, as plain Horovod (a check reads every gradient once more); the non-finite
    values reach the loss-scale optimizer. The outputs keep Horovod's values either way,
    not all NaN as a codec's decode makes them."""
    import tensorflow as tf

    if not check_finite:
        return tf.zeros([len(outputs)], tf.int32)
    # Two ops per tensor (IsFinite, All), the reduced axes shared by tensors of one rank.
    axes, finite = {}, []
    for output in outputs:
        rank = output.shape.rank
        if rank not in axes:
            axes[rank] = tf.constant(list(range(rank)), tf.int32)
        finite.append(tf.raw_ops.All(input=tf.math.is_finite(output), axis=axes[rank]))
    return tf.cast(tf.logical_not(tf.stack(finite)), tf.int32)
