"""Horovod's rank-0 checkpoint practice with MergeComp, against an uninterrupted run.

Usage: checkpoint_rank0.py DIRECTORY COMPRESSOR[,COMPRESSOR...]

Each run trains the same model for PHASE_EPOCHS, checkpoints, builds a new
model, restores and trains PHASE_EPOCHS more. Per compressor, reports the
largest weight difference from the uninterrupted run for:

- ``stock``: stock ModelCheckpoint on rank 0, ``model.load_weights`` on every rank.
  Also reports the state each rank holds once the restored model has traced
  (before it trains): how far it is from zero and whether it equals rank 0's.
- ``keras_weights``: MergeCompModelCheckpoint (TF weights) on every rank,
  ``load_weights`` + ``restore_rank_state``.
- ``keras_h5``: MergeCompModelCheckpoint (whole model, HDF5), ``checkpoint.load_model``.
- ``tape``: a DistributedGradientTape loop with ``checkpoint.save`` / ``checkpoint.restore``.

Each also reports the warnings MergeComp logged and its last reconcile outcome.
"""

import os
import sys

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd

from tests.horovodrun import report
from tests.workers.common import (capture_warnings, classification_data, small_classifier,
                                   tape_train_step)
import tf_mergecomp
from tf_mergecomp import MergeComp, checkpoint

hvd.init()
directory, compressors = sys.argv[1], sys.argv[2].split(",")
PHASE_EPOCHS = 2
x, y = classification_data(hvd.rank(), n=96)   # 3 steps of 32 per epoch
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


warnings = capture_warnings()


def build(compressor):
    model = small_classifier()
    mc = MergeComp(compressor, partitions=2, **({"ratio": 0.2} if compressor == "dgc" else {}))
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.5),
                                           compression=mc), loss=loss_fn)
    return model, mc


def fit(model, initial_epoch, callbacks=()):
    model.fit(x, y, batch_size=32, epochs=initial_epoch + PHASE_EPOCHS, initial_epoch=initial_epoch,
              shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)] + list(callbacks))


def weights(model):
    return [w.numpy() for w in model.trainable_variables]


def max_difference(a, b):
    return float(max(np.max(np.abs(u - v)) for u, v in zip(a, b)))


def trace_reduce(model, mc):
    """Traces (without running) the reduce function, as the first step does."""
    reduce_fn = mc.make_reduce_fn()
    specs = [tf.TensorSpec(v.shape, v.dtype) for v in model.trainable_variables]
    tf.function(lambda grads: reduce_fn(grads)).get_concrete_function(specs)


def outcome(mc, started):
    return dict(warnings=warnings.messages[started:], outcome=mc.rank_state.last_outcome,
                step=int(mc.step.numpy()))


for compressor in compressors:
    prefix = os.path.join(directory, compressor)
    model, mc = build(compressor)
    fit(model, 0)
    fit(model, PHASE_EPOCHS)
    reference = weights(model)
    report(compressor=compressor, scenario="reference", step=int(mc.step.numpy()))

    # Stock practice: ModelCheckpoint on rank 0 alone, restore on every rank.
    model, mc = build(compressor)
    stock_path = prefix + "-stock/ckpt"
    fit(model, 0, [tf.keras.callbacks.ModelCheckpoint(stock_path, save_weights_only=True)]
        if hvd.rank() == 0 else [])
    own_state = [v.numpy() for v in mc.existing_state_variables()]
    rank0_state = hvd_tf.broadcast_object(own_state, root_rank=0)
    model, mc = build(compressor)
    started = len(warnings.messages)
    model.load_weights(stock_path)
    trace_reduce(model, mc)
    restored = [v.numpy() for v in mc.existing_state_variables()]
    fit(model, PHASE_EPOCHS)
    report(compressor=compressor, scenario="stock", max_difference=max_difference(weights(model), reference),
           restored_abs_sum=float(sum(np.abs(s).sum() for s in restored)),
           restored_equals_rank0=all(np.array_equal(a, b) for a, b in zip(restored, rank0_state)),
           own_state_abs_sum=float(sum(np.abs(s).sum() for s in own_state)),
           **outcome(mc, started))

    # MergeComp's ModelCheckpoint on every rank, TF-format weights.
    model, mc = build(compressor)
    weights_path = prefix + "-weights/epoch{epoch}"
    fit(model, 0, [checkpoint.MergeCompModelCheckpoint(weights_path, save_weights_only=True)])
    saved_path = weights_path.format(epoch=PHASE_EPOCHS)
    model, mc = build(compressor)
    started = len(warnings.messages)
    model.load_weights(saved_path)
    found = checkpoint.restore_rank_state(model, saved_path)
    fit(model, PHASE_EPOCHS)
    report(compressor=compressor, scenario="keras_weights", found=found,
           max_difference=max_difference(weights(model), reference), **outcome(mc, started))

    # Whole model in HDF5, loaded with hvd.load_model.
    model, mc = build(compressor)
    h5_path = prefix + "-model.h5"
    fit(model, 0, [checkpoint.MergeCompModelCheckpoint(h5_path)])
    mc = MergeComp(compressor, partitions=2, **({"ratio": 0.2} if compressor == "dgc" else {}))
    started = len(warnings.messages)
    model = checkpoint.load_model(h5_path, compression=mc)
    fit(model, PHASE_EPOCHS)
    report(compressor=compressor, scenario="keras_h5",
           max_difference=max_difference(weights(model), reference), **outcome(mc, started))

    # A custom loop with DistributedGradientTape and tf.train.Checkpoint.
    def tape_run(steps, restore_from=None):
        model = small_classifier()
        mc = MergeComp(compressor, partitions=2, **({"ratio": 0.2} if compressor == "dgc" else {}))
        sgd = tf.keras.optimizers.SGD(0.05, momentum=0.5)
        ckpt = tf.train.Checkpoint(model=model, optimizer=sgd, mergecomp=mc)
        if restore_from:
            checkpoint.restore(ckpt, restore_from, mc)

        train_step = tf.function(tape_train_step(model, sgd, loss_fn, mc))

        for step in steps:
            i = (step * 32) % len(x)
            train_step(x[i:i + 32], y[i:i + 32])
        return model, mc, ckpt

    model, mc, _ = tape_run(range(12))
    tape_reference = weights(model)
    model, mc, ckpt = tape_run(range(6))
    tape_path = checkpoint.save(ckpt, mc, prefix + "-tape/ckpt")
    started = len(warnings.messages)
    model, mc, _ = tape_run(range(6, 12), restore_from=tape_path)
    report(compressor=compressor, scenario="tape", path=tape_path,
           max_difference=max_difference(weights(model), tape_reference), **outcome(mc, started))

report(scenario="done", version=tf_mergecomp.__version__)
