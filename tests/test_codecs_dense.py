"""The dense codecs: none, fp16, qsgd, terngrad, onebit, signsgd, signum, efsignsgd.

Each codec runs with the fused group ops on a group of one tensor (backend
"op") and with stock TensorFlow (backend "reference", tf_mergecomp/reference.py); deterministic codecs must agree bit for bit, and the
stochastic ones (qsgd, terngrad) must draw the same numbers for the same seed.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from tests import codec_backends
from tf_mergecomp import ops as op_library, compressors, memory

DENSE = ("none", "fp16", "qsgd", "terngrad", "onebit", "signsgd", "signum", "efsignsgd")
ALLGATHER_CODECS = ("qsgd", "terngrad", "onebit", "signsgd", "signum", "efsignsgd")
SIZES = (0, 1, 7, 8, 9, 1000, 1001)
# Crosses the ops' 32768-element work blocks, with a ragged tail.
LARGE = 70001


def wire_bytes(name, n, levels=64):
    """The wire sizes each codec's docstring documents."""
    bits = math.ceil(math.log2(2 * levels + 1))
    return {
        "none": 4 * n,
        "fp16": 2 * n,
        "qsgd": math.ceil(n * bits / 8) + 4,
        "terngrad": math.ceil(n / 4) + 4,
        "onebit": math.ceil(n / 8) + 8,
        "signsgd": math.ceil(n / 8),
        "signum": math.ceil(n / 8),
        "efsignsgd": math.ceil(n / 8) + 4,
    }[name]


def gradient(n, seed=0, dtype=np.float32):
    values = np.random.default_rng(seed).standard_normal(n).astype(dtype)
    if n > 3:
        values[:3] = [0.0, -0.0, 2.5]  # zeros of both signs take the "+" bit
    return tf.constant(values)


def exchange(codec, inputs, seeds):
    """Simulates the collective: returns (payloads, combined, own decodes)."""
    payloads, contexts = zip(*(codec.compress(x, s) for x, s in zip(inputs, seeds)))
    world = len(inputs)
    if codec.collective == compressors.ALLREDUCE:
        collected = tf.cast(
            tf.reduce_mean(tf.cast(tf.stack(payloads), tf.float32), axis=0), payloads[0].dtype
        )
    else:
        collected = tf.concat(payloads, axis=0)
    combined = codec.combine(collected, contexts[0], world)
    own = [codec.decompress(p, c) for p, c in zip(payloads, contexts)]
    return [p.numpy() for p in payloads], combined.numpy(), [o.numpy() for o in own]


@pytest.mark.parametrize("name", DENSE)
def test_payload_is_one_tensor_of_exactly_the_documented_bytes(name):
    for backend in ("op", "reference"):
        codec = codec_backends.get(name, backend=backend)
        for n in SIZES:
            payload, _ = codec.compress(gradient(n), 7)
            assert payload.shape.rank == 1
            assert payload.numpy().nbytes == codec.payload_nbytes(n) == wire_bytes(name, n), (
                backend, n)
            expected_dtype = {"none": tf.float32, "fp16": tf.float16}.get(name, tf.uint8)
            assert payload.dtype == expected_dtype


@pytest.mark.parametrize("levels", [1, 3, 300])
def test_qsgd_payload_size_for_other_code_widths(levels):
    codec = compressors.get("qsgd", levels=levels)
    for n in SIZES:
        payload, _ = codec.compress(gradient(n), 1)
        assert payload.numpy().nbytes == codec.payload_nbytes(n) == wire_bytes("qsgd", n, levels)


@pytest.mark.parametrize("name", DENSE)
@pytest.mark.parametrize("n", [1, 9, 1001, LARGE])
def test_op_matches_reference_bit_for_bit(name, n):
    inputs = [gradient(n, seed) for seed in range(3)]
    seeds = [11, 12, 13]
    op = exchange(compressors.get(name), inputs, seeds)
    reference = exchange(codec_backends.get(name, backend="reference"), inputs, seeds)
    np.testing.assert_array_equal(op[0], reference[0])  # the wire bytes
    np.testing.assert_array_equal(op[1], reference[1])  # combine
    np.testing.assert_array_equal(op[2], reference[2])  # decompress


