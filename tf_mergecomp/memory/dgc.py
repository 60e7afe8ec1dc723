"""Deep Gradient Compression's memory: momentum correction and local accumulation.

Algorithm (Lin et al., 2018, "Deep Gradient Compression"): with momentum mu,
    u <- mu * u + g          (momentum correction)
    v <- v + u               (local accumulation; the codec selects from v)
and after sending, v and u are zeroed where values were sent
(momentum-factor masking). The optimizer then runs plain SGD without momentum,
since the momentum is applied here.

``sent`` is the dense decode of this worker's payload: the sent entries of v
equal v exactly, so v - sent zeroes them; u is masked where sent is non-zero
(an entry sent with value exactly 0 keeps its momentum, which is harmless).

State: ``momentum`` u and ``accumulation`` v, one float32 each per element.
"""

import tensorflow as tf

from tf_mergecomp._validation import check_in_interval
from tf_mergecomp.memory.base import Memory


class DGCMemory(Memory):
    name = "dgc"
    state_names = ("momentum", "accumulation")
    needs_sent = True

    def __init__(self, momentum=0.9):
        self.momentum = check_in_interval("dgc momentum", momentum, "[0, 1)")

    @property
    def params(self):
        return {"momentum": self.momentum}

    def op_attrs(self):
        return {"decay": self.momentum}

    def compensate(self, grad, state):
        u = self.momentum * state["momentum"] + grad
        v = state["accumulation"] + u
        return v, {"momentum": u, "accumulation": v}

    def update(self, compensated, sent, state):
        kept = tf.cast(tf.equal(sent, 0.0), sent.dtype)
        return {"momentum": state["momentum"] * kept, "accumulation": compensated - sent}

    def pending(self, state):
        # compensate(g) = v + mu * u + g: sending it all is DGC with every entry selected.
        return state["accumulation"] + self.momentum * state["momentum"]
