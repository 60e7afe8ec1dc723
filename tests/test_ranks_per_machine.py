"""Machines of several ranks on the virtual cluster: the launchers' slot plan and command
line, the options of ``benchmarks.launcher`` and ``python -m benchmarks cluster``, and the
cluster worker's MergeComp level and process sets. No root needed."""

import argparse
import json
import os
import sys

import pytest

from benchmarks import cluster, launcher, worker
from benchmarks.__main__ import build_parser


class FakeServers:
    hosts = ["a", "b"]
    port = 2222
    identity_file = "/keys/id_ed25519"


def test_horovodrun_puts_the_ranks_per_machine_on_every_host():
    command = launcher.horovodrun_command(FakeServers(), ["train.py"], ranks_per_machine=2)
    assert command[command.index("-np") + 1] == "4"
    assert command[command.index("-H") + 1] == "a:2,b:2"
    assert command[-2:] == [sys.executable, "train.py"]
    one = launcher.horovodrun_command(FakeServers(), ["train.py"])
    assert one[one.index("-np") + 1] == "2" and one[one.index("-H") + 1] == "a:1,b:1"


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, None])
def test_ranks_per_machine_is_an_integer_of_at_least_one(bad):
    with pytest.raises(ValueError, match="integer >= 1"):
        launcher.check_ranks_per_machine(bad)
    with pytest.raises(ValueError, match="integer >= 1"):
        launcher.horovodrun_command(FakeServers(), ["train.py"], ranks_per_machine=bad)
    with pytest.raises(ValueError, match="integer >= 1"):
        with launcher.open_launcher("direct", cluster=None, ranks_per_machine=bad):
            pass


