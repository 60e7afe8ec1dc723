"""The step-time simulator: the network cost model, profiles, and the simulate command."""

import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import network_model
from benchmarks import profile as profile_module
from benchmarks import netns, simulate, worker
from benchmarks.__main__ import main
from tf_mergecomp.search.step_model import LinearGroupCosts, StepTimeModel
from benchmarks.network_model import FusedGroupCosts, NetworkCosts, NetworkGroupCosts, WireBytes
from tf_mergecomp.grouping import fusion_splits

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- the network cost model ---------------------------------------------------------------

def test_ring_allreduce_and_allgather_formulas():
    network = NetworkCosts(4, bandwidth=1e9, latency=1e-5)
    assert network.allreduce(1e6) == pytest.approx(2 * 3 / 4 * 1e6 / 1e9 + 2 * 3 * 1e-5)
    assert network.allgather(1e6) == pytest.approx(3 * 1e6 / 1e9 + 3 * 1e-5)
    assert network.collective("allgather", 0) == pytest.approx(3e-5)
    np.testing.assert_allclose(network.allreduce(np.array([0.0, 1e6])),
                               [6e-5, 1.5e-3 + 6e-5])
    alone = NetworkCosts(1, bandwidth=1e9, latency=1e-3)
    assert alone.allreduce(1e9) == 0 and alone.allgather(1e9) == 0


def test_more_workers_cost_more_and_allgather_grows_linearly():
    bytes_ = 25e6
    allreduce = [NetworkCosts(w, 1.25e9, 25e-6).allreduce(bytes_) for w in (2, 8, 64, 256)]
    allgather = [NetworkCosts(w, 1.25e9, 25e-6).allgather(bytes_) for w in (2, 8, 64, 256)]
    assert allreduce == sorted(allreduce) and allgather == sorted(allgather)
    # Ring allreduce's bandwidth term is bounded by 2 bytes/bw; allgather's is not.
    assert allreduce[-1] < 2 * bytes_ / 1.25e9 + 2 * 255 * 25e-6 + 1e-12
    assert allgather[-1] == pytest.approx(255 * (bytes_ / 1.25e9 + 25e-6))


@pytest.mark.parametrize("kwargs", [dict(workers=0, bandwidth=1.0), dict(workers=2, bandwidth=0),
                                    dict(workers=2, bandwidth=1.0, latency=-1),
                                    dict(workers=True, bandwidth=1.0)])
def test_network_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        NetworkCosts(**kwargs)


def test_unknown_collective_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="allreduce, allgather"):
        NetworkCosts(2, 1.0).collective("broadcast", 1)


def test_wire_bytes_with_per_tensor_payloads():
    wire = WireBytes([10, 20, 30], fixed=4, per_element=0.125, tensor_bytes=[1, 2, 3])
    assert wire(0, 3) == pytest.approx(4 + 7.5 + 6)
    np.testing.assert_allclose(wire(np.array([0, 1]), np.array([1, 3])), [4 + 1.25 + 1,
                                                                          4 + 6.25 + 5])


def test_network_group_costs_add_the_collective_and_scale_gathered_decodes():
    sizes = [100, 100]
    codec = LinearGroupCosts(sizes, [[1e-3, 0, 0], [2e-4, 0, 0], [1e-4, 1e-6, 0]])
    wire = WireBytes(sizes, per_element=1.0)
    network = NetworkCosts(8, 1e4, 0.0)
    encode, collective, decode = NetworkGroupCosts(codec, wire, "allgather", network,
                                                   decode_rows=True)(0, 2)
    assert encode == pytest.approx(1e-3)
    assert collective == pytest.approx(2e-4 + 7 * 200 / 1e4)
    # one row measured (1e-4 + 200e-6), seven more rows read at 200e-6 each
    assert decode == pytest.approx(1e-4 + 8 * 200e-6)


def test_a_multi_rank_probe_scales_the_hosts_share_of_the_collective_to_w_workers():
    sizes = [100, 100]
    # measured on 2 ranks: the collective's host work 1e-6 s per element, the
    # allgather's decode 2e-6 s per element for the 2 rows it read
    codec = LinearGroupCosts(sizes, [[1e-3, 0, 0], [2e-4, 1e-6, 0], [1e-4, 2e-6, 0]])
    wire = WireBytes(sizes, per_element=1.0)
    for workers, gather_rows, ring_share in ((2, 1, 1.0), (8, 7, 1.75)):
        network = NetworkCosts(workers, 1e4, 1e-5)
        assert network.host_scale("allgather", 2) == pytest.approx(gather_rows)
        assert network.host_scale("allreduce", 2) == pytest.approx(ring_share)
        assert network.host_scale("allgather", 1) == 1.0  # a lone probe measured no such work
        assert network.allreduce(200.0) == pytest.approx(
            network.transfer("allreduce", 200.0) + network.latency_term("allreduce"))
        assert network.latency_term("allreduce") == pytest.approx(2 * (workers - 1) * 1e-5)
        _, collective, decode = NetworkGroupCosts(codec, wire, "allgather", network,
                                                  decode_rows=True, probe_workers=2)(0, 2)
        assert collective == pytest.approx(2e-4 + gather_rows * 200e-6
                                           + network.allgather(200.0))
        assert decode == pytest.approx(1e-4 + workers * 200e-6)
        _, reduced, _ = NetworkGroupCosts(codec, wire, "allreduce", network,
                                          probe_workers=2)(0, 2)
        assert reduced == pytest.approx(2e-4 + ring_share * 200e-6
                                        + network.allreduce(200.0))
        # Horovod's fused allreduce pays the per-collective cost once, the bytes' share per byte
        fused = FusedGroupCosts(codec, wire, "allreduce", network, probe_workers=2)
        assert fused(0, 2)[1] == pytest.approx(2e-4 + ring_share * 200e-6
                                               + network.allreduce(200.0))


