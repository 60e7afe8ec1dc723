"""The virtual-cluster benchmark: images/s of each compression config on W workers.

For every model: a 1-worker run (Horovod fp32; the scaling baseline), then for
every worker count W a run of all configs on W namespaces joined by
tc-shaped links (``netns.VirtualCluster``), ranks started by
``launcher.run_ranks``, each rank a ``worker.py`` process running the configs
in sequence.

Configs: Horovod fp32 (``hvd.Compression.none``), Horovod fp16
(``hvd.Compression.fp16``), and for each algorithm MergeComp layer-wise
(``partitions="layerwise"``), one group (``partitions=1``) and the partition
searched during warmup: by training step times (``MergeCompCallback``) or, with
``--search-on exchange``, by exchange times (worker.py).

Throughput = W x batch / median over measured steps of the slowest rank's
step time. Exchange time = median over ``--exchange-rounds`` x
``--exchange-steps`` calls (the configs interleaved round by round) of the
slowest rank's time for the gradient exchange alone (worker.py: the
optimizer's allreduce function on fixed tensors of the model's gradient
shapes, no backprop): the communication and compression cost that the
grouping changes, which backprop on a CPU mostly hides.

Scaling factor = W-worker throughput / (W x 1-worker fp32
throughput). All ranks share this machine's cores, so per-rank compute time
(plain local step, measured while the other ranks do the same) is reported
next to it, and "vs local compute" = W-worker throughput / (W x batch /
median local compute step of this run): the scaling factor with the CPU
contention of this run factored out. The machine's load average before and
after each run is recorded: other processes on the machine skew the numbers.
"""

import json
import os
import time

from tf_mergecomp.bench import launcher, models, netns, report

PARTITION_MODES = ("layerwise", "one", "searched")
DEFAULT_ALGORITHMS = ("fp16", "dgc", "topk", "randomk", "qsgd", "efsignsgd", "signsgd",
                      "onebit", "signum", "terngrad", "powersgd")
QUICK = {"models": ("transformer",), "workers": (2,), "algorithms": ("efsignsgd", "topk"),
         "steps": 8, "warmup_steps": 5, "search_steps": 16, "search_max_groups": 2,
         "exchange_steps": 4, "exchange_rounds": 3}


CPU_ALLOCATORS = ("bfc", "default")


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


def algorithm_available(name):
    """(bool, reason): whether the compressor's module imports."""
    from tf_mergecomp import compressors

    try:
        compressors.compressor_class(name)
    except (ImportError, AttributeError) as error:
        return False, "%s: %s" % (type(error).__name__, error)
    return True, ""


def _time_budget_s(num_configs, args, model):
    # Generous: tracing a Keras model with per-tensor compression takes tens of
    # seconds on a contended 2-core machine; ResNet50/VGG16 steps take seconds.
    # A search on exchange times re-traces only the exchange (seconds).
    per_step = {"transformer": 3.0, "resnet50": 8.0, "vgg16": 15.0}[model]
    search_steps = args.search_steps if args.search_on == "training" else 0
    per_config = 150 + per_step * (args.steps + args.warmup_steps + search_steps) \
        + 2.0 * args.exchange_rounds * (args.exchange_steps + 2)
    searches = 600 if args.search_on == "exchange" else 0
    return 180 + num_configs * per_config + searches * len(args.algorithms)


