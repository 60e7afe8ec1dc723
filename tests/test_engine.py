"""The MergeComp engine through Horovod's own wrappers, on real Gloo workers."""

import numpy as np
import pytest
import tensorflow as tf

from tests import horovodrun
from tests._fake_comm import FakeWorld
from tf_mergecomp import MergeComp, compressors


@pytest.mark.multiworker
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


@pytest.mark.multiworker
def test_every_algorithm_trains_identically_on_two_ranks():
    results, _ = horovodrun.run("engine_algorithms.py", np=2, timeout=420)
    seen = _check_algorithm_results(results, 2)
    assert {name for name, _ in seen} == set(compressors.NAMES)


@pytest.mark.multiworker
def test_three_ranks_on_machines_of_two_and_one():
    # Machines of unequal rank counts, with dynamic process sets on: the default
    # hierarchical=None stays flat (each step runs the flat collectives, all ranks alike).
    results, _ = horovodrun.run("engine_algorithms.py", np=3, args=["signsgd,topk"], timeout=300,
                                hosts="localhost:2,127.0.0.1:1",
                                env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    _check_algorithm_results(results, 3)


@pytest.mark.multiworker
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


@pytest.mark.multiworker
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


@pytest.mark.multiworker
@pytest.mark.parametrize("mode, field", [("model", "shapes"), ("seed", "seed")])
def test_ranks_that_disagree_fail_fast_on_every_rank_with_a_catchable_error(mode, field):
    results, output = horovodrun.run("engine_rank_mismatch.py", np=2, args=[mode], timeout=120)
    for rank in (0, 1):
        (result,) = results[rank]
        assert result["caught"] == "RankMismatchError", (result, output[-4000:])
        assert "ranks disagree on %r" % field in result["message"], result


@pytest.mark.multiworker
def test_a_rank_that_retraces_alone_does_not_wait_for_the_others():
    results, output = horovodrun.run("engine_rank_mismatch.py", np=2, args=["lone_retrace"],
                                     timeout=90)
    (first,), (second,) = results[0], results[1]
    assert first["caught"] is None and second["caught"] is None, output[-4000:]
    assert second["traces"] == first["traces"] + 1  # rank 1 alone traced once more
    assert first["checksum"] == second["checksum"]
    assert first["step"] == second["step"] == 4


@pytest.mark.multiworker
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
    (dict(compressor="dgc", memory="residual", momentum=0.5), "momentum sets dgc's 'dgc' memory"),
    (dict(compressor="signum", memory="residual", beta=0.5), "beta sets signum's"),
    (dict(compressor="randomk", scale=True, memory="residual"), "scale=True cannot use error"),
    (dict(compressor="topk", ratio=True), r"ratio must be a number in \(0, 1\]"),
    (dict(compressor="qsgd", levels=np.float32(8)), "levels must be an integer"),
    (dict(compressor="none", nonfinite="ignore"), "nonfinite must be one of propagate, raise"),
])
def test_bad_arguments_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MergeComp(**kwargs)


def test_memory_parameters_reach_the_memory_also_when_it_is_named():
    assert MergeComp("dgc", memory="dgc", momentum=0.5).memory.momentum == 0.5
    assert MergeComp("dgc", momentum=0.5).memory.momentum == 0.5
    assert MergeComp("signum", memory="momentum", beta=0.25).memory.beta == 0.25


def test_numpy_scalars_are_accepted():
    assert MergeComp("topk", ratio=np.float32(0.25)).compressor.ratio == 0.25
    assert MergeComp("qsgd", levels=np.int64(8)).compressor.levels == 8
    assert MergeComp("dgc", momentum=np.float64(0.5)).memory.momentum == 0.5
    assert MergeComp("none", seed=np.int32(3), partitions=np.int64(2)).seed == 3


def test_scaled_randomk_runs_without_error_feedback():
    assert MergeComp("randomk", scale=True).memory.name == "none"
    assert MergeComp("randomk").memory.name == "residual"