def test_ranks_of_one_machine_are_consecutive_as_horovodrun_places_them():
    placements = [launcher.rank_placement(rank, 4, 2) for rank in range(4)]
    assert [p["local_rank"] for p in placements] == [0, 1, 0, 1]
    assert [p["cross_rank"] for p in placements] == [0, 0, 1, 1]
    assert {(p["local_size"], p["cross_size"]) for p in placements} == {(2, 2)}
    with pytest.raises(ValueError, match="do not fill machines of 2"):
        launcher.rank_placement(0, 3, 2)
    env = launcher.rank_environment(3, 4, "b", "lo", "127.0.0.1", 1234, ranks_per_machine=2)
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_HOSTNAME"]) == ("3", "4", "b")
    assert (env["HOROVOD_LOCAL_RANK"], env["HOROVOD_LOCAL_SIZE"]) == ("1", "2")
    assert (env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"]) == ("1", "2")


class FakeCluster:
    """Two "namespaces" that run their ranks on this machine, each marked by its index."""
    namespaces = ["ns0", "ns1"]
    server_address = "127.0.0.1"
    iface = "lo"

    def exec_prefix(self, machine):
        return ["env", "FAKE_MACHINE=%d" % machine]


def test_the_direct_launcher_starts_each_machines_ranks_in_its_namespace(tmp_path):
    script = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in ("
              "'FAKE_MACHINE', 'HOROVOD_RANK', 'HOROVOD_HOSTNAME', 'HOROVOD_LOCAL_RANK', "
              "'HOROVOD_LOCAL_SIZE', 'HOROVOD_CROSS_RANK', 'HOROVOD_CROSS_SIZE')}))")
    with launcher.open_launcher("direct", FakeCluster(), ranks_per_machine=2) as run:
        logs = run(["-c", script], str(tmp_path), timeout_s=120)
    seen = [json.loads(open(path).read().strip().splitlines()[-1]) for path in logs]
    assert [s["HOROVOD_RANK"] for s in seen] == ["0", "1", "2", "3"]
    assert [s["FAKE_MACHINE"] for s in seen] == ["0", "0", "1", "1"]
    assert [s["HOROVOD_HOSTNAME"] for s in seen] == ["ns0", "ns0", "ns1", "ns1"]
    assert [s["HOROVOD_LOCAL_RANK"] for s in seen] == ["0", "1", "0", "1"]
    assert [s["HOROVOD_CROSS_RANK"] for s in seen] == ["0", "0", "1", "1"]
    assert {(s["HOROVOD_LOCAL_SIZE"], s["HOROVOD_CROSS_SIZE"]) for s in seen} == {("2", "2")}


def test_the_rendezvous_server_serves_the_machines_slot_plan():
    pytest.importorskip("horovod.runner.http.http_server")
    with launcher.RendezvousServer("127.0.0.1") as server:
        server.start(["ns0", "ns1"], ranks_per_machine=2)
        # Gloo's scopes: all 4 ranks, 2 on each machine, 2 machines per local rank.
        assert server._server.scope_size == {"global": 4, "local_ns0": 2, "local_ns1": 2,
                                             "cross_0": 2, "cross_1": 2}


def test_the_launcher_refuses_a_bad_ranks_per_machine_before_building_anything(capsys):
    with pytest.raises(SystemExit) as exit_:
        launcher.main(["--ranks-per-machine", "0", "examples/train_digits.py"])
    assert exit_.value.code == 2
    assert "integer >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["cluster", "--ranks-per-machine", "0"], "integer >= 1"),
    (["cluster", "--ranks-per-machine", "two"], "integer >= 1"),
    (["cluster", "--hierarchical", "maybe"], "auto, true, false"),
])
def test_cluster_refuses_bad_machine_options(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err.replace("'", "")


def test_cluster_passes_the_ranks_per_machine_and_the_level_on():
    args = build_parser().parse_args(["cluster", "--ranks-per-machine", "2",
                                      "--hierarchical", "true"])
    assert cluster.check_args(args) is args
    assert cluster.ranks_per_machine(args) == 2
    spec = cluster.batch_spec("transformer", [], args, "r{rank}.json", compute_steps=0)
    assert spec["hierarchical"] is True
    defaults = build_parser().parse_args(["cluster"])
    assert (defaults.ranks_per_machine, defaults.hierarchical) == (1, "auto")
    assert cluster.batch_spec("transformer", [], defaults, "r", 0)["hierarchical"] is None
    assert cluster.ranks_per_machine(argparse.Namespace()) == 1  # a run before the option
    args.ranks_per_machine = 0
    with pytest.raises(ValueError, match="integer >= 1"):
        cluster.check_args(args)
    args.ranks_per_machine, args.hierarchical = 2, "yes"
    with pytest.raises(ValueError, match="auto, true, false"):
        cluster.check_args(args)


def test_throughput_and_header_count_every_rank_of_every_machine():
    result = {"label": "horovod fp32", "config": {"kind": "horovod", "compression": "none"},
              "ok": True, "step_times_s": [0.5, 0.5], "cpu_s": 1.0, "elapsed_s": 1.0,
              "first_steps_s": 1.0}
    group = {"model": "transformer", "workers": 2, "ranks_per_machine": 2, "batch_size": 32,
             "ranks": [{"rank": r, "results": [result]} for r in range(4)]}
    row = cluster.summarize(group)[0]
    assert "error" not in row
    assert row["images_per_s"] == pytest.approx(4 * 32 / 0.5)
    summary = {"bandwidth": "1gbit", "batch_size": 32, "ranks_per_machine": 2,
               "hierarchical": "false", "single": [{"model": "transformer", "images_per_s": 64.0}],
               "groups": [dict(group, rows=[row])]}
    text = cluster.tables(summary)
    assert "### transformer, 2 workers x 2 ranks per machine, 1gbit links" in text
    assert "MergeComp hierarchical=false" in text
    # Scaling factor: 256 images/s over 4 ranks x 64 images/s of one rank.
    table_row = next(line for line in text.splitlines() if line.startswith("| horovod fp32"))
    assert [cell.strip() for cell in table_row.split("|")[2:4]] == ["256", "1.00"], table_row
    one_rank = dict(group, ranks_per_machine=1, ranks=group["ranks"][:2])
    assert cluster.summarize(one_rank)[0]["images_per_s"] == pytest.approx(2 * 32 / 0.5)


@pytest.mark.parametrize("choice", [None, True, False])
def test_the_worker_builds_mergecomp_with_the_level_asked(choice):
    for partition in ("one", "searched"):
        mergecomp = worker.build_compression(
            {"kind": "mergecomp", "algorithm": "efsignsgd", "partition": partition}, choice)[0]
        assert mergecomp.hierarchical is choice
    assert worker.build_compression(
        {"kind": "mergecomp", "algorithm": "topk", "partition": "one"})[0].hierarchical is None


class FakeHorovod:
    def init(self, process_sets=None):
        self.process_sets = process_sets


def test_the_worker_gives_horovod_the_machines_process_sets(monkeypatch):
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "2")
    monkeypatch.setenv("HOROVOD_SIZE", "4")
    for choice in (None, True):
        hvd = FakeHorovod()
        given = worker.init_horovod(hvd, choice)
        assert given is hvd.process_sets
        assert sorted(s.ranks for s in given) == [[0, 1], [0, 2], [1, 3], [2, 3]]
    flat = FakeHorovod()
    assert worker.init_horovod(flat, False) == [] and flat.process_sets == []
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "1")
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    one_per_machine = FakeHorovod()
    assert worker.init_horovod(one_per_machine, None) == []
    assert os.environ["HOROVOD_SIZE"] == "2"


