"""The fused group ops against the plain-TF group path, and their graph size.

Every codec with a group codec runs one merged group of tensors of mixed
shapes and dtypes (0- and 1-element tensors included) through the engine's
fused path (MergecompGroupEncode, one collective, MergecompGroupDecode) and
its plain-TF path (concatenate, compensate, compress, decode, update, split)
on simulated workers, for several steps: the averaged gradients and every
tensor's error-feedback state must agree bit for bit. The graph-size check
also covers PowerSGD's three group ops (its math is tested in
test_powersgd_group.py).
"""

import numpy as np
import pytest
import tensorflow as tf

from tests import codec_backends
from tests._fake_comm import FakeWorld
from tf_mergecomp import MergeComp, compressors

FUSED = tuple(n for n in compressors.NAMES if compressors.get(n).group_codec is not None)
SHAPES = [(3, 5), (), (0,), (17,), (2, 3, 4), (1,), (1000,), (33, 8)]
DTYPES = [tf.float32, tf.float16, tf.float32, tf.float64, tf.bfloat16, tf.float32, tf.float32,
          tf.float16]
# Large enough ratios that the sparse codecs send entries of several tensors.
PARAMS = {"topk": {"ratio": 0.1}, "dgc": {"ratio": 0.1, "sample_ratio": 0.5},
          "randomk": {"ratio": 0.1}}


def make_grads(rank, step, shapes=SHAPES, dtypes=DTYPES):
    rng = np.random.RandomState(1000 * rank + step)
    return [tf.constant(rng.standard_t(3, size=shape).astype(np.float32), dtype=dtype)
            for shape, dtype in zip(shapes, dtypes)]


def engine(name, backend, **params):
    codec = codec_backends.get(name, backend=backend, **dict(PARAMS.get(name, {}), **params))
    return MergeComp(codec, partitions=1)


def run_group(mergecomps, world, steps, shapes=SHAPES, dtypes=DTYPES, make=make_grads):
    """Runs one group of all tensors on every rank; returns per step and rank
    the reduced gradients, and the final state by rank."""
    history = []
    for step in range(steps):
        def one_rank(rank, comm):
            mc = mergecomps[rank]
            grads = make(rank, step, shapes, dtypes)
            mc.set_gradient_layout([g.shape for g in grads], [g.dtype for g in grads])
            out, _ = mc.reduce_group(grads, comm, tf.constant(step, tf.int64))
            return [o.numpy() for o in out]
        history.append(world.run(one_rank))
    states = [[v.numpy() for v in mc.state_variables()] for mc in mergecomps]
    return history, states


def assert_same(a, b, what):
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and x.shape == y.shape, (what, i, x.dtype, y.dtype)
        np.testing.assert_array_equal(np.asarray(x, np.float64), np.asarray(y, np.float64),
                                      err_msg="%s, tensor %d" % (what, i))


@pytest.mark.parametrize("name", FUSED)
def test_fused_group_matches_the_plain_tf_group_bit_for_bit(name):
    world_size, steps = 2, 3
    fused = [engine(name, "op") for _ in range(world_size)]
    reference = [engine(name, "reference") for _ in range(world_size)]
    fused_history, fused_state = run_group(fused, FakeWorld(world_size), steps)
    ref_history, ref_state = run_group(reference, FakeWorld(world_size), steps)
    for step in range(steps):
        for rank in range(world_size):
            assert_same(fused_history[step][rank], ref_history[step][rank],
                        "%s step %d rank %d" % (name, step, rank))
    for rank in range(world_size):
        assert_same(fused_state[rank], ref_state[rank], "%s state rank %d" % (name, rank))
    if fused[0].memory.state_names:
        assert any(np.any(s != 0) for s in fused_state[0]), "the state was never updated"
    outputs = fused_history[-1][0]
    assert [o.shape for o in outputs] == [tuple(s) for s in SHAPES]
    assert [o.dtype for o in outputs] == [d.as_numpy_dtype for d in DTYPES]


@pytest.mark.parametrize("name", ["topk", "dgc", "randomk"])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float16])
@pytest.mark.parametrize("memory", [None, "none"])
def test_sparse_group_of_one_tensor_matches_the_plain_tf_group(name, dtype, memory):
    """A one-tensor group is selected from in place (state or gradient) when it
    is float32, else from a converted copy: both as the plain-TF path."""
    extra = {} if memory is None else {"memory": memory}
    shapes, dtypes = [(50, 7)], [dtype]
    runs = []
    for backend in ("op", "reference"):
        mergecomps = [MergeComp(codec_backends.get(name, backend=backend, **PARAMS[name]),
                                partitions=1, **extra) for _ in range(2)]
        runs.append(run_group(mergecomps, FakeWorld(2), 2, shapes, dtypes))
    (fused_history, fused_state), (ref_history, ref_state) = runs
    for step in range(2):
        for rank in range(2):
            assert_same(fused_history[step][rank], ref_history[step][rank], (name, step, rank))
    for rank in range(2):
        assert_same(fused_state[rank], ref_state[rank], (name, "state", rank))


def gapped_grads(rank, step, shapes, dtypes):
    """About 0.95% of the entries large (100 + noise), the rest small: DGC's
    sampled threshold then often lands in the gap, where even halved three
    times it finds fewer than k entries (the padding branch); otherwise its
    count reaches k at once or after a halving (the top-k branches)."""
    rng = np.random.RandomState(7000 + 1000 * rank + step)
    grads = []
    for shape, dtype in zip(shapes, dtypes):
        values = rng.standard_normal(shape).astype(np.float32) * 1e-3
        large = rng.random_sample(shape) < 0.0095
        values = np.where(large, 100.0 + rng.standard_normal(shape), values).astype(np.float32)
        grads.append(tf.constant(values, dtype=dtype))
    return grads


