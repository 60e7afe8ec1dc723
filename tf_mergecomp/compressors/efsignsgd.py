"""EF-SignSGD: scaled sign compression with error feedback.

Algorithm (Karimireddy, Rebjock, Stich and Jaggi, 2019, "Error Feedback Fixes
SignSGD and other Gradient Compression Schemes", Algorithm 1): the worker
compresses p = g + e (the ``residual`` memory adds e) as
scale * sign(p) with scale = ||p||_1 / n; combine averages the W decoded
buffers scale_w * sign_w(p). sign(0) = +1. The L1 norm is accumulated in
float64 and rounded once; n = 0 gives scale 0.

NaN and Inf: a NaN element makes the scale NaN, so the whole buffer decodes
to NaN; an infinite element makes the scale +inf, so every element decodes to
+-inf.

State: the residual e <- p - scale * sign(p) (``residual`` memory).

Wire format (uint8[4 + ceil(n/8)]): bytes 0-3 the scale (float32,
little-endian), then the sign bits, bit i % 8 of byte 4 + i // 8 is 1 when
not p_i < 0.

Ops: the "efsignsgd" codec of ``MergecompGroupEncode``/``MergecompGroupDecode``.
"""

import tensorflow as tf

from tf_mergecomp.compressors._sign import (
    DenseAllgatherCodec,
    float_bytes,
    mean_over_workers,
    non_negative,
    pack_bits,
    read_floats,
    unpack_bits,
)


class EFSignSGDCompressor(DenseAllgatherCodec):
    name = "efsignsgd"
    group_codec = "efsignsgd"
    default_memory = "residual"

    def payload_nbytes(self, n):
        return 4 + (n + 7) // 8

    def _encode_reference(self, values, seed, n):
        if n == 0:
            scale = tf.constant(0.0, tf.float32)
        else:
            l1 = tf.reduce_sum(tf.abs(tf.cast(values, tf.float64)))
            scale = tf.cast(l1 / float(n), tf.float32)
        return tf.concat([float_bytes(scale), pack_bits(non_negative(values))], 0)

    def _decode_reference(self, rows, n, world_size):
        scale = read_floats(rows, 0)[:, None]
        plus = unpack_bits(rows[:, 4:], n)
        return mean_over_workers(tf.where(plus, scale, -scale), world_size)
