"""The sparse and low-rank codecs: topk, dgc, randomk, powersgd.

PowerSGD works on whole groups of tensors (a matrix per tensor): its
algorithm, fused ops and reference are tested in test_powersgd_group.py;
here only its parameters and registry attributes."""

import numpy as np
import pytest
import tensorflow as tf

from tests import codec_backends
from tests._fake_comm import FakeWorld
from tf_mergecomp import compressors, memory
from tf_mergecomp.compressors import sparse_payload

SIZES = (0, 1, 7, 8, 9, 1000, 1001)
SPARSE = ("topk", "dgc", "randomk")


def normal(n, seed=0, dtype=np.float32):
    return tf.constant(np.random.RandomState(seed).randn(n).astype(dtype))


def heavy_tailed(n, seed=0):
    return tf.constant(np.random.RandomState(seed).standard_t(2, n).astype(np.float32))


def sent_indices(payload, k):
    return sparse_payload.unpack(payload, k)[1].numpy()[0]


# --- sizes -------------------------------------------------------------------

@pytest.mark.parametrize("name", SPARSE)
@pytest.mark.parametrize("n", SIZES)
def test_payload_bytes_match_payload_nbytes(name, n):
    codec = compressors.get(name)
    payload, _ = codec.compress(normal(n), 3)
    assert payload.shape.rank == 1
    assert payload.shape[0] * payload.dtype.size == codec.payload_nbytes(n)
    k = 0 if n == 0 else max(1, int(np.ceil(0.01 * n)))
    assert codec.payload_nbytes(n) == (4 if name == "randomk" else 8) * k


def test_k_rounding():
    assert sparse_payload.sparse_k(100, 0.07) == 7
    assert sparse_payload.sparse_k(1, 0.01) == 1
    assert sparse_payload.sparse_k(0, 0.5) == 0
    assert sparse_payload.sparse_k(1001, 0.01) == 11
    assert sparse_payload.sparse_k(10, 1.0) == 10


# --- op == reference ------------------------------------------------------------

INPUTS = {
    "normal": lambda n: normal(n, 1),
    "heavy": lambda n: heavy_tailed(n, 2),
    "ties": lambda n: tf.constant(np.resize(np.array([0, 1, -1, 2, 0, -2, 1, 0], np.float32), n)),
    "zeros": lambda n: tf.zeros([n]),
}


@pytest.mark.parametrize("name", SPARSE)
@pytest.mark.parametrize("kind", sorted(INPUTS))
@pytest.mark.parametrize("n", (1, 9, 1001, 70000))
def test_op_equals_reference_bytes(name, kind, n):
    x = INPUTS[kind](n)
    for ratio in (0.01, 0.3, 1.0):
        op = compressors.get(name, ratio=ratio)
        ref = codec_backends.get(name, ratio=ratio, backend="reference")
        for seed in (0, 12345, -7):
            p_op, ctx_op = op.compress(x, seed)
            p_ref, ctx_ref = ref.compress(x, seed)
            np.testing.assert_array_equal(p_op.numpy(), p_ref.numpy())
            np.testing.assert_array_equal(op.decompress(p_op, ctx_op).numpy(),
                                          ref.decompress(p_ref, ctx_ref).numpy())


@pytest.mark.parametrize("name", ("topk", "dgc"))
def test_combine_op_equals_reference_and_mean(name):
    n, world = 5000, 3
    op, ref = compressors.get(name, ratio=0.05), codec_backends.get(name, ratio=0.05, backend="reference")
    payloads, dense = [], []
    for w in range(world):
        payload, ctx = op.compress(normal(n, 10 + w), w)
        payloads.append(payload)
        dense.append(op.decompress(payload, ctx).numpy())
    collected = tf.concat(payloads, 0)
    combined = op.combine(collected, ctx, world).numpy()
    np.testing.assert_array_equal(combined, ref.combine(collected, ctx, world).numpy())
    np.testing.assert_allclose(combined, np.mean(dense, axis=0), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="world_size"):
        op.combine(collected, ctx, 2)


# --- semantics ------------------------------------------------------------------