LARGE_GROUPS = {
    "mixed": ([(300, 700), (70_000,), (5,), (90_000,), (40, 100), (1500,)],
              [tf.float32, tf.float16, tf.float32, tf.float32, tf.float32, tf.bfloat16]),
    # top-k samples its threshold from 32768 elements on, 1024 samples up to 131072
    "one 40k tensor": ([(200, 200)], [tf.float32]),
}


@pytest.mark.parametrize("name", ["topk", "dgc", "randomk"])
@pytest.mark.parametrize("make", [make_grads, gapped_grads], ids=["t3", "gapped"])
@pytest.mark.parametrize("group", sorted(LARGE_GROUPS))
def test_large_sparse_group_matches_the_plain_tf_group(name, make, group):
    """Groups large enough for the one-pass selections (a sampled threshold,
    then compare and collect; random-k's keys above a computed threshold),
    default ratios: bit for bit as the plain-TF path, over several steps.
    Random-k collects above the threshold from 1024 elements of a tensor on."""
    shapes, dtypes = LARGE_GROUPS[group]
    runs = []
    for backend in ("op", "reference"):
        mergecomps = [MergeComp(codec_backends.get(name, backend=backend), partitions=1)
                      for _ in range(2)]
        runs.append(run_group(mergecomps, FakeWorld(2), 3, shapes, dtypes, make))
    (fused_history, fused_state), (ref_history, ref_state) = runs
    for step in range(3):
        for rank in range(2):
            assert_same(fused_history[step][rank], ref_history[step][rank], (name, step, rank))
    for rank in range(2):
        assert_same(fused_state[rank], ref_state[rank], (name, "state", rank))


def test_randomk_merged_draws_what_each_tensor_draws_alone():
    """A merged random-k group sends, per tensor, the positions the layer-wise
    groups send: merging changes the collectives, not the samples."""
    shapes = [(40,), (7, 9), (300,)]
    dtypes = [tf.float32] * 3
    grads = make_grads(0, 0, shapes, dtypes)

    def reduce_with(partitions):
        mc = MergeComp("randomk", partitions=partitions, ratio=0.2)
        mc.set_gradient_layout([g.shape for g in grads], dtypes)
        out = []
        for index, (start, end) in enumerate(_bounds(mc.splits, len(grads))):
            out += FakeWorld(1).run(lambda rank, comm: mc.reduce_group(
                grads[start:end], comm, tf.constant(5, tf.int64), start=start, index=index)[0])[0]
        return [o.numpy() for o in out]

    merged, layerwise = reduce_with(1), reduce_with("layerwise")
    assert_same(merged, layerwise, "randomk merged vs layer-wise")
    for g, out, shape in zip(grads, merged, shapes):
        k = int(np.ceil(0.2 * np.prod(shape)))
        assert np.count_nonzero(out) == k  # the tensor's own k_i, not a share of the group's
        np.testing.assert_array_equal(out[out != 0], g.numpy()[out != 0])


def _bounds(splits, n):
    from tf_mergecomp import grouping

    return grouping.group_bounds(splits, n)


class _GroupedAsOneOp:
    """A one-rank communicator whose grouped allreduce is one op, as Horovod's is (the
    fake world's is one allreduce per tensor)."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def grouped_allreduce_mean(self, tensors, key):
        return tf.identity_n(list(tensors))


def _traced_op_count(name, tensors):
    shapes = [(8, 4)] * tensors
    mc = engine(name, "op")
    world = FakeWorld(1)
    comm = _GroupedAsOneOp(world.communicator(0))
    mc.set_gradient_layout([tf.TensorShape(s) for s in shapes], [tf.float32] * tensors)
    mc.state_variables()  # created here, outside the traced group

    @tf.function
    def group(grads):
        return mc.reduce_group(grads, comm, tf.constant(0, tf.int64))[0]

    specs = [tf.TensorSpec(s, tf.float32) for s in shapes]
    return len(group.get_concrete_function(specs).graph.get_operations())


@pytest.mark.parametrize("name", FUSED + ("powersgd",))
def test_a_merged_group_grows_by_at_most_three_ops_per_extra_tensor(name):
    # The gradient's placeholder, its state variable's handle, its output (none goes to
    # Horovod's grouped allreduce as it is: its placeholder and its output, no copy).
    small, large = _traced_op_count(name, 4), _traced_op_count(name, 12)
    assert (large - small) <= (2 if name == "none" else 3) * 8, (name, small, large)


def test_bad_state_variable_is_a_clear_error():
    from tf_mergecomp import ops

    grads = [tf.ones([4]), tf.ones([3])]
    wrong = [tf.Variable(tf.zeros([4])), tf.Variable(tf.zeros([2]))]
    with pytest.raises(tf.errors.InvalidArgumentError, match="state variable 1 must be"):
        ops.load().mergecomp_group_encode(grads, [v.handle for v in wrong], tf.constant(0, tf.int64),
                                           memory="residual", codec="efsignsgd",
                                           payload_type=tf.uint8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="unknown group codec 'nope'"):
        ops.load().mergecomp_group_encode(grads, [], tf.constant(0, tf.int64), memory="none",
                                           codec="nope", payload_type=tf.uint8)
