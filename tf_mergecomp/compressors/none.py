"""No compression: the float32 gradient itself, averaged by allreduce.

Algorithm: payload = g (cast to float32); combine returns the allreduce
average, cast back to the input dtype. The baseline every codec is compared
against.

State: none. Memory: ``none``.

Wire format: the float32[n] buffer, 4n bytes.

Ops: with memory ``none`` a group of one dtype goes to Horovod's grouped
allreduce (tf_mergecomp/plain_groups.py); otherwise the "none" codec of
``MergecompGroupEncode``/``MergecompGroupDecode`` (a copy).
"""

import tensorflow as tf

from tf_mergecomp.compressors.base import ALLREDUCE, Compressor, as_float32


class NoneCompressor(Compressor):
    name = "none"
    collective = ALLREDUCE
    group_codec = "none"
    payload_dtype = tf.float32

    def compress(self, flat, seed):
        return tf.identity(as_float32(flat)), flat.dtype

    def decompress(self, payload, ctx):
        return tf.cast(payload, ctx) if ctx != tf.float32 else payload

    def combine(self, collected, ctx, world_size):
        return tf.cast(collected, ctx) if ctx != tf.float32 else collected

    def payload_nbytes(self, n):
        return 4 * n
