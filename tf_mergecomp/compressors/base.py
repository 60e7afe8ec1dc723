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

``reduce()`` runs exactly that in plain TF. The engine runs a codec that has a
``group_codec`` through the fused group ops instead
(``custom_ops/cc/kernels/group_op.h``), which take the group's tensors as a
list and give the same bytes. A codec that is not one flat payload per group
(PowerSGD: a matrix per tensor, two collectives) sets ``reduces_own_groups``
and implements ``reduce_group()``.
"""

import tensorflow as tf

from tf_mergecomp import ops
from tf_mergecomp._validation import check_in_interval

# Tensor i of a group draws its random numbers with the group's seed plus
# (i << TENSOR_SEED_SHIFT) (kTensorSeedShift in custom_ops/cc/kernels/group_op.h).
TENSOR_SEED_SHIFT = 12
ALLREDUCE = "allreduce"
ALLGATHER = "allgather"


def check_ratio(ratio):
    return check_in_interval("ratio", ratio, "(0, 1]")


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
      reduces_own_groups: True when the engine hands whole groups to
        ``reduce_group()`` instead of running the flat-buffer path.
      votes_per_rank: True when ``combine`` is a vote of the workers' payloads
        (signSGD's majority vote): a two-level group then counts every rank's
        vote, as the flat reduce does (tf_mergecomp/hierarchical.py), with the
        codec's ``count_bits``, ``count_votes`` and ``vote_of_counts``.
    """

    name = None
    collective = ALLGATHER
    default_memory = "none"
    shared_seed = False
    group_codec = None
    payload_dtype = tf.uint8
    reduces_own_groups = False
    votes_per_rank = False

    def __init__(self):
        # "op": the fused group ops. tf_mergecomp.reference.plain() makes a
        # copy with "reference", the plain-TF path.
        self.backend = "op"

    @property
    def params(self):
        """The constructor parameters, for fingerprints and saved search results."""
        return {}

    def default_memory_params(self):
        """Parameters for ``default_memory`` (e.g. SIGNUM's beta)."""
        return {}

    def check_memory(self, memory):
        """Raises ValueError when this codec cannot work with ``memory``."""
        del memory

    def group_op_attrs(self, sizes):
        """The codec attributes of the fused group ops for tensors of these sizes."""
        del sizes
        return {}

    def codec_state_size(self, shape):
        """Floats of the codec's own state for a gradient tensor of this shape,
        kept by the engine after the memory's buffers in the tensor's variable."""
        del shape
        return 0

    @property
    def keeps_codec_state(self):
        """Whether the codec keeps state of its own per tensor (PowerSGD's Q)."""
        return type(self).codec_state_size is not Compressor.codec_state_size

    def initial_codec_state(self, shape, tensor_index):
        """The initial value of that state (float32, codec_state_size(shape)
        elements), identical on every worker: a function of the shape and of
        the tensor's index in the gradient list, not of its group. None: zeros."""
        del shape, tensor_index
        return None

    def reduce_group(self, grads, state_vars, memory, seed, communicator, key):
        """The averaged gradients of a whole group, for ``reduces_own_groups``
        codecs: grads as given (shapes, dtypes), state_vars one float32 variable
        per tensor ([memory buffers, codec state]; [] when both are empty)."""
        raise NotImplementedError("%s reduces flat buffers: call reduce()" % self.name)

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

    def reduce(self, flat, seed, communicator, group, sizes=None, nonfinite=None):
        """Runs compress, the collective and combine for one group.

        ``group`` is a hashable key of the group (index and size), for codecs
        that keep per-group state; ``sizes`` the element counts of the group's
        tensors (None: one tensor). Returns (averaged, sent) where ``sent`` is
        a zero-argument callable giving this worker's decoded contribution.

        ``nonfinite`` (a bool vector, one per tensor) travels after the payload
        as the fused group ops send it (one marker element per tensor); then a
        third value is returned: which tensors any worker marked.
        """
        payload, ctx = self.compress_group(flat, seed, sizes)
        wire = payload if nonfinite is None else self.marked_wire(payload, nonfinite)
        if self.collective == ALLREDUCE:
            collected = communicator.allreduce_mean(wire, group)
        else:
            collected = communicator.allgather(wire, group)
        if nonfinite is None:
            averaged = self.combine(collected, ctx, communicator.size)
            return averaged, lambda: self.decompress(payload, ctx)
        averaged, marked = self.combine_marked(collected, ctx, communicator.size,
                                               int(nonfinite.shape[0]))
        return averaged, lambda: self.decompress(payload, ctx), marked

    @staticmethod
    def marked_wire(payload, nonfinite):
        """The payload with one marker element per tensor after it (1: non-finite here)."""
        return tf.concat([payload, tf.cast(nonfinite, payload.dtype)], 0)

    def combine_marked(self, collected, ctx, world_size, count):
        """``combine`` of ``marked_wire`` rows: (combined, which of the ``count`` tensors
        any worker marked)."""
        rows = tf.reshape(collected, [1 if self.collective == ALLREDUCE else world_size, -1])
        marked = tf.reduce_any(rows[:, -count:] > tf.zeros([], rows.dtype), axis=0)
        return self.combine(tf.reshape(rows[:, :-count], [-1]), ctx, world_size), marked

    def collectives_per_group(self):
        return 1

    # The "op" backend of the per-tensor methods above (codec tests, `bench
    # ops`): the group ops on a group of one tensor, memory none. Their rows
    # carry one non-finite marker element after the payload: stripped here
    # after encoding, and added as zeros before decoding.
    def op_encode(self, values, seed):
        """values: 1-D float32. Returns (payload without its marker, codec_context)."""
        n = int(values.shape[0])
        payload, codec_context = ops.load().mergecomp_group_encode(
            [values], [], tf.cast(seed, tf.int64), payload_type=self.payload_dtype,
            memory="none", codec=self.group_codec, **self.group_op_attrs([n]))
        return payload[:-1], codec_context

    def op_decode(self, rows, codec_context, n, num_rows):
        """rows: num_rows payloads back to back (no markers) -> the float32[n] they decode to."""
        rows = tf.reshape(rows, [-1])
        rows = tf.reshape(rows, [num_rows, tf.size(rows) // num_rows])
        rows = tf.concat([rows, tf.zeros([num_rows, 1], rows.dtype)], 1)
        outputs, _ = ops.load().mergecomp_group_decode(
            tf.reshape(rows, [-1]), codec_context, T=[tf.float32], shapes=[[n]],
            num_rows=num_rows, codec=self.group_codec, **self.group_op_attrs([n]))
        return outputs[0]

    def __repr__(self):
        args = ", ".join("%s=%r" % kv for kv in sorted(self.params.items()))
        return "%s(%s)" % (type(self).__name__, args)


def static_length(flat, codec_name):
    """The length of a 1-D buffer of static shape; else ValueError naming the codec."""
    if flat.shape.rank != 1 or flat.shape[0] is None:
        raise ValueError(
            "%s needs a 1-D buffer of static length, got shape %s" % (codec_name, flat.shape)
        )
    return int(flat.shape[0])


def as_float32(flat):
    return tf.cast(flat, tf.float32) if flat.dtype != tf.float32 else flat
