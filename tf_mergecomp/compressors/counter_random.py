"""The ops' counter-based random numbers, in plain TensorFlow.

Mirrors ``custom_ops/cc/kernels/random.h`` bit for bit, so the plain-TF
reference of a stochastic codec draws exactly what its custom op draws for the
same seed.
"""

import tensorflow as tf

_U32 = tf.uint32


def _u32(value):
    return tf.constant(value, dtype=_U32)


def _mix32(x):
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(16)))
    x = x * _u32(0x7FEB352D)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(15)))
    x = x * _u32(0x846CA68B)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(16)))
    return x


def seed_key(seed):
    """int64 scalar seed -> (lo, hi) uint32 key, as MakeSeedKey."""
    seed = tf.bitcast(tf.cast(seed, tf.int64), tf.uint64)
    low = tf.cast(tf.bitwise.bitwise_and(seed, tf.constant(0xFFFFFFFF, tf.uint64)), _U32)
    high = tf.cast(tf.bitwise.right_shift(seed, tf.constant(32, tf.uint64)), _U32)
    key_hi = _mix32(high + _u32(0x9E3779B9))
    key_lo = _mix32(tf.bitwise.bitwise_xor(low, key_hi))
    return key_lo, key_hi


def random_bits(seed, n, offset=0):
    """uint32[n] random bits for indices offset .. offset + n - 1."""
    key_lo, key_hi = seed_key(seed)
    index = tf.cast(tf.range(offset, offset + n, dtype=tf.int64), _U32)
    return _mix32(_mix32(tf.bitwise.bitwise_xor(index, key_lo)) + key_hi)


def random_uniform(seed, n, offset=0):
    """float32[n] uniform in [0, 1), as RandomUniform."""
    bits = tf.bitwise.right_shift(random_bits(seed, n, offset), _u32(8))
    return tf.cast(bits, tf.float32) * (1.0 / 16777216.0)
