"""One model's step profile on this machine: what the step-time simulator needs.

    python -m benchmarks profile --model resnet50|vgg16|transformer|NAME
        [--out P.json] [--codecs none,fp16,...] [--quick] [--processes N]

Records, in a child process with one TensorFlow thread (as the cluster
benchmark's ranks run) and Horovod of size 1 (or N, below):

- the model's gradient tensors (shapes, element counts) in backprop order;
- when each gradient becomes ready in a real training step, from the start
  of the step (TensorFlow's profiler over 4 steps with MergeComp's no-op
  codec in one group, as the partition search profiles; the ready times are
  scaled from the profiled step to a plain one, since the profiler slows
  every op) -- tf_mergecomp/search/recorder.py; then scaled to the plain local
  step (``to_plain_step``: the profiled one-group step runs slower than the
  plain one on this shared machine);
- the forward pass, the optimizer update and the whole plain local step
  (Keras SGD, no Horovod), each the median of a few timed calls; backward =
  last ready time - forward; tail = plain step - last ready time (the
  optimizer update and Keras' per-step work);
- each codec's cost curve: the exchange probe of the partition search
  (``recorder.ExchangeProbe``) times each group's encode, collective
  and decode alone on random tensors of the model's gradient shapes, for
  balanced layouts of 1, 2, 4, 8, 16 groups and layer-wise (``--quick``: 1, 4
  and layer-wise); ``step_model.LinearGroupCosts.fit`` fits a fixed cost per
  call plus a cost per element and per tensor to each part, and the probed
  groups' own encode and decode are kept beside the fit (``probed``: the
  simulator prices those of several tensors as timed, the rest by the fit). With Horovod of
  size 1 the collective moves no bytes: its part is this host's cost of
  handing a collective to Horovod and back, kept as such by the simulator
  (with N ranks, also the host's share of moving and reducing the bytes);
- each codec's wire bytes per group (from its ``payload_nbytes``) and its
  collective (allreduce or allgather).

``--processes N`` (N >= 2) runs the children as the N ranks of one Horovod job
over loopback (Gloo, each rank its own "host", as the cluster benchmark's
ranks are) and averages them. They contend for this machine's cores as the
cluster's ranks do, and the probe's collectives do a real N-rank exchange:
the host's share of a collective (Gloo's CPU reduction, software float16
sums, the copies of every gathered row, the kernel's TCP work) lands in the
codec's collective part, and an allgather codec's decode reads N rows. The
profile records N as ``horovod.probe_workers``; the simulator scales those
per-byte parts to W workers (tf_mergecomp/search/step_model.py, ``NetworkGroupCosts``).
The loopback's own transfer is in them too: the profile measures what the
ranks' loopback ring delivers (``link_check``, every rank sending to the next
at once on its own cores) and records the check as ``probe_link``,
and the simulator takes that transfer out, the simulated network's taking its
place (on a host whose cores move the bytes, loopback is no faster than the
shaped links, and added to them the transfer counted twice). Each rank
keeps to its share of the cores (``worker.pin_to_own_cores``), as the cluster
benchmark's ranks do by default: compute and codec costs of a rank pinned to
one core are not those of a rank the scheduler moves across two
(``--no-pin-cores`` for the latter; the profile records which in
``host.pin_cores``).

``--model`` also takes any Keras model: ``package.module:function`` (a
function of no arguments returning a built model) or the name of a
``keras.applications`` model (built at 32x32x3, 10 classes, no weights);
its data is one synthetic batch of its input's shape and dtype
(benchmarks/models.py).

The JSON (``SCHEMA``) holds ``source: "measured on <host>"``; a profile built
from published figures (benchmarks/paper_profile.py) says so there.
``load`` checks a profile and names what is missing or wrong.
"""

import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time

SCHEMA = "tf_mergecomp.profile/1"
DEFAULT_CODECS = ("none", "fp16", "qsgd", "terngrad", "onebit", "signsgd", "signum",
                  "efsignsgd", "dgc", "topk", "randomk", "powersgd")
QUICK_CODECS = ("none", "fp16", "efsignsgd", "topk", "dgc")
PARTS = ("encode", "collective", "decode")
COEFFICIENTS = ("fixed_s", "per_element_s", "per_tensor_s")


# ---- the schema -----------------------------------------------------------------------

