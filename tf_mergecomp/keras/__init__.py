"""MergeComp for Keras 3 on the TensorFlow backend (``tf.keras`` of TensorFlow >= 2.16).

Horovod 0.28.1's Keras wrappers do not work under Keras 3 (docs/keras3.md); this module is
the Keras 3 route, built on Horovod's TensorFlow collectives and MergeComp's reduce function::

    import keras
    import horovod.tensorflow as hvd
    import tf_mergecomp.keras as mck
    from tf_mergecomp import MergeComp

    hvd.init()
    compression = MergeComp("efsignsgd")          # or None: plain Horovod allreduce
    model.compile(mck.DistributedOptimizer(keras.optimizers.SGD(0.01), compression=compression),
                  loss=...)
    model.fit(..., callbacks=[mck.BroadcastGlobalVariablesCallback(0),
                              mck.MetricAverageCallback(),
                              mck.MergeCompCallback(compression)])   # the partition search

Custom loops: ``mck.DistributedGradientTape(tape, compression=...)`` or
``mck.reduce_gradients(grads, variables, compression)``.
"""

import keras as _keras


def _check_keras():
    version = getattr(_keras, "__version__", "0")
    if int(version.split(".")[0]) < 3:
        raise ImportError(
            "tf_mergecomp.keras is for Keras 3; the keras package here is Keras %s. With Keras 2 "
            "use Horovod's own wrappers: hvd.DistributedOptimizer(opt, compression=MergeComp(...)) "
            "from horovod.tensorflow.keras (README, Usage)." % version)
    backend = _keras.backend.backend()
    if backend != "tensorflow":
        raise ImportError(
            "tf_mergecomp.keras needs Keras 3 on the TensorFlow backend; this Keras runs on %r. "
            "MergeComp's group ops and Horovod's TensorFlow collectives are TensorFlow ops: set "
            "KERAS_BACKEND=tensorflow before keras is first imported (valid here: 'tensorflow')."
            % backend)


_check_keras()

from tf_mergecomp.keras.optimizer import (  # noqa: E402
    DistributedOptimizer, is_distributed, reduce_gradients)
from tf_mergecomp.keras.tape import DistributedGradientTape  # noqa: E402
from tf_mergecomp.keras.callbacks import (  # noqa: E402
    BroadcastGlobalVariablesCallback, MergeCompCallback, MetricAverageCallback,
    broadcast_variables)
from tf_mergecomp.keras.state import restore_rank_state, save_rank_state  # noqa: E402

__all__ = ["BroadcastGlobalVariablesCallback", "DistributedGradientTape", "DistributedOptimizer",
           "MergeCompCallback", "MetricAverageCallback", "broadcast_variables", "is_distributed",
           "reduce_gradients", "restore_rank_state", "save_rank_state"]
