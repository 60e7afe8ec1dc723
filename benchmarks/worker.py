"""One Horovod rank of the cluster benchmark: a few configs, timed interleaved in rounds.

Started by ``cluster.py`` inside a worker's network namespace with Horovod's
Gloo environment already set::

    python -m benchmarks.worker SPEC.json

SPEC holds the model, batch size, warmup steps, the rounds and steps per
round, a deadline (Unix time), the configs of this process set (a "batch":
cluster.py runs every algorithm's configs in a fresh set of rank processes,
so no rank keeps the models, optimizers, MergeComp state and traced functions
of the whole matrix alive) and where to write this rank's result JSON.

Setup, config by config: a model of its own (the broadcast weights), a new
optimizer and compression, the partition search for "searched", then
``warmup_steps`` training steps (tracing, Horovod and allocator warm-up). A
config with ``model_of`` (cluster.py gives it to an algorithm's layer-wise
and one-group configs) instead trains the model and MergeComp of the config
it names, after that one's setup, with a train function of its own
partition; before each turn the config's partition and train function are
made the model's (``_activate``), as the partition search switches its
candidates.
Then ``rounds`` rounds; in each, every config (the order rotated by one per
round, so that each round starts with a different config) trains
``steps_per_round`` timed steps after one untimed step (the switch from the
previous config), then times ``exchange_steps`` calls of its gradient
exchange alone: the same Horovod allreduce function the optimizer uses
(compression, collectives, decompression, error feedback) on fixed random
tensors of the model's gradient shapes, no forward or backward pass. On a
CPU-only machine backprop takes seconds and hides most of what the grouping
changes; the exchange time is what an accelerator that computes backprop
almost instantly would wait for. A slow spell of the machine thus lands on
every config of the batch, not on one, and a config listed twice (cluster.py
repeats one per batch) measures the run's own noise. Before each config's
turn Horovod is restarted where that is safe (``horovod_restart.restart_horovod``)
so that its response cache holds that config's collectives alone, as it would
in a run of that config: otherwise every config pays, in every Horovod cycle,
for the collectives of all the configs and searches before it.

Before the configs the rank measures its plain local compute step time (no
Horovod) while the other ranks do the same (``compute_steps`` > 0), which
shows how much the ranks slow each other down on a shared CPU. The peak RSS
of the rank (``ru_maxrss``) is written with every result.

Ranks agree (a min-allreduce of flags) before each config's setup, after its
local build and after its warm-up, and before each round: a config that
failed on one rank, or a deadline one rank reached, is skipped or stops the
run on every rank together instead of leaving the others waiting in
collectives the failed rank never joins.

``hierarchical`` (the spec's; cluster.py's ``--hierarchical``): every MergeComp
config is built with ``MergeComp(hierarchical=...)``: None (the search may choose
two levels per group), True (every group on two levels) or False (flat). Unless it
is False, Horovod starts with the machines' process sets
(``tf_mergecomp.hierarchical.machine_process_sets``: none with one rank per
machine), which the two-level reduce runs on. A config's own ``params`` may set
it instead. The "one_two_level" partition (one group, on two levels) needs None:
beside "one" on the same MergeComp, it compares the levels on one model.

``search_on``: "training" searches the partition during training
(``MergeCompCallback``: a profiled one-group step and probes of single
groups predict the candidates, the best few are confirmed by training steps
against one group and layer-wise; the fit stops when the search is done, at
``search_steps`` steps at most); "exchange" runs the same search with the
gradient exchange alone as the step (``PartitionSearchDriver`` over the
exchange function: no backprop, so no overlap to predict), then trains with
the partition found.
"""

import json
import os
import resource
import sys
import time
import traceback

from benchmarks import report

