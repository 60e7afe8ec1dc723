"""One rank's gradient exchange: layer-wise vs one group vs 4 groups, per gradient set.

    python -m benchmarks exchange [--tensor-counts 1,16,64,256,1024] [--megabytes 16]
        [--models resnet50,vgg16,transformer] [--algorithms fp16,topk,...] [--rounds 7]

Times MergeComp's whole exchange (flatten, error feedback, encode, the
collective, decode, unflatten) in one process (Horovod of size 1, so the
collective moves no bytes) with one TensorFlow thread: the cost that grouping
changes on this machine's CPU, without a network. Gradient sets:

- the tensor-count sweep: ``--megabytes`` of float32 split into each of
  ``--tensor-counts`` tensors of equal size (within one element), so that only
  the number of tensors changes;
- ``--models``: random tensors of the model's gradient shapes
  (``models.build_model``), passed in ``trainable_variables`` order like
  Keras does (the engine reverses them into backprop order itself).

Configs: ``partitions="layerwise"``, ``1`` and ``4`` (the last only for sets
of at least 4 tensors). Each (gradient set, algorithm) runs in a child process
of its own, one at a time, so nothing of one pair's traces, variables or
allocator pool stays alive into the next. In the child every config is built
once (one MergeComp and one tf.function each), called twice to trace and warm
up, then timed round-robin, one slot per config per round (calls repeated for
at least 20 ms, the figure being seconds per call), so that a slow spell of the
machine lands on every config alike. The layer-wise config's
spread over the rounds, (max - min) / median, is the run's own noise figure,
printed next to the ratios it qualifies.
"""

import json
import subprocess
import sys
import time

from tf_mergecomp import keras2
from benchmarks import report

# (key, MergeComp partitions, fewest tensors it needs, table heading)
CONFIGS = (
    ("layerwise", "layerwise", 1, "layer-wise"),
    ("one", 1, 1, "one group"),
    ("four", 4, 4, "4 groups"),
)
DEFAULT_TENSOR_COUNTS = (1, 16, 64, 256, 1024)
DEFAULT_MEGABYTES = 16.0
QUICK = {"tensor_counts": (1, 16), "models": (), "algorithms": ("fp16", "efsignsgd"),
         "rounds": 2, "megabytes": 1.0}
# Targets on the tensor-count sweep: one group's time at most this fraction of
# layer-wise, for sets of at least this many tensors.
ONE_GROUP_TARGETS = ((1.0, 1), (0.7, 256))


# ---- gradient sets ------------------------------------------------------------------

def gradient_sets(tensor_counts, megabytes, model_names):
    """The sweep's sets, then the models'; ValueError names what cannot be built."""
    sweep = [{"kind": "tensors", "count": count, "megabytes": megabytes}
             for count in tensor_counts]
    for gradient_set in sweep:
        gradient_shapes(gradient_set)  # checks the split before any child starts
    sets = sweep + [{"kind": "model", "model": name} for name in model_names]
    if not sets:
        raise ValueError("no gradient sets: --tensor-counts and --models are both empty")
    return sets


def set_label(gradient_set):
    if gradient_set["kind"] == "model":
        return gradient_set["model"]
    return "%g MB" % gradient_set["megabytes"]


def equal_split_sizes(total_elements, count):
    """``count`` sizes summing to ``total_elements``, the first ones one element larger."""
    if not 1 <= count <= total_elements:
        raise ValueError("cannot split %d float32 elements into %d tensors"
                         % (total_elements, count))
    base, remainder = divmod(total_elements, count)
    return [base + 1 if index < remainder else base for index in range(count)]


def gradient_shapes(gradient_set):
    """The set's tensor shapes, in ``trainable_variables`` order (needs TensorFlow for models)."""
    if gradient_set["kind"] == "tensors":
        total_elements = int(gradient_set["megabytes"] * 2**20) // 4  # float32
        return [[size] for size in equal_split_sizes(total_elements, gradient_set["count"])]
    import gc

    from tf_mergecomp.keras2 import keras
    from benchmarks import models

    model = models.build_model(gradient_set["model"])
    shapes = [v.shape.as_list() for v in model.trainable_variables]
    # Only the shapes are needed: free the weights before the timing starts.
    del model
    keras.backend.clear_session()
    gc.collect()
    return shapes


