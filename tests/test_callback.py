"""MergeCompCallback and PartitionSearchDriver on two real Gloo workers (horovodrun).

In one horovodrun job, three Keras fits (each a fresh model, MergeComp and
callback): the first searches and saves; the second, same model, reuses the
file without searching; the third, a different model, searches again and says
why. A second job searches in a custom loop with DistributedGradientTape
through PartitionSearchDriver.function, rank 0 writing TensorBoard scalars and
the PNG. A third job gives a save_path that cannot be written: every rank
fails before the first step.
"""

import json

import numpy as np
import pytest

from tests import horovodrun

CODEC = "efsignsgd"
FINALISTS = 2  # tests/workers/search_callback.py's SEARCH
ROUNDS = 3
RESOLVE_ROUNDS = 2


PLAIN_HOROVOD = "plain Horovod"


def _key(layout):
    return layout if isinstance(layout, str) else tuple(layout)


def _check_ranks_agree_and_train(r0, r1):
    assert r0["splits"] == r1["splits"] and r0["group_codecs"] == r1["group_codecs"]
    assert r0["steps_aside"] == r1["steps_aside"]
    assert r0["candidates"] == r1["candidates"]  # same candidates, same averaged times
    assert r0["checksum"] == r1["checksum"]  # identical weights
    assert r0["done"] and r1["done"]
    assert r0["losses"][-1] < 0.9 * r0["losses"][0], r0["losses"]
    if r0["steps_aside"]:  # plain Horovod chosen: Horovod's collectives, not MergeComp's
        assert r0["final_collectives_per_step"] == 0 and r0["groups"] is None
        return r0
    groups = len(r0["splits"]) + 1
    assert r0["groups"] == groups
    assert r0["final_collectives_per_step"] == groups * r0["collectives_per_group"]
    return r0


def _check_search(r):
    n = r["tensors"]
    candidates = {_key(splits): (rounds, collectives, groups, role)
                  for splits, rounds, collectives, groups, role, _ in r["candidates"]}
    # The three sentinels and the finalists, each timed in every round it took part in.
    assert () in candidates and tuple(range(1, n)) in candidates and PLAIN_HOROVOD in candidates
    assert candidates[()][3] == "one group" and candidates[tuple(range(1, n))][3] == "layer-wise"
    assert candidates[PLAIN_HOROVOD][3] == "plain Horovod"
    assert 4 <= len(candidates) <= 3 + FINALISTS
    leader, extra = _key(r["leader"]), r["extra_rounds"]
    assert 0 <= extra <= RESOLVE_ROUNDS and (extra == 0 or leader != ())
    for splits, (rounds, collectives, groups, _) in candidates.items():
        if splits == PLAIN_HOROVOD:
            assert groups is None and collectives == 0
        else:
            assert groups == len(splits) + 1
            assert collectives == groups * r["collectives_per_group"]
        # Only the leader and one group are timed in the extra rounds.
        most = ROUNDS + (extra if splits in (leader, ()) else 0)
        assert 1 <= len(rounds) <= most and all(s > 0 for s in rounds)
    # One group is timed in every round, and each candidate judged by its median ratio to one
    # group in the same rounds (a dropped candidate's rounds are the first ones): so the leader
    # is never measured slower than one group side by side, nor than layer-wise.
    reference = candidates[()][0]
    assert len(reference) == max(len(rounds) for rounds, _, _, _ in candidates.values())
    planned = {splits: [t / reference[i] for i, t in enumerate(rounds[:ROUNDS])]
               for splits, (rounds, _, _, _) in candidates.items()}
    ratios = {splits: float(np.median(values)) for splits, values in planned.items()}
    assert leader == min(ratios, key=lambda s: (ratios[s], len(s)))
    assert ratios[leader] <= min(1.0, ratios[tuple(range(1, n))])
    # The leader replaces one group only if its gain over all its rounds exceeds two
    # standard errors of the mean log ratio.
    choice = _key(r["choice"])
    if leader == ():
        assert choice == ()
    else:
        logs = np.log([t / reference[i] for i, t in enumerate(candidates[leader][0])])
        resolved = logs.mean() + 2 * logs.std(ddof=1) / np.sqrt(len(logs)) < 0
        assert choice == (leader if resolved else ())
    # What it cost: one trace per candidate (the profile's trains one group).
    assert r["cost"]["traces"] == len(candidates)
    assert r["cost"]["steps"] <= 111 + RESOLVE_ROUNDS * 2 * (1 + 2)
    assert r["cost"]["seconds"] > 0
    # Horovod restarted before every turn of a candidate (the untimed one each
    # trains before the rounds, then the timed ones) and once more for the
    # choice, emptying its response cache each time.
    turns = sum(len(rounds) for rounds, _, _, _ in candidates.values())
    assert r["cost"]["horovod_restarts"] == len(candidates) + turns + 1


