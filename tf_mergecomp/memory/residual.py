"""Residual error feedback.

Algorithm: compensate returns p = g + e; after compression the residual becomes
e <- p - decode(encode(p)), computed from this worker's own payload, so what
compression dropped this step is added back the next (Seide et al., 2014,
"1-Bit Stochastic Gradient Descent"; Karimireddy et al., 2019, "Error Feedback
Fixes SignSGD and other Gradient Compression Schemes").

State: ``residual`` e, one float32 per gradient element.
"""

from tf_mergecomp.memory.base import Memory


class ResidualMemory(Memory):
    name = "residual"
    state_names = ("residual",)
    needs_sent = True

    def compensate(self, grad, state):
        return grad + state["residual"], state

    def update(self, compensated, sent, state):
        return dict(state, residual=compensated - sent)

    def pending(self, state):
        return state["residual"]
