"""The virtual-cluster benchmark: images/s of each compression config on W workers.

For every model: a 1-worker run (Horovod fp32; the scaling baseline), then for
every worker count W a run of all configs on W namespaces joined by
tc-shaped links (``netns.VirtualCluster``), ranks started by the launcher
``--launcher`` names (``launcher.py``): "direct" (the default) starts each
rank in its namespace with Horovod's Gloo environment; "horovodrun" starts an
ssh server in every namespace and the real ``horovodrun -H ns0:N,ns1:N,...``
over ssh, as on a cluster. Every namespace is a machine of ``--ranks-per-machine``
(N, default 1) ranks: ranks of one namespace talk over its loopback, ranks of
different namespaces over the shaped links, and Horovod reports local size N and
cross size W. ``--hierarchical {auto,true,false}`` builds every MergeComp config
with ``MergeComp(hierarchical=None/True/False)`` (worker.py), to compare the flat
reduce with the two-level one.

Configs: Horovod fp32 (``hvd.Compression.none``), Horovod fp16
(``hvd.Compression.fp16``), and for each algorithm MergeComp layer-wise
(``partitions="layerwise"``), one group (``partitions=1``) and the partition
``MergeCompCallback``'s search chose during warmup (with ``--search-on exchange``,
the same search with the exchange alone as the step; worker.py).

Batches: the configs run in batches, each in a fresh set of rank processes
(``plan_batches``): Horovod fp32 and fp16, then one batch per algorithm with
its layer-wise, one-group and searched configs. A rank thus holds the models,
MergeComp state and traced functions of one batch only (its peak RSS,
``ru_maxrss``, is reported per batch), and no config runs after the whole
matrix's earlier configs. An algorithm's configs train one model, the
searched config's, each in its own partition (``_share_one_model``): two
models of the same config trained up to 14% apart side by side, which a
comparison of partitions on different models would take for the partition's
doing. Within a batch, worker.py times the configs
interleaved in rounds (order rotated per round), so the ratios MergeComp
reports (searched vs layer-wise and one group) compare configs measured side
by side. Each batch also runs one config twice, as two independent configs
(Horovod fp32; the algorithm's layer-wise): the spread between the two is this
run's noise, printed next to every ratio of the batch.

``--isolate`` runs every config in a batch of its own instead (fresh rank
processes per config, the repeats too): nothing is interleaved, and nothing
is timed after another config in the same processes. Slower (each config
starts TensorFlow and Horovod, builds and traces), but steady where the
order matters: once a process has run a step of a few hundred distinct
collectives (layer-wise, Horovod's per-tensor allreduce), Horovod's
per-cycle cache sync costs each rank 0.2-0.5 cores from then on, and a
merged group timed after it runs 20-50% slower than alone
(docs/scaling.md, "Timed alone, not interleaved"); the rounds' rotation
spreads that but cannot remove it.

Throughput = W x batch / mean over measured steps of the slowest rank's
step time: the training throughput of those steps. (A median is no summary of
steps that alternate between two speeds for tens of steps at a time, as 2
ranks on 2 cores can: it lands on either speed; docs/benchmarks.md, "Two
speeds on two cores".) Each searched-vs-sentinel ratio of the targets comes
with how far the rounds agree on it: two standard errors of the per-round
ratio. Exchange time = median over the rounds' calls of the slowest rank's
time for the gradient exchange alone (worker.py: the optimizer's allreduce
function on fixed tensors of the model's gradient shapes, no backprop): the
communication and compression cost that the grouping changes,
which backprop on a CPU mostly hides.

Scaling factor = W-worker throughput / (W x 1-worker fp32
throughput). All ranks share this machine's cores, so per-rank compute time
(plain local step, measured while the other ranks do the same) is reported
next to it, and "vs local compute" = W-worker throughput / (W x batch /
median local compute step of this run): the scaling factor with the CPU
contention of this run factored out. The machine's load average before and
after each run is recorded: other processes on the machine skew the numbers.
"""

import json
import math
import os
import time

from tf_mergecomp.search.summary import mean_log_ratio
from tf_mergecomp.search.requests import PLAIN_HOROVOD
from benchmarks import launcher, link_check, models, netns, network_model, report, sshd, worker

PARTITION_MODES = ("layerwise", "one", "searched")
# Every mode a config may take (--modes): "searched_single" is the search with
# one codec for every group (MergeComp(plain_groups=False)), beside "searched".
ALL_PARTITION_MODES = worker.MERGECOMP_PARTITIONS
LAUNCHERS = launcher.LAUNCHERS
NOMINAL_UNSHAPED_BYTES_PER_S = link_check.NOMINAL_UNSHAPED_BYTES_PER_S
DEFAULT_ALGORITHMS = ("fp16", "dgc", "topk", "randomk", "qsgd", "efsignsgd", "signsgd",
                      "onebit", "signum", "terngrad", "powersgd")
QUICK = {"models": ("transformer",), "workers": (2,), "algorithms": ("efsignsgd", "topk"),
         "steps": 24, "warmup_steps": 3, "search_steps": 150, "search_max_groups": 2,
         "exchange_steps": 2, "exchange_rounds": 8}
# The config each batch runs twice, by kind: its spread is the batch's noise.
REPEATED = {"horovod": "horovod fp32", "mergecomp": "layerwise"}
REPEAT_SUFFIX = " (repeat)"


CPU_ALLOCATORS = ("bfc", "default")
HIERARCHICAL_CHOICES = tuple(worker.HIERARCHICAL_CHOICES)


def ranks_per_machine(args):
    """The ranks each namespace runs (1 for the arguments of runs before the option)."""
    return getattr(args, "ranks_per_machine", 1)