@pytest.mark.parametrize("levels", [1, 3, 7, 300])
def test_qsgd_other_code_widths_match_reference(levels):
    inputs = [gradient(1003, seed) for seed in range(2)]
    op = exchange(compressors.get("qsgd", levels=levels), inputs, [3, 4])
    reference = exchange(codec_backends.get("qsgd", levels=levels, backend="reference"), inputs, [3, 4])
    for a, b in zip(op, reference):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["qsgd", "terngrad"])
def test_same_seed_same_draws_other_seed_other_draws(name):
    codec = compressors.get(name)
    x = gradient(4096)
    first, _ = codec.compress(x, 123)
    again, _ = codec.compress(x, 123)
    other, _ = codec.compress(x, 124)
    np.testing.assert_array_equal(first.numpy(), again.numpy())
    assert not np.array_equal(first.numpy(), other.numpy())


def test_none_and_fp16_round_trips():
    x = gradient(1001)
    none = compressors.get("none")
    payload, ctx = none.compress(x, 0)
    np.testing.assert_array_equal(none.decompress(payload, ctx).numpy(), x.numpy())
    fp16 = compressors.get("fp16")
    payload, ctx = fp16.compress(x, 0)
    expected = x.numpy().astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(fp16.decompress(payload, ctx).numpy(), expected)


def test_fp16_saturates_to_infinity_and_keeps_nan():
    finite = [65504.0, 65519.0, 65520.0, -1e6, 1e-9]
    for backend in ("op", "reference"):
        codec = codec_backends.get("fp16", backend=backend)
        out = codec.decompress(*codec.compress(tf.constant(finite), 0)).numpy()
        np.testing.assert_array_equal(out, [65504.0, 65504.0, np.inf, -np.inf, 0.0])
    # Element by element in the codec itself (the reference); the op backend,
    # a group of one, applies the group ops' rule to a non-finite tensor
    # (test_op_backend_marks_a_nonfinite_tensor).
    codec = codec_backends.get("fp16", backend="reference")
    x = tf.constant(finite + [float("nan"), float("inf")])
    out = codec.decompress(*codec.compress(x, 0)).numpy()
    np.testing.assert_array_equal(out[:5], [65504.0, 65504.0, np.inf, -np.inf, 0.0])
    assert np.isnan(out[5]) and out[6] == np.inf


@pytest.mark.parametrize("name", ["signsgd", "signum"])
def test_sign_round_trip_is_plus_minus_one_with_sign_of_zero_plus(name):
    x = gradient(1001)
    codec = compressors.get(name)
    payload, ctx = codec.compress(x, 0)
    expected = np.where(x.numpy() < 0, -1.0, 1.0)
    np.testing.assert_array_equal(codec.decompress(payload, ctx).numpy(), expected)
    assert payload.numpy()[0] & 0b111 == 0b111  # 0.0, -0.0 and 2.5 are all "+"


def test_onebit_decodes_to_the_mean_of_each_side():
    x = gradient(1001).numpy()
    codec = compressors.get("onebit")
    payload, ctx = codec.compress(tf.constant(x), 0)
    plus = ~(x < 0)
    expected = np.where(plus, x[plus].astype(np.float64).mean(), x[~plus].astype(np.float64).mean())
    np.testing.assert_allclose(codec.decompress(payload, ctx).numpy(), expected, rtol=1e-6)


def test_efsignsgd_decodes_to_mean_abs_times_sign():
    x = gradient(1001).numpy()
    codec = compressors.get("efsignsgd")
    payload, ctx = codec.compress(tf.constant(x), 0)
    expected = np.abs(x.astype(np.float64)).mean() * np.where(x < 0, -1.0, 1.0)
    np.testing.assert_allclose(codec.decompress(payload, ctx).numpy(), expected, rtol=1e-6)


