"""TernGrad: unbiased stochastic ternary gradients.

Algorithm (Wen, Xu, Yan, Wu, Wang, Chen and Li, 2017, "TernGrad: Ternary
Gradients to Reduce Communication in Distributed Deep Learning"): with
m = max_i |g_i| and u_i uniform in [0, 1), element i is sent as
t_i = sign(g_i) * [u_i < |g_i| / m] in {-1, 0, +1} and decoded as m * t_i,
an unbiased estimate of g_i; combine averages the W decoded buffers. m = 0
sends nothing. (The paper's layer-wise scaling and gradient clipping are not
applied: MergeComp compresses merged groups as one buffer.)

Randomness: u_i is random.h's RandomUniform(seed, i) (counter_random.py in
the reference).

NaN and Inf: any NaN element makes m NaN; an infinite one makes m +inf. No
element is then sent and the whole buffer decodes to NaN (NaN * 0, inf * 0).

State: none. Memory: ``none``.

Wire format (uint8[4 + ceil(n/4)]): bytes 0-3 m (float32, little-endian),
then 2 bits per element at bits 2 * (i % 4) of byte 4 + i // 4: bit 0 =
sent, bit 1 = negative (codes 0: 0, 1: +1, 3: -1).

Ops: the "terngrad" codec of ``MergecompGroupEncode`` / ``MergecompGroupDecode``.
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


class TernGradCompressor(DenseAllgatherCodec):
    name = "terngrad"
    group_codec = "terngrad"

    def payload_nbytes(self, n):
        return 4 + (n + 3) // 4

    def _encode_reference(self, values, seed, n):
        magnitude = tf.abs(values)
        is_nan = tf.math.is_nan(values)
        if n == 0:
            max_abs = tf.constant(0.0, tf.float32)
        else:
            max_abs = tf.reduce_max(tf.where(is_nan, 0.0, magnitude))
            max_abs = tf.where(tf.reduce_any(is_nan), float("nan"), max_abs)
        sent = random_uniform(seed, n) < magnitude / max_abs
        codes = tf.where(sent, tf.where(non_negative(values), 1, 3), 0)
        return tf.concat([float_bytes(max_abs), pack_codes(codes, 2)], 0)

    def _decode_reference(self, rows, n, world_size):
        max_abs = read_floats(rows, 0)[:, None]
        codes = unpack_codes(rows[:, 4:], n, 2)
        sent = tf.equal(tf.bitwise.bitwise_and(codes, 1), 1)
        negative = tf.equal(tf.bitwise.bitwise_and(codes, 2), 2)
        ternary = tf.where(sent, tf.where(negative, -1.0, 1.0), 0.0)
        return mean_over_workers(max_abs * ternary, world_size)