def total_ranks(group):
    """All ranks of a (model, workers) run: its machines times their ranks."""
    return group["workers"] * group.get("ranks_per_machine", 1)


def cpu_allocator_environment(allocator):
    """TensorFlow's CPU allocator for the ranks.

    "default" allocates every large buffer afresh from the OS (glibc maps
    buffers of tens of MB, and each use page-faults them in again), which
    makes a merged group's buffers (the whole model's gradients) up to 3x
    slower to write than the per-tensor ones; "bfc" keeps freed memory in
    TensorFlow's best-fit-with-coalescing pool, as on GPUs.
    """
    if allocator not in CPU_ALLOCATORS:
        raise ValueError("cpu allocator must be one of %s, got %r" % (CPU_ALLOCATORS, allocator))
    return {"TF_CPU_ALLOCATOR_USE_BFC": "true" if allocator == "bfc" else "false"}


def rank_environment(allocator, pin_cores=True):
    """Environment added to every rank: the CPU allocator, a response cache
    large enough for a batch's configs, so that no config's collectives are
    evicted (and renegotiated) by the others' in the interleaved rounds, and
    whether each rank keeps to cores of its own (``worker.pin_to_own_cores``)."""
    return dict(cpu_allocator_environment(allocator), HOROVOD_CACHE_CAPACITY="4096",
                **{worker.PIN_CORES_VARIABLE: "1" if pin_cores else "0"})


def plan_configs(algorithms, modes=PARTITION_MODES):
    configs = [
        {"label": "horovod fp32", "kind": "horovod", "compression": "none"},
        {"label": "horovod fp16", "kind": "horovod", "compression": "fp16"},
    ]
    for algorithm in algorithms:
        for mode in modes:
            configs.append({"label": "%s %s" % (algorithm, mode), "kind": "mergecomp",
                            "algorithm": algorithm, "partition": mode})
    return configs


def _repeat(config):
    return dict(config, label=config["label"] + REPEAT_SUFFIX, repeat_of=config["label"])


def check_modes(modes):
    modes = tuple(modes)
    unknown = [m for m in modes if m not in ALL_PARTITION_MODES]
    if not modes or unknown or len(set(modes)) != len(modes):
        raise ValueError("modes must be distinct names among %s, got %s"
                         % (", ".join(ALL_PARTITION_MODES), ",".join(modes) or "none"))
    return modes


def _is_repeated(config, batch):
    """Whether ``config`` is its batch's repeated one: REPEATED's, or for
    MergeComp without a layer-wise config, the batch's first."""
    wanted = REPEATED[config["kind"]]
    if config["label"] == wanted or config.get("partition") == wanted:
        return True
    return (config["kind"] == "mergecomp" and config is batch[0]
            and not any(c.get("partition") == wanted for c in batch))


def family(config):
    """The configs compared with each other and sharing one noise figure: Horovod's, or one
    algorithm's."""
    return config.get("algorithm", "horovod")


def plan_batches(algorithms, modes=PARTITION_MODES, isolate=False):
    """The configs of ``plan_configs`` in batches: Horovod's, then one per algorithm,
    each with its repeated config (REPEATED) appended.

    ``isolate``: every config (the repeats too) in a batch of its own, in that order, so
    that no config is timed after another in the same processes.
    """
    batches = []
    for config in plan_configs(algorithms, modes):
        if not batches or family(batches[-1][0]) != family(config):
            batches.append([])
        batches[-1].append(config)
    for batch in batches:
        batch.extend(_repeat(c) for c in list(batch) if _is_repeated(c, batch))
    if isolate:
        return [[config] for batch in batches for config in batch]
    return [_share_one_model(batch) for batch in batches]


def _share_one_model(batch):
    """An algorithm's configs train one model, each in its partition: the
    searched config's (or the first's), after its search. Two models of the
    same config, built the same way, trained up to 14% apart in the same rounds
    (ResNet50, 2 workers; docs/benchmarks.md): a partition compared on
    another model would carry that difference."""
    mergecomp = [c for c in batch if c["kind"] == "mergecomp"]
    if len(mergecomp) < 2:
        return batch
    owner = next((c for c in mergecomp if c["partition"] == "searched"), mergecomp[0])
    # A fixed partition can train the owner's model; another search needs its own.
    sharing = [c for c in mergecomp if c is not owner
               and c["partition"] in worker.FIXED_PARTITIONS]
    return [dict(c, model_of=owner["label"]) if c in sharing else c for c in batch]


def rounds_plan(args):
    """(rounds, steps per round): --steps measured steps spread over --exchange-rounds rounds."""
    rounds = max(1, args.exchange_rounds)
    return rounds, max(1, math.ceil(args.steps / rounds))


def _time_budget_s(num_configs, args, model, compute_steps):
    # Generous: starting TensorFlow and Horovod takes tens of seconds, tracing a
    # Keras model with per-tensor compression as much again on a contended
    # 2-core machine; ResNet50/VGG16 steps take seconds. A search on exchange
    # times re-traces only the exchange (seconds).
    # Another keras.applications model: as much as the slowest of ours.
    per_step = {"transformer": 3.0, "mlp": 5.0, "resnet50": 8.0, "vgg16": 15.0}.get(model, 15.0)
    rounds, steps_per_round = rounds_plan(args)
    # The search: at most --search-steps steps, 5 traces, and a minute of probes.
    search_steps = args.search_steps if args.search_on == "training" else 0
    per_config = 150 + per_step * (args.warmup_steps + search_steps + rounds * (1 + steps_per_round)) \
        + 2.0 * rounds * (args.exchange_steps + 2)
    searches = 300 + 5 * 30 if args.search_on == "training" else 600
    return 180 + per_step * (3 + compute_steps) + num_configs * per_config + searches


