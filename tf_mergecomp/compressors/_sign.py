"""Shared pieces of the dense allgather codecs (sign bits, k-bit codes, float headers).

Byte layouts (the custom ops in ``custom_ops/cc/kernels/dense_bits.h`` write
the same bytes):

* bit streams are little-endian at both levels: element i's k-bit code takes
  stream bits [i*k, (i+1)*k), and stream bit j is bit j % 8 of byte j // 8;
* a sign bit is 1 for "+" and means ``not (x < 0)``: sign(0) = sign(-0) = +1,
  and NaN counts as +;
* header scalars are float32 in the machine's byte order (little-endian on
  every supported platform), placed before the bits.
"""

import tensorflow as tf

from tf_mergecomp.compressors.base import Compressor, as_float32, static_length

_BIT_WEIGHTS = (1, 2, 4, 8, 16, 32, 64, 128)


def non_negative(x):
    """The sign bit every sign codec sends: True unless x < 0 (so 0, -0 and NaN are +)."""
    return tf.logical_not(x < 0.0)


def pack_bits(bits):
    """bool[n] -> uint8[ceil(n / 8)], least significant bit first."""
    n = bits.shape[0]
    padded = tf.pad(tf.cast(bits, tf.int32), [[0, (-n) % 8]])
    rows = tf.reshape(padded, [-1, 8]) * tf.constant(_BIT_WEIGHTS, tf.int32)
    return tf.cast(tf.reduce_sum(rows, axis=1), tf.uint8)


def unpack_bits(packed, n):
    """uint8[W, L] -> bool[W, n]: the first n bits of each row."""
    shifted = tf.bitwise.right_shift(tf.cast(packed, tf.int32)[:, :, None], tf.range(8))
    bits = tf.equal(tf.bitwise.bitwise_and(shifted, 1), 1)
    return tf.reshape(bits, [tf.shape(packed)[0], -1])[:, :n]


def pack_codes(codes, bits_per_code):
    """int32[n] codes in [0, 2**k) -> uint8[ceil(n * k / 8)]."""
    shifted = tf.bitwise.right_shift(codes[:, None], tf.range(bits_per_code))
    return pack_bits(tf.reshape(tf.equal(tf.bitwise.bitwise_and(shifted, 1), 1), [-1]))


def unpack_codes(packed, n, bits_per_code):
    """uint8[W, L] -> int32[W, n] codes."""
    bits = unpack_bits(packed, n * bits_per_code)
    bits = tf.reshape(tf.cast(bits, tf.int32), [tf.shape(packed)[0], n, bits_per_code])
    return tf.reduce_sum(tf.bitwise.left_shift(bits, tf.range(bits_per_code)), axis=2)


def float_bytes(value):
    """float32 scalar -> its 4 bytes."""
    return tf.reshape(tf.bitcast(tf.reshape(value, [1]), tf.uint8), [4])


def read_floats(rows, offset):
    """The float32 at byte ``offset`` of every row of uint8[W, L] -> float32[W]."""
    return tf.bitcast(rows[:, offset:offset + 4], tf.float32)


def mean_over_workers(values, world_size):
    """float32[W, n] -> float32[n]: summed in worker order, then divided by W,
    the order the ops' decoders use, so the two agree bit for bit."""
    total = values[0]
    for w in range(1, world_size):
        total = total + values[w]
    return total / float(world_size)


def majority_vote(plus, world_size):
    """bool[W, n] ("+" bits) -> float32[n]: +1 where the +-1 votes sum to >= 0 (ties vote +1)."""
    votes = tf.where(plus, 1.0, -1.0)
    total = votes[0]
    for w in range(1, world_size):
        total = total + votes[w]
    return tf.where(total >= 0.0, 1.0, -1.0)


class DenseAllgatherCodec(Compressor):
    """Base of the allgather codecs whose payload is one uint8 row per worker.

    ``compress`` takes a 1-D buffer of static length and any float dtype,
    computes in float32, and decoded values are cast back to that dtype.
    Subclasses implement ``_encode_reference``/``_decode_reference`` (stock
    TensorFlow), where decoding maps a ``[W, payload_nbytes(n)]`` batch to the
    combined float32[n]; the op backend runs their group codec on a group of
    one tensor (``Compressor.op_encode``/``op_decode``).
    """

    def compress(self, flat, seed):
        n = static_length(flat, self.name)
        values = as_float32(flat)
        seed = tf.cast(seed, tf.int64)
        if self.backend == "op":
            payload = self._encode_op(values, seed)
        else:
            payload = self._encode_reference(values, seed, n)
        return payload, (n, flat.dtype)

    def decompress(self, payload, ctx):
        return self._decode(tf.reshape(payload, [1, -1]), ctx, 1)

    def combine(self, collected, ctx, world_size):
        return self._decode(tf.reshape(collected, [world_size, -1]), ctx, world_size)

    def _decode(self, rows, ctx, world_size):
        n, dtype = ctx
        if self.backend == "op":
            decoded = self._decode_op(rows, n)
        else:
            decoded = self._decode_reference(rows, n, world_size)
        return tf.cast(decoded, dtype) if dtype != tf.float32 else decoded

    def _encode_op(self, values, seed):
        return self.op_encode(values, seed)[0]

    def _decode_op(self, rows, n):
        return self.op_decode(rows, tf.zeros([0], tf.int32), n, int(rows.shape[0]))

    def _encode_reference(self, values, seed, n):
        raise NotImplementedError

    def _decode_reference(self, rows, n, world_size):
        raise NotImplementedError
