"""A group through the fused group ops: one encode op, one collective, one decode op.

The kernels: custom_ops/cc/kernels/group_op.h. The plain-TF route of the same group,
step by step: reference.py, whose ``reduce_group``/``encode_group``/``decode_group``
these mirror.
"""

from tf_mergecomp import compressors
from tf_mergecomp import ops as op_library


def reduce_group(codec, memory, grads, state_vars, seed, communicator, key):
    """(the group's outputs, shaped as ``grads``; an int32 vector, 1 for each tensor some
    rank held non-finite) through ``communicator``'s collective named by ``key``."""
    payload, codec_context = encode_group(codec, memory, grads, state_vars, seed)
    if codec.collective == compressors.ALLREDUCE:
        collected, rows = communicator.allreduce_mean(payload, key), 1
    else:
        collected, rows = communicator.allgather(payload, key), communicator.size
    return decode_group(codec, collected, codec_context, rows, grads)


def encode_group(codec, memory, grads, state_vars, seed):
    """(this rank's payload, the gradients compensated with the memory's state and
    encoded, with a non-finite marker per tensor after it; its codec context); the
    memory's state variables (one per tensor) updated."""
    return op_library.load().mergecomp_group_encode(
        grads, [v.handle for v in state_vars], seed, payload_type=codec.payload_dtype,
        memory=memory.name, **memory.op_attrs(), **_codec_attrs(codec, grads))


def decode_group(codec, collected, codec_context, num_rows, grads):
    """``num_rows`` rows of ``encode_group`` to (outputs shaped as ``grads``, the tensors
    some rank marked)."""
    return op_library.load().mergecomp_group_decode(
        collected, codec_context, T=[g.dtype for g in grads], shapes=[g.shape for g in grads],
        num_rows=num_rows, **_codec_attrs(codec, grads))


def _codec_attrs(codec, grads):
    return dict(codec=codec.group_codec,
                **codec.group_op_attrs([g.shape.num_elements() for g in grads]))
