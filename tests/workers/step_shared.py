"""MergeComp's step is shared: broadcast with the optimizer's variables, saved in HDF5,
and rank 0's at the first step even when the ranks start with different steps.

Usage: step_shared.py DIRECTORY
"""

import os
import sys

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd

from tests.horovodrun import report
from tests.workers.common import (classification_data, small_classifier, tape_train_step,
                                   weights_checksum)
from tf_mergecomp import MergeComp

hvd.init()
directory = sys.argv[1]
x, y = classification_data(hvd.rank(), n=64)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def build():
    model = small_classifier()
    mc = MergeComp("randomk", ratio=0.2, partitions=2)
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.5),
                                           compression=mc), loss=loss_fn)
    return model, mc


# optimizer.variables() holds the step, and none of the per-rank state.
model, mc = build()
model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
listed = {v.ref() for v in model.optimizer.variables()}
report(check="variables", step_listed=mc.step.ref() in listed,
       state_listed=any(v.ref() in listed for v in mc.existing_state_variables()),
       origin_listed=mc.state_origin.ref() in listed,
       optimizer_own=len(model.optimizer._variables), listed=len(listed))

# hvd.broadcast_variables(opt.variables()) sends the step.
mc.step.assign(100 + 7 * hvd.rank())
hvd_tf.broadcast_variables(model.optimizer.variables(), root_rank=0)
report(check="broadcast", step=int(mc.step.numpy()))

# The whole model in HDF5 (rank 0), loaded on every rank: the step comes back.
mc.step.assign(42)
path = os.path.join(directory, "model.h5")
if hvd.rank() == 0:
    model.save(path)
hvd_tf.allreduce(tf.constant(0), name="saved")  # rank 0 has written the file
loaded_mc = MergeComp("randomk", ratio=0.2, partitions=2)
loaded = hvd.load_model(path, compression=loaded_mc)
same = all(np.array_equal(a.numpy(), b.numpy()) for a, b in
           zip(model.optimizer.variables(), loaded.optimizer.variables()))
step_loaded = int(loaded_mc.step.numpy())
# HDF5 holds no per-rank state: the first trace says the state starts from zero.
reduce_fn = loaded_mc.make_reduce_fn()
specs = [tf.TensorSpec(v.shape, v.dtype) for v in loaded.trainable_variables]
tf.function(lambda grads: reduce_fn(grads)).get_concrete_function(specs)
report(check="h5", step=step_loaded, same_optimizer_values=same,
       warning=loaded_mc.rank_state.last_outcome["warning"],
       state_abs_sum=float(sum(np.abs(v.numpy()).sum() for v in loaded_mc._state)))

# Ranks that start at different steps draw random-k indices from rank 0's step
# from the first step on (Keras fit, then a DistributedGradientTape loop).
model, mc = build()
mc.step.assign(5 * hvd.rank())
model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
report(check="fit_steps_differ", step=int(mc.step.numpy()), checksum=weights_checksum(model))

model = small_classifier()
mc = MergeComp("randomk", ratio=0.2, partitions=2)
mc.step.assign(3 * hvd.rank())
sgd = tf.keras.optimizers.SGD(0.05)

train_step = tf.function(tape_train_step(model, sgd, loss_fn, mc))

for start in (0, 32, 0, 32):
    train_step(x[start:start + 32], y[start:start + 32])
report(check="tape_steps_differ", step=int(mc.step.numpy()), checksum=weights_checksum(model))
