"""Random-k sparsification with a seed shared by all workers, per tensor.

Algorithm (Stich et al. 2018, "Sparsified SGD with Memory"; Wangni et al.
2018): every worker keeps the same k_i = ceil(ratio * n_i) positions of each
tensor i of the group, drawn uniformly without replacement from a seed that
the engine makes identical on all workers (shared_seed; step and tensor are
mixed into it), so the values can be averaged with an allreduce. Tensor i of
a group draws with seed + (i << TENSOR_SEED_SHIFT), and a group's seed names
its first tensor, so each tensor gets the draws it would get in a group of its
own: merging changes the number of collectives, not the draws.

Index draw: position j of a tensor gets the counter-based key
RandomBits(seed_i, j) (custom_ops/cc/kernels/random.h); the k_i largest keys
win, ties to the lower index, and the positions are used in ascending order.
That is a uniform random k_i-subset, the same for the op (CPU or CUDA) and the
plain-TF reference (tf.math.top_k on the keys).

Decode (decompress and combine): scatter the (averaged) values into zeros.
With scale=True tensor i's values are multiplied by n_i / k_i first, which
makes the decoded vector an unbiased estimate of g (E[decode] = g over seeds).
With scale=False the decode is the plain projection onto the chosen positions.
Error feedback must use scale=False: the residual memory then keeps exactly
the entries that were not sent (e = g - g_S); with scale=True it would
subtract (n/k) g_S and grow.

State: none in the codec; default memory "residual" (scale=False), "none"
(scale=True, which refuses any other memory).
Wire format: sum_i k_i float32 values (4 sum_i k_i bytes), tensor by tensor,
each in ascending position order. Collective: allreduce (Average).
Defaults: ratio = 0.01, scale = False.
Ops: the "randomk" codec of MergecompGroupEncode/Decode (its selection:
custom_ops/cc/kernels/randomk_op.cc). The per-tensor path takes its positions
from it (a group of one) and gathers and scatters with tf.gather / tf.scatter_nd.
"""

import numpy as np
import tensorflow as tf

from tf_mergecomp.compressors import counter_random, sparse_payload
from tf_mergecomp.compressors.base import (ALLREDUCE, TENSOR_SEED_SHIFT, Compressor, as_float32,
                                           check_ratio, static_length)


class RandomKCompressor(Compressor):
    name = "randomk"
    collective = ALLREDUCE
    default_memory = "residual"
    shared_seed = True
    group_codec = "randomk"
    payload_dtype = tf.float32

    def __init__(self, ratio=0.01, scale=False):
        super().__init__()
        self.ratio = check_ratio(ratio)
        if not isinstance(scale, bool):
            raise ValueError("scale must be True or False, got %r" % (scale,))
        self.scale = scale
        if scale:
            self.default_memory = "none"  # see check_memory

    @property
    def params(self):
        return {"ratio": self.ratio, "scale": self.scale}

    def check_memory(self, memory):
        if self.scale and memory.name != "none":
            raise ValueError(
                "randomk with scale=True cannot use error feedback (memory=%r): the residual "
                "would subtract (n/k) g_S and grow; use scale=False with memory='residual' "
                "(the default), or scale=True with memory='none' (its default)" % memory.name)

    def k(self, n):
        return sparse_payload.sparse_k(n, self.ratio)

    def payload_nbytes(self, n):
        return 4 * self.k(n)

    def group_op_attrs(self, sizes):
        return {"tensor_k": [self.k(n) for n in sizes], "scale": self.scale}

    def indices(self, seed, n):
        """The k positions (int32, ascending) for this seed."""
        k = self.k(n)
        seed = tf.cast(seed, tf.int64)
        if k == 0:
            return tf.zeros([0], tf.int32)
        if self.backend == "op":
            # The group codec's positions, for a group of this one tensor.
            return self.op_encode(tf.zeros([n], tf.float32), seed)[1]
        keys = tf.cast(counter_random.random_bits(seed, n), tf.int64)
        return sparse_payload.reference_select_largest(keys, k)

    def compress(self, flat, seed):
        return self.compress_group(flat, seed, None)

    def compress_group(self, flat, seed, sizes):
        n = static_length(flat, self.name)
        sizes = [n] if sizes is None else list(sizes)
        seed = tf.cast(seed, tf.int64)
        positions, offset = [], 0
        for i, size in enumerate(sizes):
            positions.append(self.indices(seed + (i << TENSOR_SEED_SHIFT), size) + offset)
            offset += size
        indices = positions[0] if len(positions) == 1 else tf.concat(positions, 0)
        payload = tf.gather(as_float32(flat), indices)
        return payload, (n, sizes, indices, flat.dtype)

    def decompress(self, payload, ctx):
        n, sizes, indices, dtype = ctx
        if self.scale:
            # n_i / k_i rounded to float32 once per tensor, as the op does.
            factors = np.concatenate([np.full(self.k(size), size / max(self.k(size), 1), np.float32)
                                      for size in sizes])
            payload = payload * factors
        dense = tf.scatter_nd(tf.reshape(indices, [-1, 1]), payload, [n])
        return tf.cast(dense, dtype)

    def combine(self, collected, ctx, world_size):
        return self.decompress(collected, ctx)