COMPRESSION_KINDS = ("horovod", "mergecomp")
MERGECOMP_PARTITIONS = ("layerwise", "one", "one_two_level", "searched", "searched_single")
# The searched partitions, and the MergeComp settings they differ in:
# "searched" chooses per group between the codec and plain (and plain Horovod),
# "searched_single" compresses every group with the codec, as before that choice.
SEARCHED_PARTITIONS = {"searched": {}, "searched_single": {"plain_groups": False}}
# The configs' fixed partitions, as MergeComp and set_partition take them (the
# ones a config can also train on another config's model with).
FIXED_PARTITIONS = {"layerwise": "layerwise", "one": 1, "one_two_level": 1}
# The fixed partitions whose every group takes two levels (its codec as
# "<codec>/two-level"), on a MergeComp that lets each group choose its level
# (hierarchical=None): beside "one" on the same MergeComp, the two levels against flat.
TWO_LEVEL_PARTITIONS = ("one_two_level",)
SEARCH_ON = ("training", "exchange")
# The spec's "hierarchical", as MergeComp takes it, by the cluster's --hierarchical.
HIERARCHICAL_CHOICES = {"auto": None, "true": True, "false": False}


# Set (to "1") by the cluster benchmark: each rank keeps to its own cores.
PIN_CORES_VARIABLE = "MERGECOMP_BENCH_PIN_CORES"


def own_cores(rank, size, cores):
    """Rank ``rank`` of ``size``'s share of ``cores`` (sorted ids): an equal
    contiguous share, or one core shared with others when there are more ranks
    than cores."""
    cores = sorted(cores)
    first, end = rank * len(cores) // size, (rank + 1) * len(cores) // size
    return cores[first:max(end, first + 1)]


def pin_to_own_cores(environ=os.environ):
    """With ``PIN_CORES_VARIABLE`` set to "1", keeps this process (its threads
    and those it starts later) on its rank's share of the cores; returns
    those cores, or None when not asked to pin.

    The virtual cluster's ranks stand for machines: each computes on cores of
    its own. Left to the scheduler, 2 ranks' threads (TensorFlow's, Horovod's
    background thread, Gloo's) move across 2 cores and a transformer's 25 ms
    steps alternate, for tens of steps at a time, between two speeds 2x apart;
    pinned they ran 15-30% faster and steadier (docs/benchmarks.md, "Two
    speeds on two cores").
    """
    if environ.get(PIN_CORES_VARIABLE) != "1":
        return None
    rank, size = int(environ["HOROVOD_RANK"]), int(environ["HOROVOD_SIZE"])
    cores = own_cores(rank, size, os.sched_getaffinity(0))
    # Every thread already running too (importing TensorFlow starts some); the
    # ones started later inherit the calling thread's cores.
    for thread_id in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(thread_id), cores)
        except ProcessLookupError:  # ended meanwhile
            pass
    return cores


def _configure_threads():
    """The rank's cores (``pin_to_own_cores``, before TensorFlow starts its
    thread pools) and TensorFlow's thread counts."""
    pin_to_own_cores()
    import tensorflow as tf

    threads = int(os.environ.get("MERGECOMP_BENCH_TF_THREADS", "1"))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def _make_step_timer():
    from tf_mergecomp.keras2 import keras

    class StepTimer(keras.callbacks.Callback):
        """Wall and CPU clock at the start of training and the end of every batch.

        It never stops training at the deadline: one rank leaving ``fit``
        early would leave the others waiting in its collectives; deadlines are
        agreed between ranks instead (``_agree``).
        """

        def __init__(self):
            super().__init__()
            self.wall = []
            self.cpu = []

        def on_train_begin(self, logs=None):
            self.wall.append(time.perf_counter())
            self.cpu.append(time.process_time())

        def on_train_batch_end(self, batch, logs=None):
            self.wall.append(time.perf_counter())
            self.cpu.append(time.process_time())

    return StepTimer


