"""Half-precision compression: float32 gradients sent as float16.

Algorithm: payload = round_to_nearest_even(float16(g)); the allreduce averages
the float16 payloads and combine widens the average back to the input dtype.
Values with |g| >= 65520 saturate to +-inf (and an average that overflows
float16 does too); values below 2**-24 flush to 0; NaN stays NaN.

State: none. Memory: ``none``.

Wire format: the float16[n] buffer, 2n bytes.

Ops: the "fp16" codec of ``MergecompGroupEncode``/``MergecompGroupDecode``; the
reference uses ``tf.cast`` and matches bit for bit. The fp16 baseline of MergeComp
(Wang, Wu and Ng, 2021, "MergeComp: A Compression Scheduler for Scalable
Communication-Efficient Distributed Training") and Horovod's ``Compression.fp16``.
"""

import tensorflow as tf

from tf_mergecomp.compressors.base import ALLREDUCE, Compressor, as_float32


class FP16Compressor(Compressor):
    name = "fp16"
    collective = ALLREDUCE
    group_codec = "fp16"
    payload_dtype = tf.float16

    def compress(self, flat, seed):
        values = as_float32(flat)
        if self.backend == "op":
            payload = self.op_encode(values, seed)[0]
        else:
            payload = tf.cast(values, tf.float16)
        return payload, flat.dtype

    def decompress(self, payload, ctx):
        return self._widen(payload, ctx)

    def combine(self, collected, ctx, world_size):
        return self._widen(collected, ctx)

    def _widen(self, payload, dtype):
        if self.backend == "op":
            values = self.op_decode(payload, tf.zeros([0], tf.int32), int(payload.shape[0]), 1)
        else:
            values = tf.cast(payload, tf.float32)
        return tf.cast(values, dtype) if dtype != tf.float32 else values

    def payload_nbytes(self, n):
        return 2 * n