def run_group(model, workers, configs, args, out_dir):
    """One cluster of `workers` ranks running `configs`; returns the ranks' outputs."""
    tag = "%s%d" % (model[0], workers)
    run_dir = os.path.join(out_dir, "runs", "%s_w%d" % (model, workers))
    os.makedirs(run_dir, exist_ok=True)
    timeout_s = args.timeout or _time_budget_s(len(configs), args, model)
    spec = {
        "model": model,
        "batch_size": args.batch_size,
        "warmup_steps": args.warmup_steps,
        "steps": args.steps,
        "search_steps": args.search_steps,
        "compute_steps": 5,
        "exchange_steps": args.exchange_steps,
        "exchange_rounds": args.exchange_rounds,
        "search_on": args.search_on,
        "deadline": time.time() + timeout_s - 15,
        "result_path": os.path.join(run_dir, "rank{rank}.json"),
        "configs": configs,
        "search_params": {"max_groups": args.search_max_groups, "steps_per_candidate": 3,
                          "verbose": 0},
    }
    spec_path = os.path.join(run_dir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=1)
    error = None
    started = time.time()
    load_before = os.getloadavg()[0]
    with netns.VirtualCluster(workers, bandwidth=args.bandwidth, tag=tag) as cluster:
        try:
            launcher.run_ranks(cluster, ["-m", "tf_mergecomp.bench.worker", spec_path],
                               os.path.join(run_dir, "logs"), timeout_s,
                               extra_env=cpu_allocator_environment(args.cpu_allocator))
        except launcher.RankFailure as failure:
            error = str(failure)
    outputs = []
    for rank in range(workers):
        path = spec["result_path"].format(rank=rank)
        if os.path.exists(path):
            with open(path) as f:
                outputs.append(json.load(f))
    return {"model": model, "workers": workers, "error": error, "wall_s": time.time() - started,
            "load_average": [load_before, os.getloadavg()[0]], "ranks": outputs}


def summarize(group):
    """Per-config throughput and timing over the ranks of one run."""
    ranks = group["ranks"]
    workers = group["workers"]
    rows = []
    if not ranks:
        return rows
    by_label = {}
    for output in ranks:
        for result in output["results"]:
            by_label.setdefault(result["label"], []).append(result)
    batch = None
    for label, results in by_label.items():
        config = results[0]["config"]
        row = {"label": label, "config": config, "model": group["model"], "workers": workers}
        failed = [r for r in results if not r.get("ok")]
        if failed or len(results) != workers:
            row["error"] = failed[0].get("error") if failed else "missing ranks"
            rows.append(row)
            continue
        # Step i ends when the slowest rank finishes it.
        slowest = [max(steps) for steps in zip(*(r["step_times_s"] for r in results))]
        row["step_s"] = report.median(slowest)
        row["steps"] = len(slowest)
        row["cpu_util"] = report.median([r["cpu_s"] / r["elapsed_s"] for r in results])
        row["first_steps_s"] = max(r["first_steps_s"] for r in results)
        for key in ("splits", "num_groups", "num_tensors", "collectives_executed", "search_s",
                    "search_candidates", "search_finished", "search_history"):
            if key in results[0]:
                row[key] = results[0][key]
        if all(r.get("exchange_times_s") for r in results):
            row["exchange_s"] = report.median(
                [max(steps) for steps in zip(*(r["exchange_times_s"] for r in results))])
        row["note"] = results[0].get("note", "")
        if "search_candidates" in row:
            row["note"] = "search on %s times: %d candidates in %.0f s%s" % (
                results[0].get("search_on", "training"), row["search_candidates"], row["search_s"],
                "" if row["search_finished"] else ", stopped at the step budget (best so far kept)")
        rows.append(row)
    batch = group.get("batch_size")
    for row in rows:
        if row.get("step_s"):
            row["images_per_s"] = workers * batch / row["step_s"]
    return rows


SPEEDUP_TARGET_ALGORITHMS = ("efsignsgd", "signsgd", "onebit", "signum", "dgc")