def _train_timed(model, dataset, steps):
    """(wall seconds, CPU seconds) of each of ``steps`` training steps."""
    timer = _make_step_timer()()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[timer])
    # [0] is train begin; [i] the end of step i (1-based).
    wall, cpu = timer.wall, timer.cpu
    return ([wall[i] - wall[i - 1] for i in range(1, steps + 1)],
            [cpu[i] - cpu[i - 1] for i in range(1, steps + 1)])


def build_compression(config, hierarchical=None):
    """Returns (compression for hvd.DistributedOptimizer, search callback class or None, note).

    ``hierarchical``: MergeComp's level setting (None, True or False) for a MergeComp config."""
    import horovod.tensorflow.keras as hvd

    kind = config["kind"]
    if kind not in COMPRESSION_KINDS:
        raise ValueError("config kind must be one of %s, got %r" % (COMPRESSION_KINDS, kind))
    if kind == "horovod":
        choices = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}
        if config["compression"] not in choices:
            raise ValueError("horovod compression must be one of %s" % ", ".join(choices))
        return choices[config["compression"]], None, ""
    from tf_mergecomp import MergeComp, MergeCompCallback

    partition = config["partition"]
    if partition not in MERGECOMP_PARTITIONS:
        raise ValueError("partition must be one of %s, got %r" % (MERGECOMP_PARTITIONS, partition))
    params = dict(config.get("params", {}))
    params.setdefault("hierarchical", hierarchical)
    if partition in TWO_LEVEL_PARTITIONS and params["hierarchical"] is not None:
        raise ValueError("partition %r needs MergeComp(hierarchical=None), which lets a group "
                         "take two levels, got hierarchical=%r" % (partition, params["hierarchical"]))
    if partition in FIXED_PARTITIONS:
        layout = fixed_layout(config)
        mergecomp = MergeComp(config["algorithm"], partitions=layout.partitions, seed=0, **params)
        if layout.group_codecs is not None:
            layout.apply(mergecomp)
        return mergecomp, None, ""
    params.update(SEARCHED_PARTITIONS[partition])
    mergecomp = MergeComp(config["algorithm"], partitions=None, seed=0, **params)
    return mergecomp, MergeCompCallback, ""


class Slot:
    """One config of the batch: its model, optimizer and compression (its own, or
    those of the config named by ``config["model_of"]``), and its exchange."""

    def __init__(self, config, result):
        self.config = config
        self.result = result
        self.model = None
        self.compression = None
        self.mergecomp = None
        self.search_callback_class = None
        self.exchange = None
        # MergeComp: the partition it trains with and its train function,
        # made current before each of its turns (``_activate``).
        self.partition = None
        self.train_function = None


def _new_result(config):
    return {"label": config["label"], "config": config, "ok": False, "note": "",
            "step_times_s": [], "switch_steps_s": [], "exchange_times_s": [], "cpu_s": 0.0,
            "elapsed_s": 0.0}


def _build_slot(slot, weights, gradients, spec, hvd, tf, owner=None):
    """The local part of a config's setup: no collectives run here. With
    ``owner`` (the slot of ``config["model_of"]``), the config trains the
    owner's model with the owner's MergeComp, in a partition of its own."""
    from tf_mergecomp.keras2 import keras

    import benchmarks.models as models

    if slot.config.get("model_of") is not None and owner is None:
        raise ValueError("the config whose model it trains, %r, was not set up"
                         % slot.config["model_of"])
    if owner is not None:
        partition = slot.config["partition"]
        if owner.mergecomp is None or partition not in FIXED_PARTITIONS:
            raise ValueError("only MergeComp's %s configs can share a MergeComp config's model"
                             % " and ".join(FIXED_PARTITIONS))
        slot.model, slot.compression, slot.mergecomp = owner.model, owner.mergecomp, owner.mergecomp
        slot.partition = fixed_layout(slot.config)
        slot.exchange = _make_exchange(slot.compression, gradients, tf)
        return
    compression, slot.search_callback_class, slot.result["note"] = build_compression(
        slot.config, spec.get("hierarchical"))
    slot.compression = compression
    slot.mergecomp = compression if slot.config["kind"] == "mergecomp" else None
    slot.model = models.build_model(spec["model"])
    slot.model.set_weights(weights)
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.SGD(learning_rate=spec.get("learning_rate", 0.001)), compression=compression
    )
    slot.model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    slot.exchange = _make_exchange(compression, gradients, tf)