def test_qsgd_and_terngrad_decode_to_their_grids():
    x = gradient(1001).numpy()
    norm = np.linalg.norm(x.astype(np.float64))
    codec = compressors.get("qsgd", levels=4)
    payload, ctx = codec.compress(tf.constant(x), 5)
    steps = codec.decompress(payload, ctx).numpy() / (norm / 4)
    np.testing.assert_allclose(steps, np.round(steps), atol=1e-4)
    assert np.all(np.abs(steps - x / (norm / 4)) < 1 + 1e-4)  # within one level
    codec = compressors.get("terngrad")
    payload, ctx = codec.compress(tf.constant(x), 5)
    decoded = codec.decompress(payload, ctx).numpy()
    m = np.abs(x).max()
    assert set(np.unique(decoded)) <= {-m, 0.0, m}
    assert np.all(decoded * x >= 0)  # never the opposite sign


@pytest.mark.parametrize("name", ["qsgd", "terngrad"])
def test_stochastic_codecs_are_unbiased(name):
    # Averaged over K seeds, each element's decode is within 5 standard errors
    # of the input. One draw's variance is at most (step / 2)**2 with step =
    # norm / s (qsgd, s = 4 here to make it large) or m (terngrad).
    x = np.array([0.9, -0.5, 0.3, -0.05, 0.0, 0.77, -1.3, 0.01], np.float32)
    codec = compressors.get(name, levels=4) if name == "qsgd" else compressors.get(name)
    step = np.linalg.norm(x) / 4 if name == "qsgd" else np.abs(x).max()
    draws = 3000
    total = np.zeros_like(x, dtype=np.float64)
    compress = tf.function(lambda seed: codec.decompress(*codec.compress(tf.constant(x), seed)))
    for seed in range(draws):
        total += compress(tf.constant(seed, tf.int64)).numpy()
    bound = 5 * (step / 2) / math.sqrt(draws)
    np.testing.assert_allclose(total / draws, x, atol=bound)
    # A biased rounding (e.g. always down) would miss by a whole fraction of a step.
    assert bound < 0.1 * step


@pytest.mark.parametrize("backend", ["op", "reference"])
@pytest.mark.parametrize("name", ["signsgd", "signum"])
def test_majority_vote_by_hand(name, backend):
    codec = codec_backends.get(name, backend=backend)
    three = [
        tf.constant([1.0, 1.0, -1.0, -2.0, 0.0, -3.0]),
        tf.constant([2.0, -1.0, -1.0, 4.0, -0.5, -0.0]),
        tf.constant([-3.0, -1.0, 5.0, -1.0, -0.5, -1.0]),
    ]
    # Votes: ++-  +--  --+  -+-  +--  -+-  (0 and -0 vote +)
    _, combined, _ = exchange(codec, three, [0, 0, 0])
    np.testing.assert_array_equal(combined, [1.0, -1.0, -1.0, -1.0, -1.0, -1.0])
    # Two workers disagreeing is a tie, which votes +1.
    two = [tf.constant([1.0, -1.0, -1.0]), tf.constant([-1.0, 1.0, -1.0])]
    _, combined, _ = exchange(codec, two, [0, 0])
    np.testing.assert_array_equal(combined, [1.0, 1.0, -1.0])


@pytest.mark.parametrize("name", ["onebit", "efsignsgd", "qsgd", "terngrad"])
def test_mean_combine_by_hand(name):
    inputs = [gradient(37, seed) for seed in range(3)]
    codec = compressors.get(name)
    _, combined, own = exchange(codec, inputs, [1, 2, 3])
    np.testing.assert_allclose(combined, np.mean(own, axis=0), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["onebit", "efsignsgd"])
