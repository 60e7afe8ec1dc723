"""The codec interface every algorithm implements.

A compressor turns one group's flat float32 buffer into a single wire payload
(one 1-D tensor, so one collective per group), and turns what the collective
returns back into the averaged gradient:

    payload, ctx = compressor.compress(flat, seed)
    collected = allreduce_mean(payload)      if compressor.collective == "allreduce"
              = allgather(payload)           if compressor.collective == "allgather"
    averaged = compressor.combine(collected, ctx, world_size)
    sent = compressor.decompress(payload, ctx)   # this worker's own contribution,
                                                 # used by error feedback

``reduce()`` runs exactly that; algorithms needing more than one collective
(PowerSGD) override it. That is the plain-TF path; the engine runs a codec
with a ``group_codec`` through the fused group ops instead
(``custom_ops/cc/kernels/group_op.h``), which take the group's tensors as a
list and give the same bytes.
"""

import tensorflow as tf

BACKENDS = ("op", "reference")
# Tensor i of a group draws its random numbers with the group's seed plus
# (i << TENSOR_SEED_SHIFT) (kTensorSeedShift in custom_ops/cc/kernels/group_op.h).
TENSOR_SEED_SHIFT = 12
ALLREDUCE = "allreduce"
ALLGATHER = "allgather"


def check_backend(backend):
    if backend not in BACKENDS:
        raise ValueError("backend must be one of %s, got %r" % (", ".join(BACKENDS), backend))
    return backend


def check_ratio(ratio):
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 < ratio <= 1.0:
        raise ValueError("ratio must be a number in (0, 1], got %r" % (ratio,))
    return float(ratio)


def check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("%s must be an integer >= 1, got %r" % (name, value))
    return value


class Compressor:
    """Base class: subclasses set the class attributes and the three codec methods.

    Attributes:
      name: registry name.
      collective: ALLREDUCE when payloads can be summed elementwise, else ALLGATHER.
      default_memory: name of the error-feedback memory used when the user gives none.
      shared_seed: True when every worker must draw the same random numbers
        (the engine then passes the same seed on all ranks); otherwise the
        engine mixes the rank into the seed so workers draw independently.
      group_codec: the name of the fused group codec implementing this
        algorithm in MergecompGroupEncode/Decode, or None.
      payload_dtype: the dtype of the fused ops' payload.
    """

    name = None
    collective = ALLGATHER
    default_memory = "none"
    shared_seed = False
    group_codec = None
    payload_dtype = tf.uint8

    def __init__(self, backend="op"):
        self.backend = check_backend(backend)

    @property
    def params(self):
        """The constructor parameters, for fingerprints and saved search results."""
        return {}

    def default_memory_params(self):
        """Parameters for ``default_memory`` (e.g. SIGNUM's beta)."""
        return {}

    def group_op_attrs(self, sizes):
        """The codec attributes of the fused group ops for tensors of these sizes."""
        del sizes
        return {}

    def compress(self, flat, seed):
        """flat: 1-D float32; seed: int64 scalar. Returns (payload, ctx)."""
        raise NotImplementedError

    def decompress(self, payload, ctx):
        """This worker's payload alone, decoded to a 1-D float32 of ctx's length."""
        raise NotImplementedError

    def combine(self, collected, ctx, world_size):
        """The collective's result to the combined (averaged) 1-D float32 gradient."""
        raise NotImplementedError

    def payload_nbytes(self, n):
        """Exact bytes this worker puts on the wire for an n-element buffer."""
        raise NotImplementedError

    def compress_group(self, flat, seed, sizes):
        """compress() of a group of tensors of these sizes, concatenated in
        ``flat``; only codecs that treat tensors separately (randomk) look at them."""
        del sizes
        return self.compress(flat, seed)

    def reduce(self, flat, seed, communicator, group, sizes=None):
        """Runs compress, the collective and combine for one group.

        ``group`` is a hashable key of the group (index and size), for codecs
        that keep per-group state; ``sizes`` the element counts of the group's
        tensors (None: one tensor). Returns (averaged, sent) where ``sent`` is
        a zero-argument callable giving this worker's decoded contribution.
        """
        payload, ctx = self.compress_group(flat, seed, sizes)
        if self.collective == ALLREDUCE:
            collected = communicator.allreduce_mean(payload, group)
        else:
            collected = communicator.allgather(payload, group)
        averaged = self.combine(collected, ctx, communicator.size)
        return averaged, lambda: self.decompress(payload, ctx)

    def collectives_per_group(self):
        return 1

    def __repr__(self):
        args = ", ".join("%s=%r" % kv for kv in sorted(self.params.items()))
        return "%s(%s)" % (type(self).__name__, args)


def as_float32(flat):
    return tf.cast(flat, tf.float32) if flat.dtype != tf.float32 else flat
