"""Error-feedback state checkpoints with the optimizer and restores exactly."""

import sys

import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

from tests.horovodrun import report
from tests.workers.common import classification_data, small_classifier
from tf_mergecomp import MergeComp

hvd.init()
directory = sys.argv[1]
x, y = classification_data(hvd.rank(), n=128)
loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def build():
    model = small_classifier()
    mc = MergeComp("dgc", ratio=0.1, partitions=2)
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), compression=mc)
    model.compile(optimizer, loss=loss)
    return model, mc, optimizer


model, mc, optimizer = build()
model.fit(x, y, batch_size=32, epochs=1, verbose=0)
saved = {v.name: v.numpy() for v in mc.variables}
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
path = checkpoint.save(directory + "/rank%d/ckpt" % hvd.rank())

restored_model, restored_mc, restored_optimizer = build()
tf.train.Checkpoint(model=restored_model, optimizer=restored_optimizer).restore(path)
# MergeComp state is created at the first trace and restored into then (deferred restore).
restored_model.fit(x[:32], y[:32], batch_size=32, epochs=1, verbose=0)
model.fit(x[:32], y[:32], batch_size=32, epochs=1, verbose=0)
after = {v.name: v.numpy() for v in mc.variables}
restored_after = {v.name: v.numpy() for v in restored_mc.variables}
report(
    state_names=sorted(saved),
    nonzero_state=float(sum(np.abs(v).sum() for k, v in saved.items() if "momentum" in k or "accumulation" in k)),
    max_difference=max(float(np.max(np.abs(after[k] - restored_after[k]))) for k in after),
    same_keys=sorted(after) == sorted(restored_after),
)
