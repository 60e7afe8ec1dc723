"""One rank's gradient exchange, layer-wise vs one group, per TensorFlow CPU allocator.

    python -m tf_mergecomp.bench exchange [--model resnet50] [--algorithms fp16,dgc,...]

Times MergeComp's whole exchange (flatten, error feedback, encode, the
collective, decode, unflatten) on random tensors of the model's gradient
shapes, in one process (Horovod of size 1, so the collective moves no bytes)
with one TensorFlow thread: the cost that grouping changes on this machine's
CPU, without a network. Each allocator runs in a process of its own, because
TensorFlow reads ``TF_CPU_ALLOCATOR_USE_BFC`` once, at its first allocation;
the allocators alternate per algorithm so that both see the same machine.
"""

import json
import os
import subprocess
import sys
import time

from tf_mergecomp.bench import report

ALLOCATORS = ("default", "bfc")


def _median_seconds(call, repeats):
    call()
    call()  # the first calls trace and warm the allocator
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def measure(model_name, algorithm, repeats):
    """{partition: seconds} in this process (its allocator is already set)."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import horovod.tensorflow as hvd

    from tf_mergecomp import MergeComp
    from tf_mergecomp.bench import models

    hvd.init()
    shapes = [v.shape for v in models.build_model(model_name).trainable_variables]
    generator = tf.random.Generator.from_seed(1)
    gradients = [generator.normal(shape) for shape in shapes]
    seconds = {}
    for partition in ("layerwise", 1):
        reduce_fn = MergeComp(algorithm, partitions=partition).make_reduce_fn()
        # One element of every output: waiting for it waits for the exchange.
        exchange = tf.function(
            lambda grads: tf.stack([tf.reshape(g, [-1])[0] for g in reduce_fn(grads)]))
        seconds["layerwise" if partition == "layerwise" else "one"] = _median_seconds(
            lambda: exchange(gradients).numpy(), repeats)
    return seconds


def run(model_name, algorithms, repeats=5, log=print):
    rows = []
    for algorithm in algorithms:
        for allocator in ALLOCATORS:
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                       TF_CPU_ALLOCATOR_USE_BFC="true" if allocator == "bfc" else "false")
            output = subprocess.run(
                [sys.executable, "-m", "tf_mergecomp.bench.exchange", "--child", model_name,
                 algorithm, str(repeats)],
                env=env, capture_output=True, text=True, timeout=900)
            if output.returncode != 0:
                raise RuntimeError("exchange timing of %s (%s allocator) failed:\n%s"
                                   % (algorithm, allocator, output.stderr[-3000:]))
            seconds = json.loads(output.stdout.strip().splitlines()[-1])
            row = dict(algorithm=algorithm, allocator=allocator, **seconds)
            log("[exchange] %s, %s allocator: layer-wise %.1f ms, one group %.1f ms" % (
                algorithm, allocator, 1e3 * row["layerwise"], 1e3 * row["one"]))
            rows.append(row)
    return rows


def table(rows, model_name):
    lines = ["%s gradients, one rank, one TF thread; median of repeated exchanges.\n" % model_name]
    lines.append(report.markdown_table(
        ["algorithm", "CPU allocator", "layer-wise ms", "one group ms", "one group / layer-wise"],
        [[r["algorithm"], r["allocator"], 1e3 * r["layerwise"], 1e3 * r["one"],
          report.ratio(r["one"], r["layerwise"])] for r in rows]))
    return "\n".join(lines)


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    _, _, child_model, child_algorithm, child_repeats = sys.argv
    print(json.dumps(measure(child_model, child_algorithm, int(child_repeats))))