def test_the_probes_own_transfer_is_replaced_by_the_networks():
    sizes = [100, 100]
    codec = LinearGroupCosts(sizes, [[0, 0, 0], [2e-4, 1e-6, 0], [0, 0, 0]])
    wire = WireBytes(sizes, per_element=1.0)
    network = NetworkCosts(8, 1e4, 0.0)
    # the probe's 2-rank loopback ring moved 1e6 bytes/s each way: of its 200e-6 s of
    # per-byte host work for 200 bytes, an allreduce's 200 bytes took 200e-6 s moving
    # (ring share 1 at 2 ranks) and an allgather's 200e-6 s too: nothing left
    for kind in ("allreduce", "allgather"):
        replaced = NetworkGroupCosts(codec, wire, kind, network, probe_workers=2,
                                     probe_link=1e6)(0, 2)[1]
        assert replaced == pytest.approx(2e-4 + network.collective(kind, 200.0))
    # a faster loopback took less of it: the rest is the host's (sums, copies), scaled to W
    slow = NetworkGroupCosts(codec, wire, "allreduce", network, probe_workers=2,
                             probe_link=4e6)(0, 2)[1]
    assert slow == pytest.approx(2e-4 + 1.75 * (200e-6 - 50e-6) + network.allreduce(200.0))
    fused = FusedGroupCosts(codec, wire, "allreduce", network, probe_workers=2, probe_link=4e6)
    assert fused(0, 2)[1] == pytest.approx(slow)
    # PowerSGD's two collectives a group: each moved half the bytes
    halves = NetworkGroupCosts(codec, wire, "allreduce", network, calls=2, probe_workers=2,
                               probe_link=4e6)(0, 2)[1]
    assert halves == pytest.approx(2e-4 + 1.75 * (200e-6 - 50e-6)
                                   + 2 * network.allreduce(100.0))
    # unmeasured, or a lone probe (it moved nothing): the host's share is kept whole
    for probe_workers, probe_link in ((2, None), (1, 1e6)):
        kept = NetworkGroupCosts(codec, wire, "allreduce", network, probe_workers=probe_workers,
                                 probe_link=probe_link)(0, 2)[1]
        scale = network.host_scale("allreduce", probe_workers)
        assert kept == pytest.approx(2e-4 + scale * 200e-6 + network.allreduce(200.0))


def test_the_simulation_reads_the_probes_loopback_from_the_profiles_link_check():
    profile = tiny_profile()
    profile["horovod"]["probe_workers"] = 2
    profile["codecs"]["none"]["collective"]["per_element_s"] = 4e-9
    network = network_model.NetworkCosts(2, 10e9 / 8)
    steps = {}
    for label, check in (("unmeasured", None), ("failed", {"error": "no namespaces"}),
                         ("measured", {"delivered_bytes_per_s": 1e9, "workers": 2})):
        if check is not None:
            profile["probe_link"] = check
        steps[label] = simulate.Simulation(profile).horovod("fp32", network)[1]
    assert steps["failed"] == steps["unmeasured"]
    # 4 ns of host work per element, 4 bytes each at 1e9 bytes/s: the probe's whole
    # per-byte share was its transfer, and the step is that much shorter
    assert steps["measured"] < steps["unmeasured"]


def test_the_probes_own_groups_replace_the_fit_where_it_timed_them():
    """Groups of several tensors the probe timed cost what it timed; single tensors
    (most of the fit's points, so the fit is their summary) and unprobed groups, and
    every collective, what the fit says."""
    profile = tiny_profile()
    profile["placement"]["codec_on_compute"] = True  # the encodes are on the step's path
    n = len(profile["tensors"]["sizes"])
    network = network_model.NetworkCosts(2, 10e9 / 8)
    fitted = simulate.Simulation(profile)
    fit = fitted.codec_group_costs("topk")
    profile = copy.deepcopy(profile)
    profile["codecs"]["topk"]["probed"] = {
        "bounds": [[0, n], [0, 1]],
        "encode_s": [float(fit(0, n)[0]) / 10, 1.0],
        "decode_s": [float(fit(0, n)[2]) / 10, 1.0]}
    probed = simulate.Simulation(profile_module.validate(profile))
    costs = probed.codec_group_costs("topk")
    assert [float(p) for p in costs(0, n)] == pytest.approx(
        [float(fit(0, n)[0]) / 10, float(fit(0, n)[1]), float(fit(0, n)[2]) / 10])
    for lo, hi in ((0, 1), (1, n)):
        assert [float(p) for p in costs(lo, hi)] == pytest.approx([float(p) for p in fit(lo, hi)])
    old = fitted.codec_configs("topk", network, search=False)[0]
    new = probed.codec_configs("topk", network, search=False)[0]
    assert new["one group"][1] < old["one group"][1]
    assert new["layer-wise"][1] == pytest.approx(old["layer-wise"][1])
    # the network's share is unchanged: the collective's per-byte host part is the fit's
    plain = network_model.NetworkGroupCosts(fitted.codec_fit("topk"), fitted.wire("topk"),
                                         "allgather", network, probe_workers=2, probe_link=1e9)
    over = network_model.NetworkGroupCosts(costs, fitted.wire("topk"), "allgather", network,
                                        probe_workers=2, probe_link=1e9)
    assert float(over(0, n)[1]) == pytest.approx(float(plain(0, n)[1]))


@pytest.mark.parametrize("probed, complaint", [
    ({"bounds": [[0, 99]], "encode_s": [1e-3], "decode_s": [1e-3]}, "lo < hi <= 12"),
    ({"bounds": [[0, 12]], "encode_s": [1e-3], "decode_s": []}, "decode_s needs 1"),
    ({"bounds": [[0, 12]], "encode_s": [-1.0], "decode_s": [1e-3]}, "non-negative"),
])
def test_a_profiles_probed_groups_are_checked(probed, complaint):
    profile = tiny_profile()
    profile["codecs"]["topk"]["probed"] = probed
    with pytest.raises(ValueError, match=complaint):
        profile_module.validate(profile)


def test_horovod_fusion_groups_by_cycle_and_buffer():
    ready = [0.0001, 0.0004, 0.0012, 0.0013, 0.0014, 0.0031]
    nbytes = [10, 10, 10, 10, 10, 10]
    assert fusion_splits(ready, nbytes, 1e-3, 100) == (2, 5)
    # a full buffer splits a cycle's tensors
    assert fusion_splits(ready, nbytes, 1e-3, 20) == (2, 4, 5)
    assert fusion_splits(ready, nbytes, 0.0, 100) == (1, 2, 3, 4, 5)
    # Ticks shifted by the steady state's phase: 0.9 and 1.1 ms share the tick at 1.8 ms.
    assert fusion_splits([0.0009, 0.0011], [1, 1], 1e-3, 100) == (1,)
    assert fusion_splits([0.0009, 0.0011], [1, 1], 1e-3, 100, phase_s=2e-4) == ()


def test_fused_groups_pay_one_collective_each():
    sizes = [1000] * 4
    codec = LinearGroupCosts(sizes, [[0, 0, 0], [1e-4, 0, 0], [0, 0, 0]])
    network = NetworkCosts(2, 1e6, 1e-4)
    costs = FusedGroupCosts(codec, WireBytes(sizes), "allreduce", network)
    _, one, _ = costs(0, 4)
    _, each, _ = costs(np.arange(4), np.arange(1, 5))
    assert one == pytest.approx(1e-4 + 4 * 4000 / 1e6 + 2e-4)  # float32 bytes
    assert float(np.sum(each)) > one  # four latencies and host costs instead of one


