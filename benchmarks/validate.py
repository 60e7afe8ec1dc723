"""Measured vs simulated step times: the cluster benchmark against the simulator.

    python -m benchmarks validate --cluster DIR[,DIR...]
        --profiles transformer=P.json,resnet50=Q.json [--latency 25us] [--out DIR]

For every config row of each cluster run (``bench cluster``'s cluster.json),
the simulator (benchmarks/simulate.py) predicts the step time of the
same config on the same network (the run's workers and tc rate): Horovod
fp32/fp16 with tensor fusion, and each codec with the partition the run
actually trained (layer-wise, one group, or what its search chose). The
collectives move at the rate the run's link check measured (``--links
delivered``, the default; ``bench cluster``'s links deliver less than their tc
rate on a host of few cores, benchmarks/link_check.py) or at the
nominal tc rate (``--links nominal``, and runs recorded without a check).
Two predictions per row:

- ``profile``: the profile's own compute (recorded on this machine);
- ``run compute``: the profile's compute times (ready times, tail, local
  step), and on a CPU host its codec costs too (they run on the same
  cores), scaled by the local compute step the cluster run measured on its
  ranks (each rank computing alone while the others do the same) over the
  profile's: the machine is shared, and its load changes between the
  profile and the run.

Error = simulated / measured - 1. The cluster run's repeated configs (the
"(repeat)" rows: the same config measured twice) give the run's own noise.

A third comparison leaves compute out: each config's gradient exchange timed
alone (the cluster's "exchange ms": the same exchange on fixed tensors, no
forward or backward pass) against the simulator's step with every gradient
ready at once and nothing else to compute (``exchange_profile``): the
network, Horovod's cycle and fusion and the codecs, without backprop's noise.
"""

import json
import os

import numpy as np

from benchmarks import netns, report, simulate
from benchmarks.profile import load

REPEAT_SUFFIX = " (repeat)"
LINK_RATES = ("delivered", "nominal")