def target_lines(group, single_images_per_s):
    """The issue's targets for one (model, workers) run: 'met' or by how much missed.

    MergeComp >= 2x layer-wise throughput for the sign family and dgc; MergeComp
    never more than 3% slower than the better of layer-wise and one group; the
    best scaling factor >= 90%. The exchange-time ratio is given next to the
    throughput one, since CPU backprop hides most of the exchange.
    """
    by = {(r["config"].get("algorithm"), r["config"].get("partition")): r for r in group["rows"]}
    lines = []
    algorithms = []
    for row in group["rows"]:
        algorithm = row["config"].get("algorithm")
        if algorithm and algorithm not in algorithms:
            algorithms.append(algorithm)
    for algorithm in algorithms:
        searched = by.get((algorithm, "searched"), {})
        layerwise = by.get((algorithm, "layerwise"), {})
        one = by.get((algorithm, "one"), {})
        if not searched.get("images_per_s"):
            lines.append("%s: MergeComp not measured" % algorithm)
            continue
        verdicts = []
        if algorithm in SPEEDUP_TARGET_ALGORITHMS:
            speedup = report.ratio(searched["images_per_s"], layerwise.get("images_per_s"))
            exchange = report.ratio(layerwise.get("exchange_s"), searched.get("exchange_s"))
            verdicts.append("MergeComp >= 2x layer-wise: %s (throughput %sx, exchange %sx)" % (
                _verdict(speedup, 2.0), report.fmt(speedup), report.fmt(exchange)))
        sentinels = [v for v in (layerwise.get("images_per_s"), one.get("images_per_s")) if v]
        if sentinels:
            relative = searched["images_per_s"] / max(sentinels)
            verdicts.append("within 3%% of the better sentinel: %s (%s)" % (
                _verdict(relative, 0.97), "%.1f%% %s" % (
                    100 * abs(1 - relative), "slower" if relative < 1 else "faster")))
        lines.append("%s: %s" % (algorithm, "; ".join(verdicts)))
    if single_images_per_s:
        scaling = [(r["images_per_s"] / (group["workers"] * single_images_per_s), r["label"])
                   for r in group["rows"] if r.get("images_per_s")]
        if scaling:
            best, label = max(scaling)
            lines.append("best scaling factor >= 0.90: %s (%s, %s)" % (
                _verdict(best, 0.90), report.fmt(best), label))
    return lines


def _verdict(value, target):
    if value is None:
        return "not measured"
    return "met" if value >= target else "missed"


