"""Error-feedback memories, found by name.

A memory names its state buffers and defines how they change; the engine owns
the state (one flat float32 ``tf.Variable`` per gradient tensor, holding the
memory's buffers back to back in ``state_names`` order, so that it checkpoints
with the model and does not depend on the partition). ``MergecompGroupEncode``
applies the memory inside the kernel (``Memory.op_attrs``); the plain-TF
reference hands each group's slice of the state in and out as flat buffers:

    compensated, state = memory.compensate(flat_grad, state)
    ... compress and communicate ``compensated`` ...
    state = memory.update(compensated, sent, state)

``state`` maps each name in ``memory.state_names`` to a flat float32 buffer of
the group's length; ``sent`` is this worker's own payload, decoded.
"""

from tf_mergecomp._validation import from_registry
from tf_mergecomp.memory.base import Memory, NoMemory
from tf_mergecomp.memory.dgc import DGCMemory
from tf_mergecomp.memory.momentum import MomentumMemory
from tf_mergecomp.memory.residual import ResidualMemory

_REGISTRY = {
    "none": NoMemory,
    "residual": ResidualMemory,
    "dgc": DGCMemory,
    "momentum": MomentumMemory,
}

NAMES = tuple(_REGISTRY)


def get(name, **params):
    """Returns a new memory, or ``name`` itself when it is one; bad parameters
    raise ValueError naming the valid ones."""
    return from_registry("memory", name, params, Memory, _memory_class)


def _memory_class(name):
    if name not in _REGISTRY:
        raise ValueError("unknown memory %r; valid choices: %s" % (name, ", ".join(NAMES)))
    return _REGISTRY[name]


def for_compressor(compressor, memory, compressor_params):
    """The memory a compressor runs with: ``memory`` (a name or instance), or
    the compressor's documented default when None. The codec's own parameters
    of its default memory (DGC's momentum, SIGNUM's beta) go to that memory
    also when it is named explicitly; given with another memory they would do
    nothing, so they are refused."""
    if memory is None or memory == compressor.default_memory:
        return get(compressor.default_memory, **compressor.default_memory_params())
    unused = sorted(set(compressor_params) & set(compressor.default_memory_params()))
    if unused:
        raise ValueError(
            "%s sets %s's %r memory, but memory=%r was given: drop %s or use memory=%r"
            % (", ".join(unused), compressor.name, compressor.default_memory, memory,
               ", ".join(unused), compressor.default_memory))
    return get(memory)


def is_builtin(memory):
    """Whether ``memory`` is one of this library's memories (the ones the fused
    group ops implement), not a subclass or a memory of the user's own."""
    return type(memory) is _REGISTRY.get(memory.name)


__all__ = ["Memory", "NAMES", "for_compressor", "get", "is_builtin"]
