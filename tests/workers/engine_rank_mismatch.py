"""Ranks that disagree must fail fast on every rank, with an error users can catch.

argv[1]:
  model         rank 1 builds a wider model than rank 0;
  seed          each rank passes its own seed (random-k would draw different indices);
  lone_retrace  a custom loop whose tf.function takes the batch: rank 1's last
                batch is smaller, so it alone re-traces the step: with nothing
                in disagreement it must not wait in a check the other rank
                never joins, and training goes on.
"""

import sys

import tensorflow as tf
import horovod.tensorflow.keras as hvd

import tf_mergecomp
from tests.horovodrun import report
from tests.workers.common import (classification_data, small_classifier, tape_train_step,
                                   weights_checksum)
from tf_mergecomp import MergeComp

hvd.init()
mode = sys.argv[1]
loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
x, y = classification_data(hvd.rank(), n=64)
if mode == "model":
    width = 16 if hvd.rank() == 0 else 24
    model = tf.keras.Sequential([tf.keras.layers.Dense(width, input_shape=(8,)),
                                 tf.keras.layers.Dense(4)])
    compression = MergeComp("topk")
elif mode == "seed":
    model = small_classifier()
    compression = MergeComp("randomk", seed=hvd.rank())
else:
    model = small_classifier()
    compression = MergeComp("topk", ratio=0.25, partitions=2)
    optimizer = tf.keras.optimizers.SGD(0.1)
    traces = []

    step = tape_train_step(model, optimizer, loss, compression)

    @tf.function
    def train_step(features, labels):
        traces.append(features.shape[0])
        return step(features, labels)

    sizes = [16, 16, 16, 16 if hvd.rank() == 0 else 12]
    start = 0
    for size in sizes:
        train_step(tf.constant(x[start:start + size]), tf.constant(y[start:start + size]))
        start += size
    report(caught=None, checksum=weights_checksum(model), step=int(compression.step.numpy()),
           traces=len(traces))
    sys.exit(0)
model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=compression),
              loss=loss)
try:
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
except tf_mergecomp.RankMismatchError as error:
    report(caught=type(error).__name__, message=str(error)[-2000:])
else:
    report(caught=None, checksum=weights_checksum(model), step=int(compression.step.numpy()))
