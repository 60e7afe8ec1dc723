"""Keras fit with MergeCompCallback, or a custom loop with PartitionSearch.

    search_callback.py CODEC keras SAVE_PATH WIDTHS   one fit per hidden width in the comma
                                                     list, each a fresh model, MergeComp and
                                                     callback searching or reusing SAVE_PATH
    search_callback.py CODEC tape LOG_DIR             DistributedGradientTape + PartitionSearch,
                                                     TensorBoard scalars into LOG_DIR

CODEC is a registry name, or "plain" for an uncompressed average defined here.

Reports the chosen partition, the candidates measured, collectives per step,
the losses, and the weights checksum.
"""

import sys

import tensorflow as tf
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd

from tests.horovodrun import report
from tests.workers.common import classification_data, weights_checksum
from tf_mergecomp import MergeComp
from tf_mergecomp.compressors.base import ALLREDUCE, Compressor
from tf_mergecomp.callback import MergeCompCallback
from tf_mergecomp.search_driver import PartitionSearch



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
    callback = MergeCompCallback(mc, steps_per_candidate=2, max_groups=3, save_path=save_path,
                                 verbose=1)
    history = model.fit(x, y, batch_size=16, epochs=4, verbose=0, shuffle=False,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), callback])
    return model, mc, callback.search, history.history["loss"]


def train_tape():
    model = build_model(32)
    mc = MergeComp(PlainAverage() if codec == "plain" else codec)
    sgd = tf.keras.optimizers.SGD(0.05)
    search = PartitionSearch(mc, steps_per_candidate=2, max_groups=3, verbose=1,
                             log_dir=sys.argv[3])

    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = hvd_tf.DistributedGradientTape(tape, compression=mc)
        grads = tape.gradient(loss, model.trainable_variables)
        sgd.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step = search.function(train_step)
    losses = []
    for epoch in range(4):
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


def report_run(model, mc, search, losses):
    report(
        splits=list(mc.splits), groups=mc.num_groups, done=search.done,
        loaded_from=search.loaded_from, reason=search.reason_for_search,
        candidates=[[r["splits"], r["seconds"], r["collectives_per_step"], r["groups"]]
                    for r in search.history],
        final_collectives_per_step=search.final_collectives_per_step,
        collectives_per_group=mc.compressor.collectives_per_group(),
        search_steps=search.search_steps, best=list(search.searcher.best) if search.searcher else None,
        losses=losses, checksum=weights_checksum(model), tensors=mc.num_tensors,
    )


if mode == "keras":
    for width in sys.argv[4].split(","):
        report_run(*train_keras(sys.argv[3], int(width)))
else:
    report_run(*train_tape())
