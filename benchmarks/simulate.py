"""Step times of every compression config on W workers, from one model's profile.

    python -m benchmarks simulate --profile P.json --workers 2,8,64,256
        --bandwidth 1gbit,10gbit,100gbit [--latency 25us] [--codecs ...] [--out DIR]

Built on the library's step-time model (tf_mergecomp/search/step_model.py), the
model the partition search's explore phase uses: backprop releases the
profile's gradients at their measured ready times; a group's encode starts
when its last gradient is ready and the codec is free; its collective is
taken up by Horovod's next cycle and costs what Horovod's algorithms cost on
W workers (``network_model.NetworkCosts``: ring allreduce, or allgather for the
codecs that gather rows, with their latency terms), plus this host's
measured cost of a collective; its decode follows (an allgather's decode
reads W rows), then the optimizer update (the profile's tail). Configs:

- ``horovod fp32`` / ``horovod fp16``: per-tensor collectives, fused by
  Horovod's tensor fusion (64 MB buffers, 1 ms cycle:
  ``tf_mergecomp.grouping.fusion_splits``); fp16 casts each tensor;
- per codec: ``layer-wise`` (one group per tensor), ``one group``,
  ``searched`` (the project's search core, ``search.run_search``, unchanged,
  answering its profile, probes and confirm rounds from the model, as a real
  run would measure them) and ``best <= 3`` (the model's exhaustive optimum of
  1, 2 or 3 groups, ``step_model.exhaustive_best``);
- per codec, ``searched per-group``: the search with per-group codecs (each
  group the codec or ``none``, the profile's plain fp32 allreduce; a mixed
  layout is timed with each group's own costs) and the plain-Horovod
  sentinel (timed as ``horovod fp32``), as ``MergeComp(plain_groups=True)``
  searches; ``searched per-group +fp16``: the same with fp16 groups too
  (``PartitionSearch(plain_codecs=("none", "fp16"))``), where the profile has fp16.

Scaling factor = 1-worker step (the profile's local step, no communication)
/ W-worker step; "speed-up" = layer-wise step / searched step.
"""

import json
import math
import os
import re
import time

import numpy as np

from tf_mergecomp import grouping
from tf_mergecomp.search import requests as search_requests
from tf_mergecomp.search import run as search_run
from benchmarks import network_model
from tf_mergecomp.search import step_model
from benchmarks import netns, report
from benchmarks.profile import codec_coefficients

DEFAULT_WORKERS = (2, 8, 64, 256)
DEFAULT_BANDWIDTHS = ("1gbit", "10gbit", "100gbit")
DEFAULT_LATENCY_S = 25e-6
EXHAUSTIVE_GROUPS = 3
SEARCH_MAX_GROUPS = 4
# Rounds of (fusion layout, tick phase) for Horovod's per-tensor configs.
FUSION_ROUNDS = 4
HOROVOD_CONFIGS = ("horovod fp32", "horovod fp16")
PER_GROUP = "searched per-group"
PER_GROUP_FP16 = "searched per-group +fp16"
MODES = ("layer-wise", "one group", "searched", "best <= 3", PER_GROUP, PER_GROUP_FP16)
PLAIN_CODEC = "none"
# The codecs a group may take besides the user's, per per-group mode: the
# search's default (``PartitionSearch(plain_codecs=("none",))``, exact), and with
# fp16 groups too (``plain_codecs=("none", "fp16")``).
PER_GROUP_PLAIN_CODECS = {PER_GROUP: (PLAIN_CODEC,), PER_GROUP_FP16: (PLAIN_CODEC, "fp16")}

_PREFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_bandwidth(text, networks=None):
    """(label, bytes per second, default latency or None) of a tc rate as the cluster
    benchmark's --bandwidth takes it ('10gbit', '400mbit'; tc's 'gbps' are bytes), a rate
    per second with its unit spelled out ('12.5GB/s' bytes, '100Gb/s' bits) or the name of a
    network of the profile."""
    text = text.strip()
    if networks and text in networks:
        network = networks[text]
        return text, float(network["bandwidth_bytes_per_s"]), float(network["latency_s"])
    per_second = None
    spelled_out = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(B|b)/s", text)
    if spelled_out:
        number, prefix, unit = spelled_out.groups()
        per_second = float(number) * _PREFIXES[prefix.lower()] / (8.0 if unit == "b" else 1.0)
    else:
        try:  # refuses 'none' too: an unshaped link has no rate to simulate
            per_second = netns.rate_bytes_per_s(text)
        except ValueError:
            pass
    if per_second is None:
        names = ", ".join(sorted(networks)) if networks else "none in this profile"
        raise ValueError("bandwidth %r: expected a tc rate (1gbit, 400mbit), a rate per second "
                         "(12.5GB/s, 100Gb/s) or a network named in the profile (%s)"
                         % (text, names))
    if per_second <= 0:
        raise ValueError("bandwidth %r is not positive" % text)
    return text, per_second, None


