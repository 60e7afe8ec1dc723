"""tf_mergecomp.keras (Keras 3, TensorFlow backend) on two real Gloo workers (horovodrun -np 2).

The workers run with TF_USE_LEGACY_KERAS removed from their environment, so
that tf.keras is Keras 3 (tests/workers/keras3_common.py checks it). Each rank
trains on its own data: identical weights afterwards show that the gradients
were averaged, and the control (a plain Keras 3 optimizer) shows that the check
catches an optimizer that does not average.
"""

import importlib.metadata
import re

import pytest

from tests import horovodrun

try:
    KERAS_MAJOR = int(importlib.metadata.version("keras").split(".")[0])
except importlib.metadata.PackageNotFoundError:
    KERAS_MAJOR = 0

pytestmark = [pytest.mark.multiworker,
              pytest.mark.skipif(KERAS_MAJOR < 3, reason="needs Keras 3 (TensorFlow >= 2.16)")]
KERAS3 = {"TF_USE_LEGACY_KERAS": None}
AVERAGED = ("none", "efsignsgd", "dgc_accum", "lso", "mixed", "tape")


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    directory = tmp_path_factory.mktemp("keras3")
    results, _ = horovodrun.run(
        "keras3_fit.py", args=["control," + ",".join(AVERAGED) + ",resume", directory],
        env=KERAS3, timeout=300)
    return {r["scenario"]: (r, results[1][i]) for i, r in enumerate(results[0])}


def test_plain_keras3_optimizer_diverges(scenarios):
    r0, r1 = scenarios["control"]
    assert abs(r0["checksum"] - r1["checksum"]) > 1e-3


@pytest.mark.parametrize("name", AVERAGED)
def test_ranks_end_with_identical_weights(scenarios, name):
    r0, r1 = scenarios[name]
    assert r0["checksum"] == r1["checksum"]
    if name != "tape":  # MetricAverageCallback: the same logs on every rank
        assert r0["loss"] == r1["loss"] and r0["accuracy"] == r1["accuracy"]
    if name not in ("none", "lso"):
        assert r0["loss"][-1] < r0["loss"][0]
    if name != "none":  # each rank keeps its own error-feedback state
        assert r0["state_finite"] and r1["state_finite"]
        assert r0["state_sum"] > 0 and r0["state_sum"] != r1["state_sum"]
        assert r0["step"] == r1["step"]


def test_one_group_and_gradient_accumulation(scenarios):
    r0, _ = scenarios["efsignsgd"]
    assert r0["groups"] == 1 and r0["collectives"] == r0["step"] == 24  # 8 steps x 3 epochs
    r0, _ = scenarios["dgc_accum"]
    # Averaged per micro-batch (24 exchanges), applied every second one.
    assert r0["groups"] == 1 and r0["step"] == 24 and r0["iterations"] == 12


def test_loss_scale_overflow_skips_on_every_rank(scenarios):
    r0, r1 = scenarios["lso"]
    assert r0["scale"] == r1["scale"] < 2.0 ** 40
    assert r0["step"] < 24  # overflowing steps leave MergeComp's step (and state) alone
    m0, _ = scenarios["mixed"]
    assert m0["outer"] == "LossScaleOptimizer" and m0["outer_distributed"]


def test_per_rank_weights_files_resume_exactly(scenarios):
    r0, r1 = scenarios["resume"]
    assert r0 == r1
    assert r0["own"] == r0["straight"] and r0["own_outcome"]["kept"]
    assert r0["own_step"] == 2 * r0["saved_step"]
    assert not r0["rank0_outcome"]["kept"] and "reset" in r0["rank0_outcome"]["warning"]
    assert r0["rank0"] != r0["straight"]


def test_partition_search_in_keras3_fit(tmp_path):
    path = tmp_path / "partition.json"
    results, output = horovodrun.run("keras3_search.py", args=["efsignsgd", path], env=KERAS3,
                                     timeout=300)
    r0, r1 = results[0][0], results[1][0]
    assert r0["done"] and r1["done"] and path.exists()
    assert r0["checksum"] == r1["checksum"] and r0["splits"] == r1["splits"]
    assert r0["candidates"] == r1["candidates"] and 4 <= len(r0["candidates"]) <= 5
    assert r0["cost"]["traces"] == len(r0["candidates"])
    assert 0 < r0["cost"]["tracings"] <= 6
    assert r0["losses"][-1] < r0["losses"][0]
    if not r0["steps_aside"]:
        assert r0["final_collectives_per_step"] == r0["groups"] * r0["collectives_per_group"]
    assert "MergeComp search: chose" in output
    # Keras 3 runs the train step inlined into its caller: the profile still finds every
    # gradient's op (under the caller's node name).
    assert re.search(r"profiled one group .*: gradients ready from [\d.]+ to [\d.]+ ms\n", output)
    assert "not seen in the profile" not in output


def test_keras3_digits_example_learns():
    _, output = horovodrun.run("examples/train_digits_keras3.py", args=["--epochs", "3", "--no-search"],
                               env=KERAS3)
    accuracy = float(re.search(r"\[0\]<stdout>:test loss [\d.]+, test accuracy ([\d.]+)",
                               output).group(1))
    assert accuracy > 0.8, output[-3000:]
    assert "weights identical on all 2 ranks: yes" in output
    assert "jit_compile='auto' -> False" in output