def test_topk_selects_the_largest_magnitudes():
    x = normal(10000, 7)  # continuous draw: no ties
    codec = compressors.get("topk", ratio=0.02)
    payload, ctx = codec.compress(x, 0)
    k = codec.k(10000)
    expected = np.sort(np.argsort(-np.abs(x.numpy()), kind="stable")[:k])
    np.testing.assert_array_equal(sent_indices(payload, k), expected)
    dense = codec.decompress(payload, ctx).numpy()
    np.testing.assert_array_equal(dense[expected], x.numpy()[expected])
    assert np.count_nonzero(dense) == k


def test_topk_ties_go_to_the_lower_index():
    x = tf.constant(np.array([1, 3, 3, -3, 2, 3], np.float32))
    payload, _ = compressors.get("topk", ratio=0.5).compress(x, 0)
    np.testing.assert_array_equal(sent_indices(payload, 3), [1, 2, 3])


def test_randomk_indices_uniform_distinct_and_seeded():
    codec = compressors.get("randomk", ratio=0.1)
    n, k = 1000, 100
    a = codec.indices(5, n).numpy()
    assert len(set(a)) == k and np.all(np.diff(a) > 0) and a[0] >= 0 and a[-1] < n
    np.testing.assert_array_equal(a, codec.indices(5, n).numpy())
    assert not np.array_equal(a, codec.indices(6, n).numpy())
    counts = np.zeros(n)
    seeds = 400
    for seed in range(seeds):
        counts[codec.indices(seed, n).numpy()] += 1
    # Each position is chosen with probability k/n = 0.1: 40 expected, sd ~6.
    assert abs(counts.mean() - 40) < 1e-9
    assert counts.min() > 40 - 6 * 6 and counts.max() < 40 + 6 * 6


def test_scaled_randomk_is_unbiased():
    n, ratio, seeds = 50, 0.2, 3000
    g = normal(n, 8)
    scaled = compressors.get("randomk", ratio=ratio, scale=True)
    plain = compressors.get("randomk", ratio=ratio)
    decode = tf.function(lambda seed: [c.decompress(*c.compress(g, seed)) for c in (scaled, plain)])
    sums = np.zeros((2, n))
    for seed in range(seeds):
        sums += np.stack([t.numpy() for t in decode(tf.constant(seed, tf.int64))])
    mean_scaled, mean_plain = sums / seeds
    # Scaled decode of coordinate i: (n/k) g_i w.p. k/n, so its variance is
    # g_i^2 (n/k - 1) = 4 g_i^2 and the mean's sd is 2 |g_i| / sqrt(seeds).
    bound = 5 * 2 * np.abs(g.numpy()) / np.sqrt(seeds)
    assert np.all(np.abs(mean_scaled - g.numpy()) <= bound)
    # Unscaled decode is biased towards (k/n) g.
    np.testing.assert_allclose(mean_plain, ratio * g.numpy(), atol=float(np.max(bound)) / 5 * 2)
    assert np.abs(mean_plain - g.numpy()).max() > 10 * bound.max() / 5


def test_randomk_allreduce_mean_over_workers():
    n, world = 2000, 3
    grads = [normal(n, 20 + w) for w in range(world)]
    codecs = [compressors.get("randomk", ratio=0.05) for _ in range(world)]
    results = FakeWorld(world).run(lambda r, comm: codecs[r].reduce(grads[r], 99, comm, (0, n)))
    averaged = results[0][0].numpy()
    chosen = codecs[0].indices(99, n).numpy()
    mean = np.mean([g.numpy() for g in grads], axis=0)
    np.testing.assert_allclose(averaged[chosen], mean[chosen], rtol=1e-6)
    assert np.count_nonzero(averaged) == len(chosen)
    for avg, _ in results[1:]:
        np.testing.assert_array_equal(avg.numpy(), averaged)


