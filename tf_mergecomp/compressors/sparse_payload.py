"""Helpers shared by the sparse codecs (topk, dgc, randomk).

Sparse payload of k slots, one uint8 tensor of exactly 8k bytes:

    bytes [0, 4k)    k float32 values, little-endian
    bytes [4k, 8k)   k int32 indices into the group's flat buffer, little-endian

Slots are in ascending index order (dgc's zero padding slots come last).
"""

import math

import tensorflow as tf


def sparse_k(n, ratio):
    """k = ceil(ratio * n), at least 1 when n >= 1.

    The product is rounded to 9 decimals first, so that e.g. 0.07 * 100
    (7.000000000000001 in binary floating point) gives 7, not 8.
    """
    if n == 0:
        return 0
    return min(n, max(1, int(math.ceil(round(ratio * n, 9)))))


def magnitude(values):
    """|values| with NaN as +inf (the ops' ranking key), so a NaN is sent, not dropped."""
    return tf.where(tf.math.is_nan(values), tf.constant(float("inf"), values.dtype), tf.abs(values))


def pack(values, indices):
    """float32[k], int32[k] -> uint8[8k] (the layout above)."""
    return tf.concat([tf.reshape(tf.bitcast(values, tf.uint8), [-1]),
                      tf.reshape(tf.bitcast(indices, tf.uint8), [-1])], axis=0)


def unpack(payloads, k):
    """uint8[W * 8k] -> float32[W, k] values, int32[W, k] indices."""
    slots = tf.reshape(payloads, [-1, 2, k, 4])
    return tf.bitcast(slots[:, 0], tf.float32), tf.bitcast(slots[:, 1], tf.int32)


def reference_scatter_mean(payloads, n, k):
    """The plain-TF decode: all workers' values added into zeros, divided by W."""
    if k == 0:
        return tf.zeros([n], tf.float32)
    values, indices = unpack(payloads, k)
    workers = tf.cast(tf.shape(values)[0], tf.float32)
    total = tf.tensor_scatter_nd_add(tf.zeros([n], tf.float32),
                                     tf.reshape(indices, [-1, 1]), tf.reshape(values, [-1]))
    return total / workers


def reference_select_largest(keys, k):
    """Indices of the k largest keys, ties to the lower index, ascending."""
    return tf.sort(tf.math.top_k(keys, k, sorted=False).indices)


def check_payload_length(collected, k, world_size):
    length = collected.shape[0]
    if length is not None and length != world_size * 8 * k:
        raise ValueError("collected sparse payloads hold %d bytes; expected world_size * 8k = "
                         "%d * %d" % (length, world_size, 8 * k))
