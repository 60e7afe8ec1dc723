"""``DistributedOptimizer`` for Keras 3: gradients averaged by MergeComp (or plain Horovod)
before the wrapped optimizer uses them.

``optimizer.apply(grads, variables)`` (which ``apply_gradients`` and Keras 3's ``fit``
call) first reduces the gradients across the ranks, then runs the wrapped optimizer's
own ``apply``, so clipping, loss scaling, gradient accumulation and EMA all see the
averaged gradients, identical on every rank (docs/keras3.md, "Where the average
happens"). A ``LossScaleOptimizer`` goes inside: ``DistributedOptimizer(
LossScaleOptimizer(opt))``, so that every rank skips an overflowing step together.
"""

import functools
import inspect
import logging

import keras
import tensorflow as tf

from tf_mergecomp.mergecomp import MergeComp

logger = logging.getLogger("tf_mergecomp")

_MARK = "_tf_mergecomp_distributed"
_HOLDER = "_tf_mergecomp_keras"
_classes = {}


class _Settings:
    """What a distributed optimizer keeps besides the wrapped one's state (not tracked)."""

    def __init__(self, compression, op, process_set, device, original_class):
        self.compression = compression
        self.op = op
        self.process_set = process_set
        self.device = device
        self.original_class = original_class
        self.reduce = make_reduce_fn(compression, op, process_set, device)


def _check_compression(compression):
    import horovod.tensorflow as hvd

    if compression is None or isinstance(compression, MergeComp):
        return compression
    if isinstance(compression, type) and issubclass(compression, hvd.compression.Compressor):
        return compression
    raise TypeError(
        "compression must be a tf_mergecomp.MergeComp, None (a plain Horovod allreduce) or one "
        "of Horovod's compressions (hvd.Compression.none, hvd.Compression.fp16); got %r"
        % (compression,))


def make_reduce_fn(compression, op=None, process_set=None, device=""):
    """Horovod's ``allreduce_grads(grads, vars=None, use_generic_names=False)`` for
    ``compression``: MergeComp's reduce (through tf_mergecomp's Horovod hook), or
    Horovod's own per-tensor allreduce for None or a Horovod compression."""
    import horovod.tensorflow as hvd
    import tf_mergecomp  # noqa: F401 (installs the Horovod hook)

    compression = _check_compression(compression)
    if compression is None:
        compression = hvd.Compression.none
    op = hvd.Average if op is None else op
    if op not in (hvd.Average, hvd.Sum):
        raise ValueError("op must be hvd.Average or hvd.Sum, got %r" % (op,))
    process_set = hvd.global_process_set if process_set is None else process_set
    return hvd._make_allreduce_grads_fn(
        "DistributedOptimizer", device, device, compression, False, op, 1.0, None, process_set)


def _refuse_conditional_apply():
    graph = tf.compat.v1.get_default_graph()
    if type(graph).__name__ == "CondBranchFuncGraph":
        raise RuntimeError(
            "tf_mergecomp.keras.DistributedOptimizer.apply was called inside a conditional "
            "(a LossScaleOptimizer around the DistributedOptimizer skips it on the ranks whose "
            "own gradients overflowed, and the others would wait for them forever). Wrap the other "
            "way round: DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt), ...)")


class _DistributedMixin:
    """Reduces the gradients across the ranks at the start of ``apply``."""

    _tf_mergecomp_distributed = True

    def apply(self, grads, trainable_variables=None):
        _refuse_conditional_apply()
        settings = getattr(self, _HOLDER)
        grads = list(grads)
        if any(g is not None for g in grads):
            # Without the variables: Horovod's reduce is a tf.function, which
            # cannot take Keras 3 variables as arguments; the collectives are
            # named by position, the same on every rank.
            grads = list(settings.reduce(grads, None))
        return super().apply(grads, trainable_variables)

    @property
    def compression(self):
        return getattr(self, _HOLDER).compression


def _distributed_class(base):
    cls = _classes.get(base)
    if cls is None:
        cls = type(base.__name__, (_DistributedMixin, base), {
            "__module__": base.__module__, "__qualname__": base.__qualname__,
            "__doc__": base.__doc__})
        _classes[base] = cls
    return cls


def is_distributed(optimizer):
    """Whether ``optimizer`` was made by ``DistributedOptimizer``."""
    return getattr(type(optimizer), _MARK, False)


