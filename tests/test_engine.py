"""The MergeComp engine through Horovod's own wrappers, on real Gloo workers."""

import pytest

from tests import horovodrun
from tf_mergecomp import MergeComp, compressors


def test_none_matches_stock_horovod_for_every_partition():
    results, _ = horovodrun.run("engine_matches_horovod.py", np=2)
    for rank in (0, 1):
        by_partition = {(r["partitions"], r["function"]): r for r in results[rank]}
        assert len(by_partition) == 6
        for (partitions, _), r in by_partition.items():
            assert r["max_abs_error"] <= 1e-6, r
            assert r["groups"] == {"layerwise": 6, 1: 1, 3: 3}[partitions]
            assert r["collectives"] == r["groups"]


def _check_algorithm_results(results, world):
    per_rank = [{(r["algorithm"], r["mode"]): r for r in results[rank]} for rank in range(world)]
    assert per_rank[0] and all(set(p) == set(per_rank[0]) for p in per_rank)
    for key, r in per_rank[0].items():
        for other in per_rank[1:]:
            assert other[key]["checksum"] == r["checksum"], ("weights differ across ranks", key)
        assert r["last_loss"] < r["first_loss"], ("loss did not fall", key, r)
        assert r["collectives"] == r["expected"], ("collectives per step", key, r)
    return per_rank[0]


def test_every_algorithm_trains_identically_on_two_ranks():
    results, _ = horovodrun.run("engine_algorithms.py", np=2, timeout=420)
    seen = _check_algorithm_results(results, 2)
    assert {name for name, _ in seen} == set(compressors.NAMES)


def test_three_ranks():
    results, _ = horovodrun.run("engine_algorithms.py", np=3, args=["signsgd,topk"], timeout=300)
    _check_algorithm_results(results, 3)


def test_randomk_merged_trains_exactly_as_layerwise():
    results, _ = horovodrun.run("engine_randomk_merged.py", np=2)
    for rank in (0, 1):
        by_partition = {r["partitions"]: r for r in results[rank]}
        assert set(by_partition) == {"layerwise", 3, 1}
        for partitions, r in by_partition.items():
            assert r["moved"] > 0.01, r  # it trained
            assert r["max_difference"] == 0.0, r
            assert r["collectives"] == 20 * r["groups"], r
        assert by_partition[1]["groups"] == 1 and by_partition["layerwise"]["groups"] == 6


def test_embedding_unused_variable_batch_norm_and_aggregation_train_under_fit():
    results, _ = horovodrun.run("engine_special_gradients.py", np=2)
    (r0, a0), (r1, a1) = results[0], results[1]
    assert r0["checksum"] == r1["checksum"]
    assert r0["losses"][-1] < r0["losses"][0]
    # The unused variable's None gradient is left out of the groups.
    assert r0["tensors"] == r0["trainable"] - 1
    # backward_passes_per_step=2: one reduction every second batch.
    assert a0["checksum"] == a1["checksum"]
    assert a0["losses"][-1] < a0["losses"][0]
    assert a0["reductions"] * 2 == a0["batches"]
    assert a0["collectives"] == a0["reductions"] * a0["groups"]


def test_rank_with_a_different_model_fails_fast_on_every_rank():
    _, output = horovodrun.run("engine_rank_mismatch.py", np=2, timeout=120, expect_failure=True)
    assert "UNEXPECTED" not in output
    for rank in (0, 1):
        assert any(line.startswith("[%d]" % rank) and "ranks disagree on 'shapes'" in line
                   for line in output.splitlines()), output[-4000:]


def test_error_feedback_state_checkpoints_and_restores(tmp_path):
    results, _ = horovodrun.run("engine_checkpoint.py", np=2, args=[tmp_path])
    for rank in (0, 1):
        (r,) = results[rank]
        assert r["same_keys"]
        assert any("momentum" in name for name in r["state_names"])
        assert r["nonzero_state"] > 0
        assert r["max_difference"] == 0.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(compressor="nope"), "valid choices: none, fp16"),
    (dict(compressor="topk", ratio=0.0), r"ratio must be a number in \(0, 1\]"),
    (dict(compressor="topk", ratio=1.5), r"ratio must be a number in \(0, 1\]"),
    (dict(compressor="qsgd", levels=0), "levels"),
    (dict(compressor="powersgd", rank=0), "rank"),
    (dict(compressor="topk", ratoi=0.1), "valid parameters: "),
    (dict(compressor="none", memory="nope"), "valid choices: none, residual, dgc, momentum"),
    (dict(compressor="none", partitions=0), "partitions must be >= 1"),
    (dict(compressor="none", partitions=[3, 2]), "strictly increasing"),
    (dict(compressor="none", partitions="all"), "layerwise"),
    (dict(compressor="none", seed=-1), "seed"),
])
def test_bad_arguments_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MergeComp(**kwargs)


def test_stock_compression_is_untouched():
    import horovod.tensorflow as hvd

    import tf_mergecomp.horovod_hook as hook

    assert not hook.install()  # already installed on import; idempotent
    original = getattr(hvd._make_allreduce_grads_fn, hook._INSTALLED_MARK)
    ours = hvd._make_allreduce_grads_fn("x", "", "", hvd.Compression.fp16, False, hvd.Average, 1.0, None,
                                        process_set=hvd.global_process_set)
    theirs = original("x", "", "", hvd.Compression.fp16, False, hvd.Average, 1.0, None,
                      process_set=hvd.global_process_set)
    assert ours is theirs  # Horovod's cache returns the very same function


def test_horovod_groups_argument_is_refused():
    import horovod.tensorflow as hvd

    with pytest.raises(ValueError, match="groups="):
        hvd._make_allreduce_grads_fn("x", "", "", MergeComp("none"), False, hvd.Average, 1.0, 2,
                                     process_set=hvd.global_process_set)
