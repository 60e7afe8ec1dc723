"""Keras 3 against Keras 2: the same keras.applications model and codec, images/s in one run.

    horovodrun -np 2 --gloo python -m benchmarks.keras_versions \
        [--model mobilenet_v2|vgg16|small_cnn|small_cnn_bn|...] [--codec efsignsgd] \
        [--rounds 4] [--steps 10] [--no-controls] [--out FILE]

One process per rank holds both Keras: Keras 2 (``tf_keras``, with
``TF_USE_LEGACY_KERAS=1``, which ``main`` sets before TensorFlow is imported) trains through Horovod's
``hvd.DistributedOptimizer(compression=MergeComp(...))``, and Keras 3 (the
``keras`` package) through ``tf_mergecomp.keras.DistributedOptimizer``. Both
models are built from the same application with random weights, train on the
same synthetic images with a MergeComp of one group each, and run ``fit`` in
alternating rounds (the order swapped every round) of ``--steps`` timed steps
after an untimed warm-up round, so that the machine's load falls on both
alike. Rank 0 prints the median images/s of each, their ratio and the range
of the per-round ratios (the run's spread), and writes them as JSON to
``--out``. Needs TensorFlow >= 2.16 with tf_keras installed.

With ``--controls`` (the default) each Keras also trains a second copy of the
model without any distribution (its plain optimizer, each rank on its own
data), in the same alternating rounds, so that the two ratios that make up
the result are seen apart: Keras 3 against Keras 2 with nothing distributed
(the two Keras' own speed on this machine), and each Keras' distributed step
against its own undistributed one (what the data-parallel path costs in each).
"""

import argparse
import json
import os
import statistics
import time


APPLICATIONS = {"mobilenet_v2": "MobileNetV2", "resnet50": "ResNet50",
                "densenet121": "DenseNet121", "vgg16": "VGG16"}  # VGG16: no BatchNormalization
# Four conv blocks and two dense layers, the same in both Keras, with and without
# BatchNormalization: tells whether a gap between the Keras follows that layer (Keras 3
# computes it from separate moment ops, Keras 2 with TensorFlow's fused kernel).
SMALL_CNNS = ("small_cnn", "small_cnn_bn")


def build_small_cnn(keras, input_shape, batch_norm):
    layers = [keras.Input(input_shape)]
    for filters in (32, 64, 128, 128):
        layers.append(keras.layers.Conv2D(filters, 3, padding="same", use_bias=not batch_norm))
        if batch_norm:
            layers.append(keras.layers.BatchNormalization())
        layers += [keras.layers.ReLU(), keras.layers.MaxPooling2D()]
    layers += [keras.layers.Flatten(), keras.layers.Dense(256, activation="relu"),
               keras.layers.Dense(10)]
    return keras.Sequential(layers)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenet_v2", choices=sorted(APPLICATIONS) + list(SMALL_CNNS))
    parser.add_argument("--codec", default="efsignsgd")
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds of each Keras")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--out", default=None, help="JSON file for the figures (rank 0)")
    parser.add_argument("--no-controls", dest="controls", action="store_false",
                        help="skip the undistributed copy of each model")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    if args.out is not None:
        from benchmarks.outputs import check_file

        try:
            args.out = check_file(args.out, "keras_versions_%s.json" % args.model)
        except ValueError as error:
            parser.error(str(error))
    return args