def batch_spec(model, configs, args, result_path, compute_steps):
    rounds, steps_per_round = rounds_plan(args)
    timeout_s = args.timeout or _time_budget_s(len(configs), args, model, compute_steps)
    return {
        "model": model,
        "batch_size": args.batch_size,
        "warmup_steps": args.warmup_steps,
        "rounds": rounds,
        "steps_per_round": steps_per_round,
        "search_steps": args.search_steps,
        "compute_steps": compute_steps,
        "exchange_steps": args.exchange_steps,
        "search_on": args.search_on,
        # MergeComp(hierarchical=...) of every MergeComp config.
        "hierarchical": worker.HIERARCHICAL_CHOICES[getattr(args, "hierarchical", "auto")],
        # The ranks stop themselves (together) before the launcher kills them.
        "deadline": time.time() + timeout_s - 30,
        "timeout_s": timeout_s,
        "result_path": result_path,
        "configs": configs,
        # Rank 0 logs the search's phases into the batch's log.
        "search_params": {"max_groups": args.search_max_groups, "steps_per_candidate": 3,
                          "min_turn_seconds": args.search_min_turn_ms / 1e3, "verbose": 1},
    }


def run_batch(num_ranks, launch, model, batch_index, configs, args, run_dir):
    """One batch in a fresh set of ``num_ranks`` rank processes, started by ``launch`` (from
    ``launcher.open_launcher``); returns its record (``ranks``: their outputs).

    The local compute step is measured in the first batch only (the same for all).
    """
    name = "batch%d" % batch_index
    spec = batch_spec(model, configs, args, os.path.join(run_dir, name + "_rank{rank}.json"),
                      compute_steps=5 if batch_index == 0 else 0)
    spec_path = os.path.join(run_dir, name + "_spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=1)
    error = None
    started = time.time()
    try:
        launch(["-m", "benchmarks.worker", spec_path], os.path.join(run_dir, "logs"),
               spec["timeout_s"], log_prefix=name + "_rank",
               extra_env=rank_environment(args.cpu_allocator, args.pin_cores))
    except launcher.RankFailure as failure:
        error = str(failure)
    outputs = []
    for rank in range(num_ranks):
        path = spec["result_path"].format(rank=rank)
        if os.path.exists(path):
            with open(path) as f:
                outputs.append(json.load(f))
    return {"labels": [c["label"] for c in configs], "error": error,
            "wall_s": time.time() - started, "ranks": outputs}


def run_group(model, workers, batches, args, out_dir, ranks_per_namespace=1):
    """The batches of one (model, workers), one after another on one virtual cluster of
    ``workers`` namespaces with ``ranks_per_namespace`` ranks each."""
    tag = "%s%d" % (model[0], workers)
    run_dir = os.path.join(out_dir, "runs", "%s_w%d" % (model, workers))
    os.makedirs(run_dir, exist_ok=True)
    started = time.time()
    load_before = os.getloadavg()[0]
    records = []
    link = None
    with netns.VirtualCluster(workers, bandwidth=args.bandwidth, tag=tag) as cluster, \
            launcher.open_launcher(args.launcher, cluster, ranks_per_namespace) as launch:
        if workers > 1 and args.link_check:
            link = check_links(cluster, args)
        for index, configs in enumerate(batches):
            print("[cluster]   batch %d/%d: %s" % (index + 1, len(batches),
                                                  ", ".join(c["label"] for c in configs)), flush=True)
            records.append(run_batch(workers * ranks_per_namespace, launch, model, index, configs,
                                     args, run_dir))
    return {"model": model, "workers": workers, "ranks_per_machine": ranks_per_namespace,
            "batch_size": args.batch_size,
            "wall_s": time.time() - started, "load_average": [load_before, os.getloadavg()[0]],
            "batches": records, "ranks": merge_batches(records, workers * ranks_per_namespace),
            "link": link}


def check_links(cluster, args):
    """What the cluster's links deliver (``link_check``), each worker's side on
    its rank's cores when the ranks keep to theirs. A check that fails is
    reported and the run goes on (the configs' own errors say more)."""
    unshaped = netns.check_rate(args.bandwidth) is None
    nominal = NOMINAL_UNSHAPED_BYTES_PER_S if unshaped else netns.rate_bytes_per_s(args.bandwidth)
    check = link_check.measure_on_rank_cores(cluster, nominal, args.pin_cores)
    if unshaped:
        check["nominal_bytes_per_s"] = None
    print("[cluster]   " + link_check.describe(check), flush=True)
    return check


def merge_batches(records, num_ranks):
    """Per rank (``num_ranks`` of them), the results of all batches, each result marked
    with its batch and that batch's peak RSS on this rank."""
    ranks = [{"rank": rank, "results": []} for rank in range(num_ranks)]
    for index, record in enumerate(records):
        for output in record["ranks"]:
            merged = ranks[output["rank"]]
            if "compute_step_s" in output:
                merged["compute_step_s"] = output["compute_step_s"]
            merged.setdefault("gradient_tensors", output.get("gradient_tensors"))
            merged.setdefault("restart_blocker", output.get("restart_blocker"))
            merged["horovod_restarts"] = (merged.get("horovod_restarts", 0)
                                          + output.get("horovod_restarts", 0))
            for result in output["results"]:
                merged["results"].append(dict(result, batch=index,
                                              peak_rss_mb=output.get("peak_rss_mb")))
    return ranks


def batch_errors(group):
    return ["batch %d (%s): %s" % (i + 1, ", ".join(b["labels"]), b["error"])
            for i, b in enumerate(group.get("batches", [])) if b["error"]]


def summarize(group):
    """Per-config throughput and timing over the ranks of one run, with each batch's noise."""
    workers = total_ranks(group)
    by_label = {}
    for output in group["ranks"]:
        for result in output["results"]:
            by_label.setdefault(result["label"], []).append(result)
    rows = [_summarize_config(label, results, group["model"], workers, group.get("batch_size"))
            for label, results in by_label.items()]
    _add_noise(rows)
    return rows


def _summarize_config(label, results, model, workers, batch_size):
    """``workers``: all ranks of the run."""
    config = results[0]["config"]
    row = {"label": label, "config": config, "model": model, "workers": workers,
           "batch": results[0].get("batch"),
           "peak_rss_mb": max((r.get("peak_rss_mb") or 0 for r in results), default=None) or None}
    failed = [r for r in results if not r.get("ok")]
    if failed or len(results) != workers:
        row["error"] = failed[0].get("error", "failed") if failed else "missing ranks"
        return row
    if not all(r.get("step_times_s") for r in results):
        row["error"] = "set up but not timed (the batch stopped; see its logs)"
        return row
    # Step i ends when the slowest rank finishes it.
    slowest = [max(steps) for steps in zip(*(r["step_times_s"] for r in results))]
    row["step_s"] = sum(slowest) / len(slowest)
    row["step_s_median"] = report.median(slowest)
    row["turn_step_s"] = turn_means(slowest, len(results[0].get("switch_steps_s", [])))
    row["steps"] = len(slowest)
    row["cpu_util"] = report.median([r["cpu_s"] / r["elapsed_s"] for r in results])
    row["first_steps_s"] = max(r["first_steps_s"] for r in results)
    for key in ("splits", "num_groups", "num_tensors", "group_codecs", "plain_horovod",
                "collectives_executed", "search_s",
                "search_candidates", "search_finished", "search_history", "search_steps",
                "search_traces", "search_summary"):
        if key in results[0]:
            row[key] = results[0][key]
    if all(r.get("exchange_times_s") for r in results):
        row["exchange_s"] = report.median(
            [max(calls) for calls in zip(*(r["exchange_times_s"] for r in results))])
    checksums = [r.get("weights_checksum") for r in results]
    if all(c is not None for c in checksums):  # runs before the checksum have none
        row["ranks_identical"] = len(set(checksums)) == 1
    row["note"] = results[0].get("note", "")
    if "search_candidates" in row:
        row["note"] = search_note(results[0], row)
    if batch_size:
        row["images_per_s"] = workers * batch_size / row["step_s"]
    return row


def turn_means(steps, turns):
    """Mean step time of each of ``turns`` equal turns (one per round) of ``steps``
    ([] when they do not divide evenly)."""
    if not turns or len(steps) % turns:
        return []
    size = len(steps) // turns
    return [sum(steps[i:i + size]) / size for i in range(0, len(steps), size)]


def paired_uncertainty(row, other):
    """How far the throughput ratio of ``row`` over ``other`` is known: two
    standard errors of the mean over the rounds of log(other's turn time / row's
    turn time in the same round), as a fraction; None with fewer than 3 rounds."""
    pairs = [(a, b) for a, b in zip(row.get("turn_step_s", []), other.get("turn_step_s", []))
             if a > 0 and b > 0]
    if len(pairs) < 3:
        return None
    _, half_width = mean_log_ratio([b / a for a, b in pairs], standard_errors=2)
    return math.expm1(half_width)


def search_note(result, row):
    """The search's cost and its confirm medians (choice vs sentinels), for the notes column."""
    note = "search on %s: %s traces, %s steps, %.0f s" % (
        result.get("search_on", "training"), row.get("search_traces", "?"),
        row.get("search_steps", "?"), row["search_s"])
    summary = row.get("search_summary") or {}
    candidates = {_candidate_key(c["splits"]): c for c in summary.get("candidates", [])}
    choice = _candidate_key(summary.get("choice") or ())
    n = row.get("num_tensors")
    parts = []
    for label, layout in (("chosen", choice), ("one group", ()),
                          ("layer-wise", tuple(range(1, n)) if n else None),
                          ("plain Horovod", PLAIN_HOROVOD)):
        if candidates.get(layout, {}).get("measured_s") is not None:
            parts.append("%s %.1f ms" % (label, 1e3 * candidates[layout]["measured_s"]))
    if choice and candidates.get(choice, {}).get("relative_to_one_group") is not None:
        parts.append("chosen/one group in the same rounds %.3f"
                     % candidates[choice]["relative_to_one_group"])
    if parts:
        note += " (interleaved medians: %s)" % ", ".join(parts)
    if summary.get("extra_rounds"):
        note += ", %d extra rounds on the leader" % summary["extra_rounds"]
    leader = summary.get("leader")
    if leader is not None and _candidate_key(leader) != choice:
        note += ", leader %s unresolved (%.3f of one group): one group kept" % (
            PLAIN_HOROVOD if leader == PLAIN_HOROVOD else "%d groups" % (len(leader) + 1),
            candidates.get(_candidate_key(leader), {}).get("relative_to_one_group")
            or float("nan"))
    if not row.get("search_finished"):
        note += ", stopped at the step budget (best so far kept)"
    return note


def _candidate_key(splits):
    """A search candidate as the summary names it: its cuts, or plain Horovod (no cuts)."""
    return PLAIN_HOROVOD if splits is None or splits == PLAIN_HOROVOD else tuple(splits)


def spread(first, second):
    """Relative difference of two measurements of the same config: |first/second - 1|."""
    value = report.ratio(first, second)
    return None if value is None else abs(value - 1)


def _add_noise(rows):
    """Each row of a family (``family``: one batch, or one algorithm's isolated batches)
    gets the family's noise: the spread between its repeated config's two measurements,
    in throughput ("noise") and exchange time."""
    by_label = {r["label"]: r for r in rows}
    for repeat in rows:
        original = by_label.get(repeat["config"].get("repeat_of"))
        if original is None:
            continue
        noise = spread(repeat.get("images_per_s"), original.get("images_per_s"))
        exchange_noise = spread(repeat.get("exchange_s"), original.get("exchange_s"))
        for row in rows:
            if family(row["config"]) == family(repeat["config"]):
                row.update(noise=noise, exchange_noise=exchange_noise, noise_of=original["label"])


def primary_rows(rows):
    """The rows without the repeated configs (those only measure the noise)."""
    return [r for r in rows if not r["config"].get("repeat_of")]


def _percent(value):
    return "-" if value is None else "%.1f%%" % (100 * value)


# The targets of a 2-worker, 1 Gbit/s run (docs/benchmarks.md, section 1).
SENTINEL_MARGIN = 0.97  # searched >= 97% of the better of layer-wise and one group
VS_HOROVOD = {"fp32": 2.5, "fp16": 1.8}  # the best codec's throughput over Horovod's
TRANSFORMER_SPEEDUP = {"efsignsgd": 1.3, "topk": 1.3}  # searched over layer-wise
PLAIN_CHOICE_MARGIN = 0.97  # searched >= 97% of the better of Horovod fp32 and fp16


def target_lines(group, single_images_per_s, model=None):
    """The targets for one (model, workers) run: 'met' or by how much missed.

    Per codec: MergeComp's searched partition never more than 3% slower than
    the better of layer-wise and one group (with the batch's own noise next
    to it); on the transformer, searched >= 1.3x layer-wise for efsignsgd and
    topk. Per run: the best codec's throughput >= 2.5x Horovod fp32's and
    >= 1.8x Horovod fp16's. The best scaling factor is reported, not targeted.
    """
    rows = primary_rows(group["rows"])
    by = {(r["config"].get("algorithm"), r["config"].get("partition")): r for r in rows}
    horovod = {r["config"].get("compression"): r for r in rows
               if r["config"]["kind"] == "horovod" and r.get("images_per_s")}
    lines = []
    for algorithm in _algorithms(rows):
        searched = by.get((algorithm, "searched"), {})
        layerwise = by.get((algorithm, "layerwise"), {})
        one = by.get((algorithm, "one"), {})
        two_level = by.get((algorithm, "one_two_level"), {})
        levels = []
        if two_level.get("images_per_s") and one.get("images_per_s"):
            levels.append("one group, two levels / flat: %sx%s" % (
                report.fmt(two_level["images_per_s"] / one["images_per_s"]),
                _uncertainty_text(paired_uncertainty(two_level, one))))
        if not searched.get("images_per_s"):
            lines.append("%s: %s" % (algorithm, "; ".join(levels + [
                "MergeComp searched not measured"])))
            continue
        verdicts = []
        sentinels = [r for r in (layerwise, one) if r.get("images_per_s")]
        if sentinels:
            better = max(sentinels, key=lambda r: r["images_per_s"])
            relative = searched["images_per_s"] / better["images_per_s"]
            verdicts.append("within 3%% of the better sentinel: %s (%.1f%% %s%s)" % (
                _verdict(relative, SENTINEL_MARGIN), 100 * abs(1 - relative),
                "slower" if relative < 1 else "faster",
                _uncertainty_text(paired_uncertainty(searched, better))))
        if model == "transformer" and algorithm in TRANSFORMER_SPEEDUP:
            speedup = report.ratio(searched["images_per_s"], layerwise.get("images_per_s"))
            verdicts.append("searched >= %sx layer-wise: %s (%sx%s)" % (
                TRANSFORMER_SPEEDUP[algorithm], _verdict(speedup, TRANSFORMER_SPEEDUP[algorithm]),
                report.fmt(speedup), _uncertainty_text(paired_uncertainty(searched, layerwise))))
        verdicts.extend(levels)
        verdicts.extend(_plain_choice_verdicts(searched, by.get((algorithm, "searched_single"), {}),
                                               horovod))
        lines.append("%s: %s; %s" % (algorithm, "; ".join(verdicts), _noise_text(searched)))
    codecs = [r for r in rows if r["config"]["kind"] == "mergecomp" and r.get("images_per_s")]
    if codecs and horovod:
        best = max(codecs, key=lambda r: r["images_per_s"])
        verdicts = []
        for compression, target in VS_HOROVOD.items():
            baseline = horovod.get("fp16" if compression == "fp16" else "none")
            if baseline is None:
                continue
            ratio = best["images_per_s"] / baseline["images_per_s"]
            verdicts.append(">= %sx Horovod %s: %s (%sx)" % (target, compression,
                                                               _verdict(ratio, target),
                                                               report.fmt(ratio)))
        lines.append("best codec (%s, %s images/s): %s" % (best["label"],
                                                           report.fmt(best["images_per_s"]),
                                                           "; ".join(verdicts)))
    if single_images_per_s:
        scaling = [(r["images_per_s"] / (total_ranks(group) * single_images_per_s), r["label"])
                   for r in rows if r.get("images_per_s")]
        if scaling:
            best, label = max(scaling)
            lines.append("best scaling factor: %s (%s)" % (report.fmt(best), label))
    return lines


def _plain_choice_verdicts(searched, single, horovod):
    """The per-group codec choice's targets: searched >= 0.97x the better of
    Horovod fp32 and fp16 (measured in another batch: its noise is Horovod's
    and the algorithm's, both stated), and searched against the single-codec
    search (``searched_single``) measured side by side."""
    verdicts = []
    if horovod:
        better = max(horovod.values(), key=lambda r: r["images_per_s"])
        relative = searched["images_per_s"] / better["images_per_s"]
        verdicts.append("searched >= %sx the better Horovod (%s): %s (%sx; Horovod's %s)"
                        % (PLAIN_CHOICE_MARGIN, better["label"],
                           _verdict(relative, PLAIN_CHOICE_MARGIN), report.fmt(relative),
                           _noise_text(better)))
    if single.get("images_per_s"):
        relative = searched["images_per_s"] / single["images_per_s"]
        verdicts.append("searched / searched_single: %sx%s" % (
            report.fmt(relative), _uncertainty_text(paired_uncertainty(searched, single))))
    choice = searched.get("group_codecs") or ()
    if searched.get("plain_horovod"):
        verdicts.append("chose plain Horovod")
    elif any(codec != searched["config"]["algorithm"] for codec in choice):
        verdicts.append("group codecs %s" % ",".join(choice))
    elif choice:
        verdicts.append("no group plain")
    return verdicts


def _algorithms(rows):
    """The algorithms of ``rows`` in order of appearance."""
    algorithms = []
    for row in rows:
        algorithm = row["config"].get("algorithm")
        if algorithm and algorithm not in algorithms:
            algorithms.append(algorithm)
    return algorithms


def _uncertainty_text(uncertainty):
    return "" if uncertainty is None else ", +-%.1f%% over the rounds" % (100 * uncertainty)


def _noise_text(row):
    """The run's own noise for the ratios of ``row``'s batch."""
    if not row.get("noise_of"):
        return "noise not measured"
    return "noise: %s measured twice differs by %s in throughput, %s in exchange" % (
        row["noise_of"], _percent(row.get("noise")), _percent(row.get("exchange_noise")))


def _verdict(value, target):
    if value is None:
        return "not measured"
    return "met" if value >= target else "missed"


def _partition_text(row):
    if row["config"]["kind"] != "mergecomp" or row.get("num_groups") is None:
        return "-"
    splits = row.get("splits") or []
    if row.get("plain_horovod"):
        return "plain Horovod"
    if row["config"]["partition"] == "layerwise":
        return "layer-wise (%d)" % row["num_groups"]
    codecs = row.get("group_codecs") or []
    plain = [c for c in codecs if c != row["config"]["algorithm"]]
    codecs_text = " codecs %s" % ",".join(codecs) if plain else ""
    if len(splits) <= 4:
        return "%d groups %s%s" % (row["num_groups"], list(splits), codecs_text)
    return "%d groups%s" % (row["num_groups"], codecs_text)


def _batches_text(group):
    """How the rows were measured, and the memory that took."""
    rows = group["rows"]
    peaks = [r["peak_rss_mb"] for r in rows if r.get("peak_rss_mb")]
    steps = max([r.get("steps", 0) for r in rows] + [0])
    restarts = (" Horovod was restarted before each config's turn (%d restarts per rank, the "
                "searches' own not counted)." % group["horovod_restarts"]
                if group.get("horovod_restarts") else "")
    restarts += _identical_text(rows, group)
    if group.get("isolate"):
        return ("Configs run one per batch (--isolate), each in fresh rank processes, in %s "
                "rounds (%d measured steps per config); \"batch noise\" is the spread between "
                "the two measurements (two batches) of the config each algorithm runs twice "
                "(the \"(repeat)\" rows). Peak RSS of a rank: %s MB (largest batch).%s" % (
                    group.get("rounds", "-"), steps, report.fmt(max(peaks)) if peaks else "-",
                    restarts))
    return ("Configs run in %d batches, each in fresh rank processes, timed interleaved in %s "
            "rounds (%d measured steps per config); \"batch noise\" is the spread between the "
            "two measurements of the config each batch runs twice (the \"(repeat)\" rows). "
            "Peak RSS of a rank: %s MB (largest batch).%s" % (
                len({r.get("batch") for r in rows}), group.get("rounds", "-"), steps,
                report.fmt(max(peaks)) if peaks else "-", restarts))


def _identical_text(rows, group):
    """Whether every config's model ended with the same trainable weights on all ranks."""
    checked = [r for r in rows if "ranks_identical" in r]
    if not checked:
        return ""
    differing = [r["label"] for r in checked if not r["ranks_identical"]]
    return (" Trainable weights after the last round identical on all %d ranks: %s." % (
        total_ranks(group), "every config" if not differing else "NO, they differ in " + ", ".join(differing)))


def _ranks_per_machine_text(group):
    """The header's ranks per machine: nothing for one (the runs before the option)."""
    per_machine = group.get("ranks_per_machine", 1)
    return "" if per_machine == 1 else " x %d ranks per machine" % per_machine


def _hierarchical_text(summary):
    choice = summary.get("hierarchical", "auto")
    return "" if choice == "auto" else ", MergeComp hierarchical=%s" % choice


def _load_text(load):
    if not load:
        return "-"
    return "%.1f -> %.1f on %d cores" % (load[0], load[1], os.cpu_count() or 0)


def tables(summary):
    """Markdown: one table per (model, workers)."""
    parts = []
    single = {s["model"]: s for s in summary["single"]}
    for group in summary["groups"]:
        model, workers = group["model"], group["workers"]
        ranks = total_ranks(group)
        one = single.get(model, {}).get("images_per_s")
        compute = group.get("compute_step_s") or []
        # Throughput of W ranks computing without communication, under this run's contention.
        local = (ranks * summary.get("batch_size", 32) / report.median(compute)) if compute else None
        parts.append("### %s, %d workers%s, %s links, %s CPU allocator, %s launcher%s\n" % (
            model, workers, _ranks_per_machine_text(group), summary["bandwidth"],
            summary.get("cpu_allocator", "default"), summary.get("launcher", "direct"),
            _hierarchical_text(summary)))
        parts.append("1-worker Horovod fp32: %s images/s (local compute step %s s; machine load "
                     "average %s). Per-rank local compute step in this run: %s s, so %s images/s "
                     "for %d ranks without communication (load average %s).\n" % (
                         report.fmt(one), report.fmt(single.get(model, {}).get("compute_step_s")),
                         _load_text(single.get(model, {}).get("load_average")),
                         ", ".join(report.fmt(c) for c in compute) or "-", report.fmt(local),
                         ranks, _load_text(group.get("load_average"))))
        if group.get("link"):
            parts.append(link_check.describe(group["link"]) + ".\n")
        layerwise = {r["config"].get("algorithm"): r for r in primary_rows(group["rows"])
                     if r["config"].get("partition") == "layerwise"}
        rows = []
        for row in group["rows"]:
            speedup = exchange_speedup = None
            if row["config"]["kind"] == "mergecomp" and row["config"]["partition"] != "layerwise":
                baseline = layerwise.get(row["config"]["algorithm"], {})
                speedup = report.ratio(row.get("images_per_s"), baseline.get("images_per_s"))
                exchange_speedup = report.ratio(baseline.get("exchange_s"), row.get("exchange_s"))
            rows.append([
                row["label"],
                row.get("images_per_s"),
                report.ratio(row.get("images_per_s"), ranks * one if one else None),
                report.ratio(row.get("images_per_s"), local),
                speedup,
                _partition_text(row),
                row.get("step_s"),
                1e3 * row["exchange_s"] if row.get("exchange_s") else None,
                exchange_speedup,
                "%s / %s" % (_percent(row.get("noise")), _percent(row.get("exchange_noise"))),
                row.get("cpu_util"),
                row.get("peak_rss_mb"),
                row.get("error") or row.get("note") or "",
            ])
        parts.append(report.markdown_table(
            ["config", "images/s", "scaling factor", "vs local compute", "speedup vs layer-wise",
             "partition", "step s (mean)", "exchange ms (median)",
             "exchange speedup vs layer-wise", "batch noise: images/s / exchange",
             "CPU util/rank", "peak RSS MB/rank", "notes"], rows))
        parts.append("")
        parts.append(_batches_text(group))
        parts.append("")
        targets = target_lines(group, one, model)
        if targets:
            parts.append("Targets (%s, %d workers, %s):\n" % (model, workers, summary["bandwidth"]))
            parts.extend("- " + line for line in targets)
            parts.append("")
    for line in summary.get("notes", []):
        parts.append("- " + line)
    return "\n".join(parts)


def chart(summary, path):
    """Per (model, workers): images/s (left) and exchange ms (right) for layer-wise,
    one group and MergeComp per algorithm, Horovod fp32 and fp16 as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [g for g in summary["groups"] if g["rows"]]
    if not groups:
        return None
    fig, axes = plt.subplots(len(groups), 2, figsize=(16, 3.8 * len(groups)), squeeze=False)
    for (throughput_ax, exchange_ax), group in zip(axes, groups):
        title = "%s, %d workers%s, %s links" % (group["model"], group["workers"],
                                                _ranks_per_machine_text(group), summary["bandwidth"])
        _bars(throughput_ax, group["rows"], "images_per_s", 1.0, "images/s (higher is better)",
              title + ": training throughput")
        _bars(exchange_ax, group["rows"], "exchange_s", 1e3, "ms (lower is better)",
              title + ": gradient exchange alone")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(ax, rows, key, scale, ylabel, title):
    rows = primary_rows(rows)
    algorithms = _algorithms(rows)
    styles = {"layerwise": ("layer-wise", "tab:gray"), "one": ("one group", "tab:orange"),
              "one_two_level": ("one group, two levels", "tab:red"),
              "searched": ("MergeComp", "tab:blue"),
              "searched_single": ("MergeComp, single codec", "tab:cyan")}
    modes = [m for m in styles if any(r["config"].get("partition") == m for r in rows)]
    width = 0.8 / max(1, len(modes))
    for offset, mode in enumerate(modes):
        values = []
        for algorithm in algorithms:
            match = [r for r in rows if r["config"].get("algorithm") == algorithm
                     and r["config"].get("partition") == mode]
            values.append(scale * (match[0].get(key) or 0) if match else 0)
        label, colour = styles[mode]
        ax.bar([i + (offset - (len(modes) - 1) / 2) * width for i in range(len(algorithms))],
               values, width, label=label, color=colour)
    for label, style in (("horovod fp32", "--"), ("horovod fp16", ":")):
        match = [r for r in rows if r["label"] == label and r.get(key)]
        if match:
            ax.axhline(scale * match[0][key], color="black", linestyle=style,
                       label="Horovod " + label.split()[1])
    tallest = max([scale * (r.get(key) or 0) for r in rows] + [1e-9])
    ax.set_ylim(0, tallest * 1.3)  # room for the legend above the bars
    ax.set_xticks(range(len(algorithms)))
    ax.set_xticklabels(algorithms)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, ncol=5, loc="upper center")


def run(args):
    try:
        modes = check_modes(getattr(args, "modes", PARTITION_MODES))
    except ValueError as error:
        raise SystemExit(str(error))
    ok, reason = netns.available()
    if not ok:
        raise SystemExit("the cluster benchmark needs network namespaces: %s" % reason)
    if args.launcher == "horovodrun":
        ok, reason = sshd.available()
        if not ok:
            raise SystemExit("--launcher horovodrun needs an ssh server: %s" % reason)
    removed = netns.cleanup_stale()
    out_dir = args.out
    os.makedirs(out_dir, exist_ok=True)
    notes = []
    if removed:
        notes.append("removed stale namespaces/links of dead runs: %s" % ", ".join(removed))
    batches = plan_batches(args.algorithms, modes, isolate=args.isolate)
    summary = {"bandwidth": args.bandwidth, "batch_size": args.batch_size, "steps": args.steps,
               "isolate": args.isolate,
               # The ranks inherit HOROVOD_CYCLE_TIME: validate simulates that cycle.
               "horovod_cycle_time_s": network_model.horovod_cycle_s(),
               "cpu_allocator": args.cpu_allocator, "launcher": args.launcher,
               "ranks_per_machine": ranks_per_machine(args),
               "hierarchical": getattr(args, "hierarchical", "auto"),
               "pin_cores": args.pin_cores,
               "warmup_steps": args.warmup_steps, "single": [], "groups": [], "notes": notes,
               "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        with netns.terminate_cleanly():
            _run_all(args, batches, summary, out_dir)
    except (KeyboardInterrupt, netns.Terminated) as interrupt:
        notes.append("interrupted (%s); results so far are kept" % (interrupt or "Ctrl-C"))
        _write(summary, out_dir)
        raise
    finally:
        netns.cleanup_stale()
    return _write(summary, out_dir)


def _run_all(args, batches, summary, out_dir):
    notes = summary["notes"]
    rounds, _ = rounds_plan(args)
    for model in args.models:
        print("[cluster] %s: 1 worker, Horovod fp32" % model, flush=True)
        single = run_group(model, 1, [batches[0][:1]], args, out_dir)
        rows = summarize(single)
        compute = [r.get("compute_step_s") for r in single["ranks"]]
        summary["single"].append({
            "model": model, "error": "; ".join(batch_errors(single)) or None,
            "images_per_s": rows[0].get("images_per_s") if rows else None,
            "load_average": single["load_average"], "compute_step_s": compute[0] if compute else None,
            "peak_rss_mb": rows[0].get("peak_rss_mb") if rows else None})
        for workers in args.workers:
            print("[cluster] %s: %d workers x %d ranks per machine, %d configs in %d batches" % (
                model, workers, ranks_per_machine(args), sum(len(b) for b in batches),
                len(batches)), flush=True)
            group = run_group(model, workers, batches, args, out_dir, ranks_per_machine(args))
            errors = batch_errors(group)
            summary["groups"].append({
                "model": model, "workers": workers, "ranks_per_machine": ranks_per_machine(args),
                "errors": errors, "rounds": rounds,
                "isolate": args.isolate,
                "wall_s": group["wall_s"], "rows": summarize(group),
                "load_average": group["load_average"],
                "compute_step_s": [r["compute_step_s"] for r in group["ranks"] if "compute_step_s" in r],
                "gradient_tensors": group["ranks"][0].get("gradient_tensors"),
                "horovod_restarts": group["ranks"][0].get("horovod_restarts", 0),
                "link": group["link"],
            })
            notes.extend("%s with %d workers: %s" % (model, workers, e) for e in errors)
            blocker = group["ranks"][0].get("restart_blocker") if group["ranks"] else None
            if blocker is not None:
                notes.append("%s with %d workers: Horovod was not restarted between configs (%s): "
                             "each config's turn also paid for the collectives cached before it"
                             % (model, workers, blocker))
            _write(summary, out_dir)


def _write(summary, out_dir):
    with open(os.path.join(out_dir, "cluster.json"), "w") as f:
        json.dump(summary, f, indent=1)
    text = tables(summary)
    with open(os.path.join(out_dir, "cluster.md"), "w") as f:
        f.write(text + "\n")
    chart(summary, os.path.join(out_dir, "cluster.png"))
    return text


def rewrite_report(out_dir):
    """cluster.md and cluster.png of an earlier run, from its cluster.json."""
    from benchmarks import validate

    return _write(validate.load_cluster(out_dir), out_dir)


def check_args(args):
    for model in args.models:
        models.check_profile_model(model)  # ours, or any keras.applications model
    for workers in args.workers:
        if workers < 2:
            raise ValueError("--workers are the multi-worker counts (>= 2); 1 worker always runs")
    netns.check_rate(args.bandwidth)
    launcher.check_ranks_per_machine(ranks_per_machine(args))
    if getattr(args, "hierarchical", "auto") not in HIERARCHICAL_CHOICES:
        raise ValueError("--hierarchical must be one of %s, got %r"
                         % (", ".join(HIERARCHICAL_CHOICES), args.hierarchical))
    if "one_two_level" in getattr(args, "modes", PARTITION_MODES):
        _check_two_level_mode(args)
    if args.launcher not in launcher.LAUNCHERS:
        raise ValueError("--launcher must be one of %s, got %r" % (", ".join(launcher.LAUNCHERS),
                                                                  args.launcher))
    if not 0 <= args.search_min_turn_ms < float("inf"):
        raise ValueError("--search-min-turn-ms must be >= 0, got %r" % args.search_min_turn_ms)
    return args


def _check_two_level_mode(args):
    """Mode one_two_level (one group on two levels, beside one group flat on the same
    MergeComp) needs machines of several ranks, --hierarchical auto and codecs that can
    be cut into shards."""
    if ranks_per_machine(args) < 2:
        raise ValueError("mode one_two_level needs --ranks-per-machine 2 or more (with one rank "
                         "per machine every group is flat)")
    if getattr(args, "hierarchical", "auto") != "auto":
        raise ValueError("mode one_two_level needs --hierarchical auto (MergeComp(hierarchical="
                         "None), which lets a group take two levels), got %r" % args.hierarchical)
    unshardable = [a for a in args.algorithms if a == "powersgd"]
    if unshardable:
        raise ValueError("mode one_two_level: %s reduces its groups itself and has no two-level "
                         "reduce; leave it out of --algorithms" % ", ".join(unshardable))
