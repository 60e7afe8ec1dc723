"""One Horovod rank of the cluster benchmark: runs several configs in sequence.

Started by ``cluster.py`` inside a worker's network namespace with Horovod's
Gloo environment already set::

    python -m tf_mergecomp.bench.worker SPEC.json

SPEC holds the model, batch size, warmup and measured step counts, a deadline
(Unix time), the configs to run and where to write this rank's result JSON.
Importing TensorFlow and building the model costs tens of seconds, so one
process runs every config of one (model, worker count): the same model, a new
optimizer and compression per config.

Per config the rank records the wall time of each measured step (between
consecutive ``on_train_batch_end`` calls after the warmup steps, which include
tracing) and the process CPU time over them. Before the configs it measures
its plain local compute step time (no Horovod) while the other ranks do the
same, which shows how much the ranks slow each other down on a shared CPU.

After all configs have trained, the rank times the gradient exchange alone
of each: the same Horovod allreduce function the optimizer uses (compression,
collectives, decompression, error feedback) applied to fixed random tensors
of the model's gradient shapes, with no forward or backward pass;
``exchange_steps`` timed calls per config in each of ``exchange_rounds``
rounds, the configs interleaved within a round so that a slow spell of the
machine does not land on one config. On a CPU-only machine backprop takes
seconds and hides most of what the grouping changes; the exchange time is
what an accelerator that computes backprop almost instantly would wait for.

``search_on``: "training" searches the partition from training step times
(``MergeCompCallback``, a model re-trace per candidate); "exchange" from
exchange times (``PartitionSearch`` over the exchange function, cheap
re-traces), then trains with the partition found.
"""

import json
import os
import sys
import time
import traceback

COMPRESSION_KINDS = ("horovod", "mergecomp")
MERGECOMP_PARTITIONS = ("layerwise", "one", "searched")
SEARCH_ON = ("training", "exchange")


class DeadlineExceeded(RuntimeError):
    pass


def _configure_threads():
    import tensorflow as tf

    threads = int(os.environ.get("MERGECOMP_BENCH_TF_THREADS", "1"))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def _make_step_timer():
    import tensorflow as tf

    class StepTimer(tf.keras.callbacks.Callback):
        """Wall and CPU clock at the end of every training batch."""

        def __init__(self, deadline):
            super().__init__()
            self.deadline = deadline
            self.wall = []
            self.cpu = []

        def on_train_begin(self, logs=None):
            self.wall.append(time.perf_counter())
            self.cpu.append(time.process_time())

        def on_train_batch_end(self, batch, logs=None):
            self.wall.append(time.perf_counter())
            self.cpu.append(time.process_time())
            if time.time() > self.deadline:
                raise DeadlineExceeded("deadline passed during training")

    return StepTimer


def _searched_partition_support():
    """(callback class or None, note)."""
    try:
        from tf_mergecomp.callback import MergeCompCallback  # noqa: F401
    except ImportError as error:
        return None, "MergeCompCallback not available (%s): partitions=2 used instead" % error
    return MergeCompCallback, ""


def build_compression(config):
    """Returns (compression for hvd.DistributedOptimizer, search callback class or None, note)."""
    import horovod.tensorflow.keras as hvd

    kind = config["kind"]
    if kind not in COMPRESSION_KINDS:
        raise ValueError("config kind must be one of %s, got %r" % (COMPRESSION_KINDS, kind))
    if kind == "horovod":
        choices = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}
        if config["compression"] not in choices:
            raise ValueError("horovod compression must be one of %s" % ", ".join(choices))
        return choices[config["compression"]], None, ""
    from tf_mergecomp import MergeComp

    partition = config["partition"]
    if partition not in MERGECOMP_PARTITIONS:
        raise ValueError("partition must be one of %s, got %r" % (MERGECOMP_PARTITIONS, partition))
    params = dict(config.get("params", {}))
    if partition == "layerwise":
        return MergeComp(config["algorithm"], partitions="layerwise", seed=0, **params), None, ""
    if partition == "one":
        return MergeComp(config["algorithm"], partitions=1, seed=0, **params), None, ""
    callback_class, note = _searched_partition_support()
    if callback_class is None:
        return MergeComp(config["algorithm"], partitions=2, seed=0, **params), None, note
    mergecomp = MergeComp(config["algorithm"], partitions=None, seed=0, **params)
    return mergecomp, callback_class, ""


