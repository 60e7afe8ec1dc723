"""Keras 3 callbacks: the initial broadcast, metric averaging, the partition search in ``fit``."""

import keras
import numpy as np
import tensorflow as tf

from tf_mergecomp.keras.optimizer import settle_jit_compile
from tf_mergecomp.mergecomp import find_mergecomp
from tf_mergecomp.search.fit import FitSearchHooks


def _refuse_xla(model):
    if getattr(model, "jit_compile", False):
        settle_jit_compile(model, True)  # raises: set to True after compile


def broadcast_variables(model, root_rank=0, process_set=None):
    """Sends rank ``root_rank``'s weights, optimizer variables and MergeComp step to
    every rank; call it on every rank. Keras 3 creates an optimizer's variables
    lazily (at its first ``apply``, or when ``fit`` builds the model): an optimizer
    not built yet is built first, so its slots exist when they are sent."""
    import horovod.tensorflow as hvd

    optimizer = getattr(model, "optimizer", None)
    variables = list(model.variables)
    if optimizer is not None:
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        variables += list(optimizer.variables)
        mergecomp = find_mergecomp(optimizer)
        if mergecomp is not None:
            variables.append(mergecomp.step)
    plain = []
    for variable in variables:
        if isinstance(variable, keras.Variable):
            variable = variable._value if hasattr(variable, "_value") else variable.value
        plain.append(variable)
    hvd.broadcast_variables(plain, root_rank=root_rank,
                            process_set=hvd.global_process_set if process_set is None
                            else process_set)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcasts rank ``root_rank``'s model and optimizer state at the start of training."""

    def __init__(self, root_rank=0, process_set=None):
        super().__init__()
        if isinstance(root_rank, bool) or not isinstance(root_rank, int) or root_rank < 0:
            raise ValueError("root_rank must be a rank (an int >= 0, not a bool), got %r"
                             % (root_rank,))
        self.root_rank = root_rank
        self.process_set = process_set
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        _refuse_xla(self.model)
        if self.broadcast_done:
            return
        broadcast_variables(self.model, self.root_rank, self.process_set)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Averages the numeric entries of each epoch's logs (loss, metrics, validation
    metrics) over the ranks (list it before callbacks that read the logs: Keras runs
    them in order)."""

    def __init__(self, process_set=None):
        super().__init__()
        self.process_set = process_set

    def on_epoch_end(self, epoch, logs=None):
        import horovod.tensorflow as hvd

        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0
                      and isinstance(np.asarray(v).item(), (int, float)))
        if not keys:
            return
        values = tf.constant([float(logs[k]) for k in keys], tf.float64)
        averaged = hvd.allreduce(values, op=hvd.Average, name="tf_mergecomp.keras.metrics.%d"
                                 % len(keys), process_set=hvd.global_process_set
                                 if self.process_set is None else self.process_set).numpy()
        for key, value in zip(keys, averaged):
            logs[key] = float(value)


class MergeCompCallback(FitSearchHooks, keras.callbacks.Callback):
    """Searches the fastest partition for ``compression`` while a Keras 3 model trains.

    The arguments are tf_mergecomp.MergeCompCallback's; ``compression`` is the
    MergeComp given to ``DistributedOptimizer``.
    """

    def on_train_begin(self, logs=None):
        _refuse_xla(self.model)
        if find_mergecomp(self.model) is not self.compression:
            raise ValueError(
                "MergeCompCallback's MergeComp is not the one the model's optimizer uses: pass "
                "the MergeComp given to tf_mergecomp.keras.DistributedOptimizer(compression=...)")
        self._begin_search(self.model)