# ---- the child: one (gradient set, algorithm) ---------------------------------------

def _make_exchange(algorithm, partitions):
    """A tf.function running one MergeComp exchange; it returns one element of every
    reduced tensor, so waiting for it waits for the whole exchange without copying
    the gradients out."""
    import tensorflow as tf

    from tf_mergecomp import MergeComp

    allreduce_grads = MergeComp(algorithm, partitions=partitions).make_reduce_fn()

    @tf.function
    def exchange(gradients):
        return tf.stack([tf.reshape(g, [-1])[0] for g in allreduce_grads(gradients)])

    return exchange


def _slot_seconds(exchange, gradients, min_slot_s):
    """Seconds per call over one round's slot: calls repeated for at least ``min_slot_s``,
    so that exchanges of a millisecond are not timed at the clock's and scheduler's grain."""
    calls = 0
    started = time.perf_counter()
    while True:
        exchange(gradients).numpy()
        calls += 1
        elapsed = time.perf_counter() - started
        if elapsed >= min_slot_s:
            return elapsed / calls


def measure(gradient_set, algorithm, rounds, warmup_calls=2, min_slot_s=0.02):
    """{config key: [seconds per call, one figure per round]} for one gradient set and
    algorithm, in this process."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import horovod.tensorflow as hvd

    hvd.init()
    shapes = gradient_shapes(gradient_set)
    generator = tf.random.Generator.from_seed(1)
    # One set of gradients shared by every config's exchange.
    gradients = [generator.normal(shape) for shape in shapes]
    exchanges = {key: _make_exchange(algorithm, partitions)
                 for key, partitions, fewest_tensors, _ in CONFIGS
                 if len(shapes) >= fewest_tensors}
    for exchange in exchanges.values():
        for _ in range(warmup_calls):
            exchange(gradients).numpy()
    # Variable-creating functions trace twice on their first call; any trace
    # after the warm-up would time tracing and keep a second graph alive.
    traces_after_warmup = _tracing_counts(exchanges)
    keys = list(exchanges)
    seconds = {key: [] for key in keys}
    for round_index in range(rounds):
        # Rotate which config goes first, so none always follows the same neighbour.
        shift = round_index % len(keys)
        for key in keys[shift:] + keys[:shift]:
            seconds[key].append(_slot_seconds(exchanges[key], gradients, min_slot_s))
    if _tracing_counts(exchanges) != traces_after_warmup:
        raise RuntimeError("an exchange retraced while timed (traces per config: %s, then %s)"
                           % (traces_after_warmup, _tracing_counts(exchanges)))
    return {"tensors": len(shapes), "elements": sum(_elements(s) for s in shapes),
            "seconds": seconds}


def _tracing_counts(exchanges):
    return {key: exchange.experimental_get_tracing_count() for key, exchange in exchanges.items()}


def _elements(shape):
    count = 1
    for dimension in shape:
        count *= dimension
    return count


# ---- the parent ---------------------------------------------------------------------

def summarize(gradient_set, algorithm, measured):
    """A table row: medians, ratios to layer-wise and the layer-wise spread."""
    seconds = measured["seconds"]
    median_s = {key: report.median(times) for key, times in seconds.items()}
    layerwise = seconds["layerwise"]
    spread = (max(layerwise) - min(layerwise)) / median_s["layerwise"]
    return {
        "gradient_set": gradient_set, "label": set_label(gradient_set), "algorithm": algorithm,
        "tensors": measured["tensors"], "megabytes": 4 * measured["elements"] / 2**20,
        "seconds": seconds, "median_s": median_s,
        "one_vs_layerwise": report.ratio(median_s["one"], median_s["layerwise"]),
        "four_vs_layerwise": report.ratio(median_s.get("four"), median_s["layerwise"]),
        "layerwise_spread": spread,
    }


def _run_child(gradient_set, algorithm, rounds, environment):
    output = subprocess.run(
        [sys.executable, "-m", "benchmarks.exchange", "--child",
         json.dumps(gradient_set), algorithm, str(rounds)],
        env=environment, capture_output=True, text=True, timeout=1800)
    if output.returncode != 0:
        raise RuntimeError("exchange timing of %s on %s failed:\n%s"
                           % (algorithm, set_label(gradient_set), output.stderr[-3000:]))
    return json.loads(output.stdout.strip().splitlines()[-1])


def run(sets, algorithms, rounds=7, cpu_allocator="bfc", log=print):
    """{"rows": [...], ...}: one child process per (gradient set, algorithm), one at a time."""
    from benchmarks.cluster import cpu_allocator_environment

    environment = keras2.child_environ(TF_CPP_MIN_LOG_LEVEL="2",
                                       **cpu_allocator_environment(cpu_allocator))
    rows = []
    for gradient_set in sets:
        for algorithm in algorithms:
            measured = _run_child(gradient_set, algorithm, rounds, environment)
            row = summarize(gradient_set, algorithm, measured)
            log("[exchange] %s in %s, %s: %s" % (
                row["label"], _tensors_text(row["tensors"]), algorithm, ", ".join(
                    "%s %.1f ms" % (heading, 1e3 * row["median_s"][key])
                    for key, _, _, heading in CONFIGS if key in row["median_s"])))
            rows.append(row)
    return {"rows": rows, "rounds": rounds, "cpu_allocator": cpu_allocator,
            "started": time.strftime("%Y-%m-%d %H:%M:%S")}


# ---- the report ---------------------------------------------------------------------

def _percent(fraction):
    return "%.0f%%" % (100 * fraction)


def _tensors_text(count):
    return "%d tensor%s" % (count, "" if count == 1 else "s")


def _ratio_text(row, ratio_key):
    return "%s %s at %s: %sx (layer-wise spread %s)" % (
        row["algorithm"], row["label"], _tensors_text(row["tensors"]),
        report.fmt(row[ratio_key]),
        _percent(row["layerwise_spread"]))


def target_line(rows, at_most, fewest_tensors):
    """'one group <= X layer-wise ...: met/missed (figures)' over the tensor-count sweep."""
    scope = ("at every tensor count" if fewest_tensors <= 1
             else "at %d tensors and more" % fewest_tensors)
    title = "one group <= %sx layer-wise %s for every codec" % (at_most, scope)
    checked = [r for r in rows if r["gradient_set"]["kind"] == "tensors"
               and r["tensors"] >= fewest_tensors]
    if not checked:
        return "%s: not measured" % title
    missed = [r for r in checked if r["one_vs_layerwise"] > at_most]
    if missed:
        return "%s: missed (%s)" % (title, "; ".join(_ratio_text(r, "one_vs_layerwise")
                                                      for r in missed))
    worst = max(checked, key=lambda r: r["one_vs_layerwise"])
    return "%s: met (worst: %s)" % (title, _ratio_text(worst, "one_vs_layerwise"))


def table(result):
    rows = result["rows"]
    lines = ["One rank (Horovod size 1), one TF thread, %s CPU allocator; median ms of %d "
             "rounds, the configs timed round-robin; spread: (max - min) / median of the "
             "layer-wise times over the rounds, this run's noise.\n"
             % (result["cpu_allocator"], result["rounds"])]
    headings = [heading + " ms" for _, _, _, heading in CONFIGS]
    lines.append(report.markdown_table(
        ["gradient set", "tensors", "algorithm"] + headings
        + ["one group / layer-wise", "4 groups / layer-wise", "layer-wise spread"],
        [[r["label"], r["tensors"], r["algorithm"]]
         + [None if r["median_s"].get(key) is None else 1e3 * r["median_s"][key]
            for key, _, _, _ in CONFIGS]
         + [r["one_vs_layerwise"], r["four_vs_layerwise"], _percent(r["layerwise_spread"])]
         for r in rows]))
    lines.append("\nTargets (tensor-count sweep):\n")
    lines += ["- " + target_line(rows, at_most, fewest_tensors)
              for at_most, fewest_tensors in ONE_GROUP_TARGETS]
    return "\n".join(lines)


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    _, _, child_set, child_algorithm, child_rounds = sys.argv
    print(json.dumps(measure(json.loads(child_set), child_algorithm, int(child_rounds))))