@pytest.mark.parametrize("make", (normal, heavy_tailed), ids=("normal", "heavy_tailed"))
def test_dgc_threshold_selects_close_to_k(make):
    n = 1_000_000
    codec = codec_backends.get("dgc", ratio=0.01, backend="reference")
    topk = compressors.get("topk", ratio=0.01)
    k = codec.k(n)
    x = make(n, 3)
    ratios, exact = [], 0
    for seed in range(4):
        _, sampled, final = codec.reference_threshold(x, seed)
        ratios.append(int(sampled) / k)
        assert int(final) >= k
        payload, _ = compressors.get("dgc", ratio=0.01).compress(x, seed)
        # All candidates reach the threshold and are larger than the rest:
        # with >= k of them the payload is the exact top-k.
        np.testing.assert_array_equal(payload.numpy(), topk.compress(x, 0)[0].numpy())
        exact += 1
    # A sample of 10,000 estimates the 1% quantile to about +-10% in count.
    assert 0.7 < np.mean(ratios) < 1.4 and all(0.5 < r < 2.0 for r in ratios), ratios
    assert exact == 4


def test_dgc_pads_when_too_few_candidates():
    # 100 entries of magnitude 2^1 .. 2^100 among 900 ones: halving the
    # threshold adds about one candidate, so a sample that ranks the k-th
    # largest a little too high leaves fewer than k candidates.
    n, k = 1000, 50
    magnitudes = np.ones(n, np.float32)
    magnitudes[::10] = 2.0 ** np.arange(1, 101)
    x = tf.constant(magnitudes * np.where(np.arange(n) % 3 == 0, -1, 1).astype(np.float32))
    codec = compressors.get("dgc", ratio=k / n)
    ref = codec_backends.get("dgc", ratio=k / n, backend="reference")
    padded = 0
    for seed in range(20):
        _, _, final = ref.reference_threshold(x, seed)
        payload, ctx = codec.compress(x, seed)
        np.testing.assert_array_equal(payload.numpy(), ref.compress(x, seed)[0].numpy())
        values, indices = (t.numpy()[0] for t in sparse_payload.unpack(payload, k))
        c = int(final)
        if c < k:
            padded += 1
            top_c = np.sort(np.argsort(-magnitudes, kind="stable")[:c])
            np.testing.assert_array_equal(indices[:c], top_c)
            np.testing.assert_array_equal(values[:c], x.numpy()[top_c])
            np.testing.assert_array_equal(values[c:], 0.0)
            np.testing.assert_array_equal(indices[c:], 0)
            dense = codec.decompress(payload, ctx).numpy()
            np.testing.assert_array_equal(dense[top_c], x.numpy()[top_c])
            assert np.count_nonzero(dense) == c
    assert padded > 0


# --- error feedback -------------------------------------------------------------

@pytest.mark.parametrize("name", ("topk", "dgc", "randomk"))
def test_error_feedback_invariant(name):
    codec = compressors.get(name, ratio=0.05)
    mem = memory.get(codec.default_memory, **codec.default_memory_params())
    n = 3000
    state = {s: tf.zeros([n]) for s in mem.state_names}
    total_in, total_sent = np.zeros(n), np.zeros(n)
    for step in range(5):
        g = normal(n, 30 + step)
        compensated, state = mem.compensate(g, state)
        payload, ctx = codec.compress(compensated, step)
        sent = codec.decompress(payload, ctx)
        state = mem.update(compensated, sent, state)
        chosen = np.flatnonzero(sent.numpy())
        assert len(chosen) == codec.k(n)
        kept = state["residual"] if name != "dgc" else state["accumulation"]
        # Sent entries leave the memory entirely; the rest stay.
        np.testing.assert_array_equal(kept.numpy()[chosen], 0.0)
        np.testing.assert_array_equal(sent.numpy()[chosen], compensated.numpy()[chosen])
        rest = np.setdiff1d(np.arange(n), chosen)
        np.testing.assert_array_equal(kept.numpy()[rest], compensated.numpy()[rest])
        if name == "dgc":
            np.testing.assert_array_equal(state["momentum"].numpy()[chosen], 0.0)
        total_in += g.numpy()
        total_sent += sent.numpy()
    if name != "dgc":
        # Nothing is lost: what was sent plus what is kept is all the gradient.
        np.testing.assert_allclose(total_sent + state["residual"].numpy(), total_in, atol=1e-4)