def test_cycle_time_makes_collectives_wait_for_horovods_pass_but_not_one_each():
    ready = np.full(10, 0.0101)
    costs = LinearGroupCosts([1] * 10, [[0, 0, 0], [1e-5, 0, 0], [0, 0, 0]])
    plain = StepTimeModel(ready, costs, codec_on_compute=False)
    cycled = StepTimeModel(ready, costs, codec_on_compute=False, cycle_s=1e-3)
    layerwise = tuple(range(1, 10))
    # All ten collectives are taken up by the pass at 11 ms and run back to back.
    assert cycled.step_time(layerwise) == pytest.approx(0.011 + 10 * 1e-5)
    assert plain.step_time(layerwise) == pytest.approx(0.0101 + 10 * 1e-5)
    with pytest.raises(ValueError):
        StepTimeModel(ready, costs, cycle_s=-1)


# ---- profiles ---------------------------------------------------------------------------

def tiny_profile(n=12):
    rng = np.random.default_rng(3)
    sizes = [int(s) for s in rng.integers(1_000, 400_000, size=n)]
    ready = list(np.linspace(0.02, 0.06, n))

    def codec(kind, per_element_bytes, encode, decode, fixed_bytes=0):
        return {"collective_op": kind, "collectives_per_group": 1,
                "wire": {"fixed_bytes": fixed_bytes, "per_element_bytes": per_element_bytes,
                         "tensor_bytes": None},
                "encode": {"fixed_s": encode[0], "per_element_s": encode[1], "per_tensor_s": 0.0},
                "collective": {"fixed_s": 50e-6, "per_element_s": 0.0, "per_tensor_s": 0.0},
                "decode": {"fixed_s": decode[0], "per_element_s": decode[1], "per_tensor_s": 0.0}}

    return {
        "schema": profile_module.SCHEMA,
        "source": "synthetic (tests/test_simulate.py)",
        "model": "tiny",
        "tensors": {"sizes": sizes, "shapes": [[s] for s in sizes]},
        "compute": {"forward_s": 0.02, "backward_s": 0.04, "optimizer_s": 0.005,
                    "step_s": 0.065, "tail_s": 0.005, "ready_s": ready},
        "placement": {"codec_on_compute": False, "decodes_after_backprop": False},
        "horovod": {"cycle_time_s": 1e-3, "fusion_buffer_bytes": 64 * 2**20, "fp32": "none",
                    "fp16": "fp16"},
        "codecs": {"none": codec("allreduce", 4.0, (20e-6, 0.5e-9), (20e-6, 0.5e-9)),
                   "fp16": codec("allreduce", 2.0, (30e-6, 1e-9), (30e-6, 1e-9)),
                   "efsignsgd": codec("allgather", 0.125, (300e-6, 3e-9), (200e-6, 1e-9), 4),
                   "topk": codec("allgather", 0.08, (400e-6, 8e-9), (100e-6, 0.1e-9))},
    }


def test_a_none_groups_copies_are_on_horovods_thread_as_horovod_fp32s():
    """The library sends a ``none`` group by Horovod's grouped collectives: where Horovod
    copies off the compute stream (a GPU profile: fusion_copies_on_compute false) the
    group's encode and decode are its collective's, as Horovod fp32's are; on a CPU host
    they stay where they were measured. Other codecs keep theirs."""
    profile = tiny_profile()
    gpu = simulate.Simulation(profile)
    lo, hi = np.array([0, 3]), np.array([3, 12])
    (encode, collective, decode), (raw_encode, raw_collective, raw_decode) = (
        np.broadcast_arrays(*fit(lo, hi)) for fit in (gpu.group_fit("none"),
                                                      gpu.codec_fit("none")))
    assert not np.any(encode) and not np.any(decode) and np.all(raw_encode > 0)
    np.testing.assert_allclose(collective, raw_collective + raw_encode + raw_decode)
    np.testing.assert_array_equal(gpu.group_fit("fp16").coefficients,
                                  gpu.codec_fit("fp16").coefficients)
    profile["horovod"]["fusion_copies_on_compute"] = True
    cpu = simulate.Simulation(profile)
    np.testing.assert_array_equal(cpu.group_fit("none").coefficients,
                                  cpu.codec_fit("none").coefficients)


def test_a_cpu_hosts_collective_cpu_slows_layerwise_more_than_one_group():
    """A profile's collective_cpu (a CPU host: codec_on_compute) bounds each
    config's step from below by its CPU work: one collective's worth for one
    group, one per tensor for layer-wise, one per fused collective for
    Horovod's own allreduce (here one per tensor: each is ready in another cycle)."""
    profile = tiny_profile()
    profile["placement"]["codec_on_compute"] = True
    network = network_model.NetworkCosts(2, 100e9 / 8)
    before = simulate.Simulation(profile)
    for codec in profile["codecs"].values():
        codec["collective_cpu"] = {"fixed_s": 0.01, "per_element_s": 0.0, "per_tensor_s": 0.0}
    after = simulate.Simulation(profile_module.validate(profile))
    old, new = (s.codec_configs("efsignsgd", network, search=False)[0] for s in (before, after))
    n = len(profile["tensors"]["sizes"])
    assert new["one group"][1] >= old["one group"][1]
    assert new["layer-wise"][1] >= 0.06 + n * 0.01  # backprop ends at 0.06
    assert new["layer-wise"][1] - new["one group"][1] >= (n - 1) * 0.01 - 0.02
    assert after.horovod("fp32", network)[1] >= 0.06 + n * 0.01


@pytest.mark.parametrize("splits", [(), (4,), (2, 7, 9), tuple(range(1, 12))])
def test_an_exchange_that_cannot_overlap_backprop_delays_it_by_every_collective(splits):
    """SerializedExchange on a codec-on-compute model: every encode, collective
    and decode runs on the compute stream, so any layout's step is backprop plus
    all of them plus the tail, and never shorter than the overlapping one's."""
    profile = tiny_profile()
    profile["placement"]["codec_on_compute"] = True
    simulation = simulate.Simulation(profile, cycle_s=0.0)
    network = network_model.NetworkCosts(2, 1e9 / 8, 25e-6)
    overlapping = simulation.codec_costs("efsignsgd", network)
    serialized = network_model.SerializedExchange(overlapping)
    bounds = np.asarray((0,) + splits + (12,))
    parts = sum(np.sum(p) for p in overlapping(bounds[:-1], bounds[1:]))
    tail = profile["compute"]["tail_s"]
    model = simulation.model(serialized, cycle=False)
    assert model.step_time(splits) == pytest.approx(0.06 + parts + tail)
    assert model.step_time(splits) >= simulation.model(overlapping, cycle=False).step_time(
        splits) - 1e-12


