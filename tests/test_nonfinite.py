"""Non-finite gradients: nothing non-finite reaches the compression state.

Two simulated workers reduce one merged group of mixed tensors; worker 0's
tensor 1 holds a NaN and worker 1's tensor 4 an inf. For every algorithm, on
the fused path and the plain-TF path alike: those two tensors come out all NaN
on both workers and are flagged; the other tensors come out finite (they are
reduced as usual); the worker that held a non-finite tensor keeps its
group's state exactly as it was, and the next step trains on normally.
Multi-rank behaviour under a real loss-scale optimizer is in
tests/workers/engine_nonfinite.py.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests import codec_backends
from tests._fake_comm import FakeWorld
from tests.test_group_ops import SHAPES, engine, make_grads, run_group
from tf_mergecomp import MergeComp, compressors

POISONED = {0: (1, float("nan")), 1: (4, float("inf"))}  # rank: (tensor, value)
SIZES = [int(np.prod(s)) for s in SHAPES]


def poisoned_grads(rank, step):
    grads = make_grads(rank, step)
    if step == 0 and rank in POISONED:
        index, value = POISONED[rank]
        values = np.array(grads[index].numpy(), dtype=np.float32)
        values.flat[values.size // 2] = value
        grads[index] = tf.constant(values, dtype=grads[index].dtype)
    return grads


def reduce_steps(mergecomps, world, steps):
    """Per step and rank: (outputs, flags, state after the step)."""
    history = []
    for step in range(steps):
        def one_rank(rank, comm):
            mc = mergecomps[rank]
            grads = poisoned_grads(rank, step)
            mc.set_gradient_layout([g.shape for g in grads], [g.dtype for g in grads])
            state = mc.state_variables()
            outputs, flags = mc.reduce_group(grads, comm, tf.constant(step, tf.int64))
            return ([o.numpy().astype(np.float64) for o in outputs], flags.numpy(),
                    [v.numpy().copy() for v in state])
        history.append(world.run(one_rank))
    return history


def warmed_up(name, backend):
    """Two workers' engines after two finite steps, so that every state is non-zero."""
    mergecomps = [engine(name, backend) for _ in range(2)]
    world = FakeWorld(2)
    for step in (7, 8):
        def one_rank(rank, comm):
            grads = make_grads(rank, step)
            mc = mergecomps[rank]
            mc.set_gradient_layout([g.shape for g in grads], [g.dtype for g in grads])
            mc.reduce_group(grads, comm, tf.constant(step, tf.int64))
        world.run(one_rank)
    return mergecomps, world


@pytest.mark.parametrize("backend", ["op", "reference"])
@pytest.mark.parametrize("name", compressors.NAMES)
def test_nonfinite_tensors_come_out_nan_everywhere_and_leave_the_state_alone(name, backend):
    if name == "powersgd":
        pytest.skip("PowerSGD's own test below")
    mergecomps, world = warmed_up(name, backend)
    before = [[v.numpy().copy() for v in mc.state_variables()] for mc in mergecomps]
    (step0, step1) = reduce_steps(mergecomps, world, 2)
    marked = sorted(index for index, _ in POISONED.values())
    for rank in range(2):
        outputs, flags, state = step0[rank]
        assert [i for i, f in enumerate(flags) if f] == marked, (rank, flags)
        for i, output in enumerate(outputs):
            if i in marked:
                assert output.size == 0 or np.isnan(output).all(), (rank, i)
            else:
                assert np.isfinite(output).all(), (name, rank, i, output)
        for i, (old, new) in enumerate(zip(before[rank], state)):
            # Both workers held a non-finite tensor in this group: neither state moved.
            np.testing.assert_array_equal(old, new, err_msg="%s rank %d tensor %d" % (name, rank, i))
        outputs, flags, state = step1[rank]
        assert not flags.any()
        assert all(np.isfinite(o).all() for o in outputs)
        assert all(np.isfinite(s).all() for s in state)
        if before[rank]:
            assert any(not np.array_equal(old, new) for old, new in zip(before[rank], state)), \
                "the finite step after must move the state again"


