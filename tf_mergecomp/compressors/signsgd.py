"""signSGD with majority vote: one sign bit per element.

Algorithm (Bernstein, Wang, Azizzadenesheli and Anandkumar, 2018, "signSGD:
Compressed Optimisation for Non-Convex Problems"; majority vote from
Bernstein, Zhao, Azizzadenesheli and Anandkumar, 2019, "signSGD with Majority
Vote is Communication Efficient and Fault Tolerant"): each worker sends
sign(g_i); the combined gradient is sign(sum_w sign_w(g_i)), decoded as +1.0
or -1.0. sign(0) = +1, and a tie of the votes also gives +1.

NaN and Inf: a sign bit means ``not (g_i < 0)``, so NaN votes +1, -0.0 votes
+1 and +-inf vote their sign; the output is always +-1.0 (never NaN).

State: none. Memory: ``none`` (signum adds momentum; efsignsgd adds error
feedback and a scale).

On two levels (machines of L ranks, tf_mergecomp/hierarchical.py), ``two_level_vote``:
``"rank"`` (default) counts every rank's vote, the flat vote bit for bit (each rank
sends its group's bits across machines, L shards of it); ``"machine"`` lets each
machine's average cast one vote (L times fewer bytes across machines, but M voters
instead of L * M, and with an even M more ties, which vote +1).

Wire format (uint8[ceil(n/8)], ceil(n/8) bytes): bit i % 8 of byte i // 8
(least significant first) is 1 when g_i is "+"; padding bits are 0.

Ops: the "signsgd" codec of ``MergecompGroupEncode`` (-> uint8[ceil(n/8)]) and
``MergecompGroupDecode`` (uint8[W, ceil(n/8)] -> float32[n], the vote);
``decompress`` is the vote of this worker alone, its own +-1 signs.
"""

import tensorflow as tf

from tf_mergecomp.compressors._sign import (
    DenseAllgatherCodec,
    majority_vote,
    non_negative,
    pack_bits,
    unpack_bits,
)


class SignSGDCompressor(DenseAllgatherCodec):
    name = "signsgd"
    group_codec = "signsgd"
    default_memory = "none"
    TWO_LEVEL_VOTES = ("rank", "machine")

    def __init__(self, two_level_vote="rank"):
        if two_level_vote not in self.TWO_LEVEL_VOTES:
            raise ValueError("%s two_level_vote must be one of %s (who votes on two levels: "
                             "every rank, or each machine's average), got %r"
                             % (self.name, ", ".join(self.TWO_LEVEL_VOTES), two_level_vote))
        super().__init__()
        self.two_level_vote = two_level_vote

    @property
    def votes_per_rank(self):
        return self.two_level_vote == "rank"

    @property
    def params(self):
        # Named only when not the default: fingerprints of before the setting unchanged.
        return {} if self.votes_per_rank else {"two_level_vote": self.two_level_vote}

    def payload_nbytes(self, n):
        return (n + 7) // 8

    def _encode_reference(self, values, seed, n):
        return pack_bits(non_negative(values))

    def _decode_reference(self, rows, n, world_size):
        return majority_vote(unpack_bits(rows, n), world_size)