@pytest.mark.multiworker
def test_keras_search_saves_and_a_second_run_reuses_it(tmp_path):
    path = tmp_path / "partition.json"
    results, output = horovodrun.run("search_callback.py", args=[CODEC, "keras", path, "32,32,24"],
                                     timeout=300)
    assert len(results[0]) == len(results[1]) == 3
    first, second, third = (_check_ranks_agree_and_train(a, b) for a, b in zip(results[0], results[1]))

    _check_search(first)
    assert "no saved partition" in first["reason"]
    assert first["plot_path"] == str(tmp_path / "partition.png")
    saved = json.loads(path.read_text())
    assert saved["world_size"] == 2
    assert saved["compression"]["compressor"] == CODEC
    assert saved["settings"]["resolve_rounds"] == RESOLVE_ROUNDS
    assert saved["settings"]["standard_errors"] == 2.0
    assert saved["cost"]["traces"] <= 3 + FINALISTS

    assert second["candidates"] == []
    assert second["cost"]["steps"] == 1  # only the first (tracing) step
    # That step's trace (one group), and the saved partition's unless it is one group.
    assert second["cost"]["traces"] == (1 if first["splits"] == [] else 2)
    assert second["steps_aside"] == first["steps_aside"]
    assert second["group_codecs"] == first["group_codecs"]
    assert saved["plain_horovod"] == first["steps_aside"]
    assert second["loaded_from"] == str(path)
    assert second["cost"]["horovod_restarts"] == 1  # for the saved partition
    assert second["splits"] == first["splits"]
    assert "reusing the partition saved in" in output

    assert "different model fingerprint" in third["reason"]
    _check_search(third)
    # The third fit's search replaced the file with its own result.
    assert saved["partition"] == (third["splits"] or [])
    assert saved["plain_horovod"] == third["steps_aside"]
    assert [PLAIN_HOROVOD if c["plain_horovod"] else c["splits"]
            for c in saved["search"]["candidates"]] == [c[0] for c in third["candidates"]]
    assert (tmp_path / "partition.png").stat().st_size > 10_000
    search_lines = [line for line in output.splitlines() if "MergeComp search: " in line]
    assert search_lines and all(line.startswith("[0]") for line in search_lines)  # rank 0 logs
    chose = [line for line in search_lines if "MergeComp search: chose " in line]
    assert len(chose) == 2 and all("traces of the train step" in line for line in chose)
    # The warnings the search causes on purpose stay out of the log (SearchNoise).
    assert "triggered tf.function retracing" not in output
    assert "is slow compared to the batch time" not in output