def test_residual_error_feedback_invariant(name):
    codec = compressors.get(name)
    assert codec.default_memory == "residual"
    residual = memory.get("residual")
    state = {"residual": tf.zeros([1001])}
    for step in range(3):
        g = gradient(1001, step)
        old = state["residual"]
        compensated, state = residual.compensate(g, state)
        payload, ctx = codec.compress(compensated, step)
        sent = codec.decompress(payload, ctx)
        state = residual.update(compensated, sent, state)
        np.testing.assert_allclose(
            sent.numpy() + state["residual"].numpy(), g.numpy() + old.numpy(), rtol=1e-6, atol=1e-6)
        assert np.any(state["residual"].numpy() != 0)


def test_signums_beta_reaches_its_momentum_memory():
    signum = compressors.get("signum", beta=0.8)
    assert memory.get(signum.default_memory, **signum.default_memory_params()).beta == 0.8
    assert compressors.get("qsgd").params == {"levels": 64}


@pytest.mark.parametrize("name", DENSE)
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float64])
def test_other_float_dtypes_compute_in_float32(name, dtype):
    x = tf.cast(gradient(1001), dtype)
    codec = compressors.get(name)
    payload, ctx = codec.compress(x, 3)
    reference_payload, reference_ctx = codec.compress(tf.cast(x, tf.float32), 3)
    np.testing.assert_array_equal(payload.numpy(), reference_payload.numpy())
    decoded = codec.decompress(payload, ctx)
    combined = codec.combine(payload, ctx, 1)
    assert decoded.dtype == dtype and combined.dtype == dtype
    expected = codec.decompress(reference_payload, reference_ctx)
    np.testing.assert_array_equal(decoded.numpy(), tf.cast(expected, dtype).numpy())


@pytest.mark.parametrize("name", ["fp16", "signsgd", "onebit", "efsignsgd", "qsgd", "terngrad",
                                  "topk", "dgc", "randomk"])
def test_op_backend_marks_a_nonfinite_tensor(name):
    """The op backend is the group ops on a group of one tensor: a tensor
    holding an inf or a NaN is encoded as zeros with its marker set, and the
    decoder turns a marked tensor into NaN and reports it."""
    codec = compressors.get(name)
    values = tf.constant([1.0, -2.0, float("nan"), 0.5, -0.25] * 40)
    ops = op_library.load()
    attrs = codec.group_op_attrs([200])
    row, context = ops.mergecomp_group_encode(
        [values], [], tf.constant(5, tf.int64), payload_type=codec.payload_dtype, memory="none",
        codec=codec.group_codec, **attrs)
    assert float(tf.cast(row[-1], tf.float32)) == 1.0
    payload, _ = codec.op_encode(values, 5)
    np.testing.assert_array_equal(payload.numpy(), row.numpy()[:-1])
    zeros, _ = codec.op_encode(tf.zeros([200]), 5)
    np.testing.assert_array_equal(payload.numpy(), zeros.numpy(), err_msg=name)
    outputs, nonfinite = ops.mergecomp_group_decode(
        row, context, T=[tf.float32], shapes=[[200]], num_rows=1, codec=codec.group_codec,
        **attrs)
    assert nonfinite.numpy().tolist() == [1]
    assert np.all(np.isnan(outputs[0].numpy()))


