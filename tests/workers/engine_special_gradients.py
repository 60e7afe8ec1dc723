"""Keras fit on a model with an embedding (IndexedSlices), an unused variable and batch norm."""

import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

from tests.horovodrun import report
from tests.workers.common import weights_checksum
from tf_mergecomp import MergeComp

hvd.init()


class WithUnusedVariable(tf.keras.layers.Layer):
    """Adds a trainable variable that the loss never touches (its gradient is None)."""

    def build(self, input_shape):
        self.unused = self.add_weight(name="unused", shape=(3,), initializer="ones")

    def call(self, inputs):
        return inputs


tf.keras.utils.set_random_seed(3)
tokens = tf.keras.Input(shape=(6,), dtype="int32")
h = tf.keras.layers.Embedding(50, 8)(tokens)
h = tf.keras.layers.GlobalAveragePooling1D()(h)
h = tf.keras.layers.Dense(16)(h)
h = tf.keras.layers.BatchNormalization()(h)
h = tf.keras.layers.Activation("relu")(h)
h = WithUnusedVariable()(h)
logits = tf.keras.layers.Dense(2)(h)
model = tf.keras.Model(tokens, logits)

rng = np.random.RandomState(hvd.rank())
x = rng.randint(0, 50, size=(256, 6)).astype("int32")
y = (x[:, 0] < 25).astype("int32")
mc = MergeComp("efsignsgd", partitions=2)
model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), compression=mc),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=6, verbose=0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
report(checksum=weights_checksum(model), losses=history.history["loss"],
       tensors=mc.num_tensors, trainable=len(model.trainable_variables), groups=mc.num_groups)

# Horovod's backward_passes_per_step: local aggregation, then one MergeComp
# reduction (one collective per group) every second batch.
from tests.workers.common import classification_data, small_classifier  # noqa: E402

model = small_classifier()
x, y = classification_data(hvd.rank(), n=128)
mc = MergeComp("topk", ratio=0.3, partitions=2)
model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=mc,
                                       backward_passes_per_step=2),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
report(aggregated=True, checksum=weights_checksum(model), losses=history.history["loss"],
       batches=3 * 128 // 16, reductions=int(mc.step.numpy()),
       collectives=int(mc.collectives_executed.numpy()), groups=mc.num_groups)
