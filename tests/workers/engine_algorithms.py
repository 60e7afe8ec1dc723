"""Trains the small classifier with every algorithm through Horovod's own wrappers.

For each algorithm: a custom loop with DistributedGradientTape in a tf.function
(3 groups), then Keras fit with DistributedOptimizer (layer-wise). Reports the
weights checksum, the losses, and the collectives executed vs expected.
"""

import sys

import tensorflow as tf
import horovod.tensorflow.keras as hvd

from tests.horovodrun import report
from tests.workers.common import (classification_data, small_classifier, tape_train_step,
                                   weights_checksum)
from tf_mergecomp import MergeComp, compressors

hvd.init()
# Small models need denser sparsifiers than the papers' 1% to learn in a few steps.
PARAMS = {"topk": {"ratio": 0.3}, "dgc": {"ratio": 0.3}, "randomk": {"ratio": 0.3}}
LEARNING_RATE = {"signsgd": 0.01, "signum": 0.01, "onebit": 0.05, "efsignsgd": 0.05}
algorithms = sys.argv[1].split(",") if len(sys.argv) > 1 else list(compressors.NAMES)
x, y = classification_data(hvd.rank())
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

for name in algorithms:
    lr = LEARNING_RATE.get(name, 0.1)
    # Custom loop, DistributedGradientTape, 3 groups.
    model = small_classifier()
    mc = MergeComp(name, partitions=3, **PARAMS.get(name, {}))
    sgd = tf.keras.optimizers.SGD(lr)

    train_step = tf.function(tape_train_step(model, sgd, loss_fn, mc))

    losses = []
    steps = 30
    for step in range(steps):
        i = (step * 32) % len(x)
        losses.append(float(train_step(x[i:i + 32], y[i:i + 32])))
    per_step = mc.num_groups * mc.compressor.collectives_per_group()
    report(algorithm=name, mode="tape", checksum=weights_checksum(model),
           first_loss=sum(losses[:5]) / 5, last_loss=sum(losses[-5:]) / 5,
           collectives=int(mc.collectives_executed.numpy()), expected=per_step * steps,
           groups=mc.num_groups)

    # Keras fit, DistributedOptimizer, layer-wise.
    model = small_classifier()
    mc = MergeComp(name, partitions="layerwise", **PARAMS.get(name, {}))
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(lr), compression=mc), loss=loss_fn)
    history = model.fit(x, y, batch_size=32, epochs=4, verbose=0)
    steps = 4 * len(x) // 32
    per_step = mc.num_groups * mc.compressor.collectives_per_group()
    report(algorithm=name, mode="fit", checksum=weights_checksum(model),
           first_loss=history.history["loss"][0], last_loss=history.history["loss"][-1],
           collectives=int(mc.collectives_executed.numpy()), expected=per_step * steps,
           groups=mc.num_groups)