def _require(mapping, key, where, kind=None):
    if not isinstance(mapping, dict) or key not in mapping:
        raise ValueError("profile: %s lacks %r" % (where, key))
    value = mapping[key]
    if kind is not None and not isinstance(value, kind):
        raise ValueError("profile: %s.%s must be %s, got %r"
                         % (where, key, getattr(kind, "__name__", kind), type(value).__name__))
    return value


def validate(profile):
    """Raises ValueError naming the first missing or malformed field; returns the profile."""
    if not isinstance(profile, dict):
        raise ValueError("profile: a JSON object expected")
    schema = _require(profile, "schema", "the profile", str)
    if schema != SCHEMA:
        raise ValueError("profile: schema %r, expected %r" % (schema, SCHEMA))
    source = _require(profile, "source", "the profile", str)
    if not source.strip():
        raise ValueError("profile: source must say where the figures come from")
    _require(profile, "model", "the profile", str)
    tensors = _require(profile, "tensors", "the profile", dict)
    sizes = _require(tensors, "sizes", "tensors", list)
    if not sizes or any(not isinstance(s, (int, float)) or s < 0 for s in sizes):
        raise ValueError("profile: tensors.sizes must be non-negative element counts")
    n = len(sizes)
    compute = _require(profile, "compute", "the profile", dict)
    ready = _require(compute, "ready_s", "compute", list)
    if len(ready) != n:
        raise ValueError("profile: compute.ready_s has %d values for %d tensors" % (len(ready), n))
    for key in ("forward_s", "backward_s", "optimizer_s", "step_s", "tail_s"):
        value = _require(compute, key, "compute", (int, float))
        if value < 0:
            raise ValueError("profile: compute.%s must be >= 0" % key)
    placement = _require(profile, "placement", "the profile", dict)
    for key in ("codec_on_compute", "decodes_after_backprop"):
        _require(placement, key, "placement", bool)
    horovod = _require(profile, "horovod", "the profile", dict)
    for key in ("cycle_time_s", "fusion_buffer_bytes"):
        _require(horovod, key, "horovod", (int, float))
    codecs = _require(profile, "codecs", "the profile", dict)
    if not codecs:
        raise ValueError("profile: codecs is empty")
    for name, codec in codecs.items():
        where = "codecs.%s" % name
        kind = _require(codec, "collective_op", where, str)
        if kind not in ("allreduce", "allgather"):
            raise ValueError("profile: %s.collective_op must be allreduce or allgather" % where)
        _require(codec, "collectives_per_group", where, int)
        wire = _require(codec, "wire", where, dict)
        for key in ("fixed_bytes", "per_element_bytes"):
            _require(wire, key, where + ".wire", (int, float))
        extra = wire.get("tensor_bytes")
        if extra is not None and len(extra) != n:
            raise ValueError("profile: %s.wire.tensor_bytes needs %d values" % (where, n))
        # collective_cpu (optional): the collectives' CPU work on the host.
        for part in PARTS + (("collective_cpu",) if "collective_cpu" in codec else ()):
            coefficients = _require(codec, part, where, dict)
            for key in COEFFICIENTS:
                value = _require(coefficients, key, "%s.%s" % (where, part), (int, float))
                if value < 0:
                    raise ValueError("profile: %s.%s.%s must be >= 0" % (where, part, key))
        if "probed" in codec:
            _check_probed(codec["probed"], where + ".probed", n)
    networks = profile.get("networks", {})
    for name, network in networks.items():
        for key in ("bandwidth_bytes_per_s", "latency_s"):
            _require(network, key, "networks.%s" % name, (int, float))
    return profile


def _check_probed(probed, where, n):
    """The probe's own groups (optional): [lo, hi) bounds within the model's n
    tensors, and a non-negative encode and decode for each."""
    bounds = _require(probed, "bounds", where, list)
    for key in ("encode_s", "decode_s"):
        values = _require(probed, key, where, list)
        if len(values) != len(bounds) or any(
                not isinstance(v, (int, float)) or v < 0 for v in values):
            raise ValueError("profile: %s.%s needs %d non-negative seconds"
                             % (where, key, len(bounds)))
    for group in bounds:
        if (not isinstance(group, list) or len(group) != 2
                or not all(isinstance(b, int) for b in group) or not 0 <= group[0] < group[1] <= n):
            raise ValueError("profile: %s.bounds: [lo, hi] with 0 <= lo < hi <= %d, got %r"
                             % (where, n, group))


