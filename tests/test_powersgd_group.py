"""PowerSGD over merged groups: one matrix per tensor, two collectives per group.

The fused ops (MergecompPowersgdGroupP/Q/Finish) against the plain-TF
reference on groups of mixed shapes and dtypes over simulated workers, and the
algorithm's properties: low rank, exact averages of 1-D tensors, Q kept per
tensor whatever the partition, error feedback, wire bytes, state checkpoints.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests import codec_backends
from tests._fake_comm import FakeWorld
from tf_mergecomp import MergeComp, compressors, grouping
from tf_mergecomp.compressors.powersgd import matrix_view, reference_orthonormalize

# A conv kernel, a dense kernel, a bias, a scalar, empty tensors, and matrices
# in float16 and float64.
SHAPES = [(3, 3, 4, 8), (20, 6), (6,), (), (0,), (0, 5), (7, 5), (5, 9)]
DTYPES = [tf.float32, tf.float32, tf.float32, tf.float32, tf.float32, tf.float32, tf.float16,
          tf.float64]


def make_grads(rank, step, shapes=SHAPES, dtypes=DTYPES):
    rng = np.random.RandomState(1000 * rank + step)
    return [tf.constant(np.asarray(rng.standard_normal(shape), np.float32), dtype=dtype)
            for shape, dtype in zip(shapes, dtypes)]


def engines(world_size, backend="op", rank=2, partitions=1, **kwargs):
    return [MergeComp(codec_backends.get("powersgd", rank=rank, backend=backend),
                      partitions=partitions, **kwargs) for _ in range(world_size)]


def run_steps(mergecomps, world, steps, grads_fn=make_grads, first_step=0):
    """Runs every group of the engines' partition on every rank for `steps`
    steps; returns the reduced gradients per step and rank, and the state by rank."""
    history = []
    for step in range(first_step, first_step + steps):
        def one_rank(rank, comm):
            mc = mergecomps[rank]
            grads = grads_fn(rank, step)
            mc.set_gradient_layout([g.shape for g in grads], [g.dtype for g in grads])
            out = []
            for index, (start, end) in enumerate(grouping.group_bounds(mc.splits, len(grads))):
                out += mc.reduce_group(grads[start:end], comm, tf.constant(step, tf.int64),
                                        start=start, index=index)[0]
            return [o.numpy() for o in out]
        history.append(world.run(one_rank))
    states = [[v.numpy() for v in mc.state_variables()] for mc in mergecomps]
    return history, states


def assert_close(a, b, what, rtol=1e-5):
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and x.shape == y.shape, (what, i, x.dtype, y.dtype)
        # A float16 result may round to the neighbouring float16 value.
        tolerance = 2e-3 if x.dtype == np.float16 else rtol
        x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
        scale = max(1.0, float(np.max(np.abs(y64)))) if y64.size else 1.0
        np.testing.assert_allclose(x64, y64, rtol=tolerance, atol=tolerance * scale,
                                   err_msg="%s, tensor %d" % (what, i))


# --- fused == reference -----------------------------------------------------------

@pytest.mark.parametrize("memory", [None, "none"])
def test_fused_group_matches_the_plain_tf_reference(memory):
    world_size, steps = 2, 4
    fused, fused_state = run_steps(engines(world_size, "op", memory=memory), FakeWorld(2), steps)
    ref, ref_state = run_steps(engines(world_size, "reference", memory=memory), FakeWorld(2),
                               steps)
    for step in range(steps):
        for rank in range(world_size):
            assert_close(fused[step][rank], ref[step][rank], "step %d rank %d" % (step, rank))
        # Every worker gets the same average.
        for a, b in zip(fused[step][0], fused[step][1]):
            np.testing.assert_array_equal(a, b)
    for rank in range(world_size):
        assert_close(fused_state[rank], ref_state[rank], "state rank %d" % rank)
    outputs = fused[-1][0]
    assert [o.shape for o in outputs] == [tuple(s) for s in SHAPES]
    assert [o.dtype for o in outputs] == [d.as_numpy_dtype for d in DTYPES]


def test_state_layout_is_residual_then_q():
    codec = compressors.get("powersgd", rank=2)
    mc = MergeComp(codec, partitions=1)
    grads = make_grads(0, 0)
    mc.set_gradient_layout([g.shape for g in grads], [g.dtype for g in grads])
    state = mc.state_variables()
    for i, (shape, variable) in enumerate(zip(SHAPES, state)):
        n = int(np.prod(shape))
        view = matrix_view(shape, 2)
        q_size = 0 if view is None else view.cols * view.rank
        assert variable.shape == (n + q_size,), (shape, variable.shape)
        np.testing.assert_array_equal(variable.numpy()[:n], 0.0)  # residual
        assert q_size == 0 or np.std(variable.numpy()[n:]) > 0.3  # a normal draw
    assert matrix_view((3, 3, 4, 8), 2) == (36, 8, 2)
    assert matrix_view((1, 5), 4) == (1, 5, 1)
    assert matrix_view((7,), 2) is None and matrix_view((0, 5), 2) is None
    # memory="none": Q only.
    bare = MergeComp("powersgd", memory="none", partitions=1, rank=2)
    bare.set_gradient_layout([g.shape for g in grads], [g.dtype for g in grads])
    assert [v.shape[0] for v in bare.state_variables()] == [
        v.shape[0] - int(np.prod(s)) for v, s in zip(state, SHAPES)]


# --- the algorithm ----------------------------------------------------------------

def test_each_matrix_result_has_rank_at_most_r_and_vectors_are_averaged_exactly():
    rank = 2
    history, states = run_steps(engines(2, rank=rank), FakeWorld(2), 3)
    for step, by_rank in enumerate(history):
        grads = [make_grads(r, step) for r in range(2)]
        for i, (shape, out) in enumerate(zip(SHAPES, by_rank[0])):
            view = matrix_view(shape, rank)
            if view is None:
                mean = (grads[0][i].numpy() + grads[1][i].numpy()) / 2  # residual stays 0
                np.testing.assert_array_equal(out, mean.astype(out.dtype))
            else:
                matrix = np.asarray(out, np.float64).reshape(view.rows, view.cols)
                assert np.linalg.matrix_rank(matrix, tol=1e-3 * np.abs(matrix).max()) <= rank
    for state in states:
        for shape, variable in zip(SHAPES, state):
            if matrix_view(shape, rank) is None:
                np.testing.assert_array_equal(variable, 0.0)


def test_q_survives_a_partition_change():
    """A tensor's result is the same merged or alone, also after the
    partition changes mid-training: its Q lives with the tensor, not the group."""
    steps = 2
    merged = engines(2, partitions=1)
    changed = engines(2, partitions=1)
    layerwise = engines(2, partitions="layerwise")
    merged_history, merged_state = run_steps(merged, FakeWorld(2), 2 * steps)
    run_steps(changed, FakeWorld(2), steps)
    for mc in changed:
        mc.set_partition([3, 6])
    changed_history, changed_state = run_steps(changed, FakeWorld(2), steps, first_step=steps)
    layerwise_history, layerwise_state = run_steps(layerwise, FakeWorld(2), 2 * steps)
    for step in range(2 * steps):
        assert_close(merged_history[step][0], layerwise_history[step][0], "step %d" % step)
    for step in range(steps):
        assert_close(changed_history[step][0], merged_history[steps + step][0], "after the change")
    for rank in range(2):
        assert_close(merged_state[rank], layerwise_state[rank], "state")
        assert_close(changed_state[rank], layerwise_state[rank], "state after the change")


def test_initial_q_depends_on_the_tensor_index_not_the_group():
    codec = compressors.get("powersgd", rank=3)
    a = codec.initial_codec_state((10, 6), 4).numpy()
    np.testing.assert_array_equal(a, compressors.get("powersgd", rank=3)
                                  .initial_codec_state((10, 6), 4).numpy())
    assert a.shape == (18,)
    assert not np.array_equal(a, codec.initial_codec_state((10, 6), 5).numpy())
    assert codec.initial_codec_state((10,), 4) is None


def test_reconstructs_a_rank_one_matrix_exactly():
    rs = np.random.RandomState(9)
    matrix = np.outer(rs.randn(30), rs.randn(12)).astype(np.float32)
    for backend in ("op", "reference"):
        history, _ = run_steps(engines(1, backend, rank=1), FakeWorld(1), 1,
                               grads_fn=lambda r, s: [tf.constant(matrix)])
        np.testing.assert_allclose(history[0][0][0], matrix, rtol=1e-4, atol=1e-5)


def test_error_decreases_with_rank():
    rs = np.random.RandomState(11)
    u, _ = np.linalg.qr(rs.randn(40, 40))
    v, _ = np.linalg.qr(rs.randn(40, 40))
    matrix = ((u * (0.6 ** np.arange(40))) @ v.T).astype(np.float32)
    errors = []
    for rank in (1, 2, 4):
        # memory="none": every step fits the same matrix, warm-started.
        history, _ = run_steps(engines(1, rank=rank, memory="none"), FakeWorld(1), 4,
                               grads_fn=lambda r, s: [tf.constant(matrix)])
        errors.append(np.linalg.norm(history[-1][0][0] - matrix) / np.linalg.norm(matrix))
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 0.6 ** 4 * 1.5  # near the best rank-4 error, 0.6^4


def test_error_feedback_residual_is_orthogonal_to_p_and_nothing_is_lost():
    x = np.random.RandomState(40).randn(30, 30).astype(np.float32)
    (history, states) = run_steps(engines(1, rank=2), FakeWorld(1), 1,
                                  grads_fn=lambda r, s: [tf.constant(x)])
    sent = history[0][0][0]  # one worker: the average is what it sent
    residual = states[0][0][:900].reshape(30, 30)
    np.testing.assert_allclose(sent + residual, x, atol=1e-5)
    basis = np.linalg.qr(sent)[0][:, :2]
    np.testing.assert_allclose(basis.T @ residual, 0.0, atol=1e-4)


def test_two_workers_share_q_and_the_average_is_the_mean_of_what_each_sent():
    world = FakeWorld(2)
    mcs = engines(2)
    history, states = run_steps(mcs, world, 1)
    for i, shape in enumerate(SHAPES):
        view = matrix_view(shape, 2)
        if view is None:
            continue
        n = int(np.prod(shape))
        np.testing.assert_array_equal(states[0][i][n:], states[1][i][n:])  # the same Q
        sent = [make_grads(r, 0)[i].numpy().astype(np.float32).reshape(-1) - states[r][i][:n]
                for r in range(2)]
        np.testing.assert_allclose(np.asarray(history[0][0][i], np.float32).reshape(-1),
                                   (sent[0] + sent[1]) / 2, rtol=2e-3 if shape == (7, 5) else 1e-5,
                                   atol=1e-5 if shape != (7, 5) else 2e-3)
    assert world.calls[0] == [("allreduce", ((0, 495), "P")), ("allreduce", ((0, 495), "Q"))]
    assert mcs[0].compressor.collectives_per_group() == 2


@pytest.mark.parametrize("backend", ["op", "reference"])
def test_bytes_on_the_wire(backend):
    world = FakeWorld(1)
    codec = codec_backends.get("powersgd", rank=2, backend=backend)
    run_steps([MergeComp(codec, partitions=1)], world, 1)
    assert world.sent_bytes[0] == codec.payload_nbytes(SHAPES)
    # 4 * sum_i r_i (rows_i + cols_i) + 4 * (elements sent as they are)
    assert codec.payload_nbytes(SHAPES) == 4 * (2 * (36 + 8) + 2 * (20 + 6) + 2 * (7 + 5)
                                                + 2 * (5 + 9) + 6 + 1)
    assert codec.payload_nbytes(1000) == 4000  # one 1-D tensor, sent as it is


def test_a_group_of_vectors_still_issues_two_collectives():
    world = FakeWorld(2)
    shapes, dtypes = [(5,), ()], [tf.float32, tf.float64]
    history, _ = run_steps(engines(2), world, 1,
                           grads_fn=lambda r, s: make_grads(r, s, shapes, dtypes))
    assert [kind for kind, _ in world.calls[0]] == ["allreduce", "allreduce"]
    mean = (make_grads(0, 0, shapes, dtypes)[0] + make_grads(1, 0, shapes, dtypes)[0]) / 2
    np.testing.assert_array_equal(history[0][0][0], mean.numpy())


def test_zero_gradient_is_zero_not_nan_and_nan_stays_in_its_tensor():
    shapes, dtypes = [(10, 10), (8, 4)], [tf.float32, tf.float32]
    for backend in ("op", "reference"):
        zeros = run_steps(engines(1, backend), FakeWorld(1), 1,
                          grads_fn=lambda r, s: [tf.zeros([10, 10]), tf.zeros([8, 4])])[0]
        for out in zeros[0][0]:
            np.testing.assert_array_equal(out, 0.0)

        def with_nan(rank, step):
            grads = make_grads(rank, step, shapes, dtypes)
            poisoned = grads[0].numpy()
            poisoned[3, 4] = np.nan
            return [tf.constant(poisoned), grads[1]]

        (out,), = run_steps(engines(1, backend), FakeWorld(1), 1, grads_fn=with_nan)[0]
        assert np.isnan(out[0]).any()
        assert np.isfinite(out[1]).all()  # no longer spread over the group


def test_other_memories_run_the_plain_tf_path():
    history, states = run_steps(engines(1, memory="momentum"), FakeWorld(1), 2)
    assert all(np.isfinite(o).all() for o in history[-1][0])
    assert states[0][0].shape == (288 + 16,)  # momentum, then Q


def test_state_checkpoints_and_runs_in_tf_function(tmp_path):
    mc = engines(1)[0]
    grads = make_grads(0, 0)
    mc.set_gradient_layout([g.shape for g in grads], [g.dtype for g in grads])
    state = mc.state_variables()
    comm = FakeWorld(1).communicator(0)

    @tf.function
    def step(grads):
        return mc.reduce_group(grads, comm, tf.constant(0, tf.int64))[0]

    first = step(grads)
    step(grads)
    assert [o.shape for o in first] == [tuple(s) for s in SHAPES]
    path = tf.train.Checkpoint(mergecomp=mc).save(str(tmp_path / "ckpt"))
    saved = [v.numpy() for v in state]
    for v in state:
        v.assign(tf.zeros_like(v))
    tf.train.Checkpoint(mergecomp=mc).restore(path)
    for v, value in zip(state, saved):
        np.testing.assert_array_equal(v.numpy(), value)


# --- bad input ------------------------------------------------------------------

def test_bad_state_is_a_clear_error():
    from tf_mergecomp.ops import load

    grads = [tf.ones([4, 3])]
    wrong = tf.Variable(tf.zeros([12]))  # residual without Q
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="state variable 0 must be .* of 15 elements"):
        load().mergecomp_powersgd_group_p(grads, [wrong.handle], rank=1, residual=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"expected 2 state variables \(one per tensor\), got 1"):
        load().mergecomp_powersgd_group_p(grads + grads, [wrong.handle], rank=1, residual=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="p_mean must be a vector of 4"):
        load().mergecomp_powersgd_group_q(tf.zeros([5]), tf.zeros([12]), shapes=[[4, 3]], rank=1)
    with pytest.raises(ValueError, match="static shape"):
        matrix_view(tf.TensorShape([None, 3]), 1)


def test_reference_orthonormalize():
    matrix = tf.constant(np.random.RandomState(5).randn(200, 4).astype(np.float32))
    q = reference_orthonormalize(matrix).numpy()
    np.testing.assert_allclose(q.T @ q, np.eye(4), atol=1e-5)
    expected = np.linalg.qr(matrix.numpy())[0]
    np.testing.assert_allclose(np.abs(q), np.abs(expected), atol=1e-5)
    np.testing.assert_array_equal(reference_orthonormalize(tf.zeros([5, 2])).numpy(), 0.0)


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu_library", "cuda_library"])
def test_state_goes_with_the_gradients_when_the_library_has_gpu_kernels(monkeypatch, cuda):
    """Every group op, PowerSGD's included, has GPU kernels in a CUDA build of
    the library: the state is created on the gradients' device then; a
    CPU-only library keeps it on the host."""
    from tf_mergecomp import ops

    monkeypatch.setattr(ops, "build_info", lambda: {"cuda": cuda})

    class Placed:
        device = "/job:localhost/replica:0/task:0/device:GPU:0"

    for name in ("powersgd", "efsignsgd"):
        where = MergeComp(name)._state_device([Placed()])
        assert where == (Placed.device if cuda else "/device:CPU:0"), name


def test_flat_reduce_takes_the_base_signature_and_points_to_reduce_group():
    import inspect

    from tf_mergecomp.compressors import Compressor

    codec = compressors.get("powersgd")
    assert (inspect.signature(type(codec).reduce).parameters
            == inspect.signature(Compressor.reduce).parameters)
    with pytest.raises(NotImplementedError, match="call reduce_group"):
        codec.reduce(tf.zeros([4]), 0, None, (0, 4), sizes=[4], nonfinite=tf.zeros([1], tf.bool))
