"""Top-k sparsification.

Algorithm (Aji & Heafield 2017, "Sparse Communication for Distributed Gradient
Descent"; Stich et al. 2018, "Sparsified SGD with Memory"): each worker sends
the k = ceil(ratio * n) entries of its (error-compensated) buffer g with the
largest |g_i|; the receivers add every worker's entries into zeros and divide
by W. Ties at the k-th magnitude go to the lower index, so the selection is
unique; NaN ranks as +inf (it is sent and propagates), +-inf rank highest.

State: none in the codec; the default memory is "residual" (error feedback),
which keeps what was not sent for the next step.

Wire format: one uint8 buffer of exactly 8k bytes: k float32 values, then k
int32 indices, little-endian, in ascending index order (see sparse_payload.py).
Collective: allgather (W * 8k bytes arrive).

Defaults: ratio = 0.01 (ratio must be in (0, 1]).

Ops: the "topk" codec of MergecompGroupEncode/Decode (custom_ops/cc/kernels/
topk_op.h: one compensate-and-collect pass above a threshold taken from a sample,
and a radix select over the group only when fewer than k are collected; the
sample changes the work, never the result). The plain-TF reference uses
tf.math.top_k and tensor_scatter_nd_add; both give identical bytes.
"""

import tensorflow as tf

from tf_mergecomp.compressors import sparse_payload
from tf_mergecomp.compressors.base import Compressor, as_float32, check_ratio, static_length


class TopKCompressor(Compressor):
    name = "topk"
    group_codec = "topk"
    default_memory = "residual"

    def __init__(self, ratio=0.01):
        super().__init__()
        self.ratio = check_ratio(ratio)

    @property
    def params(self):
        return {"ratio": self.ratio}

    def k(self, n):
        return sparse_payload.sparse_k(n, self.ratio)

    def payload_nbytes(self, n):
        return 8 * self.k(n)

    def group_op_attrs(self, sizes):
        return {"k": self.k(sum(sizes))}

    def _encode(self, values, seed, n, k):
        """float32[n] -> the 8k-byte payload (subclasses choose the k entries differently)."""
        del n  # for dgc's override; the exact top-k needs only the values and k
        if self.backend == "op":
            return self.op_encode(values, seed)[0]
        indices = sparse_payload.reference_select_largest(sparse_payload.magnitude(values), k)
        return sparse_payload.pack(tf.gather(values, indices), indices)

    def compress(self, flat, seed):
        n = static_length(flat, self.name)
        k = self.k(n)
        payload = self._encode(as_float32(flat), tf.cast(seed, tf.int64), n, k)
        return payload, (n, k, flat.dtype)

    def _decode(self, payloads, ctx):
        n, k, dtype = ctx
        if self.backend == "op":
            rows = int(payloads.shape[0]) // (8 * k) if k else 1
            dense = (self.op_decode(payloads, tf.zeros([0], tf.int32), n, rows) if k
                     else tf.zeros([n], tf.float32))
        else:
            dense = sparse_payload.reference_scatter_mean(payloads, n, k)
        return tf.cast(dense, dtype)

    def decompress(self, payload, ctx):
        return self._decode(payload, ctx)

    def combine(self, collected, ctx, world_size):
        sparse_payload.check_payload_length(collected, ctx[1], world_size)
        return self._decode(collected, ctx)