def test_seed_layout_limits_are_checked():
    from tf_mergecomp import seeds

    seeds.check_layout(4096, 4095)
    with pytest.raises(ValueError, match="at most 4096 gradient tensors"):
        seeds.check_layout(4097, 2)
    with pytest.raises(ValueError, match="at most 4095 workers"):
        seeds.check_layout(10, 4096)


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


def test_hook_passes_arguments_it_does_not_know_through():
    """A stock compression reaches Horovod's factory with exactly the arguments
    given, whatever they are (a later Horovod may add some)."""
    import horovod.tensorflow as hvd

    import tf_mergecomp.horovod_hook as hook

    seen = []
    original = getattr(hvd._make_allreduce_grads_fn, hook._INSTALLED_MARK)

    def spy(*args, **kwargs):
        seen.append((args, kwargs))
        return original(*args, **kwargs)

    saved = hvd._make_allreduce_grads_fn
    try:
        hvd._make_allreduce_grads_fn = spy
        assert hook.install()
        hvd._make_allreduce_grads_fn("x", "", "", hvd.Compression.fp16, False, hvd.Average, 1.0,
                                     None, process_set=hvd.global_process_set)
        assert seen == [(("x", "", "", hvd.Compression.fp16, False, hvd.Average, 1.0, None),
                         {"process_set": hvd.global_process_set})]
    finally:
        hvd._make_allreduce_grads_fn = saved


def test_horovod_groups_argument_is_refused():
    import horovod.tensorflow as hvd

    with pytest.raises(ValueError, match="groups="):
        hvd._make_allreduce_grads_fn("x", "", "", MergeComp("none"), False, hvd.Average, 1.0, 2,
                                     process_set=hvd.global_process_set)


def test_a_memory_of_your_own_is_refused_with_a_fused_codec_and_runs_with_plain():
    from tf_mergecomp import compressors, reference
    from tf_mergecomp.memory.residual import ResidualMemory

    class HalfResidual(ResidualMemory):  # a user's memory: the kernels do not know it
        def update(self, compensated, sent, state):
            return {"residual": 0.5 * (compensated - sent)}

    with pytest.raises(ValueError, match="not one of the memories the fused group ops implement"):
        MergeComp("efsignsgd", memory=HalfResidual())
    plain = MergeComp(reference.plain(compressors.get("efsignsgd")), memory=HalfResidual(),
                      partitions=1)
    grads = [tf.constant([1.0, -2.0, 3.0]), tf.constant([[0.5, -0.25]])]
    plain.set_gradient_layout([g.shape for g in grads], [g.dtype for g in grads])
    outputs, flags = FakeWorld(1).run(lambda rank, comm: plain.reduce_group(grads, comm))[0]
    assert [o.shape for o in outputs] == [g.shape for g in grads]
    assert flags.numpy().tolist() == [0, 0]
    residual = np.concatenate([v.numpy() for v in plain.state_variables()])
    # sign-compressed with the group's mean magnitude, half the error kept
    flat = np.array([1.0, -2.0, 3.0, 0.5, -0.25], np.float32)
    sent = np.sign(flat) * np.abs(flat).mean()
    np.testing.assert_allclose(residual, 0.5 * (flat - sent), rtol=1e-6)


def test_the_step_and_the_seeds_are_host_tensors():
    """The encode kernels take `seed` in host memory on a GPU: the step
    variable and the seeds computed from it are pinned to the host, so a
    traced step on a GPU copies no seed from the device."""
    from tf_mergecomp import seeds

    mergecomp = MergeComp("qsgd", seed=5)
    assert "CPU" in mergecomp.step.device

    @tf.function
    def seed():
        value = seeds.group_seed(seeds.step_in_cycle(mergecomp.step), 3, 2, mergecomp.seed)
        assert "CPU" in value.op.device, value.op.device
        return value

    mergecomp.step.assign(7)
    expected = (5 << seeds.USER_SEED_SHIFT) + (7 << seeds.STEP_SHIFT) \
        + (3 << seeds.TENSOR_SHIFT) + 2
    assert int(seed()) == expected