def test_a_simulation_without_overlap_serializes_every_config():
    profile = tiny_profile()
    profile["placement"]["codec_on_compute"] = True
    network = network_model.NetworkCosts(2, 1e9 / 8, 25e-6)
    overlapping, serialized = (simulate.Simulation(profile, overlap=o) for o in (True, False))
    assert isinstance(serialized.codec_costs("topk", network), network_model.SerializedExchange)
    assert serialized.horovod("fp32", network)[1] > overlapping.horovod("fp32", network)[1]
    slow, fast = (s.codec_configs("fp16", network, search=False)[0] for s in (serialized,
                                                                             overlapping))
    for mode in ("layer-wise", "one group", "best <= 3"):
        assert slow[mode][1] >= fast[mode][1] - 1e-12


def test_no_overlap_needs_a_codec_on_the_compute_stream():
    with pytest.raises(ValueError, match="codec_on_compute"):
        simulate.Simulation(tiny_profile(), overlap=False)  # its codec has a stream of its own


def test_the_paper_comparison_fits_the_link_to_fp32_with_and_without_overlap():
    from benchmarks import paper_profile

    profile = tiny_profile()
    profile["placement"]["codec_on_compute"] = True
    rates = {}
    for overlap in (True, False):
        rates[overlap] = paper_profile.bandwidth_for_fp32_scaling(profile, 48, 25e-6, overlap)
        result = paper_profile.compare_with_paper(profile, rates[overlap], 25e-6,
                                                  {"fp16": (53, 65)}, overlap=overlap)
        assert result["fp32"] == pytest.approx(48, abs=1)
        row = result["rows"][0]
        assert row["gap_layerwise"] == pytest.approx(row["sim_layerwise"] - 53)
        assert row["sim_gain"] == pytest.approx(row["sim_mergecomp"] - row["sim_layerwise"])
    # Hidden behind backprop, the same fp32 scaling takes a slower link.
    assert rates[True] < rates[False]


def test_spearman_ranks_ties_by_their_mean():
    from benchmarks.paper_profile import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks (0, 1.5, 1.5, 3) against (0, 1, 2, 3)
    assert spearman([1, 5, 5, 9], [1, 2, 3, 4]) == pytest.approx(4.5 / np.sqrt(4.5 * 5.0))
    assert spearman([1], [2]) is None


def test_profile_round_trip(tmp_path):
    original = tiny_profile()
    path = profile_module.save(original, str(tmp_path / "p.json"))
    assert profile_module.load(path) == json.loads(json.dumps(original))


@pytest.mark.parametrize("breakage, message", [
    (lambda p: p.pop("source"), "source"),
    (lambda p: p["compute"]["ready_s"].pop(), "ready_s"),
    (lambda p: p["codecs"]["topk"].update(collective_op="bcast"), "allreduce or allgather"),
    (lambda p: p["codecs"]["fp16"]["encode"].pop("per_tensor_s"), "per_tensor_s"),
    (lambda p: p.update(schema="other/9"), "schema"),
])
def test_profile_errors_name_the_field(tmp_path, breakage, message):
    broken = tiny_profile()
    breakage(broken)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(ValueError, match=message):
        profile_module.load(str(path))


def test_shipped_paper_profile_is_valid_and_says_where_its_figures_come_from():
    paper = profile_module.load(os.path.join(REPO, "docs", "profiles",
                                             "resnet50_2xv100_paper.json"))
    assert "published" in paper["source"] and "not measured" in paper["source"]
    assert len(paper["tensors"]["sizes"]) == 214  # Keras ResNet50's trainable variables
    assert sum(paper["tensors"]["sizes"]) == 25_583_592
    assert set(paper["networks"]) == {"pcie3", "nvlink"}
    assert all("http" in note or "PCI-SIG" in note or "KERNELS" in note or "Horovod" in note
               for note in paper["notes"])


def test_wire_model_matches_the_codecs_payload():
    from tf_mergecomp import compressors

    shapes = [[3, 3, 8, 16], [16], [1000]]
    for name in ("efsignsgd", "fp16", "topk", "randomk", "powersgd"):
        codec = compressors.get(name)
        wire = profile_module.wire_model(codec, shapes)
        model = WireBytes([int(np.prod(s)) for s in shapes], wire["fixed_bytes"],
                          wire["per_element_bytes"], wire["tensor_bytes"])
        for index, shape in enumerate(shapes):
            expected = codec.payload_nbytes([shape] if name == "powersgd"
                                            else int(np.prod(shape)))
            assert model(index, index + 1) == pytest.approx(expected, rel=0.02, abs=8)


# ---- the simulate command -----------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [("1gbit", 1.25e8), ("400mbit", 5e7),
                                            ("12.5GB/s", 12.5e9), ("100Gb/s", 12.5e9),
                                            ("2gbps", 2e9)])
def test_bandwidths_read_as_the_cluster_benchmark_reads_them(text, expected):
    # A --bandwidth the cluster benchmark shapes with tc means the same rate here.
    assert simulate.parse_bandwidth(text)[1] == pytest.approx(expected)
    if "/" not in text:
        assert simulate.parse_bandwidth(text)[1] == netns.rate_bytes_per_s(text)


@pytest.mark.parametrize("text", ["none", "10 furlongs", "5G/s"])
def test_bandwidths_that_are_no_rate(text):
    with pytest.raises(ValueError, match="tc rate"):
        simulate.parse_bandwidth(text)


def test_a_zero_bandwidth_is_refused():
    with pytest.raises(ValueError, match="not positive"):
        simulate.parse_bandwidth("0gbit")


def test_bad_bandwidth_names_the_forms_and_the_profiles_networks():
    with pytest.raises(ValueError, match="pcie3"):
        simulate.parse_bandwidth("fast", {"pcie3": {}})
    assert simulate.parse_latency("25us") == pytest.approx(25e-6)
    with pytest.raises(ValueError):
        simulate.parse_latency("soon")