def test_one_group_on_two_levels_is_one_group_with_the_two_level_codec():
    from tf_mergecomp.levels import TWO_LEVEL

    assert worker.fixed_layout({"algorithm": "topk", "partition": "one"}).group_codecs is None
    layout = worker.fixed_layout({"algorithm": "topk", "partition": "one_two_level"})
    assert (layout.partitions, layout.group_codecs) == (1, ["topk" + TWO_LEVEL])
    config = {"kind": "mergecomp", "algorithm": "efsignsgd", "partition": "one_two_level"}
    mergecomp = worker.build_compression(config)[0]
    assert mergecomp.hierarchical is None
    mergecomp.set_gradient_layout([(10,), (20,)], ["float32"] * 2)
    assert mergecomp.num_groups == 1
    assert list(mergecomp.group_codecs) == ["efsignsgd" + TWO_LEVEL]
    flat = worker.build_compression(dict(config, partition="one"))[0]
    flat.set_gradient_layout([(10,), (20,)], ["float32"] * 2)
    assert list(flat.group_codecs) == ["efsignsgd"]
    for forced in (True, False):
        with pytest.raises(ValueError, match="needs MergeComp\\(hierarchical=None\\)"):
            worker.build_compression(config, forced)
    # A config's own params set its level over the spec's.
    assert worker.build_compression(dict(config, partition="one", params={"hierarchical": False}),
                                    None)[0].hierarchical is False


def test_cluster_mode_one_two_level_needs_machines_of_ranks_auto_and_shardable_codecs():
    def args_of(*extra):
        return build_parser().parse_args(["cluster", "--modes", "one,one_two_level",
                                          "--algorithms", "efsignsgd,topk"] + list(extra))

    args = args_of("--ranks-per-machine", "2")
    assert cluster.check_args(args) is args
    for extra, message in ((("--ranks-per-machine", "1"), "ranks-per-machine 2 or more"),
                           (("--ranks-per-machine", "2", "--hierarchical", "false"),
                            "needs --hierarchical auto"),
                           (("--ranks-per-machine", "2", "--algorithms", "efsignsgd,powersgd"),
                            "powersgd reduces its groups itself")):
        with pytest.raises(ValueError, match=message):
            cluster.check_args(args_of(*extra))
    batches = cluster.plan_batches(["topk"], ("one", "one_two_level", "searched"))
    topk = next(b for b in batches if b[0].get("algorithm") == "topk")
    # Both fixed partitions train the searched config's model with its MergeComp.
    assert {c["label"]: c.get("model_of") for c in topk if "repeat" not in c["label"]} == {
        "topk one": "topk searched", "topk one_two_level": "topk searched", "topk searched": None}