def _warm_up_slot(slot, dataset, spec):
    """The partition search ("searched"), then the warm-up steps (tracing included)."""
    _activate(slot)
    if slot.search_callback_class is not None:
        search_on = spec.get("search_on", "training")
        if search_on not in SEARCH_ON:
            raise ValueError("search_on must be one of %s, got %r" % (SEARCH_ON, search_on))
        if search_on == "training":
            search = _search_partition(slot.model, dataset, slot.mergecomp,
                                       slot.search_callback_class, spec)
        else:
            search = _search_on_exchange(slot.exchange, slot.mergecomp, spec)
        slot.result.update(search)
    times, _ = _train_timed(slot.model, dataset, max(1, spec["warmup_steps"]))
    slot.result["first_steps_s"] = sum(times)
    mergecomp = slot.mergecomp
    if mergecomp is not None:
        if slot.partition is None:  # its own model: the layout it was built with or chose
            slot.partition = Layout.of(mergecomp)
            slot.train_function = slot.model.train_function
        slot.result.update(
            splits=list(mergecomp.splits) if mergecomp.splits is not None else None,
            num_groups=mergecomp.num_groups,
            num_tensors=mergecomp.num_tensors,
            group_codecs=(list(mergecomp.group_codecs) if mergecomp.group_codecs is not None
                          else None),
            plain_horovod=mergecomp.steps_aside,
        )


class Layout:
    """What a MergeComp trains with: its partition (as ``set_partition`` takes it),
    each group's codec, and whether it steps aside for plain Horovod (what a search
    may choose beyond the cuts)."""

    def __init__(self, partitions, group_codecs=None, plain_horovod=False):
        self.partitions = partitions
        self.group_codecs = None if group_codecs is None else list(group_codecs)
        self.plain_horovod = plain_horovod

    @classmethod
    def of(cls, mergecomp):
        return cls(list(mergecomp.splits or ()) or 1, mergecomp.group_codecs,
                   mergecomp.steps_aside)

    def apply(self, mergecomp):
        mergecomp.set_partition(self.partitions, group_codecs=self.group_codecs)
        if self.plain_horovod:
            mergecomp.set_plain_horovod()


def fixed_layout(config):
    """The Layout of a config with a fixed partition (FIXED_PARTITIONS)."""
    from tf_mergecomp.levels import TWO_LEVEL

    partition = config["partition"]
    if partition in TWO_LEVEL_PARTITIONS:
        return Layout(FIXED_PARTITIONS[partition], [config["algorithm"] + TWO_LEVEL])
    return Layout(FIXED_PARTITIONS[partition])


def _activate(slot):
    """Makes the slot's model train with the slot's partition from its next step:
    a model several configs share trains each with a train function of its own."""
    if slot.partition is None:
        return
    slot.partition.apply(slot.mergecomp)
    if slot.train_function is None:  # traced at the next step
        slot.model.make_train_function(force=True)
        slot.train_function = slot.model.train_function
    slot.model.train_function = slot.train_function


def _make_stop_when_done(callback):
    from tf_mergecomp.keras2 import keras

    class StopWhenSearchDone(keras.callbacks.Callback):
        """Ends the fit at the step the search concludes: every rank concludes
        at the same step (its decisions are averaged over the ranks)."""

        def on_train_batch_end(self, batch, logs=None):
            if callback.done:
                self.model.stop_training = True

    return StopWhenSearchDone()


