"""MergeCompCallback and PartitionSearch on two real Gloo workers (horovodrun).

In one horovodrun job, three Keras fits (each a fresh model, MergeComp and
callback): the first searches and saves; the second, same model, reuses the
file without searching; the third, a different model, searches again and says
why. A second job searches in a custom loop with DistributedGradientTape
through PartitionSearch.function, rank 0 writing TensorBoard scalars.
"""

import json

import pytest

from tests import horovodrun

CODEC = "efsignsgd"


def _check_ranks_agree_and_train(r0, r1):
    assert r0["splits"] == r1["splits"]
    assert r0["candidates"] == r1["candidates"]  # same candidates, same averaged times
    assert r0["checksum"] == r1["checksum"]  # identical weights
    assert r0["done"] and r1["done"]
    assert r0["losses"][-1] < 0.9 * r0["losses"][0], r0["losses"]
    groups = len(r0["splits"]) + 1
    assert r0["groups"] == groups
    assert r0["final_collectives_per_step"] == groups * r0["collectives_per_group"]
    return r0


def _check_search(r):
    assert r["candidates"], "no candidate was measured"
    for splits, seconds, collectives, groups in r["candidates"]:
        assert groups == len(splits) + 1
        assert collectives == groups * r["collectives_per_group"]
        assert seconds > 0
    measured = {tuple(splits): seconds for splits, seconds, _, _ in r["candidates"]}
    assert () in measured and tuple(range(1, r["tensors"])) in measured  # the sentinels
    assert measured[tuple(r["splits"])] == min(measured.values())
    assert len(r["splits"]) + 1 <= 3 or r["splits"] == list(range(1, r["tensors"]))


def test_keras_search_saves_and_a_second_run_reuses_it(tmp_path):
    path = tmp_path / "partition.json"
    results, output = horovodrun.run("search_callback.py", args=[CODEC, "keras", path, "32,32,24"],
                                     timeout=240)
    assert len(results[0]) == len(results[1]) == 3
    first, second, third = (_check_ranks_agree_and_train(a, b) for a, b in zip(results[0], results[1]))

    _check_search(first)
    assert "no saved partition" in first["reason"]
    saved = json.loads(path.read_text())
    assert saved["world_size"] == 2
    assert saved["compression"]["compressor"] == CODEC

    assert second["candidates"] == []
    assert second["search_steps"] == 1  # only the first (tracing) step
    assert second["loaded_from"] == str(path)
    assert second["splits"] == first["splits"]
    assert "reusing the partition saved in" in output

    assert "different model fingerprint" in third["reason"]
    _check_search(third)
    # The third fit's search replaced the file with its own result.
    assert saved["partition"] == third["splits"]
    assert len(saved["measurements"]) == len(third["candidates"])
    candidate_lines = [line for line in output.splitlines() if "MergeComp search: candidate " in line]
    assert len(candidate_lines) == len(first["candidates"]) + len(third["candidates"])
    assert all(line.startswith("[0]") for line in candidate_lines)  # rank 0 logs


def test_custom_loop_partition_search(tmp_path):
    log_dir = tmp_path / "tensorboard"
    results, _ = horovodrun.run("search_callback.py", args=[CODEC, "tape", str(log_dir)],
                                timeout=240)
    (r0,), (r1,) = results[0], results[1]
    r = _check_ranks_agree_and_train(r0, r1)
    _check_search(r)
    # Rank 0 alone wrote one TensorBoard scalar per candidate: its averaged time.
    scalars = _tensorboard_scalars(log_dir)
    seconds = [c[1] for c in r["candidates"]]
    logged = scalars["mergecomp_search/candidate_seconds"]
    assert [step for step, _ in logged] == list(range(1, len(seconds) + 1))
    assert [value for _, value in logged] == pytest.approx(seconds, rel=1e-6)
    assert [g for _, g in scalars["mergecomp_search/candidate_groups"]] == [
        c[3] for c in r["candidates"]]
    assert scalars["mergecomp_search/best_seconds"][-1][1] == pytest.approx(min(seconds), rel=1e-6)


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