@pytest.mark.multiworker
def test_custom_loop_partition_search(tmp_path):
    log_dir = tmp_path / "tensorboard"
    results, _ = horovodrun.run("search_callback.py", args=[CODEC, "tape", str(log_dir)],
                                timeout=240)
    (r0,), (r1,) = results[0], results[1]
    r = _check_ranks_agree_and_train(r0, r1)
    _check_search(r)
    # Rank 0 alone wrote one TensorBoard scalar per candidate, its median
    # over rounds, and the picture.
    scalars = _tensorboard_scalars(log_dir)
    medians = [float(np.median(c[1])) for c in r["candidates"]]
    logged = scalars["mergecomp_search/candidate_seconds"]
    assert [step for step, _ in logged] == list(range(1, len(medians) + 1))
    assert [value for _, value in logged] == pytest.approx(medians, rel=1e-6)
    assert [g for _, g in scalars["mergecomp_search/candidate_groups"]] == [
        c[3] for c in r["candidates"] if c[3] is not None]
    chosen = [c[0] for c in r["candidates"]].index(r["choice"])
    assert scalars["mergecomp_search/chosen_seconds"][-1][1] == pytest.approx(medians[chosen],
                                                                               rel=1e-6)
    assert r["plot_path"] == str(log_dir / "mergecomp_search.png")
    assert (log_dir / "mergecomp_search.png").exists()