# --- dtypes ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", (tf.float16, tf.bfloat16, tf.float64))
@pytest.mark.parametrize("name", SPARSE)
def test_dtypes(name, dtype):
    x32 = normal(1001, 70)
    x = tf.cast(x32, dtype)
    codec = compressors.get(name, ratio=0.05)
    payload, ctx = codec.compress(x, 1)
    out = codec.decompress(payload, ctx)
    expected = codec.decompress(*codec.compress(tf.cast(x, tf.float32), 1))
    if name != "randomk":
        assert payload.dtype == tf.uint8
    else:
        assert payload.dtype == tf.float32
    assert out.dtype == dtype and out.shape == (1001,)
    np.testing.assert_allclose(tf.cast(out, tf.float32).numpy(),
                               tf.cast(tf.cast(expected, dtype), tf.float32).numpy(), rtol=1e-5)


# --- NaN / Inf ------------------------------------------------------------------

@pytest.mark.parametrize("name", ("topk", "dgc"))
def test_nan_and_inf_rank_as_largest_and_propagate(name):
    values = normal(1000, 80).numpy()
    values[[10, 500]] = [np.nan, -np.inf]
    x = tf.constant(values)
    # The codec's own selection (the plain-TF reference; through the ops, a
    # tensor holding an inf or a NaN is marked instead: test_codecs_dense.py).
    for backend in ("reference",):
        codec = codec_backends.get(name, ratio=0.01, backend=backend)
        payload, ctx = codec.compress(x, 0)
        assert {10, 500} <= set(sent_indices(payload, 10))
        dense = codec.decompress(payload, ctx).numpy()
        assert np.isnan(dense[10]) and dense[500] == -np.inf
        assert np.isfinite(np.delete(dense, [10, 500])).all()


def test_randomk_nan_propagates_only_where_sent():
    codec = compressors.get("randomk", ratio=0.1)
    chosen = codec.indices(4, 100).numpy()
    values = normal(100, 81).numpy()
    unsent = np.setdiff1d(np.arange(100), chosen)[0]
    values[[chosen[0], unsent]] = np.nan
    dense = codec.decompress(*codec.compress(tf.constant(values), 4)).numpy()
    assert np.isnan(dense[chosen[0]]) and dense[unsent] == 0.0


# --- parameters -----------------------------------------------------------------

@pytest.mark.parametrize("name", SPARSE)
@pytest.mark.parametrize("ratio", (0, -0.1, 1.5, "0.1", True, None))
def test_bad_ratio(name, ratio):
    with pytest.raises(ValueError, match=r"ratio must be a number in \(0, 1\]"):
        compressors.get(name, ratio=ratio)


@pytest.mark.parametrize("name,params,message", [
    ("dgc", {"sample_ratio": 0}, r"sample_ratio must be a number in \(0, 1\]"),
    ("dgc", {"momentum": 1.0}, r"momentum must be a number in \[0, 1\)"),
    ("dgc", {"momentum": -0.5}, r"momentum must be a number in \[0, 1\)"),
    ("randomk", {"scale": "yes"}, "scale must be True or False"),
    ("powersgd", {"rank": 0}, "rank must be an integer >= 1"),
    ("powersgd", {"rank": 1.5}, "rank must be an integer >= 1"),
    ("topk", {"backend": "reference"}, "unknown parameter.*backend.*valid parameters: ratio$"),
    ("topk", {"k": 3}, "valid parameters: ratio$"),
])
def test_bad_parameters(name, params, message):
    with pytest.raises(ValueError, match=message):
        compressors.get(name, **params)


def test_parameters_with_an_instance_are_refused():
    codec = compressors.get("topk")
    assert compressors.get(codec) is codec
    with pytest.raises(ValueError, match=r"parameters \['ratio'\] given with a compressor "
                                         r"instance; give the registry name with them"):
        compressors.get(codec, ratio=0.5)


def test_dgcs_momentum_reaches_its_memory():
    dgc = compressors.get("dgc", momentum=0.5)
    assert memory.get(dgc.default_memory, **dgc.default_memory_params()).momentum == 0.5


def test_non_static_length_is_refused():
    codec = compressors.get("topk")
    fn = tf.function(lambda x: codec.compress(x, 0)[0],
                     input_signature=[tf.TensorSpec([None], tf.float32)])
    with pytest.raises(ValueError, match="topk needs a 1-D buffer of static length"):
        fn.get_concrete_function()
