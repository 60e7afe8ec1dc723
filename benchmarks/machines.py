"""Machines with several ranks: the flat and the two-level reduce, simulated.

    python -m benchmarks.machines --profile P.json --machines 2,4,8,16,32
        --ranks-per-machine 8 --intra nvlink4 --bandwidth 10gbit,25gbit,100gbit
        [--latency 25us] [--codecs ...] [--out DIR --name NAME]

A cluster of M machines of L ranks each: inside a machine the ranks are joined
by a fast link (``--intra``: a preset of ``INTRA_PRESETS`` or a rate), between
machines by one network link per machine (``--bandwidth``, ``--latency``),
which the machine's L ranks share. Every collective is a ring:

- **flat**: one ring over all W = M * L ranks, ordered by machine, so each
  machine's link carries one flow each way and every ring step is bound by the
  network: what ``simulate`` prices on W workers (``network_model.NetworkCosts``
  at the network's rate). An allgather codec's rank receives W - 1 payloads.
- **two-level** (``TwoLevelGroupCosts``): reduce-scatter the group inside the
  machine (float32, or float16 with ``intra="fp16"``), each rank compresses its
  shard (1/L of the group: its error feedback is per shard) and exchanges it
  with the M - 1 ranks of the same local rank by the codec's own collective
  (the L exchanges of a machine share its link: each at 1/L of its rate), decodes
  the M payloads of its shard and allgathers the decoded shard inside the machine.
  With one rank per machine, or one machine, it is the flat reduce.
- **Horovod's hierarchical allreduce** (``HierarchicalNetwork``): Horovod's fused
  per-tensor allreduce done as reduce-scatter inside, allreduce of the shard
  across, allgather inside (HOROVOD_HIERARCHICAL_ALLREDUCE), fp32 and fp16.

Per codec, three searches, each the project's search core answered from the
model as ``simulate`` answers it, with per-group codecs and plain Horovod (flat
fp32) as a sentinel: ``flat`` (each group the codec, ``none`` or ``fp16``, flat:
``simulate``'s ``searched per-group +fp16``), ``two-level`` (the same codecs,
each two-level) and ``searched`` (level + partition + per-group codec: each
group any of the six). The step model keeps three phases per group: a
two-level group's encode (its shard's) is charged when the group is ready,
its three collectives (reduce-scatter, the exchange, allgather) as its
collective, its decode after them: the order inside a group is simplified,
the work is not.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

from benchmarks import network_model, report, simulate
from tf_mergecomp.search import requests as search_requests
from tf_mergecomp.search import run as search_run
from tf_mergecomp.search import step_model

ALLREDUCE = network_model.ALLREDUCE
ALLGATHER = network_model.ALLGATHER
TWO_LEVEL = "@2"  # a codec's two-level variant: "efsignsgd@2"
PLAIN = ("none", "fp16")
# Codecs whose two-level groups count every rank's vote (the library's
# ``Compressor.votes_per_rank``, tf_mergecomp/hierarchical.py's reduce_group_by_votes).
VOTING_CODECS = ("signsgd", "signum")
DEFAULT_MACHINES = (2, 4, 8, 16, 32)
DEFAULT_RANKS_PER_MACHINE = 8
DEFAULT_BANDWIDTHS = ("10gbit", "25gbit", "100gbit")
LINK_EFFICIENCY = 0.8  # as benchmarks/paper_profile.py: what NCCL's ring reaches of a link
INTRA_LATENCY_S = 5e-6  # per ring step inside a machine (paper_profile.py, note [4])
# Each rank's rate each way inside a machine: the link's published rate per
# direction times LINK_EFFICIENCY (not measured).
INTRA_PRESETS = {
    "pcie3": (15.75e9 * LINK_EFFICIENCY, INTRA_LATENCY_S,
              "PCIe 3.0 x16, 15.75 GB/s per direction (the MergeComp paper's V100 setting)"),
    "pcie5": (63.0e9 * LINK_EFFICIENCY, INTRA_LATENCY_S,
              "PCIe 5.0 x16, 63 GB/s per direction (an H200 NVL card without its bridge)"),
    "nvlink4": (450e9 * LINK_EFFICIENCY, INTRA_LATENCY_S,
                "NVLink 4 through NVSwitch, 450 GB/s per direction per GPU (HGX H100/H200)"),
}
LABELS = ("flat", "two-level", "searched")
HOROVOD = ("horovod fp32", "horovod fp16", "horovod hierarchical fp32",
           "horovod hierarchical fp16")
WITHIN = 1.01


def parse_intra(text):
    """(label, bytes per second, latency) of a preset name or a rate as
    ``simulate.parse_bandwidth`` reads it (latency then INTRA_LATENCY_S)."""
    if text in INTRA_PRESETS:
        rate, latency, _ = INTRA_PRESETS[text]
        return text, rate, latency
    try:
        label, rate, _ = simulate.parse_bandwidth(text)
    except ValueError:
        raise ValueError("intra-machine link %r: expected a preset (%s) or a rate (12.5GB/s, "
                         "400gbit)" % (text, ", ".join(INTRA_PRESETS))) from None
    return label, rate, INTRA_LATENCY_S


class Machines:
    """``machines`` machines of ``per_machine`` ranks: the rings the reduces use."""

    def __init__(self, machines, per_machine, intra_bandwidth, intra_latency, bandwidth, latency):
        for name, value in (("machines", machines), ("per_machine", per_machine)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError("%s must be an integer >= 1, got %r" % (name, value))
        self.machines = int(machines)
        self.per_machine = int(per_machine)
        self.workers = self.machines * self.per_machine
        self.intra = network_model.NetworkCosts(self.per_machine, intra_bandwidth, intra_latency)
        self.network = network_model.NetworkCosts(self.machines, bandwidth, latency)
        # the same-local-rank ranks of every machine, L such exchanges sharing each link
        self.cross = network_model.NetworkCosts(self.machines, bandwidth / self.per_machine,
                                                latency)
        # one ring over every rank: on one machine the intra link, else bound by the network
        self.flat = (self.intra if self.machines == 1 else
                     network_model.NetworkCosts(self.workers, bandwidth, latency))

    @property
    def two_level(self):
        """Whether a two-level reduce differs from the flat one."""
        return self.machines > 1 and self.per_machine > 1

    def intra_phase(self, nbytes):
        """A reduce-scatter (or an allgather of shards) of ``nbytes`` per rank inside
        the machine: (L - 1) / L * nbytes / rate + (L - 1) latencies."""
        return 0.5 * self.intra.collective(ALLREDUCE, nbytes)


class HierarchicalNetwork:
    """Horovod's hierarchical allreduce as a network for ``FusedGroupCosts``: reduce-
    scatter inside the machine, allreduce of each shard across machines (the L
    shards' allreduces sharing the link), allgather inside."""

    def __init__(self, machines):
        self.machines = machines
        self.workers = machines.workers

    def collective(self, kind, nbytes):
        if kind != ALLREDUCE:
            raise ValueError("Horovod's hierarchical reduce is an allreduce, not %r" % kind)
        m = self.machines
        nbytes = np.asarray(nbytes, dtype=np.float64)
        return (2 * m.intra_phase(nbytes)
                + m.cross.collective(ALLREDUCE, nbytes / m.per_machine))

    def host_scale(self, kind, probe_workers):
        return self.machines.flat.host_scale(kind, probe_workers)


class TwoLevelGroupCosts:
    """A group's (encode, collective, decode) seconds reduced in two levels.

    ``fit``: the codec's LinearGroupCosts on one rank; its shard (1/L of each
    tensor) costs the fit's fixed and per-tensor terms and 1/L of its per-element
    term. ``wire``: the codec's WireBytes for the whole group, a shard sends
    its fixed bytes and 1/L of the rest. The exchange is the codec's collective
    among the M ranks of one local rank (``NetworkGroupCosts`` on
    ``machines.cross``: an allgather's decode reads M rows of the shard). The
    reduce-scatter and the allgather inside the machine move the whole group's
    elements at ``intra_bytes`` each (4: float32, 2: float16) and add to the
    collective. ``cast``: the float16 cast's LinearGroupCosts, whose encode and
    decode over the whole group are added (the group is cast before the
    reduce-scatter and back after the allgather). ``whole_group_codec``: the
    codec's own encode and decode are over the whole group, not the shard
    (fp16: its cast is the one before the reduce-scatter, the shard crosses as
    it is). ``votes``: a voting codec's two levels (``VOTING_CODECS``): every rank
    encodes the whole group (its L shards), an alltoall of the payloads inside the
    machine replaces the reduce-scatter, each rank sends L shards' payloads (the
    whole group's bytes) across and decodes M * L rows of its shard (M of the whole
    group's); with L >= 3 it counts the L rows of its shard (a decode's per-row work
    each) and sends the counts, ceil(log2(L + 1)) times the shard's payload, and decodes
    M rows of counts. With one rank per machine it is ``NetworkGroupCosts`` over the machines,
    the flat reduce (``MachineSimulation.costs`` then uses the flat one).
    """

    def __init__(self, fit, wire, kind, machines, calls=1, decode_rows=False, probe_workers=1,
                 probe_link=None, intra_bytes=4.0, cast=None, whole_group_codec=False,
                 votes=False):
        share = 1.0 / machines.per_machine
        self.fit = fit
        self.machines = machines
        self.sizes = np.asarray(wire.sizes, dtype=np.float64)
        self.cumulative = np.concatenate([[0.0], np.cumsum(self.sizes)])
        shard_fit = step_model.LinearGroupCosts(self.sizes * share, fit.coefficients)
        if whole_group_codec:
            coefficients = np.array(fit.coefficients, dtype=np.float64)
            coefficients[0] = coefficients[2] = 0.0
            shard_fit = step_model.LinearGroupCosts(self.sizes * share, coefficients)
        tensor_bytes = wire.tensor_cumulative[1:] - wire.tensor_cumulative[:-1]
        shard_wire = network_model.WireBytes(self.sizes * share, wire.fixed, wire.per_element,
                                             tensor_bytes * share)
        self.votes = bool(votes)
        self.wire = wire
        count_bits = int(machines.per_machine).bit_length()
        self.counts = self.votes and count_bits < machines.per_machine
        self.shard_fit, self.probe_workers = shard_fit, max(1, int(probe_workers))
        if self.counts:  # the machine's counts of its shard, count_bits per vote bit
            exchange_fit, exchange_wire = shard_fit, network_model.WireBytes(
                self.sizes * share, wire.fixed, wire.per_element * count_bits,
                tensor_bytes * share)
        elif self.votes:  # the exchange carries (and decodes) the whole group's L shards
            exchange_fit, exchange_wire = fit, wire
        else:
            exchange_fit, exchange_wire = shard_fit, shard_wire
        self.exchange = network_model.NetworkGroupCosts(
            exchange_fit, exchange_wire, kind, machines.cross, calls=calls,
            decode_rows=decode_rows, probe_workers=probe_workers, probe_link=probe_link)
        self.intra_bytes = float(intra_bytes)
        self.cast = cast
        self.whole_group_codec = bool(whole_group_codec)

    def __call__(self, lo, hi):
        encode, collective, decode = (np.asarray(p, dtype=np.float64)
                                      for p in self.exchange(lo, hi))
        lo, hi = np.asarray(lo), np.asarray(hi)
        elements = self.cumulative[hi] - self.cumulative[lo]
        gather = self.machines.intra_phase(self.intra_bytes * elements)
        scatter = self.machines.intra_phase(self.wire(lo, hi)) if self.votes else gather
        collective = collective + scatter + gather
        if self.counts:  # the whole group encoded, then L rows of the shard counted
            per_row = network_model.per_element_part(self.shard_fit, 2, lo, hi)
            encode = (self.fit(lo, hi)[0]
                      + self.machines.per_machine * per_row / self.probe_workers)
        if self.whole_group_codec:
            whole = self.fit(lo, hi)
            encode, decode = encode + whole[0], decode + whole[2]
        if self.cast is not None:
            cast = self.cast(lo, hi)
            # votes: nothing cast before the alltoall, the decoded shard for the allgather
            encode, decode = encode + (0.0 if self.votes else cast[0]), decode + cast[2]
        return encode, collective, decode


class MachineSimulation:
    """A profile's ``simulate.Simulation`` on machines of several ranks."""

    def __init__(self, profile, cycle_s=None, intra_dtype="fp32"):
        if intra_dtype not in ("fp32", "fp16"):
            raise ValueError("intra_dtype must be fp32 or fp16, got %r" % (intra_dtype,))
        self.simulation = simulate.Simulation(profile, cycle_s)
        self.intra_dtype = intra_dtype

    @property
    def codecs(self):
        return self.simulation.codecs

    def costs(self, variant, machines):
        """The cost function of ``variant``: a codec's name (flat) or name + TWO_LEVEL."""
        s = self.simulation
        name, two_level = _split(variant)
        if not two_level or not machines.two_level:
            return s.codec_costs(name, machines.flat)
        codec = s.codecs[name]
        kind = codec["collective_op"]
        fp16 = name == "fp16" or self.intra_dtype == "fp16"
        cast = None
        if fp16 and name != "fp16":
            if "fp16" not in s.codecs:
                raise ValueError("a float16 reduce inside the machine needs the profile's fp16")
            cast = s.codec_fit("fp16", without=("collective",))
        costs = TwoLevelGroupCosts(
            s.group_fit(name), s.wire(name), kind, machines,
            calls=int(codec.get("collectives_per_group", 1)), decode_rows=kind == ALLGATHER,
            probe_workers=s.probe_workers, probe_link=s.probe_link,
            intra_bytes=2.0 if fp16 else 4.0, cast=cast, whole_group_codec=name == "fp16",
            votes=name in VOTING_CODECS)
        return s._exchange(costs)

    def horovod(self, machines):
        """{label: (layout, seconds)} of Horovod's fp32 and fp16, flat and hierarchical."""
        s = self.simulation
        hierarchical = HierarchicalNetwork(machines) if machines.two_level else machines.flat
        return {"horovod fp32": s.horovod("fp32", machines.flat),
                "horovod fp16": s.horovod("fp16", machines.flat),
                "horovod hierarchical fp32": s.horovod("fp32", hierarchical),
                "horovod hierarchical fp16": s.horovod("fp16", hierarchical)}

    def variants(self, name, label):
        """The codecs a group may take in search ``label``, the compressor's first."""
        plain = [c for c in PLAIN if c in self.codecs and c != name]
        flat = [name] + plain
        two = [c + TWO_LEVEL for c in flat]
        if label == "flat":
            return tuple(flat)
        if label == "two-level":
            return tuple(two)
        return tuple([name, name + TWO_LEVEL] + [v for c in plain for v in (c, c + TWO_LEVEL)])

    def fusion(self, variants, machines):
        """The search's ``fusion`` option as the library's driver sets it: Horovod's
        cycle and fusion buffer where a group may go two-level, else None."""
        if machines.two_level and any(_split(v)[1] for v in variants):
            return self.simulation.cycle_s, self.simulation.fusion_bytes
        return None

    def search(self, variants, machines, plain_horovod_s):
        """(layout, seconds, group codecs or None, requests) of the search with
        per-group ``variants`` and the plain-Horovod sentinel, answered from the model."""
        s = self.simulation
        name = _split(variants[0])[0]
        costs_by_codec = [self.costs(v, machines) for v in variants]
        network = machines.flat
        uniform = s.model(costs_by_codec[0], name, network)
        ready, cycle, n = s.ready, s.cycle_s, s.num_tensors

        def step_time(layout, group_codecs):
            if layout == search_requests.PLAIN_HOROVOD:
                return plain_horovod_s
            if group_codecs is None:
                return uniform.step_time(tuple(layout))
            assignment = np.array([[variants.index(c) for c in group_codecs]])
            mixed = s.model(step_model.AssignedCodecCosts(costs_by_codec, assignment), name,
                            network)
            return mixed.step_time(tuple(layout))

        def profile(splits):
            return search_requests.ProfileResult(uniform.step_time(tuple(splits)), ready)

        def probe(splits, codec):
            bounds = np.asarray((0,) + tuple(splits) + (n,))
            parts = costs_by_codec[variants.index(codec)](bounds[:-1], bounds[1:])
            encode, collective, decode = (np.broadcast_to(np.asarray(p, dtype=np.float64),
                                                          (len(bounds) - 1,)) for p in parts)
            return np.stack([encode, collective + cycle, decode], axis=1)

        result = search_run.run_search(
            s.sizes.tolist(), profile, probe, step_time, max_groups=simulate.SEARCH_MAX_GROUPS,
            codec_on_compute=s.codec_on_compute,
            decodes_after_backprop=s.decodes_after_backprop, codecs=tuple(variants),
            plain_horovod=True, fusion=self.fusion(variants, machines))
        return (result.splits, step_time(result.splits, result.group_codecs),
                result.group_codecs, result.requests)

    def run_cell(self, machines, codecs):
        """{label: row} of every config on ``machines``."""
        rows = {}
        for label, (layout, seconds) in self.horovod(machines).items():
            rows[label] = {"step_s": seconds, "groups": len(layout) + 1}
        plain_s = rows["horovod fp32"]["step_s"]
        for name in codecs:
            for label in LABELS:
                layout, seconds, group_codecs, requests = self.search(
                    self.variants(name, label), machines, plain_s)
                key = "%s %s" % (name, label)
                if layout == search_requests.PLAIN_HOROVOD:
                    rows[key] = {"step_s": seconds, "plain_horovod": True, "groups": None,
                                 "splits": None, "group_codecs": None, "traced": requests["traced"]}
                else:
                    rows[key] = {"step_s": seconds, "plain_horovod": False,
                                 "groups": len(layout) + 1, "splits": list(layout),
                                 "group_codecs": None if group_codecs is None
                                 else list(group_codecs), "traced": requests["traced"]}
        local = self.simulation.local_step
        for row in rows.values():
            row["scaling_factor"] = local / row["step_s"]
        return rows


def _split(variant):
    if variant.endswith(TWO_LEVEL):
        return variant[:-len(TWO_LEVEL)], True
    return variant, False


def best_of_others(rows, codec):
    """(seconds, label) of the best of flat searched, two-level searched and
    Horovod's four configs."""
    candidates = [(rows["%s %s" % (codec, l)]["step_s"], "%s %s" % (codec, l))
                  for l in ("flat", "two-level")]
    candidates += [(rows[l]["step_s"], l) for l in HOROVOD]
    return min(candidates)


def simulate_machines(profile, machines, per_machine, bandwidths, intra="nvlink4", latency=None,
                      codecs=None, intra_dtype="fp32", cycle_s=None, log=print):
    """{"cells": [...], ...}: every (bandwidth, machines) cell."""
    simulation = MachineSimulation(profile, cycle_s, intra_dtype)
    intra_label, intra_rate, intra_latency = parse_intra(intra)
    parsed = [simulate.parse_bandwidth(b, profile.get("networks", {})) for b in bandwidths]
    codecs = simulate.compressing_codecs(codecs, simulation.codecs)
    cells = []
    for label, rate, network_latency in parsed:
        cell_latency = simulate.cell_latency_s(latency, network_latency)
        for count in machines:
            started = time.perf_counter()
            rows = simulation.run_cell(
                Machines(count, per_machine, intra_rate, intra_latency, rate, cell_latency),
                codecs)
            seconds = time.perf_counter() - started
            cells.append({"bandwidth": label, "bandwidth_bytes_per_s": rate,
                          "latency_s": cell_latency, "machines": count,
                          "workers": count * per_machine, "rows": rows, "simulated_s": seconds})
            log("[machines] %s, %d x %d: %d configs in %.1f s"
                % (label, count, per_machine, len(rows), seconds))
    return {"model": profile["model"], "source": profile["source"], "codecs": codecs,
            "local_step_s": simulation.simulation.local_step, "machines": list(machines),
            "ranks_per_machine": per_machine, "intra": intra_label,
            "intra_bytes_per_s": intra_rate, "intra_latency_s": intra_latency,
            "intra_dtype": intra_dtype, "bandwidths": [p[0] for p in parsed], "cells": cells,
            "search_max_groups": simulate.SEARCH_MAX_GROUPS,
            "horovod_cycle_time_s": simulation.simulation.cycle_s}


# ---- the report -------------------------------------------------------------------------

def verdict(result):
    """Per (cell, codec): the searched step over the best of the others; the count
    within 1%, the worst, and where two-level (searched) beats flat."""
    pairs = []
    for cell in result["cells"]:
        rows = cell["rows"]
        for codec in result["codecs"]:
            best, best_label = best_of_others(rows, codec)
            flat = rows["%s flat" % codec]["step_s"]
            pairs.append({"bandwidth": cell["bandwidth"], "machines": cell["machines"],
                          "codec": codec, "ratio": rows["%s searched" % codec]["step_s"] / best,
                          "best": best_label,
                          "gain_over_flat": flat / rows["%s searched" % codec]["step_s"]})
    ratios = [p["ratio"] for p in pairs]
    return {"pairs": pairs, "count": len(pairs), "within_1pct": sum(r <= WITHIN for r in ratios),
            "worst": max(ratios), "missed": [p for p in pairs if p["ratio"] > WITHIN]}


def _group_text(row, codec):
    if row.get("plain_horovod"):
        return "plain Horovod"
    codecs = row.get("group_codecs")
    if not codecs:
        codecs = [codec] * row["groups"]
    short = []
    for c in codecs:
        name, two = _split(c)
        short.append(("=" if name == codec else name) + ("@2" if two else ""))
    return "%d: %s" % (row["groups"], " ".join(short))


def table(result):
    lines = ["%s, %s; 1-rank step %.1f ms; %d ranks per machine, inside: %s (%.0f GB/s each "
             "way, %s us per ring step, reduce %s); between machines: one link per machine. "
             "Per cell: step ms (scaling factor)."
             % (result["model"], result["source"], 1e3 * result["local_step_s"],
                result["ranks_per_machine"], result["intra"], result["intra_bytes_per_s"] / 1e9,
                report.fmt(1e6 * result["intra_latency_s"]), result["intra_dtype"])]
    for bandwidth in result["bandwidths"]:
        cells = [c for c in result["cells"] if c["bandwidth"] == bandwidth]
        lines.append("\n### %s between machines (latency %s us per ring step)\n"
                     % (bandwidth, report.fmt(1e6 * cells[0]["latency_s"])))
        headings = ["config"] + ["%d x %d" % (c["machines"], result["ranks_per_machine"])
                                 for c in cells]
        body = [[label] + ["%s (%s)" % (report.fmt(1e3 * c["rows"][label]["step_s"]),
                                        simulate.scaling_text(c["rows"][label]["scaling_factor"]))
                           for c in cells] for label in HOROVOD]
        for codec in result["codecs"]:
            for label in LABELS:
                key = "%s %s" % (codec, label)
                body.append([key] + ["%s (%s)" % (report.fmt(1e3 * c["rows"][key]["step_s"]),
                                                  simulate.scaling_text(
                                                      c["rows"][key]["scaling_factor"]))
                                     for c in cells])
        lines.append(report.markdown_table(headings, body))
        lines.append("\nSearched choice (groups: codec per group, `=` the codec, `@2` "
                     "two-level) and searched / best of the others:\n")
        body = []
        for codec in result["codecs"]:
            line = [codec]
            for c in cells:
                best, _ = best_of_others(c["rows"], codec)
                row = c["rows"]["%s searched" % codec]
                line.append("%s; %s" % (_group_text(row, codec),
                                        report.fmt(row["step_s"] / best, 3)))
            body.append(line)
        lines.append(report.markdown_table(headings[:1] + headings[1:], body)
                     .replace("| config |", "| codec |", 1))
    lines.append("\n" + gains_text(result))
    check = verdict(result)
    lines.append("\nSearched (level + partition + per-group codec) within 1%% of the best of "
                 "flat searched, two-level searched, Horovod fp32/fp16 and Horovod hierarchical "
                 "fp32/fp16 in %d of %d (cell, codec) pairs; worst ratio %.4f%s."
                 % (check["within_1pct"], check["count"], check["worst"],
                    "".join("; missed: %s %d machines %s (%.3f, best %s)"
                            % (p["bandwidth"], p["machines"], p["codec"], p["ratio"], p["best"])
                            for p in check["missed"])))
    lines.append("\nSimulation time: %.0f s over %d cells."
                 % (sum(c["simulated_s"] for c in result["cells"]), len(result["cells"])))
    return "\n".join(lines)


def gains_text(result):
    """Per codec and bandwidth: flat searched step / searched step at each machine
    count (> 1: the level choice gains)."""
    headings = ["codec: flat / searched"]
    keys = []
    for bandwidth in result["bandwidths"]:
        for count in result["machines"]:
            headings.append("%s %dm" % (bandwidth.replace("gbit", "G"), count))
            keys.append((bandwidth, count))
    cells = {(c["bandwidth"], c["machines"]): c["rows"] for c in result["cells"]}
    body = []
    for codec in result["codecs"]:
        body.append([codec] + [report.fmt(cells[k]["%s flat" % codec]["step_s"]
                                          / cells[k]["%s searched" % codec]["step_s"], 3)
                               for k in keys])
    body.append(["horovod fp32 / hierarchical"] + [
        report.fmt(cells[k]["horovod fp32"]["step_s"]
                   / cells[k]["horovod hierarchical fp32"]["step_s"], 3) for k in keys])
    return "Step of the flat search over the searched step (level chosen):\n\n" + \
        report.markdown_table(headings, body)


def chart(result, path):
    """Per bandwidth: scaling factor against machines, flat searched and searched per
    codec, Horovod flat and hierarchical."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bandwidths = result["bandwidths"]
    figure, axes = plt.subplots(1, len(bandwidths), figsize=(4.6 * len(bandwidths), 4.4),
                                squeeze=False, sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for column, bandwidth in enumerate(bandwidths):
        axis = axes[0][column]
        cells = [c for c in result["cells"] if c["bandwidth"] == bandwidth]
        x = [c["machines"] for c in cells]
        for style, label in (("k--", "horovod fp32"), ("k-", "horovod hierarchical fp32")):
            axis.plot(x, [c["rows"][label]["scaling_factor"] for c in cells], style, label=label)
        for index, codec in enumerate(result["codecs"]):
            color = colors[index % len(colors)]
            axis.plot(x, [c["rows"]["%s searched" % codec]["scaling_factor"] for c in cells],
                      "-o", color=color, markersize=3, label="%s searched" % codec)
            axis.plot(x, [c["rows"]["%s flat" % codec]["scaling_factor"] for c in cells],
                      ":", color=color, label="%s flat" % codec)
        axis.set_xscale("log", base=2)
        axis.grid(True, alpha=0.3)
        axis.set_title("%s, %s between machines, %d GPUs per machine (%s)"
                       % (result["model"], bandwidth, result["ranks_per_machine"],
                          result["intra"]), fontsize=8)
        axis.set_xlabel("machines")
    axes[0][0].set_ylabel("scaling factor (solid: searched, dotted: flat)")
    axes[0][-1].legend(fontsize=5, loc="best", ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def write(result, out_dir, name):
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, name + ext) for ext in (".md", ".json", ".png")]
    with open(paths[0], "w") as f:
        f.write(table(result) + "\n")
    with open(paths[1], "w") as f:
        json.dump(result, f, indent=1)
    chart(result, paths[2])
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True)
    parser.add_argument("--machines", default=",".join(map(str, DEFAULT_MACHINES)),
                        help="comma-separated machine counts (default 2,4,8,16,32)")
    parser.add_argument("--ranks-per-machine", type=int, default=DEFAULT_RANKS_PER_MACHINE)
    parser.add_argument("--intra", default="nvlink4",
                        help="the link inside a machine: %s, or a rate (default nvlink4)"
                             % ", ".join(INTRA_PRESETS))
    parser.add_argument("--intra-dtype", choices=("fp32", "fp16"), default="fp32",
                        help="what a two-level codec group reduces inside the machine")
    parser.add_argument("--bandwidth", default=",".join(DEFAULT_BANDWIDTHS),
                        help="comma-separated rates between machines (default 10gbit,25gbit,"
                             "100gbit)")
    parser.add_argument("--latency", default=None, help="per ring step between machines "
                                                        "(default 25us)")
    parser.add_argument("--codecs", default=None, help="comma-separated (default: all)")
    parser.add_argument("--cycle-ms", type=float, default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--name", default="machines")
    args = parser.parse_args(argv)
    from benchmarks import profile as profile_module

    started = time.perf_counter()
    try:
        machines = [int(m) for m in args.machines.split(",") if m]
        if not machines or any(m < 1 for m in machines) or args.ranks_per_machine < 1:
            raise ValueError("machines and --ranks-per-machine must be integers >= 1")
        result = simulate_machines(
            profile_module.load(args.profile), machines, args.ranks_per_machine,
            [b for b in args.bandwidth.split(",") if b], intra=args.intra,
            latency=None if args.latency is None else simulate.parse_latency(args.latency),
            codecs=None if args.codecs is None else [c for c in args.codecs.split(",") if c],
            intra_dtype=args.intra_dtype,
            cycle_s=None if args.cycle_ms is None else args.cycle_ms / 1e3)
    except ValueError as error:
        print("error: %s" % error, file=sys.stderr)
        return 2
    result["wall_s"] = time.perf_counter() - started
    print(table(result))
    if args.out:
        print("written: %s" % ", ".join(write(result, args.out, args.name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
