"""QSGD: unbiased stochastic quantisation to s levels per sign.

Algorithm (Alistarh, Grubic, Li, Tomioka and Vojnovic, 2017, "QSGD:
Communication-Efficient SGD via Gradient Quantization and Encoding"): with
norm = ||g||_2 and u_i uniform in [0, 1),

    l_i = floor(|g_i| * (s / norm) + u_i), clamped to [0, s],

and g_i is sent as sign(g_i) * l_i (sign(0) = +1), decoded as
(norm / s) * sign_i * l_i. E[l_i] = s * |g_i| / norm, so the decoded buffer
is an unbiased estimate of g; combine averages the W decoded buffers. Each
float operation rounds once (no fused multiply-add), so the op and the
plain-TF reference agree bit for bit; the norm is accumulated in float64 and
rounded once. A zero norm sends level 0 everywhere.

Randomness: u_i is random.h's RandomUniform(seed, i) (counter_random.py in
the reference); the engine gives each worker its own seed per step and group.

NaN and Inf: a NaN or infinite element makes the norm NaN or +inf; all levels
are then 0 and the whole buffer decodes to NaN (0 * NaN, 0 * inf).

State: none. Memory: ``none``.

Defaults: levels s = 64 (an integer in [1, 2**24]).

Wire format (uint8[4 + ceil(n * b / 8)], b = ceil(log2(2s + 1)) bits, 8 for
s = 64): bytes 0-3 the norm (float32, little-endian), then element i's code
sign_i * l_i + s (in [0, 2s]) in stream bits [i*b, (i+1)*b), stream bit j
being bit j % 8 of byte 4 + j // 8.

Ops: the "qsgd" codec of ``MergecompGroupEncode`` / ``MergecompGroupDecode``.
"""

import tensorflow as tf

from tf_mergecomp.compressors.counter_random import random_uniform
from tf_mergecomp.compressors._sign import (
    DenseAllgatherCodec,
    float_bytes,
    mean_over_workers,
    non_negative,
    pack_codes,
    read_floats,
    unpack_codes,
)
from tf_mergecomp._validation import check_positive_int

MAX_LEVELS = 2 ** 24  # levels are exact in float32 up to here


def code_bits(levels):
    """b = ceil(log2(2 * levels + 1))."""
    return (2 * levels).bit_length()


class QSGDCompressor(DenseAllgatherCodec):
    name = "qsgd"
    group_codec = "qsgd"

    def __init__(self, levels=64):
        levels = check_positive_int("qsgd levels", levels)
        if levels > MAX_LEVELS:
            raise ValueError("qsgd levels must be an integer in [1, %d], got %r" % (MAX_LEVELS, levels))
        super().__init__()
        self.levels = levels
        self.bits = code_bits(levels)

    @property
    def params(self):
        return {"levels": self.levels}

    def payload_nbytes(self, n):
        return 4 + (n * self.bits + 7) // 8

    def group_op_attrs(self, sizes):
        return {"levels": self.levels}

    def _encode_reference(self, values, seed, n):
        levels = tf.constant(float(self.levels), tf.float32)
        values64 = tf.cast(values, tf.float64)
        norm = tf.cast(tf.sqrt(tf.reduce_sum(values64 * values64)), tf.float32)
        scale = tf.where(norm > 0.0, levels / norm, 0.0)
        rounded = tf.floor(tf.abs(values) * scale + random_uniform(seed, n))
        level = tf.where(rounded >= 1.0, tf.minimum(rounded, levels), 0.0)
        codes = tf.where(non_negative(values), levels + level, levels - level)
        return tf.concat([float_bytes(norm), pack_codes(tf.cast(codes, tf.int32), self.bits)], 0)

    def _decode_reference(self, rows, n, world_size):
        unit = read_floats(rows, 0)[:, None] / float(self.levels)
        codes = unpack_codes(rows[:, 4:], n, self.bits)
        return mean_over_workers(tf.cast(codes - self.levels, tf.float32) * unit, world_size)
