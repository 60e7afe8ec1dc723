"""Keras fit with MergeCompCallback, or a custom loop with PartitionSearchDriver.

    search_callback.py CODEC keras SAVE_PATH WIDTHS   one fit per hidden width in the comma
                                                     list, each a fresh model, MergeComp and
                                                     callback searching or reusing SAVE_PATH
    search_callback.py CODEC tape LOG_DIR             DistributedGradientTape +
                                                     PartitionSearchDriver, TensorBoard
                                                     scalars and the PNG into LOG_DIR
    search_callback.py CODEC unwritable SAVE_PATH     a fit whose SAVE_PATH cannot be written:
                                                     reports the error each rank raised

CODEC is a registry name, or "plain" for an uncompressed average defined here.

Reports the chosen partition, the candidates measured, collectives per step,
what the search cost, the losses, and the weights checksum.
"""

import sys

import tensorflow as tf
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd

from tests.horovodrun import report
from tests.workers.common import classification_data, tape_train_step, weights_checksum
from tf_mergecomp import MergeComp, MergeCompCallback
from tf_mergecomp.compressors.base import ALLREDUCE, Compressor
from tf_mergecomp.search import PartitionSearchDriver

# Small enough to finish inside the short fits below (about 60 steps).
SEARCH = dict(steps_per_candidate=2, max_groups=3, finalists=2, rounds=3, warmup_steps=1,
              profiled_steps=3, resolve_rounds=2)
EPOCHS = 6



class PlainAverage(Compressor):
    """No compression: the payload is the buffer itself, averaged by allreduce."""

    name = "plain"
    collective = ALLREDUCE

    def compress(self, flat, seed):
        return tf.cast(flat, tf.float32), None

    def decompress(self, payload, ctx):
        return payload

    def combine(self, collected, ctx, world_size):
        return collected

    def payload_nbytes(self, n):
        return 4 * n


hvd.init()
codec, mode = sys.argv[1], sys.argv[2]
x, y = classification_data(hvd.rank())
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def build_model(width):
    tf.keras.utils.set_random_seed(1)
    return tf.keras.Sequential([
        tf.keras.layers.Dense(width, activation="relu", input_shape=(8,)),
        tf.keras.layers.Dense(width, activation="relu"),
        tf.keras.layers.Dense(width, activation="relu"),
        tf.keras.layers.Dense(4),
    ])




def train_keras(save_path, width):
    model = build_model(width)
    mc = MergeComp(PlainAverage() if codec == "plain" else codec)
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), compression=mc),
                  loss=loss_fn)
    callback = MergeCompCallback(mc, save_path=save_path, verbose=1, **SEARCH)
    history = model.fit(x, y, batch_size=16, epochs=EPOCHS, verbose=0, shuffle=False,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), callback])
    return model, mc, callback.search, history.history["loss"]


def train_tape():
    model = build_model(32)
    mc = MergeComp(PlainAverage() if codec == "plain" else codec)
    sgd = tf.keras.optimizers.SGD(0.05)
    search = PartitionSearchDriver(mc, verbose=1, log_dir=sys.argv[3], **SEARCH)

    step = search.function(tape_train_step(model, sgd, loss_fn, mc))
    losses = []
    for epoch in range(EPOCHS):
        epoch_losses = []
        for i in range(0, len(x), 16):
            search.before_step()
            loss = step(x[i:i + 16], y[i:i + 16])
            search.after_step(loss)
            if epoch == 0 and i == 0:
                hvd_tf.broadcast_variables(model.variables, root_rank=0)
            epoch_losses.append(float(loss))
        losses.append(sum(epoch_losses) / len(epoch_losses))
    return model, mc, search, losses


def _layout(layout):
    return layout if layout is None or isinstance(layout, str) else list(layout)


def _fusion(algorithm):
    """[the search's fusion setting, its fusion layout, the layout the job's
    Horovod settings give of the profiled ready times]."""
    from tf_mergecomp.grouping import fusion_splits
    from tf_mergecomp.search.settings import horovod_fusion

    if algorithm.ready is None:
        return [algorithm.fusion, _layout(algorithm.fusion_layout), None]
    expected = fusion_splits(algorithm.ready, [4.0 * s for s in algorithm.sizes],
                             *horovod_fusion())
    return [algorithm.fusion and list(algorithm.fusion), _layout(algorithm.fusion_layout),
            list(expected)]


def report_run(model, mc, search, losses):
    report(
        splits=None if mc.steps_aside else list(mc.splits),
        group_codecs=None if mc.steps_aside else list(mc.group_codecs),
        steps_aside=mc.steps_aside, groups=None if mc.steps_aside else mc.num_groups,
        done=search.done, loaded_from=search.loaded_from, reason=search.reason_for_search,
        candidates=[[_layout(r["layout"]), r["rounds_s"], r["collectives_per_step"], r["groups"],
                     r["role"], r["group_codecs"]] for r in search.history],
        final_collectives_per_step=search.final_collectives_per_step,
        collectives_per_group=mc.compressor.collectives_per_group(),
        cost=search.cost, steps_seen=search.steps_seen, plot_path=search.plot_path,
        choice=None if search.algorithm is None else _layout(search.algorithm.choice),
        leader=None if search.algorithm is None else _layout(search.algorithm.leader),
        extra_rounds=None if search.algorithm is None else search.algorithm.extra_rounds,
        fusion=None if search.algorithm is None else _fusion(search.algorithm),
        losses=losses, checksum=weights_checksum(model), tensors=mc.num_tensors,
    )


def unwritable_fit(save_path):
    model = build_model(32)
    mc = MergeComp(codec)
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), compression=mc),
                  loss=loss_fn)
    callback = MergeCompCallback(mc, save_path=save_path, verbose=1, **SEARCH)
    try:
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
    except ValueError as error:
        report(error=str(error), steps_seen=callback.search.steps_seen)
    else:
        report(error=None, steps_seen=callback.search.steps_seen)


if mode == "keras":
    for width in sys.argv[4].split(","):
        report_run(*train_keras(sys.argv[3], int(width)))
elif mode == "unwritable":
    unwritable_fit(sys.argv[3])
else:
    report_run(*train_tape())
