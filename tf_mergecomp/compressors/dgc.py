"""Deep Gradient Compression (DGC): top-k by a sampled threshold.

Algorithm (Lin et al. 2018, "Deep Gradient Compression: Reducing the
Communication Bandwidth for Distributed Training"): the memory accumulates
momentum-corrected gradients v; the codec sends the entries of v whose
magnitude reaches a threshold estimated from a random sample of |v| instead of
an exact top-k:

  1. s = max(MIN_SAMPLE, ceil(sample_ratio * n)) positions are drawn uniformly
     with replacement from the seed (position = floor(bits * n / 2^32), bits =
     the counter-based RandomBits(seed, j), j = 0 .. s - 1);
  2. threshold = the r-th largest sampled magnitude, r = ceil(s * k / n);
  3. refinement: while fewer than k entries reach it, the threshold is halved
     (at most REFINEMENTS = 3 times);
  4. candidates = entries with |v_i| >= threshold. If there are more than k,
     the k largest candidates are sent (which is then the exact top-k, ties to
     the lower index); if fewer, all candidates are sent and the remaining
     slots are padding (value 0, index 0), which adds nothing when decoded.
NaN ranks as +inf (it is selected and propagates), as in topk.

State: none in the codec; the default memory is "dgc" (momentum correction,
local accumulation, momentum-factor masking) with this codec's momentum.

Wire format: topk's, exactly k slots, 8k bytes: k float32 values, then k int32
indices, little-endian, ascending index order, padding last.
Collective: allgather; decode adds all workers' values into zeros, divides by W.

Defaults: ratio = 0.01, sample_ratio = 0.01 (DGC's paper samples 0.1% to 1%),
momentum = 0.9 (the memory's mu).

Ops: the "dgc" codec of MergecompGroupEncode/Decode (custom_ops/cc/kernels/dgc_op.h;
in a merged group the selection runs inside the memory's compensation pass,
dgc_op.cc). The plain-TF reference draws the same sample through
counter_random.py and gives identical bytes.
"""

import math

import tensorflow as tf

from tf_mergecomp.compressors import counter_random, sparse_payload
from tf_mergecomp.compressors.base import check_in_interval, static_length
from tf_mergecomp.compressors.topk import TopKCompressor

MIN_SAMPLE = 1024
REFINEMENTS = 3  # kDgcRefinements in custom_ops/cc/kernels/dgc_op.h


class DGCCompressor(TopKCompressor):
    """Topk's wire format, decode and combine; only the selection differs."""

    name = "dgc"
    group_codec = "dgc"
    default_memory = "dgc"

    def __init__(self, ratio=0.01, sample_ratio=0.01, momentum=0.9):
        super().__init__(ratio)
        self.sample_ratio = check_in_interval("sample_ratio", sample_ratio, "(0, 1]")
        self.momentum = check_in_interval("momentum", momentum, "[0, 1)")

    @property
    def params(self):
        return {"ratio": self.ratio, "sample_ratio": self.sample_ratio, "momentum": self.momentum}

    def default_memory_params(self):
        return {"momentum": self.momentum}

    def group_op_attrs(self, sizes):
        n = sum(sizes)
        return {"k": self.k(n), "sample_size": self.sample_size(n)}

    def sample_size(self, n):
        return max(MIN_SAMPLE, int(math.ceil(round(self.sample_ratio * n, 9))))

    def reference_threshold(self, values, seed):
        """Plain-TF threshold estimate for a float32 buffer.

        Returns (threshold, candidates at the sampled threshold, candidates
        after refinement), the quantities the op computes internally.
        """
        return self._reference_threshold(sparse_payload.magnitude(values), seed)

    def _reference_threshold(self, magnitudes, seed):
        """``reference_threshold`` from the buffer's ranking keys, ``magnitude(values)``."""
        n = static_length(magnitudes, self.name)
        k, sample_size = self.k(n), self.sample_size(n)
        bits = tf.cast(counter_random.random_bits(tf.cast(seed, tf.int64), sample_size), tf.int64)
        positions = tf.bitwise.right_shift(bits * n, tf.constant(32, tf.int64))
        sample = tf.gather(magnitudes, positions)
        rank = min(sample_size, max(1, -(-sample_size * k // n)))
        threshold = tf.math.top_k(sample, rank, sorted=True).values[rank - 1]

        def count(t):
            return tf.reduce_sum(tf.cast(magnitudes >= t, tf.int64))

        sampled_count = candidates = count(threshold)
        for _ in range(REFINEMENTS):
            threshold = tf.where(candidates < k, threshold * 0.5, threshold)
            candidates = count(threshold)
        return threshold, sampled_count, candidates

    def _reference_encode(self, values, seed, n, k):
        magnitudes = sparse_payload.magnitude(values)
        threshold, _, _ = self._reference_threshold(magnitudes, seed)
        keys = tf.where(magnitudes >= threshold, magnitudes, -1.0)
        chosen = tf.math.top_k(keys, k, sorted=False).indices
        valid = tf.gather(keys, chosen) >= 0.0
        # Valid slots in ascending index order, padding after them.
        order = tf.argsort(tf.where(valid, chosen, n), stable=True)
        chosen = tf.gather(chosen, order)
        valid = tf.gather(valid, order)
        indices = tf.where(valid, chosen, 0)
        slot_values = tf.where(valid, tf.gather(values, chosen), 0.0)
        return sparse_payload.pack(slot_values, indices)

    def _encode(self, values, seed, n, k):
        if k == 0:
            return tf.zeros([0], tf.uint8)
        if self.backend == "op":
            return self.op_encode(values, seed)[0]
        return self._reference_encode(values, seed, n, k)
