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

On two levels (M machines of L ranks, tf_mergecomp/hierarchical.py; docs/scaling.md, 2g),
``two_level_vote``: ``"rank"`` (default) counts every rank's vote, the flat vote bit for
bit: each rank sends across machines the L ranks' bits of its shard, or with L >= 3 their
count of "+" votes per element in ceil(log2(L + 1)) bits (``count_votes``); ``"machine"``
lets each machine's average cast one vote (1 bit per element across machines, but M
voters instead of L * M, and with an even M more ties, which vote +1).

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
    pack_codes,
    unpack_bits,
    unpack_codes,
)


class SignSGDCompressor(DenseAllgatherCodec):
    name = "signsgd"
    group_codec = "signsgd"
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
        # Only a non-default vote is named, so that existing fingerprints still match.
        return {} if self.votes_per_rank else {"two_level_vote": self.two_level_vote}

    def payload_nbytes(self, n):
        return (n + 7) // 8

    @staticmethod
    def count_bits(voters):
        """Bits of a count of ``voters`` votes, 0 to ``voters``: ceil(log2(voters + 1))."""
        return int(voters).bit_length()

    def count_votes(self, rows, n, tensors):
        """``rows``: uint8[V, payload_nbytes(n) + tensors], V voters' payloads with their
        non-finite markers (``marked_wire``). Returns one row: how many voted "+" on
        each element, ``count_bits(V)`` bits each (the stream layout of QSGD's codes),
        then a marker per tensor, set where any voter marked it."""
        voters = int(rows.shape[0])
        plus = unpack_bits(rows[:, :self.payload_nbytes(n)], n)
        # rows of a collective have no static shape: the lengths are restored
        counts = tf.reshape(tf.reduce_sum(tf.cast(plus, tf.int32), axis=0), [n])
        marked = tf.reshape(tf.reduce_any(rows[:, -tensors:] > 0, axis=0), [tensors])
        return tf.concat([pack_codes(counts, self.count_bits(voters)),
                          tf.cast(marked, tf.uint8)], 0)

    def vote_of_counts(self, rows, n, tensors, voters_per_row):
        """The majority vote of ``count_votes`` rows (each counting ``voters_per_row``
        voters): float32[n], +1 where the +-1 votes of all voters sum to >= 0, the flat
        vote exactly; and which of the ``tensors`` tensors some voter marked."""
        nbytes = (n * self.count_bits(voters_per_row) + 7) // 8
        counts = unpack_codes(rows[:, :nbytes], n, self.count_bits(voters_per_row))
        total = tf.reshape(tf.reduce_sum(2 * counts - voters_per_row, axis=0), [n])
        marked = tf.reshape(tf.reduce_any(rows[:, nbytes:nbytes + tensors] > 0, axis=0),
                            [tensors])
        return tf.where(total >= 0, 1.0, -1.0), marked

    def _encode_reference(self, values, seed, n):
        return pack_bits(non_negative(values))

    def _decode_reference(self, rows, n, world_size):
        return majority_vote(unpack_bits(rows, n), world_size)
