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

On two levels (tf_mergecomp/hierarchical.py) each machine casts one vote: the rank
holding a piece keeps the momentum of the machine's average gradient for that piece.
Counting every rank's vote, as signsgd does, would need each rank's whole momentum.

Wire format: identical to signsgd, uint8[ceil(n/8)]: bit i % 8 of byte i // 8
is 1 when not (m_i < 0). NaN and Inf behave as in signsgd.

Ops: the "signsgd" codec of ``MergecompGroupEncode`` / ``MergecompGroupDecode``.
"""

from tf_mergecomp.compressors.base import check_in_interval
from tf_mergecomp.compressors.signsgd import SignSGDCompressor


class SignumCompressor(SignSGDCompressor):
    name = "signum"
    default_memory = "momentum"

    def __init__(self, beta=0.9):
        beta = check_in_interval("signum beta", beta, "[0, 1)")
        super().__init__()
        self.beta = beta
        # On two levels its momentum is of the machine's average, per piece: one vote
        # per machine (every rank's vote would need each rank's whole momentum).
        self.two_level_vote = "machine"

    @property
    def params(self):
        return {"beta": self.beta}

    def default_memory_params(self):
        return {"beta": self.beta}
