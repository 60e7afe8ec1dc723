"""A custom training loop with DistributedGradientTape and MergeComp.

    horovodrun -np 2 --gloo .venv/bin/python examples/custom_loop.py [--compressor dgc]

The loop drives the partition search itself with ``PartitionSearchDriver``:
it profiles a few steps, predicts the partitions' step times from them and
from probes of single groups, then times the best few against one group and
layer-wise in interleaved rounds (``search.function`` keeps one traced step
per candidate partition), and keeps the fastest. The
MergeComp joins the checkpoint so its error-feedback state is saved with the
model.
"""

import argparse
import importlib.util
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow >= 2.16: tf.keras must be Keras 2, the tf_keras package, for Horovod
# (README, "The stack"); TensorFlow reads this when it is imported.
if importlib.util.find_spec("tf_keras") is not None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# On CPU hosts, pool freed memory (as TensorFlow always does on GPUs): the
# default CPU allocator takes every large buffer, such as a merged group,
# afresh from the OS and page-faults it in again each step.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from tf_mergecomp import MergeComp, compressors  # noqa: E402
from tf_mergecomp.search import PartitionSearchDriver  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compressor", default="dgc", choices=compressors.NAMES)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    args = parser.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(42)

    digits = load_digits()
    images = (digits.data / 16.0).astype("float32")[hvd.rank()::hvd.size()]
    labels = digits.target[hvd.rank()::hvd.size()]
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(1000, seed=hvd.rank())
    dataset = dataset.repeat().batch(32).take(args.steps)

    model = tf.keras.Sequential([
        tf.keras.layers.Dense(128, activation="relu", input_shape=(64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    optimizer = tf.keras.optimizers.SGD(args.learning_rate)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = MergeComp(args.compressor)
    search = PartitionSearchDriver(compression, max_groups=3, verbose=1 if hvd.rank() == 0 else 0)

    def train_step(x, y, first_step):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if first_step:
            # After the first update, so that the optimizer's slots exist too.
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables, root_rank=0)
        return loss

    step_fn = search.function(train_step)
    for step, (x, y) in enumerate(dataset):
        search.before_step()
        loss = step_fn(x, y, step == 0)
        search.after_step(loss)
        if step % 50 == 0 and hvd.rank() == 0:
            print("step %d loss %.4f" % (step, float(loss)), flush=True)
    search.finish()  # if training ended mid-search, keep the best partition measured

    accuracy = tf.keras.metrics.SparseCategoricalAccuracy()
    accuracy.update_state(digits.target, model(digits.data / 16.0))
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, mergecomp=compression)
    path = checkpoint.save(os.path.join(tempfile.mkdtemp(), "ckpt"))
    if hvd.rank() == 0:
        print("accuracy on all digits %.4f; partition %s; checkpoint %s"
              % (float(accuracy.result()), list(compression.splits), path), flush=True)


if __name__ == "__main__":
    main()
