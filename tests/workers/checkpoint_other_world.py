"""Restores checkpoints that checkpoint_rank0.py saved with 2 ranks, in a world of another size.

Usage: checkpoint_other_world.py DIRECTORY COMPRESSOR

Reports, for the stock checkpoint (load_weights alone) and for MergeComp's
(load_weights + restore_rank_state): the reconcile outcome, the warnings, the
state each rank holds once traced (its absolute sum) and the step.
"""

import os
import sys

import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

from tests.horovodrun import report
from tests.workers.common import capture_warnings, small_classifier
from tf_mergecomp import MergeComp, checkpoint

hvd.init()
directory, compressor = sys.argv[1], sys.argv[2]
prefix = os.path.join(directory, compressor)


warnings = capture_warnings()


def restored(path, with_rank_state):
    model = small_classifier()
    mc = MergeComp(compressor, partitions=2, **({"ratio": 0.2} if compressor == "dgc" else {}))
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.5),
                                           compression=mc),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    started = len(warnings.messages)
    model.load_weights(path)
    found = checkpoint.restore_rank_state(model, path) if with_rank_state else None
    reduce_fn = mc.make_reduce_fn()
    specs = [tf.TensorSpec(v.shape, v.dtype) for v in model.trainable_variables]
    tf.function(lambda grads: reduce_fn(grads)).get_concrete_function(specs)  # the first trace
    return dict(found=found, warnings=warnings.messages[started:],
                outcome=mc.rank_state.last_outcome, step=int(mc.step.numpy()),
                state_abs_sum=float(sum(np.abs(v.numpy()).sum()
                                        for v in mc.existing_state_variables())))


report(scenario="stock", **restored(prefix + "-stock/ckpt", with_rank_state=False))
report(scenario="keras_weights", **restored(prefix + "-weights/epoch2", with_rank_state=True))