def _search_partition(model, dataset, mergecomp, callback_class, spec):
    """Runs MergeCompCallback's search, for at most spec['search_steps'] steps.

    The fit stops when the search is done; if it reaches that many steps
    first, the callback keeps the fastest candidate measured so far.
    """
    params = dict(spec.get("search_params", {}))
    callback = callback_class(mergecomp, **params)
    started = time.perf_counter()
    model.fit(dataset, steps_per_epoch=spec["search_steps"], epochs=1, verbose=0,
              callbacks=[callback, _make_stop_when_done(callback)])
    return _search_record(callback.search, time.perf_counter() - started, "training")


def _search_record(driver, seconds, search_on):
    """What a search chose and cost, for the result JSON."""
    algorithm = driver.algorithm
    return {
        "search_s": seconds,
        "search_on": search_on,
        "search_steps": driver.cost["steps"],
        "search_traces": driver.cost["traces"],
        "search_cost": _jsonable(driver.cost),
        "search_finished": bool(algorithm is not None and algorithm.done),
        "search_candidates": len(driver.history),
        "search_history": _jsonable(driver.history),
        "search_summary": _jsonable(algorithm.summary()) if algorithm is not None else None,
    }


def _random_gradients(model, rank, tf):
    """Fixed random tensors of the model's gradient shapes, different on every rank,
    shared by the exchanges of all configs."""
    generator = tf.random.Generator.from_seed(1000 + rank)
    return [generator.normal(v.shape, dtype=v.dtype) for v in model.trainable_variables]


def _make_exchange(compression, gradients, tf):
    """(step, gradients): ``step(gradients)`` runs the optimizer's gradient exchange alone.

    ``step`` runs Horovod's ``DistributedGradientTape`` with this compression
    (MergeComp's reduction through its hook): the same allreduce function the
    optimizer builds, applied to ``gradients`` as they are (the tape is asked
    for the gradient of the tensors with respect to themselves, with the tensors
    as output gradients, which records no op). It runs in a ``tf.function``
    traced at its first call, in the config's first turn (its partition set:
    ``_activate``), and returns one element of every reduced tensor, so
    waiting for it waits for the whole exchange without copying the gradients
    out.
    """
    import horovod.tensorflow as hvd_tf

    def first_elements(grads):
        grads = list(grads)
        with tf.GradientTape() as tape:
            tape.watch(grads)
        tape = hvd_tf.DistributedGradientTape(tape, compression=compression)
        reduced = tape.gradient(grads, grads, output_gradients=grads)
        return tf.stack([tf.reshape(g, [-1])[0] for g in reduced])

    return tf.function(first_elements), gradients


def _time_exchange(exchange, calls, unmeasured):
    """Wall time of each of ``calls`` exchanges after ``unmeasured`` ones."""
    step, gradients = exchange
    times = []
    for index in range(unmeasured + calls):
        started = time.perf_counter()
        step(gradients).numpy()
        if index >= unmeasured:
            times.append(time.perf_counter() - started)
    return times


