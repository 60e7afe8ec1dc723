"""Random-k sparsification with a seed shared by all workers.

Algorithm (Stich et al. 2018, "Sparsified SGD with Memory"; Wangni et al.
2018): every worker keeps the same k = ceil(ratio * n) positions, drawn
uniformly without replacement from a seed that the engine makes identical on
all workers (shared_seed; step and group are mixed into it). Because the
positions agree, the k values can be averaged with an allreduce.

Index draw: position i gets the counter-based key RandomBits(seed, i)
(custom_ops/cc/kernels/random.h); the k largest keys win, ties to the lower
index, and the positions are used in ascending order. That is a uniform random
k-subset, the same for the op (CPU or CUDA) and the plain-TF reference
(tf.math.top_k on the keys).

Decode (decompress and combine): scatter the (averaged) values into zeros.
With scale=True they are multiplied by n / k first, which makes the decoded
vector an unbiased estimate of g (E[decode] = g over seeds). With scale=False
(the default: "scatter, then mean over workers") the decode is the plain
projection onto the chosen positions. Error feedback must use scale=False:
the residual memory then keeps exactly the entries that were not sent
(e = g - g_S); with scale=True the residual would subtract (n/k) g_S and grow.

State: none in the codec; default memory "residual".
Wire format: k float32 values (4k bytes), in ascending position order.
Collective: allreduce (Average). Defaults: ratio = 0.01, scale = False.
Ops: MergecompRandomkIndices (radix select over the keys, O(n), sharded);
gathering and scattering use tf.gather / tf.scatter_nd in both backends.
"""

import tensorflow as tf

from tf_mergecomp._ops import load
from tf_mergecomp.compressors import _random, _sparse
from tf_mergecomp.compressors.base import ALLREDUCE, Compressor, as_float32, check_ratio


class RandomKCompressor(Compressor):
    name = "randomk"
    collective = ALLREDUCE
    default_memory = "residual"
    shared_seed = True

    def __init__(self, ratio=0.01, scale=False, backend="op"):
        super().__init__(backend)
        self.ratio = check_ratio(ratio)
        if not isinstance(scale, bool):
            raise ValueError("scale must be True or False, got %r" % (scale,))
        self.scale = scale

    @property
    def params(self):
        return {"ratio": self.ratio, "scale": self.scale}

    def k(self, n):
        return _sparse.sparse_k(n, self.ratio)

    def payload_nbytes(self, n):
        return 4 * self.k(n)

    def indices(self, seed, n):
        """The k positions (int32, ascending) for this seed."""
        k = self.k(n)
        seed = tf.cast(seed, tf.int64)
        if k == 0:
            return tf.zeros([0], tf.int32)
        if self.backend == "op":
            return load().mergecomp_randomk_indices(seed, n=n, k=k)
        keys = tf.cast(_random.random_bits(seed, n), tf.int64)
        return _sparse.reference_select_largest(keys, k)

    def compress(self, flat, seed):
        n = _sparse.static_length(flat)
        indices = self.indices(seed, n)
        payload = tf.gather(as_float32(flat), indices)
        return payload, (n, indices, flat.dtype)

    def decompress(self, payload, ctx):
        n, indices, dtype = ctx
        k = self.k(n)
        if self.scale and k > 0:
            payload = payload * (n / k)
        dense = tf.scatter_nd(tf.reshape(indices, [-1, 1]), payload, [n])
        return tf.cast(dense, dtype)

    def combine(self, collected, ctx, world_size):
        return self.decompress(collected, ctx)
