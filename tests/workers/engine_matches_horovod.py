"""MergeComp("none") must average exactly what stock Horovod averages."""

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

from tests.horovodrun import report
from tests.workers.common import classification_data, small_classifier
from tf_mergecomp import MergeComp

hvd.init()
model = small_classifier()
x, y = classification_data(hvd.rank(), n=32)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def averaged_gradients(compression, use_function):
    def compute():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        return tape.gradient(loss, model.trainable_variables)
    if use_function:
        compute = tf.function(compute)
    return [g.numpy() for g in compute()]


stock = averaged_gradients(hvd.Compression.none, use_function=True)
for partitions in ("layerwise", 1, 3):
    for use_function in (True, False):
        mc = MergeComp("none", partitions=partitions)
        ours = averaged_gradients(mc, use_function)
        error = max(float(np.max(np.abs(a - b))) for a, b in zip(stock, ours))
        report(partitions=partitions, function=use_function, max_abs_error=error,
               groups=mc.num_groups, collectives=int(mc.collectives_executed.numpy()))