def _run_config(model, dataset, gradients, config, spec, hvd, tf):
    compression, search_callback_class, note = build_compression(config)
    mergecomp = compression if config["kind"] == "mergecomp" else None
    optimizer = hvd.DistributedOptimizer(
        tf.keras.optimizers.SGD(learning_rate=spec.get("learning_rate", 0.001)), compression=compression
    )
    model.compile(
        optimizer=optimizer,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    search = {}
    started = time.perf_counter()
    exchange = _make_exchange(compression, gradients, tf)
    if search_callback_class is not None:
        search_on = spec.get("search_on", "training")
        if search_on not in SEARCH_ON:
            raise ValueError("search_on must be one of %s, got %r" % (SEARCH_ON, search_on))
        if search_on == "training":
            search = _search_partition(model, dataset, mergecomp, search_callback_class, spec)
        else:
            search = _search_on_exchange(exchange, mergecomp, spec)
    timer = _make_step_timer()(spec["deadline"])
    warmup, steps = spec["warmup_steps"], spec["steps"]
    model.fit(dataset, steps_per_epoch=warmup + steps, epochs=1, verbose=0, callbacks=[timer])
    wall, cpu = timer.wall, timer.cpu
    # wall[0] is train begin; wall[i] the end of step i (1-based).
    step_times = [wall[i] - wall[i - 1] for i in range(warmup + 1, warmup + steps + 1)]
    result = {
        "label": config["label"],
        "config": config,
        "ok": True,
        "note": note,
        "first_steps_s": wall[warmup] - wall[0],
        "step_times_s": step_times,
        "elapsed_s": wall[warmup + steps] - wall[warmup],
        "cpu_s": cpu[warmup + steps] - cpu[warmup],
        "total_s": time.perf_counter() - started,
    }
    result.update(search)
    if mergecomp is not None:
        result.update(
            splits=list(mergecomp.splits) if mergecomp.splits is not None else None,
            num_groups=mergecomp.num_groups,
            num_tensors=mergecomp.num_tensors,
            collectives_executed=int(mergecomp.collectives_executed.numpy()),
        )
    return result, exchange


def _search_partition(model, dataset, mergecomp, callback_class, spec):
    """Runs MergeCompCallback's search for at most spec['search_steps'] steps.

    fit ends after that many steps even when the search has not finished;
    the callback then keeps the fastest partition measured so far.
    """
    params = dict(spec.get("search_params", {}))
    callback = callback_class(mergecomp, **params)
    started = time.perf_counter()
    model.fit(dataset, steps_per_epoch=spec["search_steps"], epochs=1, verbose=0,
              callbacks=[callback])
    history = getattr(callback.search, "history", [])
    return {
        "search_s": time.perf_counter() - started,
        "search_steps": spec["search_steps"],
        "search_finished": bool(callback.done),
        "search_candidates": len(history),
        "search_history": _jsonable(history),
    }


def _random_gradients(model, rank, tf):
    """Fixed random tensors of the model's gradient shapes, different on every rank,
    shared by the exchanges of all configs."""
    generator = tf.random.Generator.from_seed(1000 + rank)
    return [generator.normal(v.shape, dtype=v.dtype) for v in model.trainable_variables]


def _make_exchange(compression, gradients, tf):
    """(step, gradients): ``step(gradients)`` runs the optimizer's gradient exchange alone.

    ``step`` is the allreduce function Horovod's optimizer builds for this
    compression (MergeComp's through its hook), in a ``tf.function`` traced
    afresh whenever the MergeComp's partition changes. It returns one element
    of every reduced tensor, so waiting for it waits for the whole exchange
    without copying the gradients out.
    """
    import horovod.tensorflow as hvd_tf

    allreduce_grads = hvd_tf._make_allreduce_grads_fn(
        "exchange", "", "", compression, False, hvd_tf.Average, 1.0, None,
        hvd_tf.global_process_set)
    state = {"version": None, "fn": None}

    def first_elements(grads):
        return tf.stack([tf.reshape(g, [-1])[0] for g in allreduce_grads(grads)])

    def step(grads):
        version = getattr(compression, "partition_version", None)
        if state["fn"] is None or state["version"] != version:
            state["fn"] = tf.function(first_elements)
            state["version"] = version
        return state["fn"](grads)

    return step, gradients


def _time_exchange(exchange, spec, unmeasured):
    """Wall time of each of ``exchange_steps`` exchanges after ``unmeasured`` ones."""
    step, gradients = exchange
    times = []
    for index in range(unmeasured + spec["exchange_steps"]):
        if time.time() > spec["deadline"]:
            raise DeadlineExceeded("deadline passed while timing the exchange")
        started = time.perf_counter()
        step(gradients).numpy()
        if index >= unmeasured:
            times.append(time.perf_counter() - started)
    return times


def _time_exchanges_interleaved(results, exchanges, spec, hvd_tf, tf):
    """Adds ``exchange_times_s`` to each result: ``exchange_rounds`` rounds over the configs.

    Only configs that trained on every rank are timed (a config that failed on
    one rank would leave the others waiting in its collectives). The first
    round's first two calls per config trace and warm up; later rounds discard
    one call per config, the switch from the previous config's collectives.
    """
    labels = [config["label"] for config in spec["configs"]]  # the same list on every rank
    ok_here = tf.constant([1 if label in exchanges else 0 for label in labels], tf.int32)
    ok_everywhere = hvd_tf.allreduce(ok_here, op=hvd_tf.Min, name="bench_configs_ok").numpy()
    by_label = {r["label"]: r for r in results}
    timed = [by_label[label] for label, ok in zip(labels, ok_everywhere) if ok]
    for result in timed:
        result["exchange_times_s"] = []
    for round_index in range(spec.get("exchange_rounds", 1)):
        for result in timed:
            result["exchange_times_s"] += _time_exchange(
                exchanges[result["label"]], spec, unmeasured=2 if round_index == 0 else 1)


def _search_on_exchange(exchange, mergecomp, spec):
    """MergeComp's partition search driven by exchange times (see the module docstring)."""
    from tf_mergecomp.search_driver import PartitionSearch

    step, gradients = exchange
    params = dict(spec.get("search_params", {}))
    search = PartitionSearch(mergecomp, **params)
    started = time.perf_counter()
    budget = spec.get("exchange_search_steps", 400)
    for _ in range(budget):
        if search.done:
            break
        if time.time() > spec["deadline"]:
            raise DeadlineExceeded("deadline passed during the exchange search")
        search.before_step()
        search.after_step(step(gradients))
    finished = search.done
    search.finish()
    return {
        "search_s": time.perf_counter() - started,
        "search_steps": search.search_steps,
        "search_finished": bool(finished),
        "search_candidates": len(search.history),
        "search_history": _jsonable(search.history),
        "search_on": "exchange",
    }


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def _local_compute_time(model, dataset, spec, tf):
    """Median step time of plain local training (no collectives) on this rank.

    The first steps after tracing run slower (allocator and kernel caches
    warming up), so three are discarded.
    """
    model.compile(
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.0),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    timer = _make_step_timer()(spec["deadline"])
    warmup, steps = 3, spec.get("compute_steps", 5)
    model.fit(dataset, steps_per_epoch=warmup + steps, epochs=1, verbose=0, callbacks=[timer])
    times = sorted(timer.wall[i] - timer.wall[i - 1] for i in range(warmup + 1, warmup + steps + 1))
    return times[len(times) // 2]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tf_mergecomp.bench.worker SPEC.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        spec = json.load(f)
    _configure_threads()
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    import tf_mergecomp.bench.models as models

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    tf.keras.utils.set_random_seed(1234)
    model = models.build_model(spec["model"])
    dataset = models.synthetic_dataset(spec["model"], spec["batch_size"], seed=rank)
    # One broadcast so every rank starts from the same weights, as in training.
    hvd_tf.broadcast_variables(model.variables, root_rank=0)
    output = {
        "rank": rank,
        "size": size,
        "model": spec["model"],
        "parameters": int(model.count_params()),
        "gradient_tensors": len(model.trainable_variables),
        "results": [],
    }
    output["compute_step_s"] = _local_compute_time(model, dataset, spec, tf)
    gradients = _random_gradients(model, rank, tf)
    exchanges = {}  # label -> exchange of each config that trained
    for config in spec["configs"]:
        try:
            result, exchanges[config["label"]] = _run_config(
                model, dataset, gradients, config, spec, hvd, tf)
            output["results"].append(result)
        except DeadlineExceeded:
            output["results"].append({"label": config["label"], "config": config, "ok": False,
                                      "error": "deadline exceeded"})
            break
        except Exception as error:  # recorded per config; the launcher shows it
            traceback.print_exc()
            from tf_mergecomp.bench.parity import error_text

            output["results"].append({"label": config["label"], "config": config, "ok": False,
                                      "error": error_text(error)})
        with open(spec["result_path"].format(rank=rank), "w") as f:
            json.dump(output, f, indent=1)
    if spec.get("exchange_steps") and spec.get("exchange_rounds", 1) > 0:
        try:
            _time_exchanges_interleaved(output["results"], exchanges, spec, hvd_tf, tf)
        except DeadlineExceeded:
            output["exchange_error"] = "deadline passed while timing the exchanges"
    with open(spec["result_path"].format(rank=rank), "w") as f:
        json.dump(output, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