def read_json(path, what):
    """The JSON at ``path``; a ValueError naming ``what`` it should be if unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as error:
        raise ValueError("cannot read the %s %s: %s" % (what, path, error)) from None
    except json.JSONDecodeError as error:
        raise ValueError("the %s %s is not JSON: %s" % (what, path, error)) from None


def load(path):
    return validate(read_json(path, "profile"))


def save(profile, path):
    validate(profile)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as f:
        json.dump(profile, f, indent=1)
    return path


def codec_coefficients(codec):
    """[3, 3] coefficients (rows encode, collective, decode) of a profile's codec entry."""
    return [[codec[part][key] for key in COEFFICIENTS] for part in PARTS]


# ---- wire bytes -----------------------------------------------------------------------

def wire_model(compressor, shapes):
    """{fixed_bytes, per_element_bytes, tensor_bytes} for a group of a codec, from its
    exact ``payload_nbytes``: per element and fixed from two large buffers; codecs
    whose payload is per tensor (random-k's k per tensor, PowerSGD's factors) list
    each tensor's bytes instead."""
    sizes = [_elements(s) for s in shapes]
    name = compressor.name
    if name == "powersgd":
        return {"fixed_bytes": 0, "per_element_bytes": 0.0,
                "tensor_bytes": [int(compressor.payload_nbytes([s])) for s in shapes]}
    if name == "randomk":
        return {"fixed_bytes": 0, "per_element_bytes": 0.0,
                "tensor_bytes": [int(compressor.payload_nbytes(n)) for n in sizes]}
    big = 1 << 24
    per_element = (compressor.payload_nbytes(2 * big) - compressor.payload_nbytes(big)) / big
    fixed = compressor.payload_nbytes(big) - per_element * big
    return {"fixed_bytes": max(0.0, float(fixed)), "per_element_bytes": float(per_element),
            "tensor_bytes": None}


def _elements(shape):
    count = 1
    for dimension in shape:
        count *= int(dimension)
    return count


# ---- the child: one model, measured -----------------------------------------------------

def _median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else float("nan")


def _timed_calls(function, calls):
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return times


