"""1-bit SGD: a sign bit per element plus the mean of each side.

Algorithm (Seide, Fu, Droppo, Li and Yu, 2014, "1-Bit Stochastic Gradient
Descent and its Application to Data-Parallel Distributed Training of Speech
DNNs"): each worker sends the sign bits of g (bit 1 when not g_i < 0) with
mu+ = mean of the g_i whose bit is 1 and mu- = mean of the g_i < 0 (0 for an
empty side). Worker w's element decodes to mu+_w or mu-_w; combine averages
the W decoded buffers. Means are accumulated in float64 and rounded once.

NaN and Inf: a NaN element has bit 1 and makes mu+ NaN, so every "+" element
of that worker decodes to NaN (the "-" side is unaffected); +inf makes mu+
+inf and -inf makes mu- -inf.

State: the residual e (``residual`` memory), the error feedback 1-bit SGD
relies on.

Wire format (uint8[8 + ceil(n/8)]): bytes 0-3 mu+ and 4-7 mu- (float32,
little-endian), then the sign bits, bit i % 8 of byte 8 + i // 8.

Ops: the "onebit" codec of ``MergecompGroupEncode``/``MergecompGroupDecode``.
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


def _side_mean(mask, values64):
    count = tf.reduce_sum(tf.cast(mask, tf.float64))
    total = tf.reduce_sum(tf.where(mask, values64, tf.zeros_like(values64)))
    return tf.cast(tf.where(count > 0, total / tf.maximum(count, 1.0), 0.0), tf.float32)


class OneBitCompressor(DenseAllgatherCodec):
    name = "onebit"
    group_codec = "onebit"
    default_memory = "residual"

    def payload_nbytes(self, n):
        return 8 + (n + 7) // 8

    def _encode_reference(self, values, seed, n):
        plus = non_negative(values)
        values64 = tf.cast(values, tf.float64)
        mean_plus = _side_mean(plus, values64)
        mean_minus = _side_mean(tf.logical_not(plus), values64)
        return tf.concat([float_bytes(mean_plus), float_bytes(mean_minus), pack_bits(plus)], 0)

    def _decode_reference(self, rows, n, world_size):
        mean_plus = read_floats(rows, 0)[:, None]
        mean_minus = read_floats(rows, 4)[:, None]
        plus = unpack_bits(rows[:, 8:], n)
        return mean_over_workers(tf.where(plus, mean_plus, mean_minus), world_size)
