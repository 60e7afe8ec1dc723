"""python -m benchmarks {ops,exchange,cluster,parity,profile,simulate,validate,restart} [options]; see --help of each."""

import argparse
import contextlib
import importlib
import json
import os
import sys

from benchmarks import outputs

def _csv(convert):
    def parse(text):
        try:
            return [convert(part.strip()) for part in text.split(",") if part.strip()]
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return parse


def _algorithms(text):
    from tf_mergecomp.compressors import NAMES

    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(
            "unknown algorithm(s) %s; valid choices: %s" % (", ".join(unknown), ", ".join(NAMES)))
    return names


def _sizes(text):
    from benchmarks.ops import parse_sizes

    try:
        return parse_sizes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _profile_model(text):
    from benchmarks import models

    try:
        return models.check_profile_model(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _json_object(text):
    import json

    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError("not JSON: %s" % error) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object, got %r" % (value,))
    return value


def _positive(convert):
    def parse(text):
        value = convert(text)
        if value <= 0:
            raise ValueError("%r is not positive" % text)
        return value
    parse.__name__ = convert.__name__  # argparse names the type in its error message
    return parse


def _ranks_per_machine(text):
    from benchmarks.launcher import check_ranks_per_machine

    try:
        return check_ranks_per_machine(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            "ranks per machine must be an integer >= 1 (the ranks each namespace runs), "
            "got %r" % text) from None


# The commands and their one-line help: the parser lists them without importing any
# command's modules (so `--help` needs no TensorFlow).
COMMANDS = (
    ("ops", "encode/decode GB/s of the custom ops vs plain TF"),
    ("exchange", "one rank's exchange: layer-wise vs one group vs 4 groups, per tensor count "
                 "and model"),
    ("cluster", "virtual cluster of network namespaces (root)"),
    ("profile", "one model's step profile on this machine (gradient ready times, compute "
                "times, codec cost curves) for the simulator"),
    ("simulate", "step time of every config on W workers from a profile "
                 "(tf_mergecomp/search/step_model.py)"),
    ("validate", "measured (bench cluster) vs simulated step times (bench simulate)"),
    ("parity", "digits CNN accuracy, 2 workers, every algorithm"),
    ("restart", "one group's step before and after a search's worth of other partitions, "
                "with and without a Horovod restart (2 workers, loopback)"),
)

# Where each command writes: a folder by default (None: nowhere unless --out is given);
# profile writes one file (default bench_results/profile_MODEL.json).
OUT_DEFAULTS = {"ops": None, "exchange": None, "cluster": "bench_results/cluster",
                "profile": None, "simulate": None, "validate": None,
                "parity": "bench_results/parity", "restart": "bench_results/restart"}


def build_parser(command=None):
    """The command line parser. ``command``: only that command's options are added (its
    modules, and TensorFlow, are imported only then); None: every command's."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in COMMANDS:
        options = commands.add_parser(name, help=help_text)
        if command is None or command == name:
            _OPTIONS[name](options)
    return parser


def _ops_options(ops):
    from tf_mergecomp.compressors import NAMES

    ops.add_argument("--sizes", type=_sizes, default=[10_000, 1_000_000, 25_000_000],
                     help="comma-separated element counts (default 1e4,1e6,25e6)")
    ops.add_argument("--algorithms", type=_algorithms, default=list(NAMES),
                     help="comma-separated; default: all of %s" % ",".join(NAMES))
    ops.add_argument("--budget", type=float, default=10.0,
                     help="seconds at most per timed measurement (default 10)")
    ops.add_argument("--group-tensors", type=int, default=64,
                     help="also time each codec's fused group reduction of n split into this "
                          "many tensors (default 64; 0: skip)")
    ops.add_argument("--tensor-counts", type=_csv(_positive(int)), default=[16, 48, 128, 700],
                     help="also time one group against layer-wise at these tensor counts of mixed "
                          "sizes, every algorithm (default 16,48,128,700; '' skips)")
    ops.add_argument("--matrix-columns", type=int, default=0,
                     help="the --tensor-counts tensors as matrices of this many columns (what "
                          "PowerSGD compresses; default 0: vectors, which it sends as they are)")
    ops.add_argument("--out", default=None, help="also write ops.md and ops.json into this folder")


def _exchange_options(exchange):
    from benchmarks import cluster, models
    from benchmarks import exchange as exchange_bench
    from tf_mergecomp.compressors import NAMES

    exchange.add_argument("--tensor-counts", type=_csv(_positive(int)),
                          default=list(exchange_bench.DEFAULT_TENSOR_COUNTS),
                          help="split --megabytes of float32 into this many equal tensors, each "
                               "count a gradient set (default 1,16,64,256,1024; '' for none)")
    exchange.add_argument("--megabytes", type=_positive(float),
                          default=exchange_bench.DEFAULT_MEGABYTES,
                          help="size of the tensor-count sweep's sets (default 16)")
    exchange.add_argument("--models", type=_csv(models.check_model),
                          default=list(models.DEFAULT_MODELS),
                          help="gradient sets of these models' shapes (default %s; '' for none; "
                               "valid: %s)" % (",".join(models.DEFAULT_MODELS),
                                               ",".join(models.MODELS)))
    exchange.add_argument("--algorithms", type=_algorithms, default=list(NAMES),
                          help="comma-separated; default: all of %s" % ",".join(NAMES))
    exchange.add_argument("--rounds", type=_positive(int), default=7,
                          help="timed calls per config, one per round, round-robin (default 7)")
    exchange.add_argument("--cpu-allocator", choices=cluster.CPU_ALLOCATORS, default="bfc",
                          help="TensorFlow's CPU allocator (default bfc: pooled; 'default' maps "
                               "large buffers afresh)")
    exchange.add_argument("--quick", action="store_true",
                          help="smoke run: 1 MB in 1 and 16 tensors, fp16 and efsignsgd, "
                               "2 rounds, no models")
    exchange.add_argument("--out", default=None, help="also write exchange.md and exchange.json here")


def _cluster_options(clus):
    from benchmarks import cluster, models

    clus.add_argument("--workers", type=_csv(int), default=[2, 4],
                      help="multi-worker counts: namespaces, each a machine (default 2,4)")
    clus.add_argument("--ranks-per-machine", type=_ranks_per_machine, default=1,
                      help="ranks in every namespace (default 1): ranks of one namespace talk "
                           "over its loopback, of different namespaces over the shaped links "
                           "(horovodrun -H ns0:N,ns1:N; Horovod's local size N, cross size W)")
    clus.add_argument("--hierarchical", choices=cluster.HIERARCHICAL_CHOICES, default="auto",
                      help="MergeComp(hierarchical=...) of every MergeComp config: auto (None: "
                           "the search may choose two levels per group; default), true (every "
                           "group on two levels), false (flat)")
    clus.add_argument("--bandwidth", default="1gbit", help="tc rate per link, or 'none'")
    clus.add_argument("--models", type=_csv(str), default=list(models.DEFAULT_MODELS),
                      help="default %s; valid: %s, or any keras.applications model by name "
                           "(MobileNetV2, DenseNet121, ...; 32x32x3, 10 classes, no weights)"
                           % (",".join(models.DEFAULT_MODELS), ",".join(models.MODELS)))
    clus.add_argument("--algorithms", type=_algorithms, default=list(cluster.DEFAULT_ALGORITHMS))
    clus.add_argument("--steps", type=int, default=10, help="measured steps per config")
    clus.add_argument("--warmup-steps", type=int, default=5,
                      help="unmeasured steps per config (tracing, then Horovod and allocator warm-up)")
    clus.add_argument("--search-steps", type=int, default=800,
                      help="the most steps the partition search may use (it ends the search "
                           "fit when done; default 800: 500 ms turns of 25 ms steps and the "
                           "extra rounds that resolve the leader take about 650)")
    clus.add_argument("--search-max-groups", type=int, default=4,
                      help="most groups of the search's predicted candidates (default 4)")
    clus.add_argument("--search-min-turn-ms", type=float, default=500.0,
                      help="the least a confirm turn of the search lasts: more than 3 timed "
                           "steps where those are shorter (at most 30; default 500 ms, 0: 3 steps)")
    clus.add_argument("--search-on", choices=("training", "exchange"), default="training",
                      help="search during training (profiled steps and probes predict the "
                           "candidates, training steps confirm the best few: a few re-traces) "
                           "or with the gradient exchange alone as the step (default training; "
                           "with HOROVOD_CYCLE_TIME longer than the exchange, every exchange "
                           "times one cycle, whatever the partition: search on training then)")
    clus.add_argument("--exchange-steps", type=int, default=5,
                      help="timed exchanges (no backprop) per config and round (0: none)")
    clus.add_argument("--exchange-rounds", type=int, default=3,
                      help="rounds over all configs, interleaving the exchange timings")
    clus.add_argument("--cpu-allocator", choices=cluster.CPU_ALLOCATORS, default="bfc",
                      help="TensorFlow's CPU allocator in the ranks (default bfc: pooled; "
                           "'default' maps large buffers afresh)")
    clus.add_argument("--launcher", choices=cluster.LAUNCHERS, default="direct",
                      help="direct: the benchmark starts each rank in its namespace (default); "
                           "horovodrun: an ssh server per namespace and the real "
                           "'horovodrun -H ns0:N,ns1:N,...' over ssh (needs openssh-server)")
    clus.add_argument("--pin-cores", action=argparse.BooleanOptionalAction, default=True,
                      help="each rank keeps to its own share of this machine's cores, as on "
                           "machines of their own (default; --no-pin-cores: the scheduler "
                           "places every rank's threads)")
    clus.add_argument("--link-check", action=argparse.BooleanOptionalAction, default=True,
                      help="measure what the shaped links deliver (TCP around the ring, a few "
                           "seconds) before the configs; bench validate prices the collectives "
                           "at that rate (default; --no-link-check: the nominal rate)")
    clus.add_argument("--isolate", action="store_true",
                      help="every config in fresh rank processes of its own, none timed after "
                           "another in the same processes (slower; steadier where the order "
                           "matters: docs/scaling.md)")
    clus.add_argument("--modes", type=_csv(str), default=list(cluster.PARTITION_MODES),
                      help="MergeComp configs per algorithm, among %s (default %s); "
                           "searched_single: the search with the codec on every group "
                           "(MergeComp(plain_groups=False)), beside searched"
                           % (", ".join(cluster.ALL_PARTITION_MODES),
                              ",".join(cluster.PARTITION_MODES)))
    clus.add_argument("--batch-size", type=int, default=32)
    clus.add_argument("--timeout", type=float, default=None,
                      help="seconds per cluster run (default: from config count and model)")
    clus.add_argument("--quick", action="store_true",
                      help="transformer, 2 workers, efsignsgd and topk, 8 rounds, a search "
                           "of up to 2 groups (< 10 min)")
    clus.add_argument("--out", default=OUT_DEFAULTS["cluster"])
    clus.add_argument("--report", metavar="DIR", default=None,
                      help="run nothing: rewrite DIR/cluster.md and .png from DIR/cluster.json "
                           "(an earlier run's figures with this version's report)")


def _profile_options(prof):
    from benchmarks import models
    from benchmarks import profile as profile_bench

    prof.add_argument("--model", type=_profile_model, required=True,
                      help="%s, a keras.applications model (MobileNetV2, ...) or "
                           "package.module:function returning a Keras model"
                           % "|".join(models.MODELS))
    prof.add_argument("--codecs", type=_algorithms, default=None,
                      help="comma-separated; default: all (--quick: %s)"
                           % ",".join(profile_bench.QUICK_CODECS))
    prof.add_argument("--quick", action="store_true",
                      help="fewer probe layouts (1, 4 groups, layer-wise) and repeats, the "
                           "codecs %s" % ",".join(profile_bench.QUICK_CODECS))
    prof.add_argument("--processes", type=_positive(int), default=1,
                      help="profile in this many ranks of one Horovod job over loopback and "
                           "average them: they share the cores as the cluster benchmark's "
                           "ranks do, and the probe's collectives are real (default 1)")
    prof.add_argument("--pin-cores", action=argparse.BooleanOptionalAction, default=True,
                      help="with --processes > 1, each rank on its share of the cores, as the "
                           "cluster benchmark's ranks (default; --no-pin-cores: the scheduler "
                           "places them)")
    prof.add_argument("--batch-size", type=_positive(int), default=32)
    prof.add_argument("--timeout", type=_positive(float), default=1800.0)
    prof.add_argument("--out", default=None, help="write the profile JSON here "
                                                  "(default bench_results/profile_MODEL.json)")


def _simulate_options(sim):
    from benchmarks import simulate as simulate_bench

    sim.add_argument("--profile", required=True, help="a profile JSON (bench profile, or "
                                                      "docs/profiles/*.json)")
    sim.add_argument("--workers", type=_csv(int), default=list(simulate_bench.DEFAULT_WORKERS),
                     help="comma-separated worker counts (default 2,8,64,256)")
    sim.add_argument("--bandwidth", type=_csv(str), default=list(simulate_bench.DEFAULT_BANDWIDTHS),
                     help="comma-separated link rates as cluster --bandwidth takes them (1gbit, "
                          "400mbit), rates per second (12.5GB/s, 100Gb/s) or networks named in "
                          "the profile (default 1gbit,10gbit,100gbit)")
    sim.add_argument("--latency", default=None,
                     help="seconds per ring step (25us, 0.1ms); default: the profile network's, "
                          "else 25us")
    sim.add_argument("--codecs", type=_algorithms, default=None,
                     help="comma-separated; default: every codec of the profile")
    sim.add_argument("--cycle-ms", type=float, default=None,
                     help="Horovod's cycle of the simulated runs in milliseconds "
                          "(HOROVOD_CYCLE_TIME; default: the profile's)")
    sim.add_argument("--out", default=None, help="also write simulate.{md,json,png} here")
    sim.add_argument("--name", default="simulate", help="file name stem under --out")


def _validate_options(val):
    from benchmarks import validate as validate_bench

    val.add_argument("--cluster", type=_csv(str), required=True,
                     help="comma-separated cluster run folders (or their cluster.json)")
    val.add_argument("--profiles", type=_csv(str), required=True,
                     help="comma-separated MODEL=PROFILE.json pairs")
    val.add_argument("--latency", default=None, help="seconds per ring step (default 25us)")
    val.add_argument("--links", choices=validate_bench.LINK_RATES, default="delivered",
                     help="price the collectives at the rate the run's link check measured "
                          "(default; runs without one: the nominal tc rate) or the nominal rate")
    val.add_argument("--out", default=None, help="also write validate.{md,json} here")


def _parity_options(parity):
    from tf_mergecomp.compressors import NAMES

    parity.add_argument("--algorithms", type=_algorithms, default=[n for n in NAMES if n != "none"])
    parity.add_argument("--epochs", type=int, default=8)
    parity.add_argument("--seed", type=int, default=None,
                        help="the initial weights' and the shuffling's seed (default 42)")
    parity.add_argument("--seeds", type=_csv(int), default=None,
                        help="comma-separated seeds: one run each (under OUT/seed-N), then each "
                             "codec's difference over the seeds, its mean and 95%% interval "
                             "(OUT/parity_seeds.md)")
    parity.add_argument("--np", type=int, default=2, dest="num_proc")
    parity.add_argument("--ranks-per-machine", type=int, default=1,
                        help="N >= 2 (with --np 2N): two machines of N ranks on this one "
                             "(horovodrun -H localhost:N,127.0.0.1:N), one group flat against "
                             "one group on two levels for every codec (default 1)")
    parity.add_argument("--codec-params", type=_json_object, default=None,
                        help="JSON {algorithm: {parameter: value}} for that algorithm's "
                             "MergeComp in every config, e.g. '{\"randomk\": {\"ratio\": 0.1}}'")
    parity.add_argument("--timeout", type=float, default=1500.0)
    parity.add_argument("--out", default=OUT_DEFAULTS["parity"])


def _restart_options(restart):
    from benchmarks import models

    restart.add_argument("--model", type=models.check_model, default="resnet50")
    restart.add_argument("--algorithm", type=_algorithms, default=["efsignsgd"])
    restart.add_argument("--batch-size", type=_positive(int), default=32)
    restart.add_argument("--steps", type=_positive(int), default=25,
                         help="timed steps of one group per phase")
    restart.add_argument("--search-steps", type=_positive(int), default=5,
                         help="steps of each layout in a search's worth")
    restart.add_argument("--search-rounds", type=_positive(int), default=2)
    restart.add_argument("--repeats", type=_positive(int), default=2,
                         help="times the search / after / restart / restarted sequence runs")
    restart.add_argument("--np", type=_positive(int), default=2, dest="num_proc")
    restart.add_argument("--timeout", type=float, default=1200.0)
    restart.add_argument("--out", default=OUT_DEFAULTS["restart"])


_OPTIONS = {"ops": _ops_options, "exchange": _exchange_options, "cluster": _cluster_options, "profile": _profile_options, "simulate": _simulate_options, "validate": _validate_options, "parity": _parity_options, "restart": _restart_options}


def apply_quick(args):
    """--quick: the options named in the command's QUICK plan are replaced by its values."""
    if getattr(args, "quick", False):
        plan = importlib.import_module("benchmarks." + args.command).QUICK
        for option, value in plan.items():
            setattr(args, option, list(value) if isinstance(value, tuple) else value)
    return args


def _report(text, data, out_dir, name):
    """Prints the table; with --out, also writes NAME.md and NAME.json there."""
    print(text)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, name + ".md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(out_dir, name + ".json"), "w") as f:
            json.dump(data, f, indent=1, default=str)


def _command(argv):
    """The command named on the command line (its first word), or None."""
    return next((word for word in argv if not word.startswith("-")), None)


def _check_out(argv, command):
    """Checks, before any work and without TensorFlow, that the command can write where it
    will: the folder (profile: the file) --out names, else its default. Returns that path
    (profile given a folder: the default file name inside it), or None where the command
    writes nothing. Raises ValueError naming the path."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--out", default=OUT_DEFAULTS[command])
    early.add_argument("--report")
    early.add_argument("--model", default="")
    known, _ = early.parse_known_args(argv)
    if command == "cluster" and known.report:
        return None  # rewrites an earlier run's report in its own folder
    if command == "profile":
        name = "profile_%s.json" % "".join(c if c.isalnum() else "_" for c in known.model)
        return outputs.check_file(known.out or "bench_results" + os.sep, name)
    return None if known.out is None else outputs.check_folder(known.out)


@contextlib.contextmanager
def _native_stderr_silenced():
    """Standard error (file descriptor 2) goes to /dev/null inside: a command's option
    builders import TensorFlow (the defaults name the codecs), whose C++ start-up lines
    (oneDNN, CPU features, CUDA; TF_CPP_MIN_LOG_LEVEL does not reach them) would
    otherwise come before the usage that --help prints."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command(argv)
    if command not in OUT_DEFAULTS:
        build_parser(command="").parse_args(argv)  # the usage, or what is wrong
    try:
        out = _check_out(argv, command)
    except ValueError as error:
        print("error: %s" % error, file=sys.stderr)
        return 2
    asks_help = "-h" in argv or "--help" in argv
    with _native_stderr_silenced() if asks_help else contextlib.nullcontext():
        parser = build_parser(command)
    args = parser.parse_args(argv)
    if out is not None:
        args.out = out
    if args.command == "ops":
        from benchmarks import ops

        result = ops.run(args.sizes, args.algorithms, budget_s=args.budget,
                         group_tensors=args.group_tensors, tensor_counts=args.tensor_counts,
                         matrix_columns=args.matrix_columns)
        _report(ops.table(result), result, args.out, "ops")
        return 0
    if args.command == "exchange":
        from benchmarks import exchange

        apply_quick(args)
        try:
            sets = exchange.gradient_sets(args.tensor_counts, args.megabytes, args.models)
        except ValueError as error:
            print("error: %s" % error, file=sys.stderr)
            return 2
        result = exchange.run(sets, args.algorithms, rounds=args.rounds,
                              cpu_allocator=args.cpu_allocator)
        _report(exchange.table(result), result, args.out, "exchange")
        return 0
    if args.command == "cluster":
        from benchmarks import cluster

        if args.report:
            try:
                print(cluster.rewrite_report(args.report))
            except ValueError as error:
                print("error: %s" % error, file=sys.stderr)
                return 2
            return 0
        try:
            cluster.check_args(apply_quick(args))
        except ValueError as error:
            print("error: %s" % error, file=sys.stderr)
            return 2
        print(cluster.run(args))
        print("\nwritten: %s/cluster.{md,json,png}" % args.out)
        return 0
    if args.command == "profile":
        return _profile(args)
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "validate":
        from benchmarks import simulate, validate

        try:
            latency = None if args.latency is None else simulate.parse_latency(args.latency)
            result = validate.run(args.cluster, args.profiles, latency, args.links)
        except ValueError as error:
            print("error: %s" % error, file=sys.stderr)
            return 2
        _report(validate.table(result["rows"]), result, args.out, "validate")
        return 0
    if args.command == "restart":
        from benchmarks import restart

        if len(args.algorithm) != 1:
            print("error: --algorithm takes one algorithm", file=sys.stderr)
            return 2
        args.algorithm = args.algorithm[0]
        print(restart.run(args))
        return 0
    from benchmarks import parity

    if args.seed is not None and args.seeds:
        print("error: give --seed (one run) or --seeds (one run per seed), not both",
              file=sys.stderr)
        return 2
    try:
        parity.machines_hosts(args.num_proc, args.ranks_per_machine)
        args.codec_params = parity.check_codec_params(args.codec_params, args.algorithms)
    except ValueError as error:
        print("error: %s" % error, file=sys.stderr)
        return 2
    print(parity.run(args))
    return 0


def _profile(args):
    from benchmarks import profile

    codecs = args.codecs or list(profile.QUICK_CODECS if args.quick else profile.DEFAULT_CODECS)
    result = profile.record(args.model, codecs=codecs, quick=args.quick,
                            processes=args.processes, batch_size=args.batch_size,
                            timeout_s=args.timeout, pin_cores=args.pin_cores)
    path = profile.save(result, args.out)
    print(profile.summary_text(result))
    print("\nwritten: %s" % path)
    return 0


def _simulate(args):
    import time

    from benchmarks import profile, simulate

    started = time.perf_counter()
    try:
        loaded = profile.load(args.profile)
        simulate.check_workers(args.workers)
        latency = None if args.latency is None else simulate.parse_latency(args.latency)
        if args.cycle_ms is not None and not args.cycle_ms >= 0:
            raise ValueError("--cycle-ms must be >= 0 milliseconds, got %r" % args.cycle_ms)
        result = simulate.simulate(loaded, args.workers, args.bandwidth, latency=latency,
                                   codecs=args.codecs,
                                   cycle_s=None if args.cycle_ms is None else args.cycle_ms / 1e3)
    except ValueError as error:
        print("error: %s" % error, file=sys.stderr)
        return 2
    result["wall_s"] = time.perf_counter() - started
    print(simulate.table(result))
    print("\nsimulated %d cells in %.1f s" % (len(result["cells"]), result["wall_s"]))
    if args.out:
        print("written: %s" % ", ".join(simulate.write(result, args.out, args.name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