@pytest.mark.multiworker
def test_unwritable_save_path_fails_on_every_rank_before_training(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    results, output = horovodrun.run("search_callback.py",
                                     args=[CODEC, "unwritable", blocker / "partition.json"],
                                     timeout=120)
    for rank in (0, 1):
        (r,) = results[rank]
        assert r["error"] and "cannot be written" in r["error"], r
        assert r["steps_seen"] == 0


def _tensorboard_scalars(log_dir):
    """tag -> [(step, value)] from every event file under log_dir (one writer expected)."""
    import tensorflow as tf

    files = sorted(log_dir.glob("events.out.tfevents.*"))
    assert len(files) == 1, files  # rank 1 writes none
    scalars = {}
    for record in tf.data.TFRecordDataset([str(f) for f in files]):
        event = tf.compat.v1.Event.FromString(record.numpy())
        for value in event.summary.value:
            number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value
            scalars.setdefault(value.tag, []).append((event.step, number))
    return scalars


class _FakeHorovod:
    """What restart_blocker asks of Horovod, as a launch would answer it."""

    def __init__(self, size=2, mpi=False, gloo=True, initialized=True):
        self._size, self._mpi, self._gloo, self._initialized = size, mpi, gloo, initialized

    def is_initialized(self):
        return self._initialized

    def size(self):
        return self._size

    def mpi_enabled(self):
        return self._mpi

    def gloo_enabled(self):
        return self._gloo


@pytest.mark.parametrize("fake, env, reason", [
    (_FakeHorovod(initialized=False), {}, "not initialized"),
    (_FakeHorovod(size=1), {}, "one rank"),
    (_FakeHorovod(mpi=True, gloo=False), {}, "MPI"),
    (_FakeHorovod(), {"HOROVOD_GLOO_RENDEZVOUS_ADDR": None}, "not launched by horovodrun"),
    (_FakeHorovod(), {"HOROVOD_ELASTIC": "1"}, "elastic"),
    (_FakeHorovod(), {"HOROVOD_TIMELINE": "/tmp/t.json"}, "timeline"),
    (_FakeHorovod(), {"HOROVOD_AUTOTUNE": "1"}, "autotunes"),
    (_FakeHorovod(), {"HOROVOD_CACHE_CAPACITY": "0"}, "cache is off"),
])
def test_horovod_is_restarted_only_where_the_restart_rebuilds_everything(fake, env, reason,
                                                                         monkeypatch):
    from tf_mergecomp.search import restart as horovod_restart

    monkeypatch.setattr(horovod_restart, "_process_sets", lambda: {})
    launch = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_CACHE_CAPACITY": "1024"}
    assert horovod_restart.restart_blocker(_FakeHorovod(), launch) is None
    launch.update(env)
    launch = {k: v for k, v in launch.items() if v is not None}
    assert reason in horovod_restart.restart_blocker(fake, launch)
    plain = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1"}
    # Process sets numbered 1 to n are made again under their ids (2 x 2 machines' sets).
    machines = {1: [0, 1], 2: [2, 3], 3: [0, 2], 4: [1, 3]}
    monkeypatch.setattr(horovod_restart, "_process_sets", lambda: machines)
    assert horovod_restart.restart_blocker(_FakeHorovod(), plain) is None
    # A removed set leaves a gap that a restart would close: no restart.
    monkeypatch.setattr(horovod_restart, "_process_sets", lambda: {1: [0, 1], 3: [0, 2]})
    assert "ids [1, 3]" in horovod_restart.restart_blocker(_FakeHorovod(), plain)
    # Unknown process sets (Horovod lists them only privately): no restart.
    monkeypatch.setattr(horovod_restart, "_process_sets", lambda: None)
    assert "process sets" in horovod_restart.restart_blocker(_FakeHorovod(), plain)


def test_confirm_turns_last_at_least_min_turn_seconds_within_a_bound():
    from tf_mergecomp.search.settings import MAX_TURN_FACTOR, steps_per_turn

    assert steps_per_turn(0.020, 3, 0.0) == 3  # off
    assert steps_per_turn(0.250, 3, 0.2) == 3  # 3 steps already last 0.75 s
    assert steps_per_turn(0.040, 3, 0.2) == 5  # ceil(0.2 / 0.04)
    assert steps_per_turn(0.021, 3, 0.2) == 10  # ceil(9.5)
    assert steps_per_turn(0.005, 3, 0.5) == 30  # ceil(100), bounded
    assert steps_per_turn(0.001, 2, 0.2) == MAX_TURN_FACTOR * 2
    assert steps_per_turn(float("nan"), 3, 0.2) == 3  # no profiled step time


@pytest.mark.parametrize("value", [-0.1, float("inf"), "0.2", True, None])
def test_a_bad_min_turn_seconds_is_refused_at_construction(value):
    from tf_mergecomp import MergeComp
    from tf_mergecomp.search.driver import PartitionSearchDriver

    with pytest.raises(ValueError, match="min_turn_seconds"):
        PartitionSearchDriver(MergeComp("fp16"), min_turn_seconds=value)


def test_numpy_scalars_are_accepted_as_the_search_settings():
    import numpy as np

    from tf_mergecomp import MergeComp
    from tf_mergecomp.search import PartitionSearchAlgorithm, PartitionSearchDriver

    driver = PartitionSearchDriver(MergeComp("fp16"), max_groups=np.int64(3), rounds=np.int32(2),
                                   steps_per_candidate=np.int64(2),
                                   min_turn_seconds=np.float32(0.25))
    assert (driver.max_groups, driver.rounds, driver.min_turn_seconds) == (3, 2, 0.25)
    assert PartitionSearchAlgorithm([4, 8, 16], max_groups=np.int64(2)).max_groups == 2
    with pytest.raises(ValueError, match="max_groups must be an integer >= 1"):
        PartitionSearchDriver(MergeComp("fp16"), max_groups=np.float64(2.0))


def test_search_noise_keeps_only_the_searchs_own_warnings_out_while_installed():
    import logging

    from tf_mergecomp.search.report import SearchNoise

    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("tensorflow")
    logger.addHandler(handler)
    retracing = ("5 out of the last 22 calls to <function train_function> triggered "
                 "tf.function retracing. Tracing is expensive ...")
    slow = ("Callback method `on_train_batch_end` is slow compared to the batch time "
            "(batch time: 0.0100s vs `on_train_batch_end` time: 0.0300s). Check your callbacks.")
    noise = SearchNoise()
    try:
        noise.install()
        for message in (retracing, slow, "another warning"):
            logger.warning(message)
        assert seen == ["another warning"]
        noise.remove()
        logger.warning(retracing)
        assert seen == ["another warning", retracing]
    finally:
        noise.remove()
        logger.removeHandler(handler)
