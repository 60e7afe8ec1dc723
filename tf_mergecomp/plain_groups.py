"""Groups sent plain instead of compressed, and their error-feedback state.

A layout is the partition's cuts plus a codec per group: the user's
compressor, or a plain codec (``none``: a float32 allreduce, exact; ``fp16``:
half the bytes). Plain codecs keep no error-feedback state, so the state of a
group's tensors (one variable per tensor, the memory's buffers then the
codec's own state; see tf_mergecomp/mergecomp.py) is handled here, by the
engine around the group, never inside a codec:

- a group that switches to plain sends, with its first plain step, what the
  compressor had not sent yet: the memory's ``pending`` buffer (the residual
  e; DGC's accumulation v plus its momentum term mu * u), added to the
  gradient; the memory's buffers are then zero. Every plain step does the
  same, so the flush needs no record of the previous layout, holds after a
  checkpoint restore, and costs one read and one write of the buffers;
- SIGNUM's momentum is an average of gradients already sent (as signs):
  nothing in it is pending, it is reset to zero like the others;
- a group that switches back to the compressor therefore starts from a zero
  memory. The codec's own state (PowerSGD's Q, a warm start, not gradient
  mass) is kept as it is;
- on a rank that holds a non-finite gradient in the group, the state stays
  exactly as it was and nothing pending is sent (as the compressed path does).

A ``none`` group (and the compressor ``none`` without memory) goes to Horovod's
grouped collectives as its own tensors (``goes_to_horovods_groups``): Horovod
copies them into its fusion buffer and back on its own thread, as it does for
plain Horovod, where a concatenated buffer would take two copies on the compute
stream (on two levels: tf_mergecomp/hierarchical.py's ``reduce_group_by_horovod``).
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
    """The state of one plain group's tensors around its collective.

    ``gradients_to_send()`` gives the gradients plus what the memory had not
    sent; ``clear_sent_state()`` (after the collective) zeroes the memory's
    buffers, leaving the codec's own state as it is. With no state it is a
    no-op.
    """

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
    """int32, one per reduced tensor of a group Horovod reduced. With ``check_finite``
    (``nonfinite="raise"``): 1 where the output is non-finite, as one that some rank held
    non-finite is (an inf or a NaN stays one through the average), identical on every rank
    as the outputs are. Without (``"propagate"``): all 0, checking nothing, as plain Horovod:
    a check reads every gradient once more (on one CPU thread it took back the whole gain of
    leaving the copies to Horovod); the outputs carry the non-finite values to the
    loss-scale optimizer. The outputs keep Horovod's values either way: not all NaN, as a
    codec's decode makes them."""
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