def parse_latency(text):
    """Seconds of '25us', '0.1ms', '2e-5' (seconds) or '0'."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?(?:e-?\d+)?)\s*(us|ms|s|ns)?", text.strip())
    if not match:
        raise ValueError("latency %r: expected e.g. 25us, 0.1ms or seconds" % text)
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}[match.group(2)]
    return float(match.group(1)) * scale


class Simulation:
    """The step-time model of one profile, for any network."""

    def __init__(self, profile, cycle_s=None, overlap=True):
        """``cycle_s``: Horovod's cycle of the simulated run, if not the profile's.
        ``overlap=False``: the exchange cannot overlap compute (every collective
        delays backprop: ``network_model.SerializedExchange``); for a profile whose
        codec runs on the compute stream."""
        self.profile = profile
        tensors = profile["tensors"]
        self.sizes = np.asarray(tensors["sizes"], dtype=np.float64)
        self.num_tensors = len(self.sizes)
        compute = profile["compute"]
        self.ready = np.asarray(compute["ready_s"], dtype=np.float64)
        self.tail = float(compute["tail_s"])
        self.local_step = float(compute["step_s"])
        placement = profile["placement"]
        self.codec_on_compute = bool(placement["codec_on_compute"])
        if not overlap and not self.codec_on_compute:
            raise ValueError("overlap=False puts the collectives on the compute stream, which "
                             "this profile's codec does not run on (placement.codec_on_compute "
                             "is false)")
        self.overlap = bool(overlap)
        self.decodes_after_backprop = bool(placement["decodes_after_backprop"])
        horovod = profile["horovod"]
        # The probe's collectives waited the profile's cycle; the run waits its own.
        self.probe_cycle_s = float(horovod["cycle_time_s"])
        self.cycle_s = self.probe_cycle_s if cycle_s is None else float(cycle_s)
        self.fusion_bytes = float(horovod["fusion_buffer_bytes"])
        # The exchange probe serializes its groups, so each of its collectives
        # waited about one whole cycle for Horovod's next pass: the model adds
        # the cycle itself (StepTimeModel.cycle_s), so that wait comes out.
        self.probe_waits_cycle = bool(horovod.get("probe_waits_cycle", False))
        self.fusion_copies_on_compute = bool(horovod.get("fusion_copies_on_compute",
                                                         self.codec_on_compute))
        self.codecs = profile["codecs"]
        # The ranks the exchange probe ran on (profile.py, --processes).
        self.probe_workers = int(horovod.get("probe_workers", 1))
        # What the probe's loopback ring delivered each way (profiles recorded
        # since it is measured; a failed check has none): its transfer is taken
        # out of the host's share.
        self.probe_link = (profile.get("probe_link") or {}).get("delivered_bytes_per_s")

    # ---- cost functions ----------------------------------------------------
    def copies_on_horovods_thread(self, name):
        """Whether codec ``name``'s copies (its encode and decode) run on Horovod's thread:
        the plain float32 codec, which the library sends as Horovod fp32 does (one
        grouped collective of the group's own tensors, copied into and out of Horovod's
        fusion buffer by Horovod), where those copies leave the compute stream (a GPU:
        Horovod's own stream). On a CPU host that thread takes the same cores, and the
        copies stay where they were measured."""
        return name == self.profile["horovod"]["fp32"] and not self.fusion_copies_on_compute

    def codec_fit(self, name, without=()):
        coefficients = np.asarray(codec_coefficients(self.codecs[name]), dtype=np.float64)
        if self.probe_waits_cycle:
            coefficients[1, 0] = max(0.0, coefficients[1, 0] - self.probe_cycle_s)
        for part in without:
            coefficients[step_model.LinearGroupCosts.PARTS.index(part)] = 0.0
        return step_model.LinearGroupCosts(self.sizes, coefficients)

    def group_fit(self, name):
        """``codec_fit`` as a group of the codec pays it: its copies in its collective
        where ``copies_on_horovods_thread``."""
        fit = self.codec_fit(name)
        if not self.copies_on_horovods_thread(name):
            return fit
        coefficients = fit.coefficients.copy()
        coefficients[1] += coefficients[0] + coefficients[2]
        coefficients[0] = coefficients[2] = 0.0
        return step_model.LinearGroupCosts(self.sizes, coefficients)

    def codec_group_costs(self, name):
        """The codec's fit, under the encode and decode the profile's probe timed for
        its groups of several tensors (profiles recorded since it keeps them): one
        group as measured. Single tensors keep the fit: they are most of its points,
        so it is their summary, where their own timings carry the probe's per-group
        overhead (taken one by one they priced the transformer's layer-wise exchange
        up to 65% slow against 44% by the fit: docs/scaling.md, section 3). The
        collective stays the fit's: the network model replaces its transfer."""
        fit = self.group_fit(name)
        probed = self.codecs[name].get("probed")
        if not probed or not probed["bounds"] or self.copies_on_horovods_thread(name):
            return fit
        bounds = np.asarray(probed["bounds"], dtype=np.int64).reshape(-1, 2).tolist()
        return step_model.MeasuredGroupCosts(fit, {
            (lo, hi): (encode, decode) for (lo, hi), encode, decode
            in zip(bounds, probed["encode_s"], probed["decode_s"]) if hi - lo > 1},
            parts=("encode", "decode"))

    def wire(self, name):
        wire = self.codecs[name]["wire"]
        return network_model.WireBytes(self.sizes, wire["fixed_bytes"], wire["per_element_bytes"],
                                    wire.get("tensor_bytes"))

    def codec_costs(self, name, network):
        codec = self.codecs[name]
        kind = codec["collective_op"]
        return self._exchange(network_model.NetworkGroupCosts(
            self.codec_group_costs(name), self.wire(name), kind, network,
            calls=int(codec.get("collectives_per_group", 1)),
            decode_rows=kind == network_model.ALLGATHER, probe_workers=self.probe_workers,
            probe_link=self.probe_link))

    def _exchange(self, costs):
        return costs if self.overlap else network_model.SerializedExchange(costs)

    def collective_cpu(self, name, network):
        """(``host_cpu(lo, hi)``, seconds per pass) of the codec's collectives: the
        profile's ``collective_cpu``, its per-element share scaled to W workers,
        its fixed share paid once per pass of Horovod's thread, which fuses the
        collectives it takes up (per tensor, it predicted Horovod fp32 55% too
        slow on loopback; per group, MergeComp's layer-wise transformer up to
        64%: docs/scaling.md, section 3); (None, 0.0) for a profile without it."""
        cpu = self.codecs[name].get("collective_cpu")
        if cpu is None:
            return None, 0.0
        kind = self.codecs[name]["collective_op"]
        per_element = float(cpu["per_element_s"]) * network.host_scale(kind, self.probe_workers)
        cumulative = np.concatenate([[0.0], np.cumsum(self.sizes)])

        def host_cpu(lo, hi):
            return per_element * (cumulative[np.asarray(hi)] - cumulative[np.asarray(lo)])

        return host_cpu, float(cpu["fixed_s"])

    def model(self, costs, codec=None, network=None, tail=None, cycle=True):
        """The StepTimeModel of ``costs``. With ``codec`` (a profile codec's name)
        and ``network``: its collectives' per-pass costs too (the fixed
        collective cost, and on a CPU host the CPU work, that one pass of
        Horovod's thread pays once for all the collectives it takes up)."""
        host_cpu, cpu_per_pass, pass_fixed = None, 0.0, 0.0
        if codec is not None:
            host_cpu, cpu_per_pass = self.collective_cpu(codec, network)
            pass_fixed = float(self.codec_fit(codec).coefficients[1, 0])
        return step_model.StepTimeModel(self.ready, costs, self.tail if tail is None else tail,
                                        self.codec_on_compute, self.decodes_after_backprop,
                                        cycle_s=self.cycle_s if cycle else 0.0,
                                        host_cpu=host_cpu, pass_fixed_s=pass_fixed,
                                        host_cpu_per_pass=cpu_per_pass, steady_state=True)

    # ---- configs -------------------------------------------------------------
    def horovod(self, which, network):
        """(layout, seconds) of Horovod's per-tensor allreduce with tensor fusion."""
        name = self.profile["horovod"][which]
        # fp32: no cast, its copies as ``copies_on_horovods_thread`` says.
        fit = self.group_fit(name)
        wire = self.wire(name)
        tensor_bytes = wire(np.arange(self.num_tensors), np.arange(1, self.num_tensors + 1))
        costs = self._exchange(network_model.FusedGroupCosts(
            fit, wire, network_model.ALLREDUCE, network, self.probe_workers, self.probe_link))
        model = self.model(costs, name, network)
        # Which tensors a pass fuses depends on where the ticks fall, and that
        # on the step the fusion makes: a few rounds find both.
        phase, layouts = 0.0, []
        for _ in range(FUSION_ROUNDS):
            layout = grouping.fusion_splits(self.ready, tensor_bytes, self.cycle_s,
                                            self.fusion_bytes, phase)
            if layout in layouts:
                break
            layouts.append(layout)
            phase = model.cycle_phase(layout)
        return layout, model.step_time(layout)

    def codec_configs(self, name, network, search=True, plain_horovod_s=None):
        """{mode: (layout, seconds)} and the search's account for one codec;
        with ``plain_horovod_s`` (plain Horovod's step) also the per-group searches,
        whose (layout, seconds, group codecs) are in the modes of
        ``PER_GROUP_PLAIN_CODECS`` whose codecs the profile has."""
        costs = self.codec_costs(name, network)
        model = self.model(costs, name, network)
        n = self.num_tensors
        layerwise = tuple(range(1, n))
        results = {"layer-wise": (layerwise, model.step_time(layerwise)),
                   "one group": ((), model.step_time(()))}
        best = ((), results["one group"][1])
        for groups in range(2, min(EXHAUSTIVE_GROUPS, n) + 1):
            layout, seconds = step_model.exhaustive_best(model, groups)
            if layout is not None and seconds < best[1]:
                best = (layout, seconds)
        results["best <= 3"] = best
        account = None
        if search:
            layout, account = self._search(model, costs)
            results["searched"] = (layout, model.step_time(layout))
        if search and plain_horovod_s is not None:
            for mode, plain_codecs in PER_GROUP_PLAIN_CODECS.items():
                choices = tuple(c for c in plain_codecs if c != name)
                if not choices or any(c not in self.codecs for c in choices):
                    continue
                if mode != PER_GROUP and choices == PER_GROUP_PLAIN_CODECS[PER_GROUP]:
                    continue  # the same search as PER_GROUP's (fp16's own groups)
                results[mode] = self._search_per_group(name, network, model, costs,
                                                       plain_horovod_s, choices)
        return results, account

    def _search_per_group(self, name, network, model, costs, plain_horovod_s, plain_codecs):
        """(layout, seconds, group codecs or None) of the search with per-group
        codecs (``name`` or one of ``plain_codecs``) and the plain-Horovod
        sentinel, answered from the model; layout is ``PLAIN_HOROVOD`` when that
        is chosen."""
        codecs = (name,) + tuple(plain_codecs)
        costs_by_codec = [costs] + [self.codec_costs(c, network) for c in plain_codecs]
        ready, cycle = self.ready, self.cycle_s

        def step_time(layout, group_codecs):
            if layout == search_requests.PLAIN_HOROVOD:
                return plain_horovod_s
            if group_codecs is None:
                return model.step_time(tuple(layout))
            assignment = np.array([[codecs.index(c) for c in group_codecs]])
            mixed = self.model(step_model.AssignedCodecCosts(costs_by_codec, assignment),
                               name, network)
            return mixed.step_time(tuple(layout))

        def profile(splits):
            return search_requests.ProfileResult(model.step_time(tuple(splits)), ready)

        def probe(splits, codec):
            bounds = np.asarray((0,) + tuple(splits) + (self.num_tensors,))
            parts = costs_by_codec[codecs.index(codec)](bounds[:-1], bounds[1:])
            encode, collective, decode = (np.broadcast_to(np.asarray(p, dtype=np.float64),
                                                          (len(bounds) - 1,)) for p in parts)
            return np.stack([encode, collective + cycle, decode], axis=1)

        result = search_run.run_search(
            self.sizes.tolist(), profile, probe, step_time, max_groups=SEARCH_MAX_GROUPS,
            codec_on_compute=self.codec_on_compute,
            decodes_after_backprop=self.decodes_after_backprop, codecs=codecs,
            plain_horovod=True)
        return (result.splits, step_time(result.splits, result.group_codecs),
                result.group_codecs)

    def _search(self, model, costs):
        """The search core, unchanged, answered from the model: the profile is the
        one-group step with the profile's ready times; a probe times each group's
        parts alone (a real probe's collective waits a whole Horovod cycle, as
        the groups are serialized); a confirm round is the model's step time."""
        ready = self.ready
        cycle = self.cycle_s

        def profile(splits):
            return search_requests.ProfileResult(model.step_time(tuple(splits)), ready)

        def probe(splits):
            bounds = np.asarray((0,) + tuple(splits) + (self.num_tensors,))
            encode, collective, decode = (np.broadcast_to(np.asarray(p, dtype=np.float64),
                                                          (len(bounds) - 1,))
                                          for p in costs(bounds[:-1], bounds[1:]))
            return np.stack([encode, collective + cycle, decode], axis=1)

        def time_candidate(splits):
            return model.step_time(tuple(splits))

        result = search_run.run_search(
            self.sizes.tolist(), profile, probe, time_candidate, max_groups=SEARCH_MAX_GROUPS,
            codec_on_compute=self.codec_on_compute,
            decodes_after_backprop=self.decodes_after_backprop)
        algorithm = result.algorithm
        return tuple(result.splits), {
            "finalists": [list(l) for l in algorithm.finalist_layouts],
            "probed_groups": len(algorithm.probed), "requests": result.requests}

    def run_cell(self, workers, bandwidth, latency, codecs):
        """Every config on one network: {label: {...}}."""
        network = network_model.NetworkCosts(workers, bandwidth, latency)
        rows = {}
        for which, label in (("fp32", "horovod fp32"), ("fp16", "horovod fp16")):
            layout, seconds = self.horovod(which, network)
            rows[label] = {"step_s": seconds, "groups": len(layout) + 1, "splits": list(layout)}
        for name in codecs:
            results, account = self.codec_configs(
                name, network, plain_horovod_s=rows["horovod fp32"]["step_s"])
            for mode, (layout, seconds, *group_codecs) in results.items():
                if layout == search_requests.PLAIN_HOROVOD:
                    rows["%s %s" % (name, mode)] = {"step_s": seconds, "groups": None,
                                                   "splits": None, "plain_horovod": True}
                    continue
                # layer-wise's N - 1 cuts are implied by its group count
                rows["%s %s" % (name, mode)] = {
                    "step_s": seconds, "groups": len(layout) + 1,
                    "splits": None if len(layout) + 1 == self.num_tensors else list(layout)}
                if group_codecs:
                    rows["%s %s" % (name, mode)].update(
                        plain_horovod=False,
                        group_codecs=None if group_codecs[0] is None else list(group_codecs[0]))
            rows["%s searched" % name]["search"] = account
        for row in rows.values():
            row["scaling_factor"] = self.local_step / row["step_s"]
        return rows


def compressing_codecs(asked, in_profile):
    """The codecs to simulate: ``asked`` (default: all of the profile's) less "none" (the
    baseline every cell has); a codec the profile has no costs for is refused."""
    codecs = [c for c in (asked or in_profile) if c != "none"]
    unknown = [c for c in codecs if c not in in_profile]
    if unknown:
        raise ValueError("codec(s) %s not in the profile; it has %s"
                         % (", ".join(unknown), ", ".join(in_profile)))
    return codecs


def cell_latency_s(latency, network_latency):
    """A cell's one-way latency: the user's, else the network preset's, else the default."""
    if latency is not None:
        return latency
    return network_latency if network_latency is not None else DEFAULT_LATENCY_S


def simulate(profile, workers, bandwidths, latency=None, codecs=None, log=print, cycle_s=None):
    """{"cells": [...], ...}: every (bandwidth, workers) cell, each timed; ``cycle_s``:
    Horovod's cycle of the simulated runs (default: the profile's)."""
    simulation = Simulation(profile, cycle_s)
    parsed = [parse_bandwidth(b, profile.get("networks", {})) for b in bandwidths]
    codecs = compressing_codecs(codecs, simulation.codecs)
    cells = []
    for label, per_second, network_latency in parsed:
        cell_latency = cell_latency_s(latency, network_latency)
        for count in workers:
            started = time.perf_counter()
            rows = simulation.run_cell(count, per_second, cell_latency, codecs)
            seconds = time.perf_counter() - started
            cells.append({"bandwidth": label, "bandwidth_bytes_per_s": per_second,
                          "latency_s": cell_latency, "workers": count, "rows": rows,
                          "simulated_s": seconds})
            log("[simulate] %s, %d workers: %d configs in %.2f s" % (label, count, len(rows),
                                                                      seconds))
    return {"model": profile["model"], "source": profile["source"], "codecs": codecs,
            "local_step_s": simulation.local_step, "workers": list(workers),
            "bandwidths": [p[0] for p in parsed], "cells": cells,
            "search_max_groups": SEARCH_MAX_GROUPS, "exhaustive_groups": EXHAUSTIVE_GROUPS,
            "horovod_cycle_time_s": simulation.cycle_s}


# ---- the report -------------------------------------------------------------------------

def speedup(rows, codec, mode="searched"):
    return rows["%s layer-wise" % codec]["step_s"] / rows["%s %s" % (codec, mode)]["step_s"]


def _layout_text(row, n):
    if row["groups"] == 1:
        return "1"
    if row["groups"] == n:
        return "lw"
    return "%d %s" % (row["groups"], row["splits"])


def table(result):
    n = None
    lines = ["%s, %s; 1-worker step %.1f ms. Per cell: scaling factor (step ms). "
             "speed-up = layer-wise step / searched step; search vs best: searched step / "
             "exhaustive best of <= %d groups."
             % (result["model"], result["source"], 1e3 * result["local_step_s"],
                result["exhaustive_groups"])]
    for bandwidth in result["bandwidths"]:
        cells = [c for c in result["cells"] if c["bandwidth"] == bandwidth]
        lines.append("\n### %s (latency %s us per ring step)\n"
                     % (bandwidth, report.fmt(1e6 * cells[0]["latency_s"])))
        headings = ["config"] + ["%d workers" % c["workers"] for c in cells]
        labels = list(cells[0]["rows"])
        body = []
        for label in labels:
            body.append([label] + ["%s (%s)" % (report.fmt(c["rows"][label]["scaling_factor"], 2),
                                                report.fmt(1e3 * c["rows"][label]["step_s"]))
                                   for c in cells])
        lines.append(report.markdown_table(headings, body))
        lines.append("")
        summary = []
        for codec in result["codecs"]:
            if n is None:
                n = cells[0]["rows"]["%s layer-wise" % codec]["groups"]
            summary.append(
                [codec] + ["%s; %s; %s" % (
                    report.fmt(speedup(c["rows"], codec), 3),
                    _layout_text(c["rows"]["%s searched" % codec], n),
                    report.fmt(c["rows"]["%s searched" % codec]["step_s"]
                               / c["rows"]["%s best <= 3" % codec]["step_s"], 3))
                    for c in cells])
        lines.append(report.markdown_table(
            ["codec: speed-up; searched layout; search vs best"]
            + ["%d workers" % c["workers"] for c in cells], summary))
    lines.append("\nLayer-wise -> searched scaling factor (speed-up), fewest and most workers:\n")
    lines.append(gains_table(result))
    modes = per_group_modes(result)
    if modes:
        lines.append("\nPer-group codecs (%s) against Horovod fp32, fp16 and the single-codec "
                     "search: step ms, and its ratio to the best of those three:\n"
                     % ", ".join(modes))
        lines.append(per_group_table(result))
    for mode in modes:
        verdict = per_group_verdict(result, mode)
        lines.append("\n%s (plain codecs %s) within 1%% of the best of Horovod fp32, Horovod "
                     "fp16 and the single-codec search in %d of %d (cell, codec) pairs; worst "
                     "ratio %.3f; faster than the single-codec search in %d, slower in %d."
                     % (mode.capitalize(), "/".join(PER_GROUP_PLAIN_CODECS[mode]),
                        verdict["within_1pct"], verdict["count"], verdict["worst"],
                        verdict["faster_than_search"], verdict["slower_than_search"]))
    best = search_vs_best(result)
    lines.append("\nSearch vs exhaustive best of <= %d groups over %d (cell, codec) pairs: "
                 "median %.3f, worst %.3f, best %.3f; %d within 1%%, %d better (4 groups)."
                 % (result["exhaustive_groups"], best["count"], best["median"], best["max"],
                    best["min"], best["within_1pct"], best["better"]))
    timing = ", ".join("%s/%dw %.1f s" % (c["bandwidth"], c["workers"], c["simulated_s"])
                       for c in result["cells"])
    lines.append("\nSimulation time per cell: %s." % timing)
    return "\n".join(lines)


def gains_table(result, workers=None):
    """Per codec and bandwidth: layer-wise -> searched scaling factor (speed-up) at
    the fewest and the most workers simulated (or ``workers``)."""
    counts = sorted(set(result["workers"]))
    workers = workers or [counts[0], counts[-1]]
    headings = ["codec"]
    for bandwidth in result["bandwidths"]:
        headings += ["%s, %d w" % (bandwidth, w) for w in workers]
    cells = {(c["bandwidth"], c["workers"]): c["rows"] for c in result["cells"]}
    body = []
    for label in ("horovod fp32", "horovod fp16"):
        body.append([label] + ["%s" % scaling_text(cells[(b, w)][label]["scaling_factor"])
                               for b in result["bandwidths"] for w in workers])
    for codec in result["codecs"]:
        row = [codec]
        for bandwidth in result["bandwidths"]:
            for w in workers:
                rows = cells[(bandwidth, w)]
                row.append("%s -> %s (%sx)" % (
                    scaling_text(rows["%s layer-wise" % codec]["scaling_factor"]),
                    scaling_text(rows["%s searched" % codec]["scaling_factor"]),
                    report.fmt(speedup(rows, codec), 3)))
        body.append(row)
    return report.markdown_table(headings, body)


def _per_group_text(row, n, codec):
    if row.get("plain_horovod"):
        return "plain Horovod"
    text = _layout_text(row, n)
    codecs = row.get("group_codecs")
    if codecs:
        others = [c for c in codecs if c != codec]
        text += " (%d of %d plain%s)" % (
            len(others), len(codecs),
            "".join(", %d %s" % (others.count(c), c) for c in sorted(set(others))
                    if c != PLAIN_CODEC))
    return text


def _best_baseline(rows, codec):
    """The best of Horovod fp32, Horovod fp16 and the single-codec search."""
    return min(rows["horovod fp32"]["step_s"], rows["horovod fp16"]["step_s"],
               rows["%s searched" % codec]["step_s"])


def per_group_modes(result):
    """The per-group modes the result has rows for."""
    rows = result["cells"][0]["rows"]
    return [mode for mode in PER_GROUP_PLAIN_CODECS
            if any("%s %s" % (codec, mode) in rows for codec in result["codecs"])]


def per_group_table(result):
    """Per (bandwidth, workers) and codec: the per-group searches' steps and
    layouts beside Horovod fp32/fp16 and the single-codec search."""
    modes = per_group_modes(result)
    body = []
    for cell in result["cells"]:
        rows = cell["rows"]
        for codec in result["codecs"]:
            if not any("%s %s" % (codec, mode) in rows for mode in modes):
                continue
            n = rows["%s layer-wise" % codec]["groups"]
            best = _best_baseline(rows, codec)
            line = ["%s, %d w" % (cell["bandwidth"], cell["workers"]), codec,
                    report.fmt(1e3 * rows["horovod fp32"]["step_s"]),
                    report.fmt(1e3 * rows["horovod fp16"]["step_s"]),
                    report.fmt(1e3 * rows["%s searched" % codec]["step_s"])]
            for mode in modes:
                row = rows.get("%s %s" % (codec, mode))
                line += (["-"] * 3 if row is None else
                         [report.fmt(1e3 * row["step_s"]), _per_group_text(row, n, codec),
                          report.fmt(row["step_s"] / best, 3)])
            body.append(line)
    headings = ["cell", "codec", "horovod fp32 ms", "horovod fp16 ms", "searched ms"]
    for mode in modes:
        label = mode[len("searched "):]
        headings += ["%s ms" % label, "%s layout" % label, "%s / best" % label]
    return report.markdown_table(headings, body)


def per_group_verdict(result, mode=PER_GROUP):
    """How ``mode``'s searched step compares with the best of Horovod fp32, fp16
    and the single-codec search, over the (cell, codec) pairs it ran."""
    ratios, faster, slower = [], 0, 0
    for cell in result["cells"]:
        rows = cell["rows"]
        for codec in result["codecs"]:
            per_group = rows.get("%s %s" % (codec, mode))
            if per_group is None:
                continue
            searched = rows["%s searched" % codec]["step_s"]
            ratios.append(per_group["step_s"] / _best_baseline(rows, codec))
            faster += per_group["step_s"] < searched * (1 - 1e-9)
            slower += per_group["step_s"] > searched * (1 + 1e-9)
    return {"count": len(ratios), "within_1pct": sum(r <= 1.01 for r in ratios),
            "worst": max(ratios) if ratios else float("nan"),
            "faster_than_search": faster, "slower_than_search": slower}


def search_vs_best(result):
    """Searched step / exhaustive best of <= 3 groups over every (cell, codec)."""
    ratios = [c["rows"]["%s searched" % codec]["step_s"] / c["rows"]["%s best <= 3" % codec]["step_s"]
              for c in result["cells"] for codec in result["codecs"]]
    return {"median": float(np.median(ratios)), "max": float(max(ratios)),
            "min": float(min(ratios)), "count": len(ratios),
            "within_1pct": sum(r <= 1.01 for r in ratios),
            "better": sum(r < 1 - 1e-9 for r in ratios)}


def chart(result, path):
    """Per bandwidth: the searched config's scaling factor per codec (and Horovod's),
    and the searched config's speed-up over layer-wise, against worker count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bandwidths = result["bandwidths"]
    figure, axes = plt.subplots(2, len(bandwidths), figsize=(4.2 * len(bandwidths), 7.5),
                                squeeze=False, sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for column, bandwidth in enumerate(bandwidths):
        cells = [c for c in result["cells"] if c["bandwidth"] == bandwidth]
        workers = [c["workers"] for c in cells]
        top, bottom = axes[0][column], axes[1][column]
        for style, label in (("k--", "horovod fp32"), ("k:", "horovod fp16")):
            top.plot(workers, [c["rows"][label]["scaling_factor"] for c in cells], style,
                     label=label)
        for index, codec in enumerate(result["codecs"]):
            color = colors[index % len(colors)]
            # past the colour cycle, another marker and line style tell codecs apart
            style = ("-o", "--s", ":^")[(index // len(colors)) % 3]
            top.plot(workers, [c["rows"]["%s searched" % codec]["scaling_factor"] for c in cells],
                     style, color=color, markersize=3, label=codec)
            bottom.plot(workers, [speedup(c["rows"], codec) for c in cells], style, color=color,
                        markersize=3, label=codec)
        for axis in (top, bottom):
            axis.set_xscale("log", base=2)
            axis.grid(True, alpha=0.3)
        top.set_title("%s, %s" % (result["model"], bandwidth))
        top.set_ylabel("scaling factor (MergeComp searched)")
        bottom.set_ylabel("speed-up over layer-wise")
        bottom.set_xlabel("workers")
        bottom.axhline(1.0, color="grey", linewidth=0.8)
    axes[0][-1].legend(fontsize=7, loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def write(result, out_dir, name="simulate"):
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, name + ext) for ext in (".md", ".json", ".png")]
    with open(paths[0], "w") as f:
        f.write(table(result) + "\n")
    with open(paths[1], "w") as f:
        json.dump(result, f, indent=1)
    chart(result, paths[2])
    return paths


def check_workers(workers):
    if not workers or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in workers):
        raise ValueError("workers must be integers >= 1, got %r" % (workers,))
    return workers


def scaling_text(value):
    return "-" if value is None or math.isnan(value) else "%.0f%%" % (100 * value)
