"""Rank 1 builds a wider model than rank 0: both must fail fast, naming the mismatch."""

import tensorflow as tf
import horovod.tensorflow.keras as hvd

from tests.workers.common import classification_data
from tf_mergecomp import MergeComp

hvd.init()
width = 16 if hvd.rank() == 0 else 24
model = tf.keras.Sequential([tf.keras.layers.Dense(width, input_shape=(8,)), tf.keras.layers.Dense(4)])
x, y = classification_data(hvd.rank(), n=64)
model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=MergeComp("topk")),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=32, epochs=1, verbose=0)
print("UNEXPECTED: training ran with mismatched models", flush=True)