def measure(model_name, codecs, quick, batch_size=32):
    """The profile's measured fields, in this process (TensorFlow, Horovod size 1)."""
    from benchmarks.worker import pin_to_own_cores

    cores = pin_to_own_cores()  # before TensorFlow starts its thread pools
    import numpy as np
    import tensorflow as tf

    threads = int(os.environ.get("MERGECOMP_BENCH_TF_THREADS", "1"))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import horovod.tensorflow.keras as hvd

    from tf_mergecomp import MergeComp
    from tf_mergecomp.search import recorder, step_model
    from tf_mergecomp.keras2 import keras
    from benchmarks import models
    from tf_mergecomp.grouping import balanced_splits, layerwise_splits

    hvd.init()
    started = time.perf_counter()
    # The plain local step: Keras SGD, no Horovod.
    model = models.build_model(model_name)
    dataset = models.synthetic_dataset(model_name, batch_size, model=model)
    features, labels = next(iter(dataset))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=loss)
    steps = 4 if quick else 8
    model.fit(dataset, steps_per_epoch=3, epochs=1, verbose=0)  # traces, warms up
    step_s = _median(_fit_step_times(model, dataset, steps, keras))

    forward = tf.function(lambda x: model(x, training=True))
    forward(features)
    forward_s = _median(_timed_calls(lambda: forward(features).numpy(), steps))

    optimizer = keras.optimizers.SGD(0.0)
    grads = [tf.random.normal(v.shape) for v in model.trainable_variables]
    apply = tf.function(lambda g: optimizer.apply_gradients(zip(g, model.trainable_variables)))
    apply(grads)
    optimizer_s = _median(_timed_calls(lambda: (apply(grads), tf.constant(0).numpy()), steps))

    # Ready times: MergeComp's no-op codec in one group, profiled like the search does.
    mergecomp = MergeComp("none", partitions=1)
    profiled_model = models.build_model(model_name)
    profiled_model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0),
                                                              compression=mergecomp), loss=loss)
    producers = recorder.GradientOps()
    mergecomp.step_recorder = producers
    profiled_model.fit(dataset, steps_per_epoch=1, epochs=1, verbose=0)  # traces
    mergecomp.step_recorder = None
    profiled_model.fit(dataset, steps_per_epoch=2, epochs=1, verbose=0)
    profiler = recorder.StepProfiler()
    profiled = []
    note = None
    if profiler.start():
        marker = _profiler_marker(profiler, keras)
        profiled_model.fit(dataset, steps_per_epoch=4, epochs=1, verbose=0, callbacks=[marker])
        profiled = profiler.stop(producers.producers)
    if not profiled:
        note = profiler.error or "the profiler saw no step"
    plain_one_group = _median(_fit_step_times(profiled_model, dataset, 4, keras))
    sizes = mergecomp.tensor_sizes
    shapes = mergecomp.tensor_shapes
    dtypes = mergecomp.tensor_dtypes
    n = len(sizes)
    if profiled:
        ready = np.nanmedian(np.stack([p.ready for p in profiled]), axis=0)
        under_profiler = _median([p.seconds for p in profiled])
        ready = ready * (plain_one_group / under_profiler)
        unseen = int(np.isnan(ready).sum())
        if unseen:
            note = "%d of %d gradients not seen by the profiler (filled from neighbours)" % (
                unseen, n)
    else:
        ready = np.full(n, np.nan)
    from tf_mergecomp.search.step_model import fill_ready

    if np.isfinite(ready).any():
        ready = fill_ready(ready, sizes)
    else:  # no profile: gradients spread evenly over backprop, as a last resort
        ready = forward_s + (step_s - forward_s - optimizer_s) * np.arange(1, n + 1) / n
        note = (note or "") + "; ready times spread evenly"
    backprop_end = float(ready[-1])
    profile_s = time.perf_counter() - started

    # Codec cost curves from the exchange probe.
    group_counts = (1, 4) if quick else (1, 2, 4, 8, 16)
    layouts = []
    for groups in group_counts:
        if groups <= n:
            layout = tuple(balanced_splits(sizes, groups))
            if layout not in layouts:
                layouts.append(layout)
    layouts.append(tuple(layerwise_splits(n)))
    repeats = 2 if quick else 3
    codec_entries = {}
    total_elements = float(sum(sizes))
    for name in codecs:
        codec_started = time.perf_counter()
        codec_mergecomp = MergeComp(name)
        shim = _ProbeSource(codec_mergecomp, shapes, dtypes)
        probe = recorder.ExchangeProbe(shim)
        groups, seconds = [], []
        cpu_features, collective_cpu = [], []
        for layout in layouts:
            samples = probe.run(layout, repeats=repeats)  # [repeats, groups, 3]
            bounds = (0,) + layout + (n,)
            medians = np.median(samples, axis=0)
            for index in range(len(bounds) - 1):
                groups.append((bounds[index], bounds[index + 1]))
                seconds.append(medians[index].tolist())
            # The process's CPU seconds beyond the encodes and decodes (which
            # run on TensorFlow's thread, busy all along): the collectives'
            # work on the host's CPU, for all the layout's groups together.
            cpu_features.append((len(bounds) - 1, total_elements, n))
            collective_cpu.append(max(0.0, float(np.median(probe.cpu_s))
                                      - float(medians[:, 0].sum() + medians[:, 2].sum())))
        fit = step_model.LinearGroupCosts.fit(sizes, groups, seconds)
        described = fit.describe()
        probed = _probed_groups(groups, seconds)
        compressor = codec_mergecomp.compressor
        entry = {
            "collective_op": compressor.collective,
            "collectives_per_group": 2 if name == "powersgd" else 1,
            "wire": wire_model(compressor, shapes),
            "memory": codec_mergecomp.memory.name if hasattr(codec_mergecomp.memory, "name")
            else str(codec_mergecomp.memory),
            "probed_groups": len(groups),
            "probe_s": time.perf_counter() - codec_started,
            "probed": probed,
        }
        for part in PARTS:
            entry[part] = {key: float(described[part][key]) for key in COEFFICIENTS}
            entry[part]["per_input_byte_s"] = float(described[part]["per_element_s"]) / 4.0
        if hvd.size() > 1 and not tf.config.list_physical_devices("GPU"):
            # A CPU host's: there the collectives' CPU work competes with
            # backprop (StepTimeModel's host_cpu). Every layout holds all
            # tensors, so only the per-collective term is told apart; the rest
            # of a layout's CPU is spread per element.
            fixed, per_element, per_tensor = step_model.fit_coefficients(cpu_features,
                                                                         collective_cpu)
            entry["collective_cpu"] = {
                "fixed_s": float(fixed),
                "per_element_s": float(per_element + per_tensor * n / max(1.0, total_elements)),
                "per_tensor_s": 0.0}
        codec_entries[name] = entry
        print("[profile] %s: %d groups probed in %.1f s" % (name, len(groups),
                                                           entry["probe_s"]), file=sys.stderr,
              flush=True)

    return {
        "cores": cores,
        "tensors": {"shapes": shapes, "sizes": [int(s) for s in sizes], "dtypes": dtypes,
                    "order": "backprop"},
        "compute": {
            "batch_size": batch_size,
            "forward_s": forward_s,
            "backward_s": max(0.0, backprop_end - forward_s),
            "optimizer_s": optimizer_s,
            "step_s": step_s,
            "one_group_step_s": plain_one_group,
            "tail_s": max(0.0, plain_one_group - backprop_end),
            "ready_s": [float(r) for r in ready],
            "profile_s": profile_s,
            "note": note,
        },
        "codecs": codec_entries,
    }