def test_simulate_command_on_a_tiny_profile(tmp_path, capsys):
    path = profile_module.save(tiny_profile(), str(tmp_path / "tiny.json"))
    out = tmp_path / "out"
    assert main(["simulate", "--profile", path, "--workers", "1,2,8,64", "--bandwidth",
                 "1gbit,10gbit", "--out", str(out)]) == 0
    assert "simulated 8 cells" in capsys.readouterr().out
    result = json.loads((out / "simulate.json").read_text())
    assert (out / "simulate.png").stat().st_size > 10_000
    assert "| horovod fp32 |" in (out / "simulate.md").read_text()
    cells = {(c["bandwidth"], c["workers"]): c["rows"] for c in result["cells"]}
    for bandwidth in ("1gbit", "10gbit"):
        steps = [cells[(bandwidth, w)]["horovod fp32"]["step_s"] for w in (1, 2, 8, 64)]
        assert steps == sorted(steps) and steps[-1] > steps[0]
        gathered = [cells[(bandwidth, w)]["efsignsgd one group"]["step_s"] for w in (2, 8, 64)]
        assert gathered == sorted(gathered)
    for w in (2, 8, 64):
        slow, fast = cells[("1gbit", w)], cells[("10gbit", w)]
        for label in slow:
            assert fast[label]["step_s"] <= slow[label]["step_s"] + 1e-12
        for codec in ("fp16", "efsignsgd", "topk"):
            searched = slow["%s searched" % codec]["step_s"]
            best = slow["%s best <= 3" % codec]["step_s"]
            # the search (up to 4 groups) lands within 5% of the optimum of <= 3 groups,
            # and never above the better sentinel it confirms against
            assert searched <= 1.05 * best
            assert searched <= min(slow["%s layer-wise" % codec]["step_s"],
                                   slow["%s one group" % codec]["step_s"]) + 1e-12
    # one worker: nothing on the wire, so every config runs at least the local step
    assert cells[("1gbit", 1)]["horovod fp32"]["scaling_factor"] <= 1.0 + 1e-9


def test_simulate_command_takes_the_runs_horovod_cycle(tmp_path, capsys):
    path = profile_module.save(tiny_profile(), str(tmp_path / "tiny.json"))
    steps = {}
    for cycle_ms in ("1", "5"):
        out = tmp_path / cycle_ms
        assert main(["simulate", "--profile", path, "--workers", "2", "--bandwidth", "1gbit",
                     "--codecs", "efsignsgd", "--cycle-ms", cycle_ms, "--out", str(out)]) == 0
        result = json.loads((out / "simulate.json").read_text())
        assert result["horovod_cycle_time_s"] == pytest.approx(float(cycle_ms) / 1e3)
        steps[cycle_ms] = result["cells"][0]["rows"]["efsignsgd one group"]["step_s"]
    # Steady steps take whole cycles once their exchange fits in one: a longer one costs.
    assert steps["5"] > steps["1"]
    assert main(["simulate", "--profile", path, "--cycle-ms", "-1"]) == 2
    assert "--cycle-ms must be >= 0" in capsys.readouterr().err


def test_simulate_command_refuses_bad_input(tmp_path, capsys):
    path = profile_module.save(tiny_profile(), str(tmp_path / "tiny.json"))
    assert main(["simulate", "--profile", path, "--bandwidth", "fast"]) == 2
    assert "bandwidth 'fast'" in capsys.readouterr().err
    assert main(["simulate", "--profile", path, "--codecs", "dgc"]) == 2
    assert "not in the profile" in capsys.readouterr().err
    assert main(["simulate", "--profile", str(tmp_path / "missing.json")]) == 2


