"""Elastic Keras training with MergeComp whose world grows or shrinks (hvd.elastic.KerasState).

Usage: elastic_resize.py HOSTS_FILE TARGET_SIZE COMPRESSOR [hierarchical]

``hierarchical``: MergeComp(..., hierarchical=True) (the first world two machines of two
ranks, the new one localhost:TARGET_SIZE); the end reports the state's sizes.

The host discovery script prints HOSTS_FILE. After CHANGE_EPOCH committed
epochs rank 0 writes ``localhost:TARGET_SIZE`` into it; training goes on until
AFTER epochs have run in the new world. Before that, at epoch 1, every rank
trains one epoch without committing and calls ``state.restore()``: it reports
whether the model, MergeComp's step and its state came back to the commit.
At the end every rank reports its weights checksum, the step, the world sizes
it trained in and the warnings MergeComp logged. When shrinking, a custom-loop
step traced in the first world (and not rebuilt) is run again at the end: it
reports the error it raises.
"""

import sys
import time

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd

from tests.horovodrun import report
from tests.workers.common import capture_warnings, classification_data, small_classifier, weights_checksum
from tf_mergecomp import MergeComp

hvd.init()
hosts_file, target, compressor = sys.argv[1], int(sys.argv[2]), sys.argv[3]
hierarchical = sys.argv[4:] == ["hierarchical"]
CHANGE_EPOCH, AFTER, MAX_EPOCHS = 3, 2, 40


warnings = capture_warnings()

model = small_classifier()
mc = MergeComp(compressor, partitions=2, hierarchical=True if hierarchical else None,
               **({"ratio": 0.2} if compressor == "dgc" else {}))
model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.5), compression=mc),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.build((None, 8))
state = hvd.elastic.KerasState(model, epoch=0, resized_at=-1)
sizes = []


class Slow(tf.keras.callbacks.Callback):
    # Leaves the discovery (polled each second) time to see the change
    # while the old world is still training.
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.1)


def values(variables):
    return [v.numpy().copy() for v in variables]


def check_restore(x, y):
    committed = (values(model.variables), int(mc.step.numpy()),
                 values(mc.existing_state_variables()))
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)  # not committed
    moved = int(mc.step.numpy()) != committed[1]
    state.restore()
    report(check="restore", moved=moved, two_level=mc.two_level,
           state_size=sum(int(v.shape.num_elements()) for v in mc.existing_state_variables()),
           weights=all(np.array_equal(a, b) for a, b in zip(values(model.variables), committed[0])),
           step=int(mc.step.numpy()) == committed[1],
           state=all(np.array_equal(a, b)
                     for a, b in zip(values(mc.existing_state_variables()), committed[2])))


@hvd.elastic.run
def train(state):
    while True:
        sizes.append(hvd.size())
        if hvd.size() == target and state.resized_at < 0 and state.epoch >= CHANGE_EPOCH:
            state.resized_at = state.epoch
        if (state.resized_at >= 0 and state.epoch >= state.resized_at + AFTER
                or state.epoch >= MAX_EPOCHS):
            return
        x, y = classification_data(hvd.rank(), n=64)
        if state.epoch == 1 and state.resized_at < 0 and len(sizes) == 2:
            check_restore(x, y)
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hvd.elastic.CommitStateCallback(state), Slow()])
        state.epoch += 1
        if state.epoch == CHANGE_EPOCH and hvd.rank() == 0:
            with open(hosts_file, "w") as f:
                f.write("localhost:%d\n" % target)
        state.commit()


def stale_step():
    """A DistributedGradientTape step, traced now and never rebuilt."""
    tape_model = small_classifier()
    tape_mc = MergeComp(compressor, partitions=2)
    x, y = classification_data(hvd.rank(), n=16)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, tape_model(x))
        tape = hvd_tf.DistributedGradientTape(tape, compression=tape_mc)
        return tape.gradient(loss, tape_model.trainable_variables)

    step()
    return step


stale = stale_step() if target < hvd.size() else None
train(state)
if stale is not None:
    try:
        stale()
        report(check="stale", error=None)
    except tf.errors.InvalidArgumentError as error:
        report(check="stale", error=error.message)
report(check="end", rank=hvd.rank(), size=hvd.size(), checksum=weights_checksum(model),
       step=int(mc.step.numpy()), epoch=state.epoch, two_level=mc.two_level,
       state_sizes=[int(v.shape.num_elements()) for v in mc.existing_state_variables()], resized_at=state.resized_at, sizes=sizes,
       warnings=warnings.messages, finite=bool(np.all([np.isfinite(w).all() for w in
                                                         values(model.trainable_variables)])))
