"""Switches a group to plain and back, then steps aside for plain Horovod and back.

Custom loop, DistributedGradientTape, topk in 2 groups. Reports per phase the
largest residual of each group's tensors (backprop order) and the weights'
checksum; the test checks that a plain group's residual is flushed (zero),
that it fills again once compressed, and that both ranks hold the same weights.
"""

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

from tests.horovodrun import report
from tests.workers.common import (classification_data, small_classifier, tape_train_step,
                                   weights_checksum)
from tf_mergecomp import MergeComp

hvd.init()
x, y = classification_data(hvd.rank())
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
model = small_classifier()
mc = MergeComp("topk", ratio=0.3, partitions=[2])
sgd = tf.keras.optimizers.SGD(0.1)
step_index = [0]


def train(steps):
    train_step = tf.function(tape_train_step(model, sgd, loss_fn, mc))  # a trace per layout
    losses = []
    for _ in range(steps):
        i = (step_index[0] * 32) % len(x)
        step_index[0] += 1
        losses.append(float(train_step(x[i:i + 32], y[i:i + 32])))
    return losses


def phase(name, steps, **facts):
    before = int(mc.collectives_executed.numpy())
    losses = train(steps)
    residuals = [float(np.abs(v.numpy()).max()) for v in mc.state_variables()]
    report(phase=name, losses=losses, residual_max=residuals, checksum=weights_checksum(model),
           collectives=int(mc.collectives_executed.numpy()) - before,
           group_codecs=None if mc.group_codecs is None else list(mc.group_codecs),
           splits=list(mc.splits), **facts)


phase("compressed", 5)
mc.set_partition([2], group_codecs=["none", "topk"])
phase("group0_plain", 1)
phase("group0_plain_more", 3)
mc.set_partition([2])
phase("compressed_again", 3)
mc.set_plain_horovod()
phase("plain_horovod", 2, steps_aside=mc.steps_aside)
mc.set_partition([2])
phase("back_to_mergecomp", 3)