def _probed_groups(groups, seconds):
    """{"bounds", "encode_s", "decode_s"} of every group the probe timed (a group
    that several layouts hold: its median). The fit's three terms cannot follow a
    codec whose cost per element falls with the group's size (top-k: 2.3 ns an
    element in one ResNet50 group, 6 in its tensors), and
    weighs each probed group alike, so 214 tensors outvote one group: the
    simulator takes the probed groups of several tensors as timed."""
    import numpy as np

    timed = {}
    for (lo, hi), (encode, _, decode) in zip(groups, seconds):
        timed.setdefault((int(lo), int(hi)), []).append((encode, decode))
    bounds = sorted(timed)
    medians = [np.median(np.asarray(timed[b]), axis=0) for b in bounds]
    return {"bounds": [list(b) for b in bounds],
            "encode_s": [float(m[0]) for m in medians],
            "decode_s": [float(m[1]) for m in medians]}


class _ProbeSource:
    """What ExchangeProbe reads of a MergeComp: another codec, the model's shapes."""

    def __init__(self, mergecomp, shapes, dtypes):
        self.compressor = mergecomp.compressor
        self.memory = mergecomp.memory
        self.seed = mergecomp.seed
        self.plain_groups = mergecomp.plain_groups
        self.hierarchical = mergecomp.hierarchical
        self.machine_dtype = mergecomp.machine_dtype
        self.tensor_shapes = shapes
        self.tensor_dtypes = dtypes


def _fit_step_times(model, dataset, steps, keras):
    times = []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.started)

    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[Timer()])
    return times