# The codecs' own element-wise behaviour (the plain-TF reference): through
# the ops, a tensor holding an inf or a NaN is marked instead (above).
@pytest.mark.parametrize("backend", ["reference"])
def test_nan_and_inf_behave_as_documented(backend):
    def decode(name, values):
        codec = codec_backends.get(name, backend=backend)
        payload, ctx = codec.compress(tf.constant(values, tf.float32), 9)
        return codec.decompress(payload, ctx).numpy()

    nan, inf = float("nan"), float("inf")
    with_nan = [1.0, -2.0, nan, 0.5, -0.25]
    with_inf = [1.0, -2.0, inf, 0.5, -0.25]
    # Signs: NaN votes +, infinities their sign; never NaN out.
    np.testing.assert_array_equal(decode("signsgd", with_nan), [1, -1, 1, 1, -1])
    np.testing.assert_array_equal(decode("signsgd", [-inf, inf, -0.0]), [-1, 1, 1])
    # qsgd, terngrad, efsignsgd: a NaN poisons the scale and every element.
    for name in ("qsgd", "terngrad", "efsignsgd"):
        assert np.all(np.isnan(decode(name, with_nan))), name
    for name in ("qsgd", "terngrad"):
        assert np.all(np.isnan(decode(name, with_inf))), name
    np.testing.assert_array_equal(decode("efsignsgd", with_inf), [inf, -inf, inf, inf, -inf])
    # onebit: NaN joins the "+" side, whose mean becomes NaN; "-" is intact.
    out = decode("onebit", with_nan)
    assert np.all(np.isnan(out[[0, 2, 3]]))
    np.testing.assert_allclose(out[[1, 4]], -1.125)
    out = decode("onebit", with_inf)
    np.testing.assert_array_equal(out[[0, 2, 3]], inf)
    np.testing.assert_allclose(out[[1, 4]], -1.125)


@pytest.mark.parametrize("name", ALLGATHER_CODECS)
def test_all_zero_input_decodes_to_zero_or_plus_one(name):
    codec = compressors.get(name)
    payload, ctx = codec.compress(tf.zeros([19]), 0)
    expected = 1.0 if name in ("signsgd", "signum") else 0.0
    np.testing.assert_array_equal(codec.decompress(payload, ctx).numpy(), expected)


@pytest.mark.parametrize("name", DENSE)
def test_graph_mode(name):
    codec = compressors.get(name)
    x = gradient(100)

    @tf.function
    def step(flat, seed):
        payload, ctx = codec.compress(flat, seed)
        collected = payload if codec.collective == compressors.ALLREDUCE else tf.concat(
            [payload, payload], 0)
        return codec.combine(collected, ctx, 2), codec.decompress(payload, ctx)

    combined, own = step(x, tf.constant(4, tf.int64))
    payload, ctx = codec.compress(x, 4)
    np.testing.assert_array_equal(own.numpy(), codec.decompress(payload, ctx).numpy())
    assert combined.shape == (100,)


def test_bad_parameters_raise_value_error_naming_the_choices():
    with pytest.raises(ValueError, match="levels must be an integer >= 1"):
        compressors.get("qsgd", levels=0)
    with pytest.raises(ValueError, match=r"\[1, 16777216\]"):
        compressors.get("qsgd", levels=2 ** 24 + 1)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        compressors.get("signum", beta=1.0)
    with pytest.raises(ValueError, match="valid parameters: beta, two_level_vote$"):
        compressors.get("signum", momentum=0.9)
    with pytest.raises(ValueError, match="valid parameters: two_level_vote$"):
        compressors.get("signsgd", beta=0.9)
    with pytest.raises(ValueError, match="valid parameters: none"):
        compressors.get("terngrad", beta=0.9)
    with pytest.raises(ValueError, match="unknown parameter.*backend"):
        compressors.get("onebit", backend="reference")
    with pytest.raises(ValueError, match="static length"):
        compressors.get("efsignsgd").compress(tf.zeros([2, 3]), 0)


def test_each_codec_states_its_collective_and_default_memory():
    # What the module docstrings document; several codecs inherit them from Compressor.
    expected = {
        "none": ("allreduce", "none"), "fp16": ("allreduce", "none"),
        "qsgd": ("allgather", "none"), "terngrad": ("allgather", "none"),
        "onebit": ("allgather", "residual"), "signsgd": ("allgather", "none"),
        "signum": ("allgather", "momentum"), "efsignsgd": ("allgather", "residual"),
        "topk": ("allgather", "residual"), "dgc": ("allgather", "dgc"),
        "randomk": ("allreduce", "residual"), "powersgd": ("allreduce", "residual"),
    }
    assert set(expected) == set(compressors.NAMES)
    for name, (collective, default_memory) in expected.items():
        codec = compressors.get(name)
        assert (codec.collective, codec.default_memory) == (collective, default_memory), name
