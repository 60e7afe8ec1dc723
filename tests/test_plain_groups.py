"""Groups sent plain instead of compressed: the engine's per-group codecs.

Two simulated workers (tests/_fake_comm.py) reduce one group of three tensors
with a compressor, then plain, then with the compressor again. What the
compressor had not sent (the residual; DGC's accumulation and momentum term)
goes out with the first plain step and the state is then zero; later plain
steps are exact averages; the compressor resumes from a zero state, exactly
as a fresh engine would.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests import codec_backends
from tests._fake_comm import FakeWorld
from tf_mergecomp import MergeComp, consistency
from tf_mergecomp.memory import get as get_memory

SHAPES = [(3, 4), (5,), (2, 2, 2)]


def grads_for(rank, step):
    rng = np.random.default_rng(100 * step + rank)
    return [tf.constant(rng.normal(size=s).astype(np.float32)) for s in SHAPES]


def reduce_step(mergecomps, world, step, codec, grads_fn=grads_for):
    """Per rank: (outputs, state values before the step, state values after)."""
    def one_rank(rank, comm):
        mc = mergecomps[rank]
        grads = grads_fn(rank, step)
        mc.set_gradient_layout([g.shape for g in grads], [g.dtype for g in grads])
        before = [v.numpy().copy() for v in mc.state_variables()]
        outputs, flags = mc.reduce_group(grads, comm, tf.constant(step, tf.int64), codec=codec)
        after = [v.numpy().copy() for v in mc.state_variables()]
        return [o.numpy() for o in outputs], flags.numpy(), before, after
    return world.run(one_rank)


def pending_of(mc, state_values):
    """What the memory holds unsent, per tensor, computed from its definition."""
    memory = mc.memory
    pending = []
    for shape, value in zip(SHAPES, state_values):
        n = int(np.prod(shape))
        buffers = {name: value[b * n:(b + 1) * n] for b, name in enumerate(memory.state_names)}
        if memory.name == "residual":
            pending.append(buffers["residual"].reshape(shape))
        elif memory.name == "dgc":
            pending.append((buffers["accumulation"] + memory.momentum * buffers["momentum"])
                           .reshape(shape))
        else:
            pending.append(np.zeros(shape, np.float32))
    return pending


@pytest.mark.parametrize("backend", ["op", "reference"])
@pytest.mark.parametrize("name, params", [("topk", {"ratio": 0.2}), ("dgc", {"ratio": 0.2}),
                                          ("efsignsgd", {}), ("signum", {})])
def test_switch_to_plain_flushes_the_state_and_back_resumes_from_zero(name, params, backend):
    world = FakeWorld(2)
    engines = [MergeComp(codec_backends.get(name, backend, **params)) for _ in range(2)]
    for step in range(2):
        reduce_step(engines, world, step, name)
    plain = reduce_step(engines, world, 2, "none")
    held = [plain[rank][2] for rank in range(2)]
    assert any(np.abs(v).max() > 0 for v in held[0]), "the compressor left nothing in its state"
    expected = [np.mean([grads_for(r, 2)[i].numpy() + pending_of(engines[r], held[r])[i]
                         for r in range(2)], axis=0) for i in range(len(SHAPES))]
    for rank in range(2):
        outputs, flags, _, after = plain[rank]
        assert not flags.any()
        for out, want in zip(outputs, expected):
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
        memory_size = len(engines[rank].memory.state_names)
        for value, shape in zip(after, SHAPES):
            assert not np.any(value[:memory_size * int(np.prod(shape))]), "state not flushed"
    # Later plain steps: the exact average, nothing added.
    again = reduce_step(engines, world, 3, "none")
    exact = [np.mean([grads_for(r, 3)[i].numpy() for r in range(2)], axis=0)
             for i in range(len(SHAPES))]
    for rank in range(2):
        for out, want in zip(again[rank][0], exact):
            np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7)
    # Back to the compressor: exactly what a fresh engine does from zero state.
    resumed = reduce_step(engines, world, 4, name)
    fresh = reduce_step([MergeComp(codec_backends.get(name, backend, **params)) for _ in range(2)],
                        FakeWorld(2), 4, name)
    for rank in range(2):
        for a, b in zip(resumed[rank][0], fresh[rank][0]):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(resumed[rank][3], fresh[rank][3]):
            np.testing.assert_array_equal(a, b)


def test_fp16_group_and_memoryless_codec():
    world = FakeWorld(2)
    engines = [MergeComp("qsgd") for _ in range(2)]
    result = reduce_step(engines, world, 0, "fp16")
    exact = [np.mean([grads_for(r, 0)[i].numpy() for r in range(2)], axis=0)
             for i in range(len(SHAPES))]
    for out, want in zip(result[0][0], exact):
        np.testing.assert_allclose(out, want, rtol=2e-3, atol=2e-3)
    assert world.calls[0] == [("allreduce", (0, 25, "fp16"))]
    assert world.sent_bytes[0] == 2 * 25 + 2 * 3  # half precision, plus one marker per tensor


def test_a_nonfinite_gradient_keeps_the_state_and_sends_nothing_pending():
    world = FakeWorld(2)
    engines = [MergeComp("topk", ratio=0.2) for _ in range(2)]
    reduce_step(engines, world, 0, "topk")

    def poisoned(rank, step):
        grads = grads_for(rank, step)
        if rank == 0:
            values = grads[1].numpy()
            values[2] = np.nan
            grads[1] = tf.constant(values)
        return grads

    result = reduce_step(engines, world, 1, "none", poisoned)
    outputs, flags, before, after = result[0]
    # A none group goes to Horovod's grouped allreduce, whose average keeps the NaN
    # where rank 0 held it (and the other elements' average); a codec's decode would
    # make the whole tensor NaN. With nonfinite="propagate" it checks nothing.
    assert np.isnan(outputs[1]).tolist() == [False, False, True, False, False]
    assert list(flags) == [0, 0, 0]
    for a, b in zip(before, after):  # rank 0 held the NaN: its state is as it was
        np.testing.assert_array_equal(a, b)
    assert all(not np.any(v) for v in result[1][3])  # rank 1 flushed
    # Tensor 0 averages rank 0's plain gradient with rank 1's gradient plus its residual.
    want = (grads_for(0, 1)[0].numpy() + grads_for(1, 1)[0].numpy()
            + pending_of(engines[1], result[1][2])[0]) / 2
    np.testing.assert_allclose(outputs[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("group_codec", ["none", "fp16"])
def test_a_plain_group_flags_a_nonfinite_gradient_when_asked_to_raise(group_codec):
    """nonfinite="raise": a none group (Horovod's grouped allreduce) checks its outputs and
    flags the tensor a rank held non-finite, as an fp16 group's decode does."""
    world = FakeWorld(2)
    engines = [MergeComp("topk", ratio=0.2, nonfinite="raise") for _ in range(2)]

    def poisoned(rank, step):
        grads = grads_for(rank, step)
        if rank == 1:
            values = grads[2].numpy()
            values[0, 1, 0] = np.inf
            grads[2] = tf.constant(values)
        return grads

    for outputs, flags, _, _ in reduce_step(engines, world, 0, group_codec, poisoned):
        assert list(flags) == [0, 0, 1]
        assert not np.isfinite(outputs[2]).all() and np.isfinite(outputs[0]).all()


def test_settings_are_checked_at_construction_and_at_set_partition():
    with pytest.raises(ValueError, match="plain_groups must be True or False"):
        MergeComp("topk", plain_groups="yes")
    assert MergeComp("topk").codec_choices == ("topk", "none", "fp16")
    assert MergeComp("fp16").codec_choices == ("fp16", "none")
    off = MergeComp("topk", plain_groups=False)
    assert off.codec_choices == ("topk",)
    with pytest.raises(ValueError, match="plain groups are off"):
        off.set_partition([2], group_codecs=["topk", "none"])
    mc = MergeComp("topk")
    with pytest.raises(ValueError, match="not one of"):
        mc.set_partition([2], group_codecs=["topk", "qsgd"])
    with pytest.raises(ValueError, match="list of codec names"):
        mc.set_partition([2], group_codecs="none")
    mc.set_gradient_layout(SHAPES, [tf.float32] * 3)
    with pytest.raises(ValueError, match="names 1 codecs for 2 groups"):
        mc.set_partition([2], group_codecs=["none"])
    mc.set_partition([2], group_codecs=["none", "topk"])
    assert mc.group_codecs == ("none", "topk")
    assert mc.describe()["group_codecs"] == ["none", "topk"]
    mc.set_partition([1, 2])
    assert mc.group_codecs == ("topk",) * 3


def test_ranks_that_disagree_on_a_group_codec_are_told_which():
    a, b = MergeComp("topk"), MergeComp("topk")
    for mc in (a, b):
        mc.set_gradient_layout(SHAPES, [tf.float32] * 3)
    a.set_partition([2], group_codecs=["none", "topk"])
    b.set_partition([2], group_codecs=["topk", "topk"])
    message = consistency.mismatch_message([a.describe(), b.describe()])
    assert "group_codecs" in message
    # The state does not depend on the codecs: a checkpoint fits either layout.
    assert a.settings_fingerprint() == b.settings_fingerprint()


def test_pending_of_each_memory():
    state = {"residual": tf.constant([1.0, -2.0])}
    np.testing.assert_array_equal(get_memory("residual").pending(state).numpy(), [1.0, -2.0])
    dgc = get_memory("dgc", momentum=0.5)
    pending = dgc.pending({"momentum": tf.constant([2.0]), "accumulation": tf.constant([1.0])})
    np.testing.assert_allclose(pending.numpy(), [2.0])
    assert get_memory("momentum").pending({"momentum": tf.constant([1.0])}) is None
    assert get_memory("none").pending({}) is None


@pytest.mark.multiworker
def test_two_ranks_switch_a_group_to_plain_and_back_and_step_aside_for_plain_horovod():
    from tests import horovodrun

    results, _ = horovodrun.run("engine_plain_groups.py", np=2)
    phases = [{r["phase"]: r for r in results[rank]} for rank in (0, 1)]
    order = ["compressed", "group0_plain", "group0_plain_more", "compressed_again",
             "plain_horovod", "back_to_mergecomp"]
    assert list(phases[0]) == order and list(phases[1]) == order
    checksums = [phases[0][name]["checksum"] for name in order]
    for name in order:
        assert phases[1][name]["checksum"] == phases[0][name]["checksum"], name
    assert len(set(checksums)) == len(order), "some phase did not train"
    # Back to compressed, group 0 holds a residual again (on some rank: its
    # 4-element bias may be sent whole on one).
    assert max(max(phases[r]["compressed_again"]["residual_max"][:2]) for r in (0, 1)) > 0
    for rank in (0, 1):
        p = phases[rank]
        assert max(p["compressed"]["residual_max"][2:]) > 0
        # Group 0 (tensors 0-1) sent plain: its residual went out and stays zero;
        # group 1 is still compressed and keeps its own.
        for name in ("group0_plain", "group0_plain_more"):
            assert p[name]["residual_max"][:2] == [0.0, 0.0], (rank, name)
            assert min(p[name]["residual_max"][2:]) > 0, (rank, name)
            assert p[name]["group_codecs"] == ["none", "topk"]
        assert p["group0_plain"]["collectives"] == 2
        # Plain Horovod: no MergeComp collective, every residual sent.
        assert p["plain_horovod"]["collectives"] == 0
        assert p["plain_horovod"]["residual_max"] == [0.0] * 6
        assert max(p["back_to_mergecomp"]["residual_max"]) > 0
        assert p["back_to_mergecomp"]["collectives"] == 6


@pytest.mark.parametrize("name, plain_groups, expected", [
    ("topk", True, ("topk", "none")), ("topk", False, None), ("none", True, None),
    ("fp16", True, ("fp16", "none"))])
def test_the_search_chooses_per_group_between_the_codec_and_none(name, plain_groups, expected):
    from tf_mergecomp.search import PartitionSearchDriver

    driver = PartitionSearchDriver(MergeComp(name, plain_groups=plain_groups), verbose=0)
    assert driver.searched_codecs() == expected
    both = PartitionSearchDriver(MergeComp(name, plain_groups=plain_groups), verbose=0,
                                 plain_codecs=("none", "fp16"))
    if expected is not None and name != "fp16":
        assert both.searched_codecs() == (name, "none", "fp16")


@pytest.mark.parametrize("plain_codecs", ["none", (), ("none", "none"), ("qsgd",)])
def test_bad_plain_codecs_are_refused(plain_codecs):
    from tf_mergecomp.search import PartitionSearchDriver

    with pytest.raises(ValueError, match="plain_codecs must be"):
        PartitionSearchDriver(MergeComp("topk"), plain_codecs=plain_codecs)


def test_state_restored_from_a_checkpoint_goes_out_with_the_next_plain_step(tmp_path):
    """The state is per tensor whatever the groups' codecs: a checkpoint taken while
    compressed restores into an engine that now sends the group plain, and the
    restored residual goes out with that engine's first plain step."""
    world = FakeWorld(2)
    engines = [MergeComp("topk", ratio=0.2) for _ in range(2)]
    for step in range(2):
        reduce_step(engines, world, step, "topk")
    paths = [tf.train.Checkpoint(mergecomp=engines[r]).save(str(tmp_path / ("rank%d" % r)))
             for r in range(2)]
    saved = [[v.numpy().copy() for v in engines[r].state_variables()] for r in range(2)]
    reduce_step(engines, world, 2, "none")  # flushes
    assert all(not np.any(v) for r in range(2) for v in engines[r].state_variables())
    for r in range(2):
        tf.train.Checkpoint(mergecomp=engines[r]).restore(paths[r]).assert_consumed()
        for a, b in zip(engines[r].state_variables(), saved[r]):
            np.testing.assert_array_equal(a.numpy(), b)
    result = reduce_step(engines, world, 3, "none")
    expected = [np.mean([grads_for(r, 3)[i].numpy() + pending_of(engines[r], saved[r])[i]
                         for r in range(2)], axis=0) for i in range(len(SHAPES))]
    for out, want in zip(result[0][0], expected):
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    assert all(not np.any(v) for v in result[0][3])


@pytest.mark.parametrize("name", ["efsignsgd", "dgc", "powersgd"])
def test_a_group_on_the_codec_traces_the_same_ops_whichever_plain_groups(name):
    """plain_groups=True adds nothing to a group that stays on the codec: its
    traced reduction has exactly the ops of plain_groups=False (the flush is
    built only into plain groups), so a layout the search leaves compressed
    costs what it did before per-group codecs."""
    def traced_ops(plain_groups, codec=None):
        mc = MergeComp(name, partitions=None, plain_groups=plain_groups)
        comm = FakeWorld(1).communicator(0)
        mc.set_gradient_layout([tf.TensorShape(s) for s in SHAPES], [tf.float32] * len(SHAPES))
        mc.state_variables()

        @tf.function
        def group(grads):
            return mc.reduce_group(grads, comm, tf.constant(0, tf.int64), codec=codec)[0]

        graph = group.get_concrete_function([tf.TensorSpec(s, tf.float32) for s in SHAPES]).graph
        return sorted(op.type for op in graph.get_operations())

    compressed = traced_ops(True)
    assert compressed == traced_ops(False)
    assert compressed == traced_ops(True, codec=name)
    assert traced_ops(True, codec="none") != compressed  # the check can see a difference