def test_validate_compares_each_measured_config_with_its_simulation():
    from benchmarks import validate

    profile = tiny_profile()
    n = len(profile["tensors"]["sizes"])

    def row(label, kind, step, **config):
        return {"label": label, "config": dict(config, label=label, kind=kind), "step_s": step,
                "num_groups": None}

    run = {"bandwidth": "1gbit", "groups": [{
        "model": "tiny", "workers": 2, "compute_step_s": [0.13, 0.13], "rows": [
            row("horovod fp32", "horovod", 0.1, compression="none"),
            row("horovod fp32 (repeat)", "horovod", 0.12, compression="none"),
            row("topk layerwise", "mergecomp", 0.1, algorithm="topk", partition="layerwise"),
            dict(row("topk searched", "mergecomp", 0.1, algorithm="topk", partition="searched"),
                 splits=[n // 2]),
            row("dgc one", "mergecomp", 0.1, algorithm="dgc", partition="one"),  # not profiled
        ]}]}
    rows = validate.compare([run], {"tiny": profile})
    assert [r["label"] for r in rows] == ["horovod fp32", "topk layerwise", "topk searched"]
    assert rows[0]["repeat_s"] == 0.12
    simulation = simulate.Simulation(profile)
    network = NetworkCosts(2, 1.25e8, simulate.DEFAULT_LATENCY_S)
    model = simulation.model(simulation.codec_costs("topk", network), "topk", network)
    assert rows[1]["profile"] == pytest.approx(model.step_time(tuple(range(1, n))))
    assert rows[2]["profile"] == pytest.approx(model.step_time((n // 2,)))
    assert rows[2]["profile error"] == pytest.approx(rows[2]["profile"] / 0.1 - 1)
    # the run computed twice as slowly as the profile's local step: its compute is scaled
    assert rows[2]["run compute"] > rows[2]["profile"]
    assert "median |error|" in validate.table(rows)
    # the exchange timed alone: the same config with every gradient ready at once and
    # nothing to compute; rows without one (a run before it was timed) have no such column
    assert "exchange" not in rows[1]
    timed = dict(run, groups=[dict(run["groups"][0], rows=[
        dict(r, exchange_s=0.02) for r in run["groups"][0]["rows"]])])
    exchanged = validate.compare([timed], {"tiny": profile})
    alone = simulate.Simulation(validate.exchange_profile(profile))
    assert alone.local_step == 0 and not any(alone.ready)
    model = alone.model(alone.codec_costs("topk", network), "topk", network)
    assert exchanged[1]["exchange"] == pytest.approx(model.step_time(tuple(range(1, n))))
    assert 0 < exchanged[1]["exchange"] < exchanged[1]["profile"]
    assert exchanged[1]["exchange error"] == pytest.approx(exchanged[1]["exchange"] / 0.02 - 1)
    assert "exchange alone (no compute" in validate.table(exchanged)
    assert "exchange alone (no compute" not in validate.table(rows)
    # A run whose ranks ran Horovod with a 5 ms cycle is simulated with that cycle (the
    # probe's own wait, the profile's cycle, still comes out of the collective cost).
    slow_cycle = dict(run, horovod_cycle_time_s=0.005)
    five = validate.compare([slow_cycle], {"tiny": profile})
    simulation = simulate.Simulation(profile, cycle_s=0.005)
    assert simulation.probe_cycle_s == profile["horovod"]["cycle_time_s"]
    model = simulation.model(simulation.codec_costs("topk", network), "topk", network)
    assert five[1]["profile"] == pytest.approx(model.step_time(tuple(range(1, n))))
    assert five[1]["profile"] > rows[1]["profile"]  # more waits for the cycle
    # A run whose link check measured its links prices the collectives at the delivered rate
    # (unless asked for the nominal one); the table says which.
    assert rows[0]["link"] == "nominal" and rows[0]["link_bytes_per_s"] == 1.25e8
    checked = dict(run, groups=[dict(run["groups"][0], link={
        "nominal_bytes_per_s": 1.25e8, "delivered_bytes_per_s": 0.5e8})])
    slow_links = validate.compare([checked], {"tiny": profile})
    assert slow_links[0]["link"] == "delivered" and slow_links[0]["link_bytes_per_s"] == 0.5e8
    half = NetworkCosts(2, 0.5e8, simulate.DEFAULT_LATENCY_S)
    simulation = simulate.Simulation(profile)
    model = simulation.model(simulation.codec_costs("topk", half), "topk", half)
    assert slow_links[1]["profile"] == pytest.approx(model.step_time(tuple(range(1, n))))
    assert slow_links[0]["profile"] > rows[0]["profile"]  # Horovod fp32's bytes, slower
    assert "(0.40 Gbit/s delivered)" in validate.table(slow_links)
    nominal = validate.compare([checked], {"tiny": profile}, links="nominal")
    assert [r["profile"] for r in nominal] == pytest.approx([r["profile"] for r in rows])
    with pytest.raises(ValueError, match="delivered, nominal"):
        validate.compare([checked], {"tiny": profile}, links="fastest")


def test_tc_rates_read_as_tc_reads_them():
    assert netns.rate_bytes_per_s("1gbit") == 1.25e8
    assert netns.rate_bytes_per_s("100mbit") == 1.25e7
    assert netns.rate_bytes_per_s("2gbps") == 2e9  # tc's bps are bytes
    for bad in ("none", "fast"):
        with pytest.raises(ValueError):
            netns.rate_bytes_per_s(bad)


def test_horovod_cycle_comes_from_the_environment():
    assert network_model.horovod_cycle_s({}) == network_model.HOROVOD_CYCLE_S
    assert network_model.horovod_cycle_s({"HOROVOD_CYCLE_TIME": "5"}) == pytest.approx(0.005)
    for bad in ("fast", "0", "-1"):
        with pytest.raises(ValueError, match="HOROVOD_CYCLE_TIME"):
            network_model.horovod_cycle_s({"HOROVOD_CYCLE_TIME": bad})


def test_profile_arguments(capsys):
    from benchmarks.__main__ import build_parser

    args = build_parser().parse_args(["profile", "--model", "resnet50", "--quick",
                                      "--processes", "2"])
    assert (args.model, args.quick, args.processes, args.codecs) == ("resnet50", True, 2, None)
    assert args.pin_cores
    assert not build_parser().parse_args(["profile", "--model", "resnet50",
                                          "--no-pin-cores"]).pin_cores
    for model in ("MobileNetV2", "my_models.small:build"):
        assert build_parser().parse_args(["profile", "--model", model]).model == model
    for bad in ("lenet", "module:", "module:not an identifier"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["profile", "--model", bad])
        error = capsys.readouterr().err
        assert "unknown model %r; valid choices: resnet50, vgg16, transformer, mlp" % bad in error
        assert "package.module:function" in error
    with pytest.raises(ValueError, match="valid choices"):
        profile_module.record("resnet50", codecs=("gzip",))


@pytest.mark.multiworker
def test_profile_of_a_users_model_on_two_loopback_ranks_feeds_the_simulator(tmp_path):
    """The whole path: a model given as module:function, profiled by a 2-rank
    Horovod job over loopback (real collectives in the probe), then simulated."""
    out = tmp_path / "tiny.json"
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    profiled = subprocess.run(
        [sys.executable, "-m", "benchmarks", "profile", "--model",
         "tests.workers.tiny_model:build", "--quick", "--codecs", "none,fp16,efsignsgd",
         "--processes", "2", "--timeout", "300", "--out", str(out)],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=360)
    assert profiled.returncode == 0, profiled.stderr[-3000:]
    profile = profile_module.load(str(out))
    assert profile["model"] == "tests.workers.tiny_model:build"
    assert profile["horovod"]["probe_workers"] == 2
    # what the probe's loopback ring delivered, each rank's side on its own cores
    assert profile["probe_link"]["workers"] == 2
    assert profile["probe_link"]["delivered_bytes_per_s"] > 1e7
    # each rank on its own share of the cores, as the cluster benchmark's ranks
    cores = sorted(os.sched_getaffinity(0))
    assert profile["host"]["pin_cores"] is True
    assert profile["host"]["rank_cores"] == [worker.own_cores(rank, 2, cores) for rank in (0, 1)]
    assert profile["tensors"]["sizes"] == [3, 48, 16, 256, 16, 192]  # backprop order
    assert profile["codecs"]["efsignsgd"]["collective_op"] == "allgather"
    # each codec keeps the groups its probe timed: one group, the quick run's 4, each tensor
    n = len(profile["tensors"]["sizes"])
    for codec in profile["codecs"].values():
        bounds = codec["probed"]["bounds"]
        assert [0, n] in bounds and all([i, i + 1] in bounds for i in range(n))
        assert len(codec["probed"]["encode_s"]) == len(bounds)
    # a real 2-rank collective costs this host something (how the fit splits it between
    # the fixed, per-element and per-tensor terms varies from run to run)
    collective = profile["codecs"]["fp16"]["collective"]
    sizes = profile["tensors"]["sizes"]
    assert (collective["fixed_s"] + collective["per_element_s"] * sum(sizes)
            + collective["per_tensor_s"] * len(sizes)) > 0
    for codec in profile["codecs"].values():  # and some of it is CPU work
        cpu = codec["collective_cpu"]
        assert cpu["fixed_s"] >= 0 and cpu["per_element_s"] >= 0
    assert any(c["collective_cpu"]["fixed_s"] + c["collective_cpu"]["per_element_s"] > 0
               for c in profile["codecs"].values())
    simulated = subprocess.run(
        [sys.executable, "-m", "benchmarks", "simulate", "--profile", str(out),
         "--workers", "2,8", "--bandwidth", "1gbit", "--out", str(tmp_path / "sim")],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=300)
    assert simulated.returncode == 0, simulated.stderr[-3000:]
    assert "efsignsgd" in (tmp_path / "sim" / "simulate.md").read_text()


def test_the_per_group_search_is_never_slower_than_plain_horovod_or_its_sentinels(tmp_path):
    """Per cell and codec, the per-group search (codec or none per group, plain
    Horovod as a sentinel) is reported beside Horovod fp32/fp16 and the
    single-codec search, and confirms no slower than plain Horovod, one group or
    layer-wise; on a fast link plain Horovod or plain groups win."""
    from benchmarks import simulate as simulate_bench

    profile = tiny_profile()
    result = simulate_bench.simulate(profile, [2, 64], ["1gbit", "100gbit"], log=lambda *_: None)
    kinds = set()
    for cell in result["cells"]:
        rows = cell["rows"]
        for codec in result["codecs"]:
            per_group = rows["%s searched per-group" % codec]
            sentinels = min(rows["horovod fp32"]["step_s"], rows["%s one group" % codec]["step_s"],
                            rows["%s layer-wise" % codec]["step_s"])
            assert per_group["step_s"] <= sentinels * (1 + 1e-9), (cell["bandwidth"], codec)
            kinds.add("plain Horovod" if per_group.get("plain_horovod") else
                      "mixed" if per_group.get("group_codecs") else "compressor")
    assert "plain Horovod" in kinds or "mixed" in kinds
    text = simulate_bench.table(result)
    assert "per-group / best" in text and "per-group +fp16 / best" in text
    assert "Searched per-group (plain codecs none) within 1%" in text
    assert "Searched per-group +fp16 (plain codecs none/fp16) within 1%" in text


def test_fp16_groups_join_the_per_group_search_where_the_profile_has_fp16():
    """``searched per-group +fp16`` searches fp16 groups too: its groups use the
    codec, none or fp16, it is never slower than the sentinels either, and where
    fp16 merged beats both the codec and fp32 (a slow link, a codec dearer than
    its bytes save), it takes fp16 groups. fp16 itself gets no +fp16 row (the
    same search as its per-group one)."""
    from benchmarks import simulate as simulate_bench

    profile = tiny_profile()
    # A host whose none groups copy on the compute stream (a CPU host's): there fp16's
    # halved bytes pay for its casts; with the copies on Horovod's thread none wins.
    profile["horovod"]["fusion_copies_on_compute"] = True
    result = simulate_bench.simulate(profile, [2, 64], ["1gbit", "100gbit"], log=lambda *_: None)
    used = set()
    for cell in result["cells"]:
        rows = cell["rows"]
        assert "fp16 searched per-group +fp16" not in rows
        for codec in result["codecs"]:
            if codec == "fp16":
                continue
            row = rows["%s searched per-group +fp16" % codec]
            sentinels = min(rows["horovod fp32"]["step_s"], rows["%s one group" % codec]["step_s"],
                            rows["%s layer-wise" % codec]["step_s"])
            assert row["step_s"] <= sentinels * (1 + 1e-9), (cell["bandwidth"], codec)
            assert set(row.get("group_codecs") or ()) <= {codec, "none", "fp16"}
            used.update(row.get("group_codecs") or ())
    assert "fp16" in used
    verdict = simulate_bench.per_group_verdict(result, simulate_bench.PER_GROUP_FP16)
    assert verdict["count"] == 4 * (len(result["codecs"]) - 1)


# ---- machines of several ranks (benchmarks/machines.py) ------------------------------------

def test_two_level_with_one_rank_per_machine_is_the_flat_reduce():
    from benchmarks import machines as machines_bench

    profile = tiny_profile()
    simulation = simulate.Simulation(profile)
    cluster = machines_bench.Machines(4, 1, 100e9, 5e-6, 1.25e9, 25e-6)
    lo, hi = np.array([0, 3, 7]), np.array([3, 7, 12])
    for name in ("efsignsgd", "fp16", "none", "topk"):
        codec = profile["codecs"][name]
        two = machines_bench.TwoLevelGroupCosts(
            simulation.group_fit(name), simulation.wire(name), codec["collective_op"], cluster,
            decode_rows=codec["collective_op"] == "allgather", whole_group_codec=name == "fp16")
        flat = simulation.codec_costs(name, cluster.flat)
        for a, b in zip(two(lo, hi), flat(lo, hi)):
            np.testing.assert_allclose(a, b, rtol=1e-12)
    rows = machines_bench.MachineSimulation(profile).run_cell(cluster, ["efsignsgd"])
    assert rows["efsignsgd two-level"]["step_s"] == pytest.approx(rows["efsignsgd flat"]["step_s"])
    assert rows["horovod hierarchical fp32"]["step_s"] == pytest.approx(
        rows["horovod fp32"]["step_s"])


def test_two_level_costs_computed_by_hand():
    """One tensor of 8e6 elements, 4 machines of 8 ranks: the shard is 1e6
    elements, sent to 3 machines at 1/8 of the link, decoded from 4 rows; the
    reduce-scatter and allgather inside move 7/8 of 32 MB each."""
    from benchmarks import machines as machines_bench

    sizes = [8_000_000]
    fit = LinearGroupCosts(sizes, [[1e-5, 2e-9, 3e-6], [4e-5, 0.0, 0.0], [5e-6, 1e-9, 2e-6]])
    wire = WireBytes(sizes, fixed=4, per_element=0.125)
    cluster = machines_bench.Machines(4, 8, 100e9, 5e-6, 1.25e9, 25e-6)
    encode, collective, decode = machines_bench.TwoLevelGroupCosts(
        fit, wire, "allgather", cluster, decode_rows=True)(np.array([0]), np.array([1]))
    assert encode[0] == pytest.approx(1e-5 + 2e-9 * 1e6 + 3e-6)
    intra = 7 / 8 * 32e6 / 100e9 + 7 * 5e-6
    cross = 3 * (4 + 0.125e6) / (1.25e9 / 8) + 3 * 25e-6
    assert collective[0] == pytest.approx(4e-5 + cross + 2 * intra)
    assert decode[0] == pytest.approx(5e-6 + 4 * 1e-9 * 1e6 + 2e-6)
    # A voting codec on 8 ranks per machine: the whole group encoded (its 8 shards), its
    # payload alltoall'ed inside, each rank's shard counted from 8 rows (a row's decode
    # each) and its counts sent across in 4 bits per element, 4 rows of counts decoded.
    encode, collective, decode = machines_bench.TwoLevelGroupCosts(
        fit, wire, "allgather", cluster, decode_rows=True, votes=True)(np.array([0]),
                                                                       np.array([1]))
    assert encode[0] == pytest.approx(1e-5 + 2e-9 * 8e6 + 3e-6 + 8 * 1e-9 * 1e6)
    counts_cross = 3 * (4 + 0.125 * 4 * 1e6) / (1.25e9 / 8) + 3 * 25e-6
    votes_intra = 7 / 8 * (4 + 0.125 * 8e6) / 100e9 + 7 * 5e-6
    assert collective[0] == pytest.approx(4e-5 + counts_cross + votes_intra + intra)
    assert decode[0] == pytest.approx(5e-6 + 4 * 1e-9 * 1e6 + 2e-6)
    # With 2 ranks per machine a count takes 2 bits, as the rows: the rows go across,
    # the whole group's bytes, and 4 rows of the group are decoded.
    pairs = machines_bench.Machines(4, 2, 100e9, 5e-6, 1.25e9, 25e-6)
    encode, collective, decode = machines_bench.TwoLevelGroupCosts(
        fit, wire, "allgather", pairs, decode_rows=True, votes=True)(np.array([0]),
                                                                     np.array([1]))
    assert encode[0] == pytest.approx(1e-5 + 2e-9 * 8e6 + 3e-6)
    rows_cross = 3 * (4 + 0.125 * 8e6) / (1.25e9 / 2) + 3 * 25e-6
    rows_intra = 1 / 2 * (4 + 0.125 * 8e6) / 100e9 + 5e-6
    pairs_intra = 1 / 2 * 32e6 / 100e9 + 5e-6
    assert collective[0] == pytest.approx(4e-5 + rows_cross + rows_intra + pairs_intra)
    assert decode[0] == pytest.approx(5e-6 + 4 * 1e-9 * 8e6 + 2e-6)
    # Horovod's hierarchical allreduce of 32 MB: inside, then 4 MB shards across
    hierarchical = machines_bench.HierarchicalNetwork(cluster).collective("allreduce", 32e6)
    assert hierarchical == pytest.approx(
        2 * intra + 2 * 3 / 4 * 4e6 / (1.25e9 / 8) + 2 * 3 * 25e-6)
    with pytest.raises(ValueError, match="allreduce"):
        machines_bench.HierarchicalNetwork(cluster).collective("allgather", 1e6)


def test_intra_presets_and_rates():
    from benchmarks import machines as machines_bench

    assert machines_bench.parse_intra("nvlink4")[1] == pytest.approx(360e9)
    assert machines_bench.parse_intra("100GB/s")[1] == pytest.approx(100e9)
    with pytest.raises(ValueError, match="nvlink4"):
        machines_bench.parse_intra("warp drive")
    with pytest.raises(ValueError):
        machines_bench.Machines(0, 8, 1e9, 0, 1e9, 0)


def _tiny_machines_grid():
    from benchmarks import machines as machines_bench

    profile = tiny_profile()
    return profile, machines_bench.simulate_machines(
        profile, [2, 16], 4, ["1gbit", "100gbit"], intra="pcie3",
        codecs=["efsignsgd", "fp16"], log=lambda *_: None)


def test_the_level_search_on_a_grid_is_within_1pct_of_the_best():
    """4 ranks per machine over PCIe, 2 and 16 machines, 1 and 100 Gbit/s: the
    searched choice (level + partition + codec per group) is within 1% of the best
    of the flat search, the two-level search and Horovod's four configs in every cell
    (1.2% behind Horovod's hierarchical fp32 at 16 machines and 100 Gbit/s while the
    none groups copied on the compute stream)."""
    from benchmarks import machines as machines_bench

    _, result = _tiny_machines_grid()
    check = machines_bench.verdict(result)
    assert check["count"] == 8 and check["within_1pct"] == 8, check["missed"]


def test_the_level_search_goes_two_level_at_scale_and_its_flat_search_is_simulates():
    """Its flat search is ``simulate``'s per-group +fp16 search on W ranks; at 16
    machines on 1 Gbit/s the allgather codec gains by going two-level."""
    from benchmarks import machines as machines_bench

    profile, result = _tiny_machines_grid()
    check = machines_bench.verdict(result)
    assert check["count"] == 8 and check["within_1pct"] >= 6 and check["worst"] < 1.02, check
    cells = {(c["bandwidth"], c["machines"]): c["rows"] for c in result["cells"]}
    slow = cells[("1gbit", 16)]
    assert slow["efsignsgd searched"]["step_s"] < 0.9 * slow["efsignsgd flat"]["step_s"]
    assert any(c.endswith("@2") for c in slow["efsignsgd searched"]["group_codecs"] or ())
    flat = simulate.Simulation(profile).codec_configs(
        "efsignsgd", NetworkCosts(64, 1.25e8, 25e-6), plain_horovod_s=slow["horovod fp32"][
            "step_s"])[0]["searched per-group +fp16"]
    assert slow["efsignsgd flat"]["step_s"] == pytest.approx(flat[1])
    text = machines_bench.table(result)
    assert "in %d of 8 (cell, codec) pairs" % check["within_1pct"] in text


def test_machines_command_writes_its_table(tmp_path, capsys):
    from benchmarks import machines as machines_bench

    path = tmp_path / "tiny.json"
    profile_module.save(tiny_profile(), str(path))
    assert machines_bench.main(["--profile", str(path), "--machines", "2", "--ranks-per-machine",
                                "2", "--bandwidth", "1gbit", "--codecs", "topk",
                                "--out", str(tmp_path / "out"), "--name", "m"]) == 0
    assert "topk searched" in (tmp_path / "out" / "m.md").read_text()
    assert (tmp_path / "out" / "m.png").exists()
    assert machines_bench.main(["--profile", str(path), "--intra", "warp drive"]) == 2


def test_a_gpu_profile_scales_the_base_compute_to_the_devices_step():
    from benchmarks import gpu_profile

    profile = tiny_profile()
    ready = list(profile["compute"]["ready_s"])
    factor = gpu_profile.scale_compute(profile, 0.0325)
    assert factor == pytest.approx(0.5)
    assert profile["compute"]["step_s"] == pytest.approx(0.0325)
    np.testing.assert_allclose(profile["compute"]["ready_s"], np.array(ready) * 0.5)
    with pytest.raises(ValueError):
        gpu_profile.scale_compute(profile, 0)


def test_the_shipped_h200_profile_says_what_was_measured():
    shipped = profile_module.load(os.path.join(REPO, "docs", "profiles",
                                               "resnet50_h200_gpu_check.json"))
    assert "H200" in shipped["source"] and shipped["compute"]["step_s"] == pytest.approx(0.0182)
    assert "efsignsgd" in shipped["gpu_check"]["measured_codecs"]
