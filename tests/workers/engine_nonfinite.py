"""Loss-scale overflow and non-finite gradients on real ranks.

argv[1] == "loss_scale": a LossScaleOptimizer around Horovod's
DistributedOptimizer under mixed_float16, starting at a loss scale of 2**40 (so
the first steps overflow), for each algorithm in argv[2:] and for stock Horovod:
the scale must settle, the weights move and agree on both ranks, and the
compression state and the step stay finite and sane.

argv[1] == "raise": rank 1's gradient turns NaN at step 3 with
nonfinite="raise": every rank must raise InvalidArgumentError naming the
variable, after the same number of steps, without waiting on the other.
"""

import sys

import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

from tests.horovodrun import report
from tests.workers.common import classification_data, small_classifier, weights_checksum
from tf_mergecomp import MergeComp

hvd.init()
x, y = classification_data(hvd.rank(), n=256)
loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def loss_scale_run(name):
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    model = small_classifier()
    initial = [w.numpy().copy() for w in model.trainable_variables]
    compression = hvd.Compression.none if name == "stock" else MergeComp(name, partitions=2)
    optimizer = tf.keras.mixed_precision.LossScaleOptimizer(
        hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), compression=compression),
        initial_scale=2.0 ** 40)
    model.compile(optimizer, loss=loss)
    model.fit(x, y, batch_size=16, epochs=4, verbose=0, shuffle=False)
    moved = max(float(np.abs(w.numpy() - w0).max())
                for w, w0 in zip(model.trainable_variables, initial))
    result = dict(algorithm=name, loss_scale=float(optimizer.loss_scale.numpy()),
                  moved=moved, checksum=weights_checksum(model),
                  steps_run=int(optimizer.iterations.numpy()),
                  loss=float(model.evaluate(x, y, verbose=0)))
    if name != "stock":
        state = [v.numpy() for v in compression.state_variables()]
        result.update(state_finite=bool(all(np.isfinite(s).all() for s in state)),
                      state_nonzero=bool(any(np.abs(s).sum() > 0 for s in state)),
                      step=int(compression.step.numpy()))
    tf.keras.mixed_precision.set_global_policy("float32")
    report(**result)


def raise_run():
    model = small_classifier()
    compression = MergeComp("efsignsgd", partitions=2, nonfinite="raise")
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), compression=compression),
                  loss=loss)
    poison = np.float32(np.nan) if hvd.rank() == 1 else np.float32(0.0)
    steps = 0
    for step in range(6):
        batch = x[16 * step:16 * (step + 1)].copy()
        if step == 3:
            batch[0, 0] = poison
        try:
            model.train_on_batch(batch, y[16 * step:16 * (step + 1)])
        except tf.errors.InvalidArgumentError as error:
            lines = [line for line in str(error).splitlines() if "non-finite" in line]
            report(raised_at=step, message=(lines or [str(error)])[0][:600])
            return
        steps += 1
    report(raised_at=None, steps=steps)


if sys.argv[1] == "loss_scale":
    for algorithm in sys.argv[2:]:
        loss_scale_run(algorithm)
else:
    raise_run()
