"""SIGNUM: signSGD of the momentum, with majority vote.

Algorithm (Bernstein et al., 2018, "signSGD: Compressed Optimisation for
Non-Convex Problems", Algorithm 3): each worker keeps m <- beta * m +
(1 - beta) * g and sends sign(m); the combined update is the majority vote
sign(sum_w sign_w(m_i)) as +-1.0 (ties and sign(0) give +1). The momentum is
applied by the ``momentum`` memory before this codec, so the codec itself is
signSGD's.

State: the momentum m, one float32 per element (the ``momentum`` memory,
``default_memory_params() == {"beta": beta}``).

Defaults: beta = 0.9 (must be in [0, 1)).

On two levels (M machines of L ranks, tf_mergecomp/hierarchical.py; docs/scaling.md, 2g),
``two_level_vote``: ``"rank"`` (default) counts every rank's vote, the flat reduce bit
for bit: each rank keeps its whole momentum, as flat, and sends the signs of every shard
(its group's bits) across machines. ``"machine"``: each machine's average votes, and the
rank holding a piece keeps the momentum of the machine's average gradient for that piece
(1/L of the state, L times fewer bytes across machines, M voters instead of L * M).

Wire format: identical to signsgd, uint8[ceil(n/8)]: bit i % 8 of byte i // 8
is 1 when not (m_i < 0). NaN and Inf behave as in signsgd.

Ops: the "signsgd" codec of ``MergecompGroupEncode`` / ``MergecompGroupDecode``.
"""

from tf_mergecomp.compressors.base import check_in_interval
from tf_mergecomp.compressors.signsgd import SignSGDCompressor


class SignumCompressor(SignSGDCompressor):
    name = "signum"
    default_memory = "momentum"

    def __init__(self, beta=0.9, two_level_vote="rank"):
        beta = check_in_interval("signum beta", beta, "[0, 1)")
        super().__init__(two_level_vote)
        self.beta = beta

    @property
    def params(self):
        return {"beta": self.beta, **super().params}

    def default_memory_params(self):
        return {"beta": self.beta}
