"""The memory interface, and the memory that keeps nothing."""


class Memory:
    """Subclasses name their state buffers and implement the two hooks."""

    name = None
    state_names = ()
    # False when update() ignores ``sent``, so the engine can skip decoding
    # this worker's own payload.
    needs_sent = False

    @property
    def params(self):
        return {}

    def op_attrs(self):
        """MergecompGroupEncode's decay and gradient_scale for this memory (its
        ``memory`` attribute is ``name``)."""
        return {}

    def compensate(self, grad, state):
        """Returns (the buffer to compress, the state after compensation)."""
        return grad, state

    def update(self, compensated, sent, state):
        """Returns the state after this worker sent ``sent``."""
        return state

    def pending(self, state):
        """What the state holds that was never sent (a flat buffer of the
        group's length), sent with a group's first plain step
        (tf_mergecomp/plain_groups.py); None when nothing is pending."""
        del state
        return None

    def __repr__(self):
        args = ", ".join("%s=%r" % kv for kv in sorted(self.params.items()))
        return "%s(%s)" % (type(self).__name__, args)


class NoMemory(Memory):
    """Compensate returns the gradient; nothing is kept."""

    name = "none"
