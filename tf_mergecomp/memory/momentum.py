"""Momentum before compression, as SIGNUM uses it.

Algorithm (Bernstein et al., 2018, "signSGD: Compressed Optimisation for
Non-Convex Problems", SIGNUM): m <- beta * m + (1 - beta) * g, and the codec
compresses m (its sign) instead of g. Nothing is fed back from the payload.

State: ``momentum`` m, one float32 per gradient element.
"""

from tf_mergecomp._validation import check_in_interval
from tf_mergecomp.memory.base import Memory


class MomentumMemory(Memory):
    name = "momentum"
    state_names = ("momentum",)

    def __init__(self, beta=0.9):
        self.beta = check_in_interval("momentum beta", beta, "[0, 1)")

    @property
    def params(self):
        return {"beta": self.beta}

    def op_attrs(self):
        # Rounded to float32 as the plain-TF compensate rounds them.
        return {"decay": self.beta, "gradient_scale": 1.0 - self.beta}

    def compensate(self, grad, state):
        m = self.beta * state["momentum"] + (1.0 - self.beta) * grad
        return m, {"momentum": m}
