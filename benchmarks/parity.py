"""Accuracy parity: the main job (examples/train_digits.py: a small CNN on scikit-learn's
digits), 2 workers, every codec.

    python -m benchmarks parity [--algorithms ...] [--epochs 8]

Runs ``horovodrun -np 2 --gloo`` on this machine (loopback); each rank trains
on its half of the training split (80% of the 1,797 images, split with a fixed
seed), batch 32 per worker, a fixed number of epochs, the same initial weights
for every config (seeded with ``--seed``, then broadcast from rank 0). Configs: Horovod fp32,
and for each algorithm MergeComp layer-wise, MergeComp with the searched
layout (``MergeCompCallback`` during the first epoch; per group the codec or
plain, or plain Horovod) and with the single-codec search
(``MergeComp(plain_groups=False)``). Reports the final test accuracy on the 360
test images, the searched config's accuracy against the single-codec search's
(``PLAIN_GROUPS_TOLERANCE``), and whether both ranks ended with identical weights.

``--ranks-per-machine N`` (N >= 2, ``--np 2N``): two machines of N ranks on this one
(``horovodrun -H localhost:N,127.0.0.1:N``; Horovod reports local size N, cross size
2). Configs then: Horovod fp32, and for each algorithm one group flat and one group on
two levels (``MergeComp(hierarchical=None)`` with the group's codec
``"<codec>/two-level"``; PowerSGD has no two-level reduce and runs flat only); the table
gives two levels against flat, ``TWO_LEVEL_TOLERANCE`` points at most.

``--codec-params '{"randomk": {"ratio": 0.1}}'``: parameters of an algorithm's compressor
in every config of it (checked before any rank starts; the tables name them).

Optimizer: plain SGD for every config, learning rate 0.05 x workers, except
DGC, whose memory adds momentum 0.9 (so 0.005 x workers gives the same
effective step), and the majority-vote codecs (signsgd, signum), whose update
is a sign per coordinate: 0.002 x workers.
"""

import json
import os
import sys
import time
import traceback

from benchmarks import launcher, report

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIGN_CODECS = ("signsgd", "signum")
LEARNING_RATE = 0.05
DGC_LEARNING_RATE = 0.005
SIGN_LEARNING_RATE = 0.002
SEED = 42
MODES = ("layerwise", "searched", "searched_single")
# On machines of several ranks: one group flat against one group on two levels.
TWO_LEVEL_MODES = ("one", "one_two_level")
# Two levels may not cost more than this much test accuracy against flat (points).
TWO_LEVEL_TOLERANCE = 0.5
# The per-group codec choice may not cost more than this much test accuracy
# against the single-codec search (accuracy points, i.e. percent).
PLAIN_GROUPS_TOLERANCE = 0.5


def learning_rate(algorithm):
    """Per-worker learning rate (scaled by the worker count in training)."""
    if algorithm in SIGN_CODECS:
        return SIGN_LEARNING_RATE
    if algorithm == "dgc":
        return DGC_LEARNING_RATE
    return LEARNING_RATE


def check_codec_params(codec_params, algorithms):
    """``--codec-params``: {algorithm: {parameter: value}} for algorithms of the run, each
    accepted by its compressor (built here, before any rank starts). Returns a dict."""
    from tf_mergecomp import compressors

    codec_params = dict(codec_params or {})
    for name, params in codec_params.items():
        if name not in algorithms:
            raise ValueError("--codec-params names %r, which is not among the run's algorithms "
                             "(%s)" % (name, ", ".join(algorithms)))
        if not isinstance(params, dict):
            raise ValueError("--codec-params: %r must map to {parameter: value}, got %r"
                             % (name, params))
        compressors.get(name, **params)  # a bad parameter or value is refused here
    return codec_params