def DistributedOptimizer(optimizer, compression=None, op=None, process_set=None, device=""):
    """Makes a Keras 3 optimizer average its gradients across the Horovod ranks.

    Args:
      optimizer: a Keras 3 optimizer (any; a ``LossScaleOptimizer`` too).
      compression: a ``MergeComp`` (its groups, codec and partition search), or
        None for Horovod's plain per-tensor allreduce (also Horovod's
        ``hvd.Compression.fp16``).
      op: ``hvd.Average`` (default) or ``hvd.Sum``.
      process_set: a Horovod process set (default: all ranks).
      device: where Horovod's plain allreduce runs (Horovod's ``device_dense``).

    Returns ``optimizer``, now distributed: its class is swapped for a subclass
    named like it, so a saved model loads without this library. With a MergeComp,
    the optimizer tracks it: ``tf.train.Checkpoint(optimizer=...)`` holds its
    state, and Keras' ``.keras`` / ``.weights.h5`` files hold its step and this
    rank's state (docs/keras3.md, "Checkpoints").
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError("DistributedOptimizer wraps a Keras 3 optimizer (keras.optimizers.*), "
                        "got %r" % (optimizer,))
    if is_distributed(optimizer):
        raise ValueError("this optimizer is already a DistributedOptimizer")
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None and is_distributed(inner):
        raise ValueError(
            "the LossScaleOptimizer wraps a DistributedOptimizer already; wrap the other way "
            "round: DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt), ...)")
    settings = _Settings(_check_compression(compression), op, process_set, device,
                         type(optimizer))
    optimizer.__class__ = _distributed_class(type(optimizer))
    object.__setattr__(optimizer, _HOLDER, settings)
    if isinstance(compression, MergeComp):
        from tf_mergecomp.keras import state

        optimizer.mergecomp = compression  # tracked: TF checkpoints hold its state
        object.__setattr__(optimizer, "mergecomp_state", state.KerasMergeCompState(compression))
    _install_compile_check()
    return optimizer


def _unwrap(optimizer):
    """Makes a distributed optimizer plain again; returns its settings."""
    settings = getattr(optimizer, _HOLDER)
    optimizer.__class__ = settings.original_class
    object.__delattr__(optimizer, _HOLDER)
    if "mergecomp_state" in vars(optimizer):
        object.__delattr__(optimizer, "mergecomp_state")
    return settings


def _log_rank0(message):
    import horovod.tensorflow as hvd

    if not hvd.is_initialized() or hvd.rank() == 0:
        logger.warning(message)


def settle_jit_compile(model, jit_argument):
    """After ``compile``: XLA cannot hold Horovod's collectives. An explicit
    ``jit_compile=True`` is refused; the default ("auto") is set to False,
    saying so in one line."""
    if jit_argument is True:
        raise ValueError(
            "jit_compile=True compiles the train step with XLA, which cannot run Horovod's "
            "collectives (tf_mergecomp.keras.DistributedOptimizer); compile with "
            "jit_compile=False or leave the default ('auto')")
    if jit_argument == "auto":
        was = bool(model.jit_compile)
        model.jit_compile = False
        _log_rank0("tf_mergecomp.keras: jit_compile='auto' -> False (%s): the train step runs "
                   "as a tf.function without XLA, which cannot hold Horovod's collectives"
                   % ("XLA would have been used here" if was else "as Keras chose here"))


def _install_compile_check():
    # Patched where it is defined (Keras' Trainer), so that Keras still sees the
    # models' compile as its own (compile_from_config, when loading, checks).
    owner = next(k for k in keras.Model.__mro__ if "compile" in vars(k))
    original = vars(owner)["compile"]
    if getattr(original, _MARK, False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def compile(self, *args, **kwargs):  # noqa: A001 (Keras' name)
        arguments = signature.bind(self, *args, **kwargs)
        arguments.apply_defaults()
        optimizer = arguments.arguments.get("optimizer")
        if not is_distributed(optimizer):
            return original(self, *args, **kwargs)
        jit_argument = arguments.arguments.get("jit_compile", "auto")
        if jit_argument is True:
            settle_jit_compile(self, True)
        result = original(self, *args, **kwargs)
        if self.optimizer is not optimizer and is_distributed(
                getattr(self.optimizer, "inner_optimizer", None)):
            # A mixed_float16 policy: compile put a LossScaleOptimizer around the
            # distributed one. Re-wrap, to average before the overflow check.
            settings = _unwrap(optimizer)
            DistributedOptimizer(self.optimizer, compression=settings.compression,
                                 op=settings.op, process_set=settings.process_set,
                                 device=settings.device)
            _log_rank0("tf_mergecomp.keras: compile wrapped the DistributedOptimizer in a "
                       "LossScaleOptimizer (mixed_float16); averaging the loss-scaled gradients "
                       "before its overflow check instead")
        settle_jit_compile(self, jit_argument)
        return result

    setattr(compile, _MARK, True)
    owner.compile = compile


# Horovod's reduce functions for None and Horovod's compressions, which live as long as the
# process: an eager call reuses its traced function. A MergeComp's function holds the
# MergeComp, so it is made at each call (the MergeComp keeps its own traced function), and
# a MergeComp its user drops can be collected.
_reduce_functions = {}


def _reduce_function(compression, op, process_set):
    if isinstance(compression, MergeComp):
        return make_reduce_fn(compression, op, process_set)
    key = (id(compression), op, id(process_set))
    entry = _reduce_functions.get(key)
    if entry is None or entry[0] is not compression:
        entry = _reduce_functions[key] = (compression, make_reduce_fn(compression, op, process_set))
    return entry[1]


def reduce_gradients(grads, variables=None, compression=None, op=None, process_set=None):
    """Averages ``grads`` (a list, None entries allowed) across the ranks with
    ``compression`` (a MergeComp, or None for Horovod's plain allreduce); for
    custom loops. Returns the list of reduced gradients. Call it on every rank
    with the same gradient list, inside or outside a ``tf.function``."""
    grads = list(grads)
    if variables is not None:
        variables = list(variables)
        if len(variables) != len(grads):
            raise ValueError("reduce_gradients got %d gradients and %d variables"
                             % (len(grads), len(variables)))
    return list(_reduce_function(compression, op, process_set)(grads, None))
