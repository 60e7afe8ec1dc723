"""The main job: 2-worker Keras training on scikit-learn's digits with MergeComp.

    horovodrun -np 2 --gloo .venv/bin/python examples/train_digits.py [--compressor dgc]

Each rank trains on its own shard of the 1,797 real 8x8 digit images; the
gradients are merged into groups, compressed once per group and exchanged
with one collective per group. During the first steps MergeCompCallback
predicts the partitions' step times from a profiled step and probes of single
groups, times the best few against one group and layer-wise, and keeps the
fastest. Rank 0 prints per-epoch
loss and accuracy, and the test accuracy at the end; then every rank prints the
host it ran on and a checksum of its final weights, and rank 0 whether they
are identical on all ranks (they are: every rank applies the same averaged
update).
"""

import argparse
import importlib.util
import os
import socket

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow >= 2.16: tf.keras must be Keras 2, the tf_keras package, for Horovod
# (README, "The stack"); TensorFlow reads this when it is imported.
if importlib.util.find_spec("tf_keras") is not None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# On CPU hosts, pool freed memory (as TensorFlow always does on GPUs): the
# default CPU allocator takes every large buffer, such as a merged group,
# afresh from the OS and page-faults it in again each step.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402

from digits_data import load_data  # noqa: E402 (this folder, on the path as the script's)
from tf_mergecomp import MergeComp, MergeCompCallback, compressors  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compressor", default="efsignsgd", choices=compressors.NAMES)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.1,
                        help="per worker; scaled by the number of workers")
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--no-search", action="store_true",
                        help="skip the partition search (2 balanced groups)")
    return parser.parse_args()


def build_model():
    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu", input_shape=(8, 8, 1)),
        tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])


def host_text():
    """This host's name and the address it resolves to (a cluster node's own address)."""
    name = socket.gethostname()
    try:
        return "%s (%s)" % (name, socket.gethostbyname(name))
    except OSError:
        return name


def main():
    args = parse_args()
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(42)

    (x_train, y_train), (x_test, y_test) = load_data(hvd.rank(), hvd.size())
    model = build_model()
    compression = MergeComp(args.compressor)
    optimizer = hvd.DistributedOptimizer(
        tf.keras.optimizers.SGD(args.learning_rate * hvd.size(), momentum=args.momentum),
        compression=compression)
    model.compile(optimizer,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()]
    if not args.no_search:
        callbacks.append(MergeCompCallback(compression, verbose=1 if hvd.rank() == 0 else 0))
    if hvd.rank() == 0:
        print("tf_mergecomp: %d workers, %s, %d training images per worker"
              % (hvd.size(), compression.compressor, len(x_train)), flush=True)
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if hvd.rank() == 0:
        print("test loss %.4f, test accuracy %.4f, partition %s (%d groups)"
              % (loss, accuracy, list(compression.splits), compression.num_groups), flush=True)
    checksum = sum(float(np.abs(w.astype(np.float64)).sum()) for w in model.get_weights())
    checksums = hvd.allgather(np.array([checksum]), name="weights_checksum")
    print("rank %d of %d on %s: trained on %d images, weights checksum %.12g"
          % (hvd.rank(), hvd.size(), host_text(), len(x_train), checksum), flush=True)
    if hvd.rank() == 0:
        print("weights identical on all %d ranks: %s"
              % (hvd.size(), "yes" if np.all(checksums == checksums[0]) else "NO"), flush=True)


if __name__ == "__main__":
    main()
