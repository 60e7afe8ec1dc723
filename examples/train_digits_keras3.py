"""The digits job on Keras 3 (TensorFlow >= 2.16's tf.keras) through tf_mergecomp.keras.

    horovodrun -np 2 --gloo python examples/train_digits_keras3.py [--compressor dgc]

Run it WITHOUT TF_USE_LEGACY_KERAS. Each rank trains on its own shard of
scikit-learn's 1,797 digit images; tf_mergecomp.keras.DistributedOptimizer
averages the gradients through MergeComp (one collective per group), and
MergeCompCallback searches the partition during the first steps. Rank 0 prints
per-epoch loss and accuracy (averaged over the ranks) and the test accuracy;
every rank prints a checksum of its weights, and rank 0 whether they are
identical on all ranks.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # docs/design.md, CPU hosts

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

import tf_mergecomp.keras as mck  # noqa: E402
from digits_data import load_data  # noqa: E402 (this folder, on the path as the script's)
from tf_mergecomp import MergeComp, compressors  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compressor", default="efsignsgd", choices=list(compressors.NAMES) + ["plain"],
                        help="'plain': Horovod's allreduce, no MergeComp")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.1,
                        help="per worker; scaled by the number of workers")
    parser.add_argument("--no-search", action="store_true")
    return parser.parse_args()


def build_model():
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def main():
    args = parse_args()
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(42)

    (x_train, y_train), (x_test, y_test) = load_data(hvd.rank(), hvd.size())
    model = build_model()
    compression = None if args.compressor == "plain" else MergeComp(args.compressor)
    optimizer = mck.DistributedOptimizer(
        keras.optimizers.SGD(args.learning_rate * hvd.size()), compression=compression)
    model.compile(optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [mck.BroadcastGlobalVariablesCallback(0), mck.MetricAverageCallback()]
    if compression is not None and not args.no_search:
        callbacks.append(mck.MergeCompCallback(compression, verbose=1 if hvd.rank() == 0 else 0))
    if hvd.rank() == 0:
        print("tf_mergecomp (Keras %s): %d workers, %s, %d training images per worker"
              % (keras.__version__, hvd.size(), compression.compressor if compression else
                 "plain allreduce", len(x_train)), flush=True)
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if hvd.rank() == 0:
        print("test loss %.4f, test accuracy %.4f%s" % (
            loss, accuracy, "" if compression is None else ", partition %s (%d groups)"
            % (list(compression.splits), compression.num_groups)), flush=True)
    checksum = sum(float(np.abs(np.float64(w)).sum()) for w in model.get_weights())
    checksums = hvd.allgather(np.array([checksum]), name="weights_checksum")
    print("rank %d of %d: weights checksum %.12g" % (hvd.rank(), hvd.size(), checksum), flush=True)
    if hvd.rank() == 0:
        print("weights identical on all %d ranks: %s"
              % (hvd.size(), "yes" if np.all(checksums == checksums[0]) else "NO"), flush=True)


if __name__ == "__main__":
    main()