def load_cluster(path):
    if os.path.isdir(path):
        path = os.path.join(path, "cluster.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError("cannot read the cluster run %s: %s" % (path, error)) from None


def scaled_profile(profile, local_step_s):
    """The profile with its compute times scaled so that its local step is ``local_step_s``."""
    compute = dict(profile["compute"])
    factor = local_step_s / compute["step_s"]
    for key in ("forward_s", "backward_s", "optimizer_s", "step_s", "tail_s",
                "one_group_step_s"):
        if key in compute:
            compute[key] = compute[key] * factor
    compute["ready_s"] = [r * factor for r in compute["ready_s"]]
    # On a CPU host the codecs run on the same contended cores as backprop.
    codecs = {}
    for name, codec in profile["codecs"].items():
        codec = dict(codec)
        if profile["placement"]["codec_on_compute"]:
            for part in ("encode", "collective", "decode", "collective_cpu"):
                if part in codec:
                    codec[part] = {key: value * factor for key, value in codec[part].items()}
        codecs[name] = codec
    return dict(profile, compute=compute, codecs=codecs)


def exchange_profile(profile):
    """The profile with nothing to compute: every gradient ready at the step's
    start, no tail. Its simulated step is the exchange timed alone."""
    compute = dict(profile["compute"])
    for key in ("forward_s", "backward_s", "optimizer_s", "step_s", "tail_s",
                "one_group_step_s"):
        if key in compute:
            compute[key] = 0.0
    compute["ready_s"] = [0.0] * len(compute["ready_s"])
    return dict(profile, compute=compute)


def _predict(simulation, network, row):
    config = row["config"]
    if config["kind"] == "horovod":
        which = "fp16" if config["compression"] == "fp16" else "fp32"
        return simulation.horovod(which, network)[1]
    costs = simulation.codec_costs(config["algorithm"], network)
    splits = tuple(row.get("splits") or ())
    if config["partition"] == "layerwise":
        splits = tuple(range(1, simulation.num_tensors))
    elif config["partition"] == "one":
        splits = ()
    return simulation.model(costs, config["algorithm"], network).step_time(splits)


def link_rate(run, group, links="delivered"):
    """(bytes per second, 'delivered' or 'nominal'): the rate ``group``'s collectives
    are priced at."""
    if links not in LINK_RATES:
        raise ValueError("links must be one of %s, got %r" % (", ".join(LINK_RATES), links))
    check = group.get("link")
    if links == "delivered" and check and check.get("delivered_bytes_per_s"):
        return float(check["delivered_bytes_per_s"]), "delivered"
    return netns.rate_bytes_per_s(run["bandwidth"]), "nominal"


def compare(cluster_runs, profiles, latency=None, links="delivered"):
    """Rows of measured vs simulated step times."""
    from benchmarks.network_model import HOROVOD_CYCLE_S, NetworkCosts

    rows = []
    for run in cluster_runs:
        for group in run["groups"]:
            per_second, rate_source = link_rate(run, group, links)
            model = group["model"]
            if model not in profiles:
                raise ValueError("no profile for %s; given: %s" % (model, ", ".join(profiles)))
            profile = profiles[model]
            run_compute = float(np.mean(group["compute_step_s"]))
            # Runs recorded before the cycle was: Horovod's default, as then.
            cycle_s = run.get("horovod_cycle_time_s", HOROVOD_CYCLE_S)
            simulations = {"profile": simulate.Simulation(profile, cycle_s),
                           "run compute": simulate.Simulation(scaled_profile(profile, run_compute),
                                                              cycle_s)}
            exchange = simulate.Simulation(exchange_profile(profile), cycle_s)
            network = NetworkCosts(group["workers"], per_second,
                                   simulate.DEFAULT_LATENCY_S if latency is None else latency)
            measured = {r["label"]: r for r in group["rows"]}
            for label, row in measured.items():
                if label.endswith(REPEAT_SUFFIX) or row.get("step_s") is None:
                    continue
                config = row["config"]
                codec = config.get("algorithm") or profile["horovod"][
                    "fp16" if config.get("compression") == "fp16" else "fp32"]
                if codec not in profile["codecs"]:
                    continue
                repeat = measured.get(label + REPEAT_SUFFIX)
                entry = {"model": model, "bandwidth": run["bandwidth"],
                         "link_bytes_per_s": per_second, "link": rate_source,
                         "workers": group["workers"], "label": label,
                         "groups": row.get("num_groups"), "measured_s": row["step_s"],
                         "repeat_s": repeat["step_s"] if repeat else None,
                         "run_compute_s": run_compute, "profile_step_s":
                             profile["compute"]["step_s"]}
                for name, simulation in simulations.items():
                    seconds = _predict(simulation, network, row)
                    entry[name] = seconds
                    entry[name + " error"] = seconds / row["step_s"] - 1.0
                if row.get("exchange_s"):
                    entry["exchange_measured_s"] = row["exchange_s"]
                    entry["exchange"] = _predict(exchange, network, row)
                    entry["exchange error"] = entry["exchange"] / row["exchange_s"] - 1.0
                rows.append(entry)
    return rows


def summary(rows, key):
    errors = [abs(r[key + " error"]) for r in rows if key + " error" in r]
    if not errors:
        return None
    return {"median_abs_error": float(np.median(errors)), "max_abs_error": float(max(errors)),
            "within_25": sum(e <= 0.25 for e in errors), "rows": len(errors)}


def _network_text(row):
    text = "%dw %s" % (row["workers"], row["bandwidth"])
    if row.get("link") == "delivered":
        text += " (%.2f Gbit/s delivered)" % (row["link_bytes_per_s"] * 8e-9)
    return text


def table(rows):
    lines = [report.markdown_table(
        ["model", "network", "config", "groups", "measured s", "repeat s",
         "simulated s (profile)", "error", "simulated s (run compute)", "error",
         "exchange alone ms: measured", "simulated", "error"],
        [[r["model"], _network_text(r), r["label"],
          "-" if r["groups"] is None else str(r["groups"]), r["measured_s"], r["repeat_s"],
          r["profile"], "%+.0f%%" % (100 * r["profile error"]), r["run compute"],
          "%+.0f%%" % (100 * r["run compute error"])]
         + (["%.1f" % (1e3 * r["exchange_measured_s"]), "%.1f" % (1e3 * r["exchange"]),
             "%+.0f%%" % (100 * r["exchange error"])] if "exchange" in r else ["-"] * 3)
         for r in rows])]
    for key in ("profile", "run compute"):
        s = summary(rows, key)
        if s:
            lines.append("\n%s: median |error| %.0f%% (target <= 15%%: %s), max %.0f%% (target "
                         "<= 25%%: %s), %d of %d rows within 25%%" % (
                             key, 100 * s["median_abs_error"],
                             "met" if s["median_abs_error"] <= 0.15 else "missed",
                             100 * s["max_abs_error"],
                             "met" if s["max_abs_error"] <= 0.25 else "missed",
                             s["within_25"], s["rows"]))
    s = summary(rows, "exchange")
    if s:
        lines.append("\nexchange alone (no compute: the network, Horovod and the codecs): median "
                     "|error| %.0f%%, max %.0f%%, %d of %d rows within 25%%" % (
                         100 * s["median_abs_error"], 100 * s["max_abs_error"], s["within_25"],
                         s["rows"]))
    noise = [abs(r["repeat_s"] / r["measured_s"] - 1) for r in rows if r["repeat_s"]]
    if noise:
        lines.append("\nThe runs' own noise, the same config measured twice: median %.0f%%, "
                     "max %.0f%% (%d pairs)." % (100 * np.median(noise), 100 * max(noise),
                                                  len(noise)))
    return "\n".join(lines)


def run(cluster_paths, profile_specs, latency=None, links="delivered"):
    profiles = {}
    for spec in profile_specs:
        model, _, path = spec.partition("=")
        if not path:
            raise ValueError("--profiles takes MODEL=PATH pairs, got %r" % spec)
        profiles[model] = load(path)
    rows = compare([load_cluster(p) for p in cluster_paths], profiles, latency, links)
    return {"rows": rows, "summary": {k: summary(rows, k)
                                      for k in ("profile", "run compute", "exchange")},
            "clusters": list(cluster_paths), "profiles": list(profile_specs), "links": links,
            "latency_s": simulate.DEFAULT_LATENCY_S if latency is None else latency}