def plan_configs(algorithms, ranks_per_machine=1, codec_params=None):
    """The run's configs; ``codec_params`` ({algorithm: {parameter: value}}) go to that
    algorithm's MergeComp in every config of it."""
    codec_params = codec_params or {}
    configs = [{"label": "horovod fp32", "kind": "horovod", "compression": "none"}]
    for algorithm in algorithms:
        modes = MODES
        if ranks_per_machine > 1:
            modes = TWO_LEVEL_MODES if algorithm != "powersgd" else TWO_LEVEL_MODES[:1]
        for mode in modes:
            configs.append({"label": "%s %s" % (algorithm, mode), "kind": "mergecomp",
                            "algorithm": algorithm, "partition": mode})
            if algorithm in codec_params:
                configs[-1]["params"] = dict(codec_params[algorithm])
    return configs


def _main_job():
    """examples/train_digits.py as a module: parity trains the main job's model on its data."""
    import importlib.util

    examples = os.path.join(_REPO_ROOT, "examples")
    if examples not in sys.path:  # the example imports its data loader (digits_data.py) as
        sys.path.insert(0, examples)  # a script would, from its own folder
    path = os.path.join(examples, "train_digits.py")
    module_spec = importlib.util.spec_from_file_location("train_digits", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _train_one(config, spec, data, main_job, hvd, hvd_tf, tf):
    from tf_mergecomp.keras2 import keras
    from benchmarks.worker import build_compression

    (x_train, y_train), (x_test, y_test) = data
    keras.utils.set_random_seed(spec.get("seed", SEED))
    model = main_job.build_model()
    compression, search_callback_class, note = build_compression(config)
    rate = learning_rate(config.get("algorithm")) * hvd.size()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(rate), compression=compression)
    model.compile(optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    hvd_tf.broadcast_variables(model.variables, root_rank=0)
    callbacks = []
    if search_callback_class is not None:
        callbacks.append(search_callback_class(compression, **spec.get("search_params", {})))
    started = time.perf_counter()
    model.fit(x_train, y_train, batch_size=32, epochs=spec["epochs"], shuffle=True,
              callbacks=callbacks, verbose=0)
    seconds = time.perf_counter() - started
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    checksum = tf.add_n([tf.reduce_sum(tf.abs(tf.cast(v, tf.float64))) for v in model.variables])
    checksums = hvd_tf.allgather(tf.reshape(checksum, [1])).numpy().tolist()
    result = {"label": config["label"], "config": config, "ok": True, "accuracy": float(accuracy),
              "train_s": seconds, "ranks_identical": len(set(checksums)) == 1,
              "learning_rate": rate, "note": note}
    if config["kind"] == "mergecomp":
        result["splits"] = list(compression.splits) if compression.splits is not None else None
        result["num_groups"] = compression.num_groups
        result["group_codecs"] = (list(compression.group_codecs)
                                  if compression.group_codecs is not None else None)
        result["plain_horovod"] = compression.steps_aside
    return result


def worker_main(spec_path):
    """One rank under horovodrun: trains every config in turn."""
    with open(spec_path) as f:
        spec = json.load(f)
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    from benchmarks.worker import init_horovod

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    init_horovod(hvd, None)  # the machines' process sets, for the two-level configs
    main_job = _main_job()
    data = main_job.load_data(hvd.rank(), hvd.size())
    results = []
    for config in spec["configs"]:
        try:
            results.append(_train_one(config, spec, data, main_job, hvd, hvd_tf, tf))
        except Exception as error:  # recorded; the same error happens on every rank
            traceback.print_exc()
            results.append({"label": config["label"], "config": config, "ok": False,
                            "error": report.error_text(error)})
        if hvd.rank() == 0:
            with open(spec["result_path"], "w") as f:
                json.dump({"size": hvd.size(), "results": results}, f, indent=1)
            print("[parity] %s: %s" % (config["label"], _brief(results[-1])), flush=True)
    return 0


def _brief(result):
    if not result.get("ok"):
        return "error " + result["error"]
    return "accuracy %.4f in %.1f s" % (result["accuracy"], result["train_s"])


def _layout_text(result, algorithm):
    if result.get("plain_horovod"):
        return "plain Horovod"
    if not result.get("num_groups"):
        return "-"
    text = "%d groups %s" % (result["num_groups"], result["splits"])
    plain = [c for c in result.get("group_codecs") or () if c != algorithm]
    return text + (" (%d plain)" % len(plain) if plain else "")


def accuracy_verdict(result, baseline, tolerance):
    """``result``'s test accuracy against ``baseline``'s, in points: (difference,
    "met" when no more than ``tolerance`` below, else "missed"), or None where either
    is missing."""
    if result.get("accuracy") is None or baseline.get("accuracy") is None:
        return None
    points = 100 * (result["accuracy"] - baseline["accuracy"])
    return points, "met" if points >= -tolerance else "missed"


def plain_groups_verdict(searched, single):
    """The searched config's accuracy against the single-codec search's."""
    return accuracy_verdict(searched, single, PLAIN_GROUPS_TOLERANCE)


def _algorithms_of(results):
    algorithms = []
    for r in results:
        algorithm = r["config"].get("algorithm")
        if algorithm and algorithm not in algorithms:
            algorithms.append(algorithm)
    return algorithms


def _identical_text(runs):
    finished = [r for r in runs if r.get("ok")]
    return ("yes" if all(r["ranks_identical"] for r in finished) else "NO") if finished else "-"


def _header(output, epochs, seed):
    machines = output.get("machines")
    workers = ("%d workers" % output.get("size", 2) if not machines else
               "%d workers (%d machines x %d ranks)" % (output["size"], machines,
                                                        output["size"] // machines))
    return ("Digits CNN, %s, %d epochs, batch 32 per worker, plain SGD "
            "(lr %g x W; dgc %g x W, its memory adds momentum 0.9; %g x W for %s); "
            "%s; test accuracy on 360 images.\n\n"
            % (workers, epochs, LEARNING_RATE, DGC_LEARNING_RATE, SIGN_LEARNING_RATE,
               "/".join(SIGN_CODECS), "seed %d" % seed if isinstance(seed, int)
               else "seeds " + ", ".join(map(str, seed))))


def two_level_verdict(two_level, flat):
    """One group on two levels against one group flat."""
    return accuracy_verdict(two_level, flat, TWO_LEVEL_TOLERANCE)


def two_level_table(output, epochs, seed=SEED):
    """The table of a run on machines of several ranks: two levels against flat."""
    results = output.get("results", [])
    by_label = {r["label"]: r for r in results}
    fp32 = by_label.get("horovod fp32", {})
    rows = [["horovod fp32", fp32.get("accuracy"), "-", "-", "", _identical_text([fp32])]]
    met = compared = 0
    for algorithm in _algorithms_of(results):
        runs = [by_label.get("%s %s" % (algorithm, mode), {}) for mode in TWO_LEVEL_MODES]
        flat, two_level = runs
        verdict = two_level_verdict(two_level, flat)
        compared += verdict is not None
        met += verdict is not None and verdict[1] == "met"
        notes = [r.get("error") or r.get("note") for r in runs]
        if not two_level:
            notes.append("no two-level reduce")
        rows.append([algorithm, flat.get("accuracy"), two_level.get("accuracy"),
                     "-" if verdict is None else "%+.1f (%s)" % verdict,
                     "; ".join(n for n in notes if n), _identical_text(runs)])
    footer = ("\n\nOne group on two levels no more than %s points below one group flat: "
              "%d of %d codecs compared." % (TWO_LEVEL_TOLERANCE, met, compared))
    return _header(output, epochs, seed) + report.markdown_table(
        ["config", "one group, flat acc", "one group, two levels acc", "two levels - flat (points)",
         "notes", "ranks identical"], rows) + footer


def table(output, epochs, seed=SEED):
    results = output.get("results", [])
    by_label = {r["label"]: r for r in results}
    fp32 = by_label.get("horovod fp32", {}).get("accuracy")
    algorithms = _algorithms_of(results)
    rows = [["horovod fp32", fp32, "-", "-", "-", "-", "-", "-",
             "yes" if by_label.get("horovod fp32", {}).get("ranks_identical") else "NO"]]
    met = 0
    for algorithm in algorithms:
        runs = [by_label.get("%s %s" % (algorithm, mode), {}) for mode in MODES]
        layerwise, searched, single = runs
        notes = [r.get("error") or r.get("note") for r in runs]
        identical = _identical_text(runs)
        verdict = plain_groups_verdict(searched, single)
        met += verdict is not None and verdict[1] == "met"
        rows.append([algorithm, layerwise.get("accuracy"), searched.get("accuracy"),
                     _layout_text(searched, algorithm), single.get("accuracy"),
                     _layout_text(single, algorithm),
                     "-" if verdict is None else "%+.1f (%s)" % verdict,
                     "; ".join(n for n in notes if n) or "", identical])
    header = _header(output, epochs, seed)
    footer = ("\n\nSearched (per-group codecs) no more than %s points below the single-codec "
              "search: %d of %d codecs." % (PLAIN_GROUPS_TOLERANCE, met, len(algorithms)))
    return header + report.markdown_table(
        ["config", "layer-wise acc", "searched acc", "searched layout", "single-codec search acc",
         "single-codec layout", "searched - single (points)", "notes", "ranks identical"],
        rows) + footer


def machines_hosts(num_proc, ranks_per_machine):
    """horovodrun's -H for two machines of ``ranks_per_machine`` ranks on this one
    (None with one rank per machine: -np alone)."""
    if ranks_per_machine == 1:
        return None
    if ranks_per_machine < 1 or num_proc != 2 * ranks_per_machine:
        raise ValueError("--ranks-per-machine N runs two machines of N ranks on this one: "
                         "--np must be 2N (got --np %d, --ranks-per-machine %d)"
                         % (num_proc, ranks_per_machine))
    return "localhost:%d,127.0.0.1:%d" % (ranks_per_machine, ranks_per_machine)


def paired_differences(outputs, two_level):
    """{algorithm: [points per run]} of the compared config minus its baseline (two
    levels - flat, or searched - single-codec search), for the algorithms that
    finished both configs in every run of ``outputs``."""
    first, second = TWO_LEVEL_MODES if two_level else MODES[2:0:-1]
    differences = {}
    for output in outputs:
        by_label = {r["label"]: r for r in output.get("results", [])}
        for algorithm in _algorithms_of(output.get("results", [])):
            verdict = accuracy_verdict(by_label.get("%s %s" % (algorithm, second), {}),
                                       by_label.get("%s %s" % (algorithm, first), {}), 0.0)
            differences.setdefault(algorithm, []).append(
                None if verdict is None else verdict[0])
    return {a: d for a, d in differences.items()
            if len(d) == len(outputs) and None not in d}


def interval_verdict(points, tolerance):
    """(mean, half-width of its 95% t-interval, verdict) of paired differences in
    points: "met" when the whole interval is above -tolerance, "missed" when it is
    wholly below, else "not resolved" (more runs needed)."""
    import statistics

    from scipy import stats

    values = [float(p) for p in points]
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, float("inf"), "not resolved"
    half = float(stats.t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) \
        / len(values) ** 0.5
    if mean - half >= -tolerance:
        return mean, half, "met"
    return mean, half, "missed" if mean + half < -tolerance else "not resolved"


def seeds_table(outputs, seeds, epochs, two_level):
    """Every seed's difference, their mean and its 95% interval, per algorithm."""
    tolerance = TWO_LEVEL_TOLERANCE if two_level else PLAIN_GROUPS_TOLERANCE
    what = "two levels - flat" if two_level else "searched - single-codec search"
    rows, counts = [], {}
    for algorithm, points in paired_differences(outputs, two_level).items():
        mean, half, verdict = interval_verdict(points, tolerance)
        counts[verdict] = counts.get(verdict, 0) + 1
        rows.append([algorithm, " / ".join("%+.1f" % p for p in points),
                     "%+.2f +- %.2f" % (mean, half), verdict])
    fp32 = [{r["label"]: r for r in o.get("results", [])}.get("horovod fp32", {}).get("accuracy")
            for o in outputs]
    identical = all(r.get("ranks_identical") for o in outputs for r in o.get("results", [])
                    if r.get("ok"))
    header = (_header(outputs[0], epochs, seeds)
              + "Horovod fp32 per seed: %s. %s (points), per seed in that order; the mean's "
              "95%% t-interval over the seeds; \"met\" when the whole interval is above -%s, "
              "\"missed\" when wholly below, else \"not resolved\". Ranks identical in every "
              "finished config of every seed: %s.\n\n"
              % (" / ".join("-" if a is None else "%.3f" % a for a in fp32), what, tolerance,
                 "yes" if identical else "NO"))
    footer = "\n\n" + ", ".join("%s: %d" % (k, counts[k]) for k in
                                 ("met", "not resolved", "missed") if k in counts) + \
        " (of %d codecs)." % len(rows)
    return header + report.markdown_table(
        ["codec", "%s per seed" % what, "mean +- 95%", "verdict"], rows) + footer


def run_seeds(args):
    """``run`` once per seed of ``args.seeds`` (under OUT/seed-N), then the paired
    differences over the seeds in OUT/parity_seeds.md."""
    import copy

    outputs = []
    for seed in args.seeds:
        one = copy.copy(args)
        one.seed, one.seeds, one.out = seed, None, os.path.join(args.out, "seed-%d" % seed)
        outputs.append(_run_once(one)[0])
    two_level = getattr(args, "ranks_per_machine", 1) > 1
    text = seeds_table(outputs, list(args.seeds), args.epochs, two_level)
    with open(os.path.join(args.out, "parity_seeds.md"), "w") as f:
        f.write(text + "\n")
    return text


def run(args):
    """One run (``--seed``), or one per seed and their summary (``--seeds``): the table."""
    if getattr(args, "seeds", None):
        return run_seeds(args)
    return _run_once(args)[1]


def _run_once(args):
    """(the ranks' results as read back, the table) of one run, written to OUT."""
    ranks_per_machine = getattr(args, "ranks_per_machine", 1)
    hosts = machines_hosts(args.num_proc, ranks_per_machine)
    os.makedirs(args.out, exist_ok=True)
    codec_params = check_codec_params(getattr(args, "codec_params", None), args.algorithms)
    notes = ["%s with %s" % (name, ", ".join("%s=%r" % item for item in sorted(params.items())))
             for name, params in sorted(codec_params.items())]
    spec = {"epochs": args.epochs,
            "configs": plan_configs(args.algorithms, ranks_per_machine, codec_params),
            "seed": SEED if getattr(args, "seed", None) is None else args.seed,
            "result_path": os.path.abspath(os.path.join(args.out, "parity.json")),
            "search_params": {"steps_per_candidate": 3, "verbose": 0}}
    code, log_path = launcher.run_local_horovodrun("benchmarks.parity", spec, args.out,
                                                   args.num_proc, args.timeout, hosts=hosts)
    if code is None:
        notes.append("timed out after %.0f s; results so far shown" % args.timeout)
    if code not in (0, None):
        notes.append("horovodrun exited %s; see %s" % (code, log_path))
    try:
        with open(spec["result_path"]) as f:
            output = json.load(f)
    except (OSError, ValueError):
        output = {"results": []}
    if hosts is not None:
        output["machines"] = 2
    text = (table if hosts is None else two_level_table)(output, args.epochs, spec["seed"]) + "".join("\n- " + n for n in notes)
    with open(os.path.join(args.out, "parity.md"), "w") as f:
        f.write(text + "\n")
    return output, text


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(worker_main(sys.argv[2]))
    print("usage: python -m benchmarks.parity --worker SPEC.json "
          "(or python -m benchmarks parity)", file=sys.stderr)
    sys.exit(2)