def test_cluster_targets_give_two_levels_against_flat():
    def row(partition, turn_s):
        return {"label": "efsignsgd " + partition, "images_per_s": 128 / turn_s,
                "turn_step_s": [turn_s * f for f in (1.0, 1.02, 0.98, 1.01)],
                "config": {"kind": "mergecomp", "algorithm": "efsignsgd", "partition": partition}}

    group = {"model": "mobilenet_v2", "workers": 2, "ranks_per_machine": 2,
             "rows": [row("one", 0.5), row("one_two_level", 0.4), row("searched", 0.4)]}
    line = next(l for l in cluster.target_lines(group, None) if l.startswith("efsignsgd"))
    assert "one group, two levels / flat: 1.25x, +-" in line, line


def test_parity_on_two_machines_compares_two_levels_with_flat():
    from benchmarks import parity

    assert parity.machines_hosts(2, 1) is None
    assert parity.machines_hosts(4, 2) == "localhost:2,127.0.0.1:2"
    with pytest.raises(ValueError, match="--np must be 2N"):
        parity.machines_hosts(3, 2)
    labels = [c["label"] for c in parity.plan_configs(["topk", "powersgd"], ranks_per_machine=2)]
    assert labels == ["horovod fp32", "topk one", "topk one_two_level", "powersgd one"]
    results = [{"label": "horovod fp32", "config": {"kind": "horovod"}, "ok": True,
                "accuracy": 0.9, "ranks_identical": True}]
    for label, accuracy in (("topk one", 0.95), ("topk one_two_level", 0.94),
                            ("powersgd one", 0.93)):
        algorithm, partition = label.split()
        results.append({"label": label, "ok": True, "accuracy": accuracy, "ranks_identical": True,
                        "config": {"kind": "mergecomp", "algorithm": algorithm,
                                   "partition": partition}})
    text = parity.two_level_table({"size": 4, "machines": 2, "results": results}, epochs=8)
    assert "4 workers (2 machines x 2 ranks)" in text
    assert "| topk | 0.950 | 0.940 | -1.0 (missed) |" in text, text
    assert "| powersgd | 0.930 | - | - | no two-level reduce |" in text, text
    assert "0 of 1 codecs compared" in text
    assert parity.two_level_verdict({"accuracy": 0.948}, {"accuracy": 0.95})[1] == "met"


def test_the_report_says_whether_every_rank_ended_with_the_same_weights():
    def group_of(checksums):
        ranks = []
        for rank, checksum in enumerate(checksums):
            result = {"label": "topk one", "ok": True, "step_times_s": [0.5, 0.5], "cpu_s": 1.0,
                      "elapsed_s": 1.0, "first_steps_s": 1.0, "switch_steps_s": [0.5],
                      "weights_checksum": checksum,
                      "config": {"kind": "mergecomp", "algorithm": "topk", "partition": "one"}}
            ranks.append({"rank": rank, "results": [result]})
        group = {"model": "transformer", "workers": 2, "ranks_per_machine": 2, "batch_size": 32,
                 "ranks": ranks}
        return dict(group, rows=cluster.summarize(group))

    same = group_of([12.5] * 4)
    assert same["rows"][0]["ranks_identical"] is True
    assert "weights after the last round identical on all 4 ranks: every config" in cluster._batches_text(same)
    differing = group_of([12.5, 12.5, 12.5, 12.75])
    assert "NO, they differ in topk one" in cluster._batches_text(differing)
    assert "identical" not in cluster._batches_text(group_of([None] * 4))  # older runs

    class Weights:
        trainable_weights = [[-1.5, 2.0], [[0.25]]]

        def get_weights(self):  # with moving statistics, which each rank keeps its own
            return self.trainable_weights + [[7.0]]

    assert worker.weights_checksum(Weights()) == 3.75