def _search_on_exchange(exchange, mergecomp, spec):
    """MergeComp's partition search with the exchange alone as the step (module docstring)."""
    from tf_mergecomp.search.driver import PartitionSearchDriver

    _, gradients = exchange
    params = dict(spec.get("search_params", {}))
    search = PartitionSearchDriver(mergecomp, **params)
    step = search.function(exchange[0].python_function)
    started = time.perf_counter()
    for _ in range(spec.get("search_steps", 300)):
        if search.done:
            break
        search.before_step()
        search.after_step(step(gradients))
    search.finish()
    return _search_record(search, time.perf_counter() - started, "exchange")


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
    from tf_mergecomp.keras2 import keras

    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    times, _ = _train_timed(model, dataset, 3 + spec["compute_steps"])
    times = sorted(times[3:])
    return times[len(times) // 2]


def peak_rss_mb():
    """The most resident memory this process has held, in MB (Linux: ru_maxrss in KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _agree(flags, name, hvd_tf, tf):
    """Per flag, whether it is true on every rank (a min-allreduce)."""
    local = tf.constant([1 if flag else 0 for flag in flags], tf.int32)
    return [bool(v) for v in hvd_tf.allreduce(local, op=hvd_tf.Min, name=name).numpy()]


def _has_time(spec, needed_s):
    return time.time() + needed_s < spec["deadline"]


def _run_step(result, step, *args):
    """Runs a setup step; on an exception records it in ``result``. Returns success."""
    try:
        step(*args)
        return True
    except Exception as error:  # recorded per config; the launcher log shows the traceback
        traceback.print_exc()
        result["error"] = report.error_text(error)
        return False


def set_up_slots(spec, weights, gradients, dataset, output, write, hvd, hvd_tf, tf):
    """Builds and warms up every config of the batch; returns the slots ready on all ranks.
    A config training another's model (``model_of``) is set up after all the others."""
    slots, by_label = [], {}
    last_setup_s = 0.0
    configs = sorted(spec["configs"], key=lambda c: c.get("model_of") is not None)
    for index, config in enumerate(configs):
        result = _new_result(config)
        output["results"].append(result)
        if not _agree([_has_time(spec, last_setup_s)], "bench_time_%d" % index, hvd_tf, tf)[0]:
            result["error"] = "deadline: no time left to set this config up"
            break
        started = time.perf_counter()
        slot = Slot(config, result)
        owner = by_label.get(config.get("model_of"))
        for phase, step, args in (("build", _build_slot,
                                   (slot, weights, gradients, spec, hvd, tf, owner)),
                                  ("warmup", _warm_up_slot, (slot, dataset, spec))):
            ok_here = _run_step(result, step, *args)
            if not _agree([ok_here], "bench_%s_%d" % (phase, index), hvd_tf, tf)[0]:
                result.setdefault("error", "%s failed on another rank" % phase)
                break
        else:
            result["ok"] = True
            result["setup_s"] = time.perf_counter() - started
            slots.append(slot)
            by_label[config["label"]] = slot
        last_setup_s = time.perf_counter() - started
        write()
    order = {c["label"]: i for i, c in enumerate(spec["configs"])}
    output["results"].sort(key=lambda r: order[r["label"]])
    return sorted(slots, key=lambda slot: order[slot.config["label"]])


def rotated(items, shift):
    """``items`` rotated left by ``shift``: each round starts with a different config."""
    if not items:
        return []
    shift %= len(items)
    return items[shift:] + items[:shift]


def time_in_rounds(slots, dataset, spec, output, write, hvd_tf, tf):
    """The interleaved measurement (module docstring); stops early, on all ranks, at the deadline."""
    from tf_mergecomp.search import restart as horovod_restart

    steps = spec["steps_per_round"]
    exchange_calls = spec.get("exchange_steps", 0)
    last_round_s = 0.0
    for round_index in range(spec["rounds"]):
        if not _agree([_has_time(spec, last_round_s)], "bench_round_%d" % round_index, hvd_tf, tf)[0]:
            output["rounds_note"] = "deadline: stopped after %d of %d rounds" % (
                round_index, spec["rounds"])
            break
        started = time.perf_counter()
        for slot in rotated(slots, round_index):
            if output["restart_blocker"] is None:
                output["restart_blocker"] = horovod_restart.restart_horovod()
                if output["restart_blocker"] is None:
                    output["horovod_restarts"] += 1
            _activate(slot)
            collectives_before = _collectives(slot)
            # One untimed step: the switch from the previous config.
            times, cpu_times = _train_timed(slot.model, dataset, 1 + steps)
            result = slot.result
            result["step_times_s"] += times[1:]
            result["switch_steps_s"].append(times[0])  # kept to show it never re-traces
            result["cpu_s"] += sum(cpu_times[1:])
            result["elapsed_s"] += sum(times[1:])
            if exchange_calls:
                # The first round's first two calls trace and warm up.
                result["exchange_times_s"] += _time_exchange(
                    slot.exchange, exchange_calls, unmeasured=2 if round_index == 0 else 1)
            if collectives_before is not None:
                result["collectives_executed"] = (result.get("collectives_executed", 0)
                                                  + _collectives(slot) - collectives_before)
        output["rounds_done"] = round_index + 1
        last_round_s = time.perf_counter() - started
        write()


def _collectives(slot):
    """MergeComp's count of the collectives it ran (shared by the configs of one model)."""
    return int(slot.mergecomp.collectives_executed.numpy()) if slot.mergecomp is not None else None


def init_horovod(hvd, hierarchical):
    """``hvd.init``, with the machines' process sets unless ``hierarchical`` is False
    (none when every machine holds one rank). Returns the sets given."""
    process_sets = []
    if hierarchical is not False:
        from tf_mergecomp.hierarchical import machine_process_sets

        process_sets = machine_process_sets()
    hvd.init(process_sets=process_sets)
    return process_sets


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m benchmarks.worker SPEC.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        spec = json.load(f)
    _configure_threads()
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    import benchmarks.models as models
    from tf_mergecomp.search import restart as horovod_restart
    from tf_mergecomp.keras2 import keras

    process_sets = init_horovod(hvd, spec.get("hierarchical"))
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(1234)
    reference = models.build_model(spec["model"])
    dataset = models.synthetic_dataset(spec["model"], spec["batch_size"], seed=rank,
                                       model=reference)
    # One broadcast so every rank starts from the same weights, as in training.
    hvd_tf.broadcast_variables(reference.variables, root_rank=0)
    output = {
        "rank": rank,
        "size": size,
        "local_size": hvd.local_size(),
        "cross_size": hvd.cross_size(),
        "hierarchical": spec.get("hierarchical"),
        "machine_process_sets": len(process_sets),
        "model": spec["model"],
        "parameters": int(reference.count_params()),
        "gradient_tensors": len(reference.trainable_variables),
        "rounds": spec["rounds"],
        "steps_per_round": spec["steps_per_round"],
        "cores": sorted(os.sched_getaffinity(0)),
        "results": [],
    }

    def write():
        output["peak_rss_mb"] = peak_rss_mb()
        with open(spec["result_path"].format(rank=rank), "w") as f:
            json.dump(output, f, indent=1)

    if spec.get("compute_steps"):
        output["compute_step_s"] = _local_compute_time(reference, dataset, spec, tf)
    # Why Horovod is not restarted between configs; None when it is.
    output["restart_blocker"] = horovod_restart.restart_blocker()
    output["horovod_restarts"] = 0  # those between configs; a search's are in its own cost
    gradients = _random_gradients(reference, rank, tf)
    weights = reference.get_weights()
    del reference  # each config trains a model of its own
    slots = set_up_slots(spec, weights, gradients, dataset, output, write, hvd, hvd_tf, tf)
    output["peak_rss_after_setup_mb"] = peak_rss_mb()
    time_in_rounds(slots, dataset, spec, output, write, hvd_tf, tf)
    for slot in slots:  # the summary compares them across the ranks
        slot.result["weights_checksum"] = weights_checksum(slot.model)
    write()
    return 0


def weights_checksum(model):
    """The sum of the trainable weights' absolute values, in float64: equal on ranks that
    hold the same weights (a model the configs of a batch share gives each of them its
    final sum). Not the other variables: BatchNormalization's moving statistics follow
    each rank's own batches, in data-parallel training as Horovod does it."""
    import numpy as np

    return float(sum(np.abs(np.asarray(w, dtype=np.float64)).sum()
                     for w in model.trainable_weights))


if __name__ == "__main__":
    sys.exit(main())