class _Setup:
    """One Keras' model, compiled for data-parallel training, and its data."""

    def __init__(self, keras, distributed_optimizer, callbacks, args, images, labels):
        self.keras = keras
        if args.model in SMALL_CNNS:
            self.model = build_small_cnn(keras, images.shape[1:], args.model == "small_cnn_bn")
        else:
            application = getattr(keras.applications, APPLICATIONS[args.model])
            self.model = application(weights=None, input_shape=images.shape[1:], classes=10,
                                     classifier_activation=None)
        optimizer = keras.optimizers.SGD(0.01)
        if distributed_optimizer is not None:
            optimizer = distributed_optimizer(optimizer)
        self.model.compile(optimizer=optimizer,
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        self.callbacks = callbacks
        self.images, self.labels = images, labels
        self.batch_size = args.batch_size

    def seconds_per_step(self, steps, callbacks=()):
        timer = _step_timer(self.keras)
        self.model.fit(self.images[: steps * self.batch_size], self.labels[: steps * self.batch_size],
                       batch_size=self.batch_size, epochs=1, shuffle=False, verbose=0,
                       callbacks=list(callbacks) + [timer])
        return statistics.median(timer.seconds[1:] or timer.seconds)


def _step_timer(keras):
    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_train_batch_begin(self, batch, logs=None):
            self._started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.seconds.append(time.perf_counter() - self._started)

    return StepTimer()


def _per_round_ratios(seconds, slower_name, faster_name):
    """Per round: images/s of ``faster_name`` over ``slower_name`` (their step times inverted)."""
    return [a / b for a, b in zip(seconds[slower_name], seconds[faster_name])]


def _control_ratios(seconds):
    """The two ratios a Keras 3 / Keras 2 figure is the product of (images/s, medians)."""
    def ratio(numerator, denominator):
        return statistics.median(seconds[denominator]) / statistics.median(seconds[numerator])

    undistributed = _per_round_ratios(seconds, "keras2_undistributed", "keras3_undistributed")
    return {
        "undistributed_keras3_over_keras2": ratio("keras3_undistributed", "keras2_undistributed"),
        "undistributed_per_round_ratio_range": [min(undistributed), max(undistributed)],
        "keras2_distributed_over_undistributed": ratio("keras2", "keras2_undistributed"),
        "keras3_distributed_over_undistributed": ratio("keras3", "keras3_undistributed"),
    }


def main(argv=None):
    args = parse_args(argv)
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras, and so Horovod's wrappers, are Keras 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd_keras2
    import keras as keras3
    import tf_keras as keras2

    import tf_mergecomp.keras as mck
    from tf_mergecomp import MergeComp

    hvd_keras2.init()
    rng = np.random.default_rng(hvd_tf.rank())
    count = (args.steps + 1) * args.batch_size
    images = rng.standard_normal((count, args.image_size, args.image_size, 3), dtype=np.float32)
    labels = rng.integers(0, 10, count)
    tf.random.set_seed(0)
    setups = {
        "keras2": _Setup(keras2, lambda opt: hvd_keras2.DistributedOptimizer(
            opt, compression=MergeComp(args.codec, partitions=1)),
            [hvd_keras2.callbacks.BroadcastGlobalVariablesCallback(0)], args, images, labels),
        "keras3": _Setup(keras3, lambda opt: mck.DistributedOptimizer(
            opt, compression=MergeComp(args.codec, partitions=1)),
            [mck.BroadcastGlobalVariablesCallback(0)], args, images, labels),
    }
    if args.controls:
        setups["keras2_undistributed"] = _Setup(keras2, None, [], args, images, labels)
        setups["keras3_undistributed"] = _Setup(keras3, None, [], args, images, labels)
    for setup in setups.values():  # untimed: traces, the initial broadcast, warm caches
        setup.seconds_per_step(args.steps, setup.callbacks)
    seconds = {name: [] for name in setups}
    for round_index in range(args.rounds):
        order = sorted(setups) if round_index % 2 == 0 else sorted(setups, reverse=True)
        for name in order:
            seconds[name].append(setups[name].seconds_per_step(args.steps))
    images_per_s = {name: hvd_tf.size() * args.batch_size / statistics.median(values)
                    for name, values in seconds.items()}
    per_round = _per_round_ratios(seconds, "keras2", "keras3")
    result = {"model": args.model, "codec": args.codec, "ranks": hvd_tf.size(),
              "image_size": args.image_size, "batch_size_per_rank": args.batch_size,
              "rounds": args.rounds, "steps": args.steps, "images_per_s": images_per_s,
              "keras3_over_keras2": images_per_s["keras3"] / images_per_s["keras2"],
              "per_round_ratio_range": [min(per_round), max(per_round)],
              "seconds_per_step": seconds}
    if args.controls:
        result["controls"] = _control_ratios(seconds)
    if hvd_tf.rank() == 0:
        print("%s, %s, %d ranks: Keras 2 %.1f images/s, Keras 3 %.1f images/s, Keras 3 / Keras 2 "
              "%.3f (per-round %.3f-%.3f)" % (
                  args.model, args.codec, hvd_tf.size(), images_per_s["keras2"],
                  images_per_s["keras3"], result["keras3_over_keras2"], *result["per_round_ratio_range"]),
              flush=True)
        if args.controls:
            controls = result["controls"]
            print("  without distribution: Keras 3 / Keras 2 %.3f (per-round %.3f-%.3f); "
                  "distributed / undistributed images/s: Keras 2 %.3f, Keras 3 %.3f" % (
                      controls["undistributed_keras3_over_keras2"],
                      *controls["undistributed_per_round_ratio_range"],
                      controls["keras2_distributed_over_undistributed"],
                      controls["keras3_distributed_over_undistributed"]), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