def _partition_text(row):
    if row["config"]["kind"] != "mergecomp" or row.get("num_groups") is None:
        return "-"
    splits = row.get("splits") or []
    if row["config"]["partition"] == "layerwise":
        return "layer-wise (%d)" % row["num_groups"]
    if len(splits) <= 4:
        return "%d groups %s" % (row["num_groups"], list(splits))
    return "%d groups" % row["num_groups"]


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
        one = single.get(model, {}).get("images_per_s")
        compute = group.get("compute_step_s") or []
        # Throughput of W ranks computing without communication, under this run's contention.
        local = (workers * summary.get("batch_size", 32) / report.median(compute)) if compute else None
        parts.append("### %s, %d workers, %s links, %s CPU allocator\n" % (
            model, workers, summary["bandwidth"], summary.get("cpu_allocator", "default")))
        parts.append("1-worker Horovod fp32: %s images/s (local compute step %s s; machine load "
                     "average %s). Per-rank local compute step in this run: %s s, so %s images/s "
                     "for %d ranks without communication (load average %s).\n" % (
                         report.fmt(one), report.fmt(single.get(model, {}).get("compute_step_s")),
                         _load_text(single.get(model, {}).get("load_average")),
                         ", ".join(report.fmt(c) for c in compute) or "-", report.fmt(local),
                         workers, _load_text(group.get("load_average"))))
        layerwise = {r["config"].get("algorithm"): r
                     for r in group["rows"] if r["config"].get("partition") == "layerwise"}
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
                report.ratio(row.get("images_per_s"), workers * one if one else None),
                report.ratio(row.get("images_per_s"), local),
                speedup,
                _partition_text(row),
                row.get("step_s"),
                1e3 * row["exchange_s"] if row.get("exchange_s") else None,
                exchange_speedup,
                row.get("cpu_util"),
                row.get("error") or row.get("note") or "",
            ])
        parts.append(report.markdown_table(
            ["config", "images/s", "scaling factor", "vs local compute", "speedup vs layer-wise",
             "partition", "step s (median)", "exchange ms (median)",
             "exchange speedup vs layer-wise", "CPU util/rank", "notes"], rows))
        parts.append("")
        targets = target_lines(group, one)
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
        title = "%s, %d workers, %s links" % (group["model"], group["workers"], summary["bandwidth"])
        _bars(throughput_ax, group["rows"], "images_per_s", 1.0, "images/s (higher is better)",
              title + ": training throughput")
        _bars(exchange_ax, group["rows"], "exchange_s", 1e3, "ms (lower is better)",
              title + ": gradient exchange alone")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(ax, rows, key, scale, ylabel, title):
    algorithms = []
    for row in rows:
        algorithm = row["config"].get("algorithm")
        if algorithm and algorithm not in algorithms:
            algorithms.append(algorithm)
    width = 0.27
    for offset, (mode, colour) in enumerate(
            (("layerwise", "tab:gray"), ("one", "tab:orange"), ("searched", "tab:blue"))):
        values = []
        for algorithm in algorithms:
            match = [r for r in rows if r["config"].get("algorithm") == algorithm
                     and r["config"].get("partition") == mode]
            values.append(scale * (match[0].get(key) or 0) if match else 0)
        label = {"layerwise": "layer-wise", "one": "one group", "searched": "MergeComp"}[mode]
        ax.bar([i + (offset - 1) * width for i in range(len(algorithms))], values, width,
               label=label, color=colour)
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
    ok, reason = netns.available()
    if not ok:
        raise SystemExit("the cluster benchmark needs network namespaces: %s" % reason)
    removed = netns.cleanup_stale()
    out_dir = args.out
    os.makedirs(out_dir, exist_ok=True)
    notes = []
    if removed:
        notes.append("removed stale namespaces/links of dead runs: %s" % ", ".join(removed))
    algorithms = []
    for algorithm in args.algorithms:
        available, why = algorithm_available(algorithm)
        if available:
            algorithms.append(algorithm)
        else:
            notes.append("skipped %s: its compressor module is not there yet (%s)" % (algorithm, why))
    configs = plan_configs(algorithms)
    summary = {"bandwidth": args.bandwidth, "batch_size": args.batch_size, "steps": args.steps,
               "cpu_allocator": args.cpu_allocator,
               "warmup_steps": args.warmup_steps, "single": [], "groups": [], "notes": notes,
               "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        with netns.terminate_cleanly():
            _run_all(args, configs, summary, out_dir)
    except (KeyboardInterrupt, netns.Terminated) as interrupt:
        notes.append("interrupted (%s); results so far are kept" % (interrupt or "Ctrl-C"))
        _write(summary, out_dir)
        raise
    finally:
        netns.cleanup_stale()
    return _write(summary, out_dir)


def _run_all(args, configs, summary, out_dir):
    notes = summary["notes"]
    for model in args.models:
        print("[cluster] %s: 1 worker, Horovod fp32" % model, flush=True)
        single = run_group(model, 1, configs[:1], args, out_dir)
        single["batch_size"] = args.batch_size
        rows = summarize(single)
        entry = {"model": model, "error": single["error"], "images_per_s": None,
                 "load_average": single["load_average"],
                 "compute_step_s": single["ranks"][0]["compute_step_s"] if single["ranks"] else None}
        if rows and rows[0].get("images_per_s"):
            entry["images_per_s"] = rows[0]["images_per_s"]
        summary["single"].append(entry)
        for workers in args.workers:
            print("[cluster] %s: %d workers, %d configs" % (model, workers, len(configs)), flush=True)
            group = run_group(model, workers, configs, args, out_dir)
            group["batch_size"] = args.batch_size
            rows = summarize(group)
            summary["groups"].append({
                "model": model, "workers": workers, "error": group["error"],
                "wall_s": group["wall_s"], "rows": rows, "load_average": group["load_average"],
                "compute_step_s": [r["compute_step_s"] for r in group["ranks"]],
                "gradient_tensors": group["ranks"][0]["gradient_tensors"] if group["ranks"] else None,
            })
            if group["error"]:
                notes.append("%s with %d workers: %s" % (model, workers, group["error"]))
            _write(summary, out_dir)


def _write(summary, out_dir):
    with open(os.path.join(out_dir, "cluster.json"), "w") as f:
        json.dump(summary, f, indent=1)
    text = tables(summary)
    with open(os.path.join(out_dir, "cluster.md"), "w") as f:
        f.write(text + "\n")
    try:
        chart(summary, os.path.join(out_dir, "cluster.png"))
    except ImportError as error:
        summary["notes"].append("no chart: %s" % error)
    return text


def check_args(args):
    for model in args.models:
        models.check_model(model)
    for workers in args.workers:
        if workers < 2:
            raise ValueError("--workers are the multi-worker counts (>= 2); 1 worker always runs")
    netns.check_rate(args.bandwidth)
    return args