@pytest.mark.parametrize("name", ["efsignsgd", "topk", "dgc", "signum", "qsgd"])
def test_a_finite_worker_keeps_its_update_and_the_fused_path_matches_the_reference(name):
    """Only worker 0 holds a NaN: worker 1's state moves as on any step, worker
    0's does not, and both paths agree bit for bit (NaN positions included)."""
    results = {}
    for backend in ("op", "reference"):
        mergecomps, world = warmed_up(name, backend)
        before = [[v.numpy().copy() for v in mc.state_variables()] for mc in mergecomps]

        def one_rank(rank, comm):
            grads = make_grads(rank, 0)
            if rank == 0:
                values = grads[6].numpy()
                values[3] = np.nan
                grads[6] = tf.constant(values, dtype=grads[6].dtype)
            mc = mergecomps[rank]
            outputs, flags = mc.reduce_group(grads, comm, tf.constant(9, tf.int64))
            return [o.numpy() for o in outputs], flags.numpy(), [v.numpy() for v in mc.state_variables()]
        after = world.run(one_rank)
        for old, new in zip(before[0], after[0][2]):
            np.testing.assert_array_equal(old, new)
        if before[1]:
            assert any(not np.array_equal(old, new) for old, new in zip(before[1], after[1][2]))
        results[backend] = after
    for rank in range(2):
        for fused, reference in zip(results["op"][rank][0], results["reference"][rank][0]):
            np.testing.assert_array_equal(fused, reference)
        np.testing.assert_array_equal(results["op"][rank][1], results["reference"][rank][1])
        assert list(results["op"][rank][1]) == [1 if i == 6 else 0 for i in range(len(SHAPES))]
        for fused, reference in zip(results["op"][rank][2], results["reference"][rank][2]):
            np.testing.assert_array_equal(fused, reference)


@pytest.mark.parametrize("name", ["fp16", "qsgd", "terngrad", "signsgd", "onebit", "efsignsgd"])
def test_a_nonfinite_value_in_any_block_of_a_large_group_is_found_while_encoding(name):
    """These codecs' encodes write no state (memory none or residual), so the fused
    op checks each 32K-element block as the encode first reads it instead of in a
    pass of its own. An inf in the block two tensors share, or in the last block,
    still turns exactly its tensor into NaN on both workers, and both paths agree
    bit for bit, outputs and state, on that step and the finite one before it."""
    shapes = [(40000,), (5,), (70000,)]  # blocks [0, 32K), [32K, 64K) shared by all three, ...
    dtypes = [tf.float32, tf.float16, tf.float32]
    for tensor, position in ((0, 39999), (1, 2), (2, 69999)):
        def make(rank, step, shapes, dtypes):
            grads = make_grads(rank, step, shapes, dtypes)
            if step == 1 and rank == 0:
                values = grads[tensor].numpy()
                values[position] = np.inf
                grads[tensor] = tf.constant(values, dtype=dtypes[tensor])
            return grads

        results = {backend: run_group([engine(name, backend) for _ in range(2)], FakeWorld(2), 2,
                                      shapes, dtypes, make)
                   for backend in ("op", "reference")}
        (history, states), (ref_history, ref_states) = results["op"], results["reference"]
        for rank in range(2):
            outputs = history[1][rank]
            assert np.isnan(outputs[tensor].astype(np.float64)).all(), (name, tensor, rank)
            assert all(np.isfinite(o.astype(np.float64)).all()
                       for i, o in enumerate(outputs) if i != tensor), (name, tensor, rank)
            for step in range(2):
                for fused, reference in zip(history[step][rank], ref_history[step][rank]):
                    np.testing.assert_array_equal(fused.astype(np.float64),
                                                  reference.astype(np.float64))
            for fused, reference in zip(states[rank], ref_states[rank]):
                np.testing.assert_array_equal(fused, reference)


@pytest.mark.parametrize("backend", ["op", "reference"])
def test_powersgd_keeps_q_and_residual_of_a_nonfinite_tensor_on_every_worker(backend):
    shapes = [(6, 4), (5,), (3, 3, 2), (8, 2)]
    codec = codec_backends.get("powersgd", backend=backend)
    mergecomps = [MergeComp(codec, partitions=1) for _ in range(2)]
    world = FakeWorld(2)
    rng = np.random.RandomState(3)

    def step(poison):
        def one_rank(rank, comm):
            grads = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in shapes]
            if poison and rank == 1:
                values = grads[2].numpy()
                values[1, 1, 0] = np.inf
                grads[2] = tf.constant(values)
            mc = mergecomps[rank]
            mc.set_gradient_layout([g.shape for g in grads], [g.dtype for g in grads])
            outputs, flags = mc.reduce_group(grads, comm, tf.constant(0, tf.int64))
            return [o.numpy() for o in outputs], flags.numpy(), [v.numpy().copy() for v in mc.state_variables()]
        return world.run(one_rank)

    warm = step(False)
    poisoned = step(True)
    for rank in range(2):
        outputs, flags, state = poisoned[rank]
        assert list(flags) == [0, 0, 1, 0]
        assert np.isnan(outputs[2]).all()
        assert all(np.isfinite(outputs[i]).all() for i in (0, 1, 3))
        # The averaged P of tensor 2 is non-finite on both workers: both keep its state.
        np.testing.assert_array_equal(warm[rank][2][2], state[2])
        assert not np.array_equal(warm[rank][2][0], state[0])
    healthy = step(False)
    for rank in range(2):
        assert not healthy[rank][1].any()
        assert all(np.isfinite(s).all() for s in healthy[rank][2])


