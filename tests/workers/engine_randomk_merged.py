"""Random-k merged trains exactly as random-k layer-wise.

A merged group samples each tensor with the draws the tensor gets as a group of
its own (k_i per tensor), so only the number of collectives changes: the same
model trained with partitions "layerwise", 3 and 1 must end with identical
weights. Reports, per partition, the largest weight difference from the
layer-wise run and the collectives executed.
"""

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

from tests.horovodrun import report
from tests.workers.common import classification_data, small_classifier, tape_train_step
from tf_mergecomp import MergeComp

hvd.init()
x, y = classification_data(hvd.rank())
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
STEPS = 20


def train(partitions):
    model = small_classifier()
    mergecomp = MergeComp("randomk", partitions=partitions, ratio=0.2)
    sgd = tf.keras.optimizers.SGD(0.1)

    train_step = tf.function(tape_train_step(model, sgd, loss_fn, mergecomp))

    for step in range(STEPS):
        i = (step * 32) % len(x)
        train_step(x[i:i + 32], y[i:i + 32])
    return [w.numpy() for w in model.trainable_variables], mergecomp


layerwise, _ = train("layerwise")
for partitions in ("layerwise", 3, 1):
    weights, mergecomp = train(partitions)
    report(partitions=partitions, groups=mergecomp.num_groups,
           collectives=int(mergecomp.collectives_executed.numpy()),
           max_difference=float(max(np.max(np.abs(a - b)) for a, b in zip(weights, layerwise))),
           moved=float(max(np.max(np.abs(a - b)) for a, b in
                           zip(weights, [w.numpy() for w in small_classifier().trainable_variables]))))