def _profiler_marker(profiler, keras):
    class Marker(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            profiler.step_begins()

        def on_train_batch_end(self, batch, logs=None):
            profiler.step_ends()

    return Marker()


# ---- the parent ---------------------------------------------------------------------------

def _average(values):
    """The element-wise mean of equal JSON structures (numbers averaged, the rest
    taken from the first)."""
    first = values[0]
    if isinstance(first, bool) or first is None or isinstance(first, str):
        return first
    if isinstance(first, (int, float)):
        numbers = [v for v in values if isinstance(v, (int, float))]
        mean = sum(numbers) / len(numbers)
        return int(round(mean)) if isinstance(first, int) else mean
    if isinstance(first, list):
        if all(isinstance(v, list) and len(v) == len(first) for v in values):
            return [_average([v[i] for v in values]) for i in range(len(first))]
        return first
    if isinstance(first, dict):
        return {key: _average([v[key] for v in values if key in v]) for key in first}
    return first


def record(model_name, codecs=DEFAULT_CODECS, quick=False, processes=1, batch_size=32,
           timeout_s=1800, log=print, pin_cores=True):
    """The profile of ``model_name`` on this machine (children as the module docstring says;
    with ``processes`` > 1 and ``pin_cores``, each rank on its share of the cores)."""
    from benchmarks import models
    from tf_mergecomp.compressors import NAMES

    models.check_profile_model(model_name)
    unknown = [c for c in codecs if c not in NAMES]
    if unknown:
        raise ValueError("unknown codec(s) %s; valid choices: %s"
                         % (", ".join(unknown), ", ".join(NAMES)))
    if processes < 1:
        raise ValueError("processes must be >= 1, got %r" % processes)
    command = [sys.executable, "-m", "benchmarks.profile", "--child", model_name,
               ",".join(codecs), "1" if quick else "0", str(batch_size)]
    started = time.time()
    pin_cores = bool(pin_cores) and processes > 1
    loopback = _check_loopback(processes, pin_cores, log) if processes > 1 else None
    outputs = _run_children(command, processes, timeout_s, model_name, pin_cores)
    rank_cores = [output.pop("cores", None) for output in outputs]
    measured = _average(outputs)
    import tensorflow as tf

    from tf_mergecomp.search.settings import horovod_fusion

    cycle_s, fusion_bytes = horovod_fusion()

    host = socket.gethostname()
    profile = {
        "schema": SCHEMA,
        "source": "measured on %s" % host,
        "model": model_name,
        "recorded": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "recording_s": time.time() - started,
        "host": {"hostname": host, "cpus": os.cpu_count(), "tensorflow": tf.__version__,
                 "tf_threads": int(os.environ.get("MERGECOMP_BENCH_TF_THREADS", "1")),
                 "processes": processes, "pin_cores": pin_cores, "rank_cores": rank_cores,
                 "load_average": list(os.getloadavg())},
        "placement": {"codec_on_compute": True, "decodes_after_backprop": True},
        "horovod": {"cycle_time_s": cycle_s, "fusion_buffer_bytes": fusion_bytes,
                    "fp32": "none", "fp16": "fp16", "probe_waits_cycle": True,
                    "probe_workers": processes},
        "probe_link": loopback,
        "notes": [
            "CPU host, one TensorFlow thread per process: codecs run on the thread that runs "
            "backprop, and decodes wait for the end of backprop (tf_mergecomp/search/step_model.py).",
            ("codecs.*.collective: one collective of a %d-rank Horovod job over loopback: "
             "this host's share of it (Gloo's reduction and copies), added to the "
             "network's cost, less the loopback's own transfer at "
             "probe_link.delivered_bytes_per_s where measured" % processes) if processes > 1 else
            ("codecs.*.collective: the cost of one collective on Horovod of size 1 (no bytes "
             "moved): this host's per-collective overhead, added to the network's cost."),
            "quick run (fewer probe layouts and repeats)" if quick else "full probe",
        ],
    }
    profile.update(measured)
    to_plain_step(profile)
    log("[profile] %s: %d tensors, step %.3f s, backprop ends at %.3f s, %d codecs, %.0f s"
        % (model_name, len(profile["tensors"]["sizes"]), profile["compute"]["step_s"],
           profile["compute"]["ready_s"][-1], len(profile["codecs"]), profile["recording_s"]))
    return validate(profile)


def _check_loopback(processes, pin_cores, log):
    """What the probe's ring over loopback delivers each way (``link_check`` on
    the ranks' cores): the probe's collectives moved their bytes at that rate,
    and the simulator takes that transfer out of the host's share of a
    collective (network_model.NetworkGroupCosts). A failed check is recorded and
    the profile goes on, its collectives' host share then kept whole."""
    from benchmarks import link_check

    check = link_check.measure_on_rank_cores(
        link_check.Loopback(processes), link_check.NOMINAL_UNSHAPED_BYTES_PER_S, pin_cores)
    if check.get("error"):
        log("[profile] loopback not measured (%s): the collectives' host share is kept whole"
            % check["error"])
    else:
        check["nominal_bytes_per_s"] = None
        log("[profile] loopback: " + link_check.describe(check))
    return check


def _run_children(command, processes, timeout_s, model_name, pin_cores=False):
    """Each child's JSON line: one child on Horovod of size 1, or ``processes``
    ranks of one Horovod job over loopback (module docstring)."""
    from benchmarks import launcher, worker

    deadline = time.monotonic() + timeout_s
    hostnames = ["profile-rank%d" % rank for rank in range(processes)]
    extra_env = {"TF_CPU_ALLOCATOR_USE_BFC": "true",
                 worker.PIN_CORES_VARIABLE: "1" if pin_cores else "0"}
    with launcher.RendezvousServer("127.0.0.1") as server:
        if processes > 1:
            server.start(hostnames)
        children = []
        for rank in range(processes):
            if processes > 1:
                environment = launcher.rank_environment(
                    rank, processes, hostnames[rank], "lo", "127.0.0.1", server.port,
                    extra_env=extra_env)
            else:
                environment = launcher.job_environment(extra_env=extra_env)
            children.append(subprocess.Popen(command, env=environment, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True,
                                             start_new_session=True))
        # One reader per child: a rank blocked on a full pipe would stall the job.
        with concurrent.futures.ThreadPoolExecutor(processes) as pool:
            futures = [pool.submit(child.communicate) for child in children]
            try:
                results = [future.result(timeout=max(1.0, deadline - time.monotonic()))
                           for future in futures]
            except concurrent.futures.TimeoutError:
                for child in children:
                    child.kill()
                raise RuntimeError("profiling %s took more than %.0f s"
                                   % (model_name, timeout_s)) from None
    outputs = []
    for rank, (child, (stdout, stderr)) in enumerate(zip(children, results)):
        if child.returncode != 0:
            raise RuntimeError("profiling %s failed (rank %d of %d, exit %d):\n%s"
                               % (model_name, rank, processes, child.returncode, stderr[-3000:]))
        outputs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outputs


def to_plain_step(profile):
    """Scales the ready times to the plain local step, then sets the tail.

    The profiled step (MergeComp's no-op codec in one group, Horovod of size
    1) runs slower than the plain Keras step on this machine (1.6x for the
    transformer, 1.9x for ResNet50 in the runs of docs/scaling.md: Horovod's
    background thread and the profiler's bookkeeping compete for the same 2
    cores), while the cluster's ranks run close to the plain step. So the profile keeps the shape of
    the ready times (which gradient is ready when, relative to the others)
    and takes the step's length from the plain step. The measured figures
    stay in ``measured_one_group_step_s`` and ``ready_scale``."""
    compute = profile["compute"]
    scale = compute["step_s"] / compute["one_group_step_s"]
    compute["measured_one_group_step_s"] = compute["one_group_step_s"]
    compute["ready_scale"] = scale
    compute["ready_s"] = [r * scale for r in compute["ready_s"]]
    compute["one_group_step_s"] = compute["step_s"]
    compute["backward_s"] = max(0.0, compute["ready_s"][-1] - compute["forward_s"])
    compute["tail_s"] = _tail(profile)
    return profile


def _tail(profile):
    """The optimizer update and per-step work: the one-group step less backprop.
    It keeps the one-group step's own (size-1) exchange, so that no config is
    predicted faster than the local step; every exchange comes on top of it."""
    compute = profile["compute"]
    return max(0.0, compute["one_group_step_s"] - compute["ready_s"][-1])


def summary_text(profile):
    compute = profile["compute"]
    lines = ["%s (%s): %d gradient tensors, %.1f MB fp32; step %.1f ms (forward %.1f, backward "
             "%.1f, optimizer %.1f, tail %.1f)" % (
                 profile["model"], profile["source"], len(profile["tensors"]["sizes"]),
                 4 * sum(profile["tensors"]["sizes"]) / 2**20, 1e3 * compute["step_s"],
                 1e3 * compute["forward_s"], 1e3 * compute["backward_s"],
                 1e3 * compute["optimizer_s"], 1e3 * compute["tail_s"])]
    lines.append("| codec | collective | encode fixed us | encode ns/element | encode us/tensor "
                 "| decode fixed us | decode ns/element | decode us/tensor |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for name, codec in profile["codecs"].items():
        lines.append("| %s | %s | %.1f | %.3f | %.1f | %.1f | %.3f | %.1f |" % (
            name, codec["collective_op"], 1e6 * codec["encode"]["fixed_s"],
            1e9 * codec["encode"]["per_element_s"], 1e6 * codec["encode"]["per_tensor_s"],
            1e6 * codec["decode"]["fixed_s"], 1e9 * codec["decode"]["per_element_s"],
            1e6 * codec["decode"]["per_tensor_s"]))
    return "\n".join(lines)


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    _, _, child_model, child_codecs, child_quick, child_batch = sys.argv
    print(json.dumps(measure(child_model, child_codecs.split(","), child_quick == "1",
                             int(child_batch))))