def test_nonfinite_choice_is_checked():
    with pytest.raises(ValueError, match="propagate, raise"):
        MergeComp("efsignsgd", nonfinite="skip")


@pytest.mark.multiworker
def test_loss_scale_overflow_settles_and_trains_on_two_ranks():
    """LossScaleOptimizer(DistributedOptimizer(SGD, MergeComp)) from a scale of
    2**40: the overflowing steps are skipped on both ranks, the scale settles
    where stock Horovod's does, and the state stays finite."""
    from tests import horovodrun

    results, output = horovodrun.run("engine_nonfinite.py",
                                     args=["loss_scale", "stock", "efsignsgd", "topk", "dgc"],
                                     timeout=420)
    by_rank = [{r["algorithm"]: r for r in results[rank]} for rank in range(2)]
    stock = by_rank[0]["stock"]
    for name in ("efsignsgd", "topk", "dgc"):
        ours, theirs = by_rank[0][name], by_rank[1][name]
        assert ours["checksum"] == theirs["checksum"], (name, output[-3000:])
        assert 2.0 ** 10 <= ours["loss_scale"] <= 2.0 ** 24, ours
        assert abs(np.log2(ours["loss_scale"]) - np.log2(stock["loss_scale"])) <= 2, (ours, stock)
        assert ours["moved"] > 0.01, ours
        assert ours["state_finite"] and ours["state_nonzero"], ours
        # The step counter counts exactly the steps that were applied: all but
        # the skipped ones, one per halving of the scale (64 steps, no growth yet).
        skipped = round(np.log2(2.0 ** 40 / ours["loss_scale"]))
        assert ours["step"] == ours["steps_run"] - skipped == theirs["step"], ours


@pytest.mark.multiworker
def test_nonfinite_raise_names_the_variable_on_every_rank_without_hanging():
    from tests import horovodrun

    results, output = horovodrun.run("engine_nonfinite.py", args=["raise"], timeout=240)
    for rank in range(2):
        (result,) = results[rank]
        assert result["raised_at"] == 3, (rank, result, output[-3000:])
        assert "non-finite gradient" in result["message"] and "dense" in result["message"], result


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_the_check_finds_one_nonfinite_value_at_any_position_of_any_dtype(dtype):
    """The check reads 32 bytes at a time, four at once, then element by element:
    one inf or NaN anywhere (vector body, unrolled body, tail; either sign) flags its
    tensor and no other."""
    sizes = [1, 7, 129, 300]
    mergecomp = MergeComp("fp16", partitions=1)
    shapes = [(n,) for n in sizes]
    mergecomp.set_gradient_layout(shapes, [dtype] * len(shapes))
    world = FakeWorld(1)

    def flags_with(poisoned, position, value):
        grads = [np.ones(n, np.float32) for n in sizes]
        if poisoned is not None:
            grads[poisoned][position] = value
        tensors = [tf.constant(g, dtype=dtype) for g in grads]

        def one_rank(rank, comm):
            _, flags = mergecomp.reduce_group(tensors, comm, tf.constant(0, tf.int64))
            return flags.numpy().tolist()
        return world.run(one_rank)[0]

    assert flags_with(None, 0, 0.0) == [0, 0, 0, 0]
    for tensor, n in enumerate(sizes):
        for position in sorted({0, n // 2, n - 1, min(n - 1, 64), min(n - 1, 127)}):
            for value in (float("inf"), float("-inf"), float("nan")):
                expected = [int(i == tensor) for i in range(len(sizes))]
                assert flags_with(tensor, position, value) == expected, (tensor, position, value)
