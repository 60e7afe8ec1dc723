"""The CUDA launchers reproduce the CPU ops, on a GPU or on the CUDA emulation.

The kernels are built straight from custom_ops/ into a plain shared library
and called through their ``extern "C"`` launchers, without TensorFlow, on one
of two backends (gpu_check/array_backends.py; $MERGECOMP_LAUNCHER_BACKEND
picks one, else the first available):

- "cuda": nvcc's build (gpu_check/launchers.py) with CuPy arrays on a GPU;
- "emulated": g++'s build against the CUDA emulation (gpu_check/emulation:
  the kernels run on the host, one host thread per CUDA thread, with real
  block barriers) with numpy arrays as device memory. It shows what the
  kernels compute, not how fast, and not faults that x86 forgives (a
  misaligned load): ``make gpu-emulate-sanitize`` runs this file under UBSan
  and ThreadSanitizer for those.

Every test asserts the same on both backends, at the same sizes (the
emulation runs them all in about 45 s on 2 cores, the 2^20 + 1-element case
about 20 s of it).

Expected bytes come from the CPU ops: tests/data/dense_golden.npz (the
single-buffer codecs, make_dense_golden.py) and tests/data/group_golden.npz
(make_group_golden.py: the group ops over 9 tensors of sizes 0..2053 on 3
workers, every group codec and memory, non-finite tensors; stress cases of 2
to 8 workers, odd tensor counts and sparse corner cases; a group with a tensor
of 2^20 + 1 elements compared through SHA-256 digests).

Exact everywhere (payload, codec context, state, decoded outputs and
non-finite flags), with one documented tolerance: the float64 sums behind the
onebit/efsignsgd/qsgd headers are added in another order on the GPU, so a
header may differ in its last float32 bit (rtol 2e-7), and so may what is
computed from it: the residual/momentum state (rtol 1e-6) and a QSGD level
sitting on a rounding boundary (> 99.9% of codes equal). Random codecs use the
CPU's counter-based RNG (random.h), so their draws are the same, not
statistically similar.
"""

import ctypes
import json
from pathlib import Path

import numpy as np
import pytest

from gpu_check import array_backends, launchers
from tests import golden_inputs
from tests._close import assert_close

ROOT = Path(__file__).resolve().parent.parent
N = 5003
WORLD = 3
HEADER_BYTES = {"onebit": 8, "efsignsgd": 4, "qsgd": 4, "terngrad": 4}
SUMMED_HEADERS = ("onebit", "efsignsgd", "qsgd")


# The backend every test runs on: B.asarray / empty / zeros / full (device
# arrays), B.get (to numpy), B.ptr (device pointer), B.synchronize.
B = array_backends.select()

pytestmark = pytest.mark.skipif(B is None, reason=array_backends.unavailable_reason())

P, I64 = ctypes.c_void_p, ctypes.c_int64
EMULATED = B is not None and B.name == "emulated"


@pytest.fixture(scope="module")
def lib():
    return launchers.load(B.library())


def test_library_exports_every_launcher(lib):
    """The library of this backend (nvcc's, or g++'s against the emulation)
    exports exactly the launchers the checks bind."""
    exported = launchers.exported_symbols(lib._name)
    assert sorted(set(launchers.EXPECTED_SYMBOLS) - exported) == []
    assert sorted(s for s in exported if s.startswith("mergecomp_")) == sorted(
        launchers.EXPECTED_SYMBOLS)


@pytest.fixture(scope="module")
def golden():
    return np.load(ROOT / "tests" / "data" / "dense_golden.npz")


@pytest.fixture(scope="module")
def group_golden():
    return np.load(ROOT / "tests" / "data" / "group_golden.npz")


# ---- single-buffer dense launchers ---------------------------------------------------


def inputs():
    return [np.random.default_rng(w).standard_normal(N).astype(np.float32) for w in range(WORLD)]


def _call(fn, *args):
    converted = [B.ptr(a) if B.is_array(a) else a for a in args]
    fn.restype = ctypes.c_int
    fn.argtypes = [P if B.is_array(a) or a is None else I64 for a in args]
    assert fn(*converted) == 0
    B.synchronize()


def _encode(lib, key, x, seed):
    scratch = B.empty(lib.mergecomp_dense_scratch_bytes(), np.uint8)
    payload = None
    if key == "fp16":
        payload = B.empty(N, np.uint16)
        _call(lib.mergecomp_fp16_encode_gpu, x, N, payload, None)
        return B.get(payload).view(np.float16)
    sizes = {"signsgd": (N + 7) // 8, "onebit": 8 + (N + 7) // 8,
             "efsignsgd": 4 + (N + 7) // 8, "qsgd64": 4 + N, "qsgd5": 4 + (N * 4 + 7) // 8,
             "terngrad": 4 + (N + 3) // 4}
    payload = B.empty(sizes[key], np.uint8)
    if key == "signsgd":
        _call(lib.mergecomp_signsgd_encode_gpu, x, N, payload, None)
    elif key in ("onebit", "efsignsgd"):
        _call(getattr(lib, "mergecomp_%s_encode_gpu" % key), x, N, payload, scratch, None)
    elif key.startswith("qsgd"):
        _call(lib.mergecomp_qsgd_encode_gpu, x, N, seed, int(key[4:]), payload, scratch, None)
    else:
        _call(lib.mergecomp_terngrad_encode_gpu, x, N, seed, payload, scratch, None)
    return B.get(payload)


def _decode(lib, key, rows):
    out = B.empty(N, np.float32)
    batch = B.asarray(np.concatenate(rows))
    if key.startswith("qsgd"):
        _call(lib.mergecomp_qsgd_decode_gpu, batch, len(rows), N, int(key[4:]), out, None)
    else:
        _call(getattr(lib, "mergecomp_%s_decode_gpu" % key), batch, len(rows), N, out, None)
    return B.get(out)


@pytest.mark.parametrize("key", ["fp16", "signsgd", "terngrad", "onebit", "efsignsgd",
                                 "qsgd64", "qsgd5"])
def test_gpu_encode_matches_cpu_op(lib, golden, key):
    header = {"onebit": 8, "efsignsgd": 4, "qsgd64": 4, "qsgd5": 4}.get(key, 0)
    for w, x in enumerate(inputs()):
        got = _encode(lib, key, B.asarray(x), w + 11)
        expected = golden["%s_payload%d" % (key, w)]
        if header == 0:
            np.testing.assert_array_equal(got, expected)
            continue
        np.testing.assert_allclose(got[:header].view(np.float32),
                                   expected[:header].view(np.float32), rtol=2e-7)
        same = np.mean(got[header:] == expected[header:])
        assert same == 1.0 if key in ("onebit", "efsignsgd") else same > 0.999


@pytest.mark.parametrize("key", ["signsgd", "terngrad", "onebit", "efsignsgd", "qsgd64", "qsgd5"])
def test_gpu_decode_matches_cpu_op(lib, golden, key):
    rows = [golden["%s_payload%d" % (key, w)] for w in range(WORLD)]
    np.testing.assert_array_equal(_decode(lib, key, rows), golden["%s_combined" % key])


def test_gpu_fp16_decode_is_exact(lib):
    values = np.random.default_rng(5).standard_normal(N).astype(np.float16)
    out = B.empty(N, np.float32)
    _call(lib.mergecomp_fp16_decode_gpu, B.asarray(values.view(np.uint16)), N, out, None)
    np.testing.assert_array_equal(B.get(out), values.astype(np.float32))


# ---- group launchers -----------------------------------------------------------------


def _cases(group_golden):
    return json.loads(str(group_golden["cases"]))


def _meta(group_golden, case):
    return json.loads(str(group_golden[case + "__meta"]))


def _split(flat, sizes, buffers=1):
    parts, start = [], 0
    for n in sizes:
        parts.append(B.asarray(flat[start:start + buffers * n]))
        start += buffers * n
    return parts


def _codec(meta):
    return launchers.make_codec(
        meta["codec"], memory=meta["memory"], decay=meta["decay"],
        gradient_scale=meta["gradient_scale"], marker_bytes=meta["marker_bytes"],
        scale=meta["scale"], levels=meta["levels"], k=meta["k"], sample_size=meta["sample_size"],
        tensor_k=meta["tensor_k"] if meta["codec"] == "randomk" else None)


def _check(lib, code, what):
    if code != 0:
        raise launchers.LauncherError(lib, what, code)


def _group_encode(lib, g, case, w, inputs=None, state=None):
    """Runs the encode launcher on worker w's inputs and state (flat; by
    default the golden's); returns (row bytes, context, state after (flat) or
    None)."""
    meta = _meta(g, case)
    sizes = [int(n) for n in g[case + "__sizes"]]
    grads = _split(g["%s__input%d" % (case, w)] if inputs is None else inputs, sizes)
    buffers = meta["state_buffers"]
    if buffers:
        flat_state = g["%s__state%d" % (case, w)] if state is None else state
        state = _split(flat_state.copy(), sizes, buffers)
    group = launchers.DeviceGroup(B, sizes, inputs=grads, state=state)
    pair = _codec(meta)
    codec = group.bind(pair)
    row = B.zeros(lib.mergecomp_group_row_bytes(codec, group.struct), np.uint8)
    context = B.zeros(max(1, lib.mergecomp_group_context_size(codec, group.struct)), np.int32)
    workspace = B.zeros(lib.mergecomp_group_workspace_bytes(codec, group.struct), np.uint8)
    seed = int(g["%s__seed%d" % (case, w)])
    _check(lib, lib.mergecomp_group_encode_gpu(codec, group.struct, seed, B.ptr(row),
                                               B.ptr(context), B.ptr(workspace), None),
           "group encode " + case)
    B.synchronize()
    after = np.concatenate([B.get(s) for s in state]) if state else None
    size = lib.mergecomp_group_context_size(codec, group.struct)
    return B.get(row), B.get(context)[:size], after


def _group_decode(lib, g, case, rows=None):
    meta = _meta(g, case)
    sizes = [int(n) for n in g[case + "__sizes"]]
    outputs = [B.full(n, 7.0, np.float32) for n in sizes]  # garbage to overwrite
    group = launchers.DeviceGroup(B, sizes, outputs=outputs)
    codec = group.bind(_codec(meta))
    rows = B.asarray(g[case + "__rows"] if rows is None else rows)
    context = B.asarray(np.concatenate([g[case + "__context0"], np.zeros(1, np.int32)]))
    nonfinite = B.full(len(sizes), -1, np.int32)
    workspace = B.zeros(lib.mergecomp_group_workspace_bytes(codec, group.struct), np.uint8)
    code = lib.mergecomp_group_decode_gpu(codec, group.struct, B.ptr(rows), meta["num_rows"],
                                          B.ptr(context), B.ptr(nonfinite), B.ptr(workspace),
                                          None)
    B.synchronize()
    return code, np.concatenate([B.get(o) for o in outputs]), B.get(nonfinite)


# One group of 9 tensors (0 to 2053 elements) on 3 workers: every codec and memory.
CASES = ["none", "fp16", "signsgd", "signum", "onebit", "efsignsgd", "efsignsgd_nonfinite", "qsgd",
         "qsgd5_residual", "terngrad", "topk", "topk_nonfinite", "dgc", "randomk",
         "randomk_scaled", "fp16_dgc_memory"]
# After the first GPU run (top-k's and DGC's decode faulting on 2+ rows, whose
# rows start unaligned): 2 to 8 workers, odd tensor counts, tensors of 0, 1 and
# 3 elements, top-k with k = n and with fewer non-zero values than k, DGC with
# fewer candidates than k (padding slots), the other allgather codecs on
# several rows (make_group_golden.py's STRESS_CASES).
STRESS_CASES = ["topk_w2", "topk_w8_nonfinite", "topk_all_w4", "topk_few_nonzero_w3", "dgc_w5",
                "dgc_w7", "dgc_few_candidates_w6", "dgc_few_candidates_w2", "signsgd_w8",
                "onebit_w7", "efsignsgd_w4_nonfinite", "qsgd5_w6", "terngrad_w3", "randomk_w2"]
# A tensor of 2^20 + 1 elements among tensors of 3, 0, 1 and 3: inputs
# regenerated from a seed (tests/golden_inputs.py), SHA-256 digests compared.
DIGEST_CASES = ["topk_big_w2"]


def test_golden_covers_every_group_codec(group_golden):
    assert sorted(CASES + STRESS_CASES + DIGEST_CASES) == _cases(group_golden)
    codecs = {_meta(group_golden, c)["codec"] for c in CASES}
    assert codecs == set(launchers.GROUP_CODECS)


def test_stress_cases_hold_what_they_are_for(group_golden):
    """The golden's stress cases do stress: sparse decodes of every worker
    count from 2 to 8 with rows starting at unaligned offsets, odd tensor
    counts with tensors of 0, 1 and 3 elements, DGC payloads padded (fewer
    candidates than k), top-k with k = n and with fewer non-zero values than k."""
    g = group_golden
    metas = {case: _meta(g, case) for case in STRESS_CASES + DIGEST_CASES}
    sparse = [m for m in metas.values() if m["codec"] in ("topk", "dgc")]
    assert {m["num_rows"] for m in sparse} >= set(range(2, 9))
    assert all(m["row_bytes"] % 4 != 0 for m in sparse)  # row w > 0 starts unaligned
    for case, meta in metas.items():
        sizes = [int(n) for n in g[case + "__sizes"]]
        assert len(sizes) % 2 == 1 and {0, 1, 3} <= set(sizes), case
    for case in ("dgc_few_candidates_w6", "dgc_few_candidates_w2"):
        assert all(p > 0 for p in metas[case]["padding_slots"]), case
        k = metas[case]["k"]
        for w in range(metas[case]["world"]):
            values = g["%s__row%d" % (case, w)][:4 * k].view(np.float32)
            assert (values == 0).sum() == metas[case]["padding_slots"][w]
    assert metas["topk_all_w4"]["k"] == sum(int(n) for n in g["topk_all_w4__sizes"])
    few = metas["topk_few_nonzero_w3"]
    assert all(np.count_nonzero(g["topk_few_nonzero_w3__input%d" % w]) < few["k"]
               for w in range(few["world"]))
    assert max(int(n) for n in g["topk_big_w2__sizes"]) == 2 ** 20 + 1


@pytest.mark.parametrize("case", CASES + STRESS_CASES)
def test_group_encode_matches_cpu_op(lib, group_golden, case):
    g, meta = group_golden, _meta(group_golden, case)
    header = HEADER_BYTES.get(meta["codec"], 0)
    summed = meta["codec"] in SUMMED_HEADERS
    for w in range(meta["world"]):
        row, context, state = _group_encode(lib, g, case, w)
        expected = g["%s__row%d" % (case, w)]
        assert row.shape == expected.shape
        np.testing.assert_array_equal(context, g["%s__context%d" % (case, w)])
        if not summed:
            np.testing.assert_array_equal(row, expected)
        else:
            np.testing.assert_allclose(row[:header].view(np.float32),
                                       expected[:header].view(np.float32), rtol=2e-7)
            same = np.mean(row[header:] == expected[header:])
            assert same == 1.0 if meta["codec"] != "qsgd" else same > 0.999
        if state is None:
            continue
        expected_state = g["%s__state_after%d" % (case, w)]
        if meta["codec"] == "qsgd":  # a level on a rounding boundary moves s by a unit
            assert np.isclose(state, expected_state, rtol=1e-6, atol=1e-7).mean() > 0.999
        elif summed:
            np.testing.assert_allclose(state, expected_state, rtol=1e-6, atol=1e-7)
        else:
            np.testing.assert_array_equal(state, expected_state)


@pytest.mark.parametrize("case", CASES + STRESS_CASES)
def test_group_decode_matches_cpu_op(lib, group_golden, case):
    code, output, nonfinite = _group_decode(lib, group_golden, case)
    assert code == 0, lib.mergecomp_group_error_string(code)
    np.testing.assert_array_equal(nonfinite, group_golden[case + "__nonfinite"])
    np.testing.assert_array_equal(output, group_golden[case + "__output"])


@pytest.mark.parametrize("case", DIGEST_CASES)
def test_large_tensor_matches_cpu_op_digests(lib, group_golden, case):
    """A group holding a tensor of 2^20 + 1 elements (grids of 4097 blocks,
    257 selection chunks): every worker's encode of the regenerated inputs
    gives the CPU op's row, context and state, and the decode of all rows its
    outputs and flags (SHA-256 digests of the bytes)."""
    g, meta = group_golden, _meta(group_golden, case)
    sizes = [int(n) for n in g[case + "__sizes"]]
    buffers = meta["state_buffers"]
    rows = []
    for w in range(meta["world"]):
        what = "%s worker %d" % (case, w)
        inputs = np.concatenate(golden_inputs.worker_gradients(w, sizes))
        assert golden_inputs.digest(inputs) == str(g["%s__input_sha256%d" % (case, w)]), (
            what + ": the regenerated inputs are not the golden's")
        state = None
        if buffers:
            state = np.concatenate(golden_inputs.worker_state(w, sizes, buffers))
            assert golden_inputs.digest(state) == str(g["%s__state_sha256%d" % (case, w)]), what
        row, context, after = _group_encode(lib, g, case, w, inputs=inputs, state=state)
        assert row.size == meta["row_bytes"], what
        np.testing.assert_array_equal(context, g["%s__context%d" % (case, w)], err_msg=what)
        assert golden_inputs.digest(row) == str(g["%s__row_sha256%d" % (case, w)]), what + ": row"
        if buffers:
            assert golden_inputs.digest(after) == str(
                g["%s__state_after_sha256%d" % (case, w)]), what + ": state"
        rows.append(row)
    rows = np.concatenate(rows) if meta["num_rows"] > 1 else rows[0]
    assert golden_inputs.digest(rows) == str(g[case + "__rows_sha256"])
    code, output, nonfinite = _group_decode(lib, g, case, rows)
    assert code == 0, lib.mergecomp_group_error_string(code)
    np.testing.assert_array_equal(nonfinite, g[case + "__nonfinite"])
    assert golden_inputs.digest(output) == str(g[case + "__output_sha256"]), case + ": outputs"


def test_nonfinite_tensor_leaves_state_and_is_marked(lib, group_golden):
    case = "efsignsgd_nonfinite"
    worker, tensor = _meta(group_golden, case)["nonfinite"]
    _, _, state = _group_encode(lib, group_golden, case, worker)
    np.testing.assert_array_equal(state, group_golden["%s__state%d" % (case, worker)])
    _, output, nonfinite = _group_decode(lib, group_golden, case)
    assert nonfinite[tensor] == 1 and nonfinite.sum() == 1
    sizes = [int(n) for n in group_golden[case + "__sizes"]]
    start = sum(sizes[:tensor])
    assert np.isnan(output[start:start + sizes[tensor]]).all()


@pytest.mark.parametrize("case", ["topk", "dgc"])
def test_bad_sparse_index_is_an_error(lib, group_golden, case):
    meta = _meta(group_golden, case)
    rows = group_golden[case + "__rows"].copy()
    total = int(group_golden[case + "__sizes"].sum())
    indices = rows[4 * meta["k"]:8 * meta["k"]].view(np.int32)
    indices[1] = total + 5  # worker 0, slot 1
    code, _, _ = _group_decode(lib, group_golden, case, rows)
    assert code == launchers.BAD_INDEX


def test_unknown_codec_is_a_bad_argument(lib):
    group = launchers.DeviceGroup(B, [4], inputs=[B.full(4, 1.0, np.float32)])
    codec, _ = launchers.make_codec("nosuchcodec")
    assert lib.mergecomp_group_encode_gpu(codec, group.struct, 0, None, None, None, None) == (
        launchers.BAD_ARGUMENT)
    assert b"topk" in lib.mergecomp_group_error_string(launchers.BAD_ARGUMENT)


def test_large_group_matches_layer_wise_sign_bits(lib):
    """A group of many tensors encodes what one flat buffer of the same values
    encodes (the cursor's tensor lookup over thousands of tensors)."""
    rng = np.random.default_rng(3)
    sizes = [int(n) for n in rng.integers(0, 3000, 2000)]
    flat = rng.standard_normal(sum(sizes)).astype(np.float32)
    group = launchers.DeviceGroup(B, sizes, inputs=_split(flat, sizes))
    codec = group.bind(launchers.make_codec("signsgd"))
    row = B.zeros(lib.mergecomp_group_row_bytes(codec, group.struct), np.uint8)
    workspace = B.zeros(lib.mergecomp_group_workspace_bytes(codec, group.struct), np.uint8)
    _check(lib, lib.mergecomp_group_encode_gpu(codec, group.struct, 0, B.ptr(row), None,
                                               B.ptr(workspace), None), "signsgd encode")
    single = B.zeros((flat.size + 7) // 8, np.uint8)
    _call(lib.mergecomp_signsgd_encode_gpu, B.asarray(flat), flat.size, single, None)
    np.testing.assert_array_equal(B.get(row)[:single.size], B.get(single))
    assert not B.get(row)[single.size:].any()  # all markers 0


def test_single_buffer_sparse_decode_refuses_a_bad_index(lib):
    """MergecompSparseScatterMean's GPU launcher fails on an index outside
    [0, n), as the CPU kernel does (it used to skip it)."""
    k, n = 4, 10
    payload = np.zeros(8 * k, np.uint8)
    payload[:4 * k].view(np.float32)[:] = [1, 2, 3, 4]
    payload[4 * k:].view(np.int32)[:] = [0, 3, 9, 5]
    out = B.zeros(n, np.float32)
    fn = lib.mergecomp_sparse_scatter_mean_gpu
    fn.argtypes, fn.restype = [P, I64, I64, I64, P, P], ctypes.c_int
    device_payload = B.asarray(payload)
    assert fn(B.ptr(device_payload), 1, k, n, B.ptr(out), None) == 0
    np.testing.assert_array_equal(B.get(out)[[0, 3, 9, 5]], [1, 2, 3, 4])
    payload[4 * k:].view(np.int32)[2] = n
    device_payload = B.asarray(payload)
    assert fn(B.ptr(device_payload), 1, k, n, B.ptr(out), None) == launchers.BAD_INDEX


def test_powersgd_products_match_numpy(lib):
    """PowerSGD's per-tensor products in one launch: P_i = M_i Q_i and
    Qlocal_i = M_i^T P_i for matrices of mixed shapes (1 x n, n x 1, rank 1
    and 4), against float64 numpy rounded to float32 (the launcher sums each
    entry in float64)."""
    rng = np.random.default_rng(9)
    shapes = [(64, 32, 4), (1, 50, 1), (50, 1, 1), (300, 7, 4), (3, 3, 2)]  # rows, cols, rank
    ms = [rng.standard_normal((rows, cols)).astype(np.float32) for rows, cols, _ in shapes]
    qs = [rng.standard_normal((cols, rank)).astype(np.float32) for _, cols, rank in shapes]

    def grouped(a_list, b_list, m, k, r, transpose):
        c_offsets = np.concatenate([[0], np.cumsum([mi * ri for mi, ri in zip(m, r)])])
        a_offsets = np.concatenate([[0], np.cumsum([x.size for x in a_list])])[:-1]
        b_offsets = np.concatenate([[0], np.cumsum([x.size for x in b_list])])[:-1]
        tables = {name: B.asarray(np.asarray(v, np.int64)) for name, v in [
            ("c_offsets", c_offsets), ("m", m), ("k", k), ("r", r), ("a_offsets", a_offsets),
            ("b_offsets", b_offsets)]}
        host = (ctypes.c_int64 * len(c_offsets))(*c_offsets)
        matrices = launchers.GpuMatrices(
            count=len(m), host_c_offsets=ctypes.cast(host, ctypes.POINTER(ctypes.c_int64)),
            **{name: B.ptr(t) for name, t in tables.items()})
        a = B.asarray(np.concatenate([x.ravel() for x in a_list]))
        b = B.asarray(np.concatenate([x.ravel() for x in b_list]))
        c = B.zeros(int(c_offsets[-1]), np.float32)
        assert lib.mergecomp_grouped_matmul_gpu(matrices, B.ptr(a), int(transpose), B.ptr(b),
                                                B.ptr(c), None) == 0
        B.synchronize()
        flat = B.get(c)
        return [flat[c_offsets[i]:c_offsets[i + 1]].reshape(m[i], r[i]) for i in range(len(m))]

    rows = [s[0] for s in shapes]
    cols = [s[1] for s in shapes]
    ranks = [s[2] for s in shapes]
    ps = grouped(ms, qs, rows, cols, ranks, transpose=False)
    for m_i, q_i, p_i in zip(ms, qs, ps):
        expected = (m_i.astype(np.float64) @ q_i.astype(np.float64)).astype(np.float32)
        np.testing.assert_allclose(p_i, expected, rtol=1e-6, atol=1e-6)
    q_local = grouped(ms, ps, cols, rows, ranks, transpose=True)
    for m_i, p_i, q_i in zip(ms, ps, q_local):
        expected = (m_i.astype(np.float64).T @ p_i.astype(np.float64)).astype(np.float32)
        np.testing.assert_allclose(q_i, expected, rtol=1e-6, atol=1e-6)


# ---- PowerSGD's group steps against the CPU ops -----------------------------------------


@pytest.fixture(scope="module")
def powersgd_golden():
    return np.load(ROOT / "tests" / "data" / "powersgd_golden.npz")


def _assert_close(actual, expected, what, rtol=2e-5):
    """Equal to float32 rounding (the GPU sums products in float64, Eigen in
    float32), compared as float32."""
    assert_close(actual, expected, what, rtol=rtol, dtype=np.float32)


def test_powersgd_steps_match_the_cpu_ops(lib, powersgd_golden):
    """The P, Q and Finish steps of the PowerSGD launchers, each from the CPU
    ops' inputs of that step (tests/data/powersgd_golden.npz: 2 workers,
    mixed shapes, an all-zero matrix, with and without the residual, float16
    gradients, a worker's non-finite tensor): the compensation and the raw
    values exactly, the products, Gram-Schmidt, outputs and state to float32
    rounding, the non-finite flags exactly."""
    g = powersgd_golden
    for case in json.loads(str(g["cases"])):
        meta = json.loads(str(g[case + "__meta"]))
        shapes = [tuple(s) for s in meta["shapes"]]
        rank, residual, dtype = meta["rank"], meta["residual"], meta["dtype"]
        layout = launchers.powersgd_layout(shapes, rank)
        tensors = layout["tensors"]
        sizes = [t["size"] for t in tensors]
        state_sizes = [(t["size"] if residual else 0) + t["cols"] * t["rank"] for t in tensors]
        raw = np.zeros(layout["p"], bool)
        for t in tensors:
            if not t["low_rank"]:
                raw[t["p_offset"]:t["p_offset"] + t["size"]] = True
        for w in range(meta["world"]):
            what = "%s worker %d" % (case, w)
            grads = [x.astype(dtype) for x in _split(g["%s__input%d" % (case, w)], sizes)]
            state = _split(g["%s__state%d" % (case, w)], state_sizes)
            outputs = [B.zeros(n, dtype) for n in sizes]
            group = launchers.DevicePowersgdGroup(B, shapes, rank, residual, gradients=grads,
                                                  outputs=outputs, state=state,
                                                  dtypes=[dtype] * len(shapes))
            m = B.zeros(layout["compensated"], np.float32)
            p = B.zeros(layout["p"], np.float32)
            q = B.zeros(layout["q"], np.float32)
            _check(lib, lib.mergecomp_powersgd_gather_q_gpu(group.struct, B.ptr(q), None),
                   "gather Q")
            _check(lib, lib.mergecomp_powersgd_compensate_gpu(group.struct, B.ptr(m),
                                                              B.ptr(p), None), "compensate")
            _check(lib, lib.mergecomp_grouped_matmul_gpu(group.matrices("p"), B.ptr(m), 0,
                                                         B.ptr(q), B.ptr(p), None), "P = M Q")
            B.synchronize()
            np.testing.assert_array_equal(B.get(m), g["%s__compensated%d" % (case, w)],
                                          err_msg=what)
            expected_p = g["%s__p%d" % (case, w)]
            np.testing.assert_array_equal(B.get(p)[raw], expected_p[raw], err_msg=what)
            _assert_close(B.get(p), expected_p, what + ": P")

            p_orthonormal = B.asarray(g[case + "__p_mean"])
            _check(lib, lib.mergecomp_powersgd_orthonormalize_gpu(
                group.struct, B.ptr(p_orthonormal), None), "orthonormalize")
            expected_orthonormal = g["%s__p_orthonormal%d" % (case, w)]
            _assert_close(B.get(p_orthonormal), expected_orthonormal, what + ": Gram-Schmidt")

            golden_m = B.asarray(g["%s__compensated%d" % (case, w)])
            golden_orthonormal = B.asarray(expected_orthonormal)
            q_local = B.zeros(layout["q"], np.float32)
            _check(lib, lib.mergecomp_grouped_matmul_gpu(
                group.matrices("q_local"), B.ptr(golden_m), 1, B.ptr(golden_orthonormal),
                B.ptr(q_local), None), "Qlocal = M^T P")
            B.synchronize()
            _assert_close(B.get(q_local), g["%s__q_local%d" % (case, w)], what + ": Qlocal")

            nonfinite = B.full(len(shapes), -1, np.int32)
            golden_q_local = B.asarray(g["%s__q_local%d" % (case, w)])
            q_mean = B.asarray(g[case + "__q_mean"])
            _check(lib, lib.mergecomp_powersgd_finish_gpu(
                group.struct, B.ptr(golden_orthonormal), B.ptr(golden_q_local),
                B.ptr(q_mean), B.ptr(golden_m), B.ptr(nonfinite), None), "finish")
            B.synchronize()
            np.testing.assert_array_equal(B.get(nonfinite), g["%s__nonfinite%d" % (case, w)],
                                          err_msg=what)
            out = np.concatenate([B.get(o).astype(np.float32) for o in outputs])
            _assert_close(out, g["%s__output%d" % (case, w)], what + ": outputs",
                          rtol=1e-3 if dtype == "float16" else 2e-5)
            _assert_close(np.concatenate([B.get(s) for s in state]),
                          g["%s__state_after%d" % (case, w)], what + ": state")


# ---- the group casts --------------------------------------------------------------------


def _bfloat16_bits(values):
    """float32 -> bfloat16 bits as the CPU kernels' casts round (to nearest even; a NaN
    becomes the quiet NaN of its sign)."""
    values = np.asarray(values, np.float32)
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    rounded[nan] = np.where(np.signbit(values[nan]), 0xffc0, 0x7fc0).astype(np.uint16)
    return rounded


def test_group_casts_convert_every_tensor_in_one_launch(lib):
    """mergecomp_group_cast_to_float_gpu / ..._from_float_gpu: a group of float16,
    bfloat16, float64 and float32 tensors (sizes 0, 1, 3 and odd, so vectors straddle
    tensors) cast to float32 and back as numpy rounds (float32 tensors left alone); a
    missing table is a bad argument."""
    rng = np.random.default_rng(11)
    kinds = [1, 2, 3, 0, 1, 2, 0, 3, 1]
    sizes = [5, 0, 3, 7, 1, 1029, 4, 2, 513]
    values = [(rng.standard_normal(n) * 3).astype(np.float32) for n in sizes]
    values[5][:3] = [np.nan, np.inf, 1e-40]  # NaN, inf and a float32 denormal through bfloat16
    values[0][:2] = [65520.0, 6e-8]  # float16 overflow and a float16 denormal
    originals = []
    for kind, v in zip(kinds, values):
        if kind == 1:
            with np.errstate(over="ignore"):  # 65520 rounds to float16 infinity, as intended
                originals.append(v.astype(np.float16))
        elif kind == 2:
            originals.append(_bfloat16_bits(v))
        elif kind == 3:
            originals.append(v.astype(np.float64) * (1 + 2.0 ** -40))  # rounds back to v
        else:
            originals.append(v)
    sources = [B.asarray(o) for o in originals]
    targets = [B.full(n, -7.0, np.float32) for n in sizes]
    group = launchers.DeviceGroup(B, sizes, inputs=targets, outputs=targets)
    kinds_table = B.asarray(np.array(kinds, np.int64))
    source_table = B.asarray(np.array([B.ptr(s) for s in sources], np.uint64))
    target_table = B.asarray(np.array([B.ptr(t) for t in targets], np.uint64))
    cast = lib.mergecomp_group_cast_to_float_gpu
    cast.restype = ctypes.c_int
    cast.argtypes = [ctypes.c_void_p, P, P, P, P]
    _check(lib, cast(ctypes.byref(group.struct), B.ptr(kinds_table), B.ptr(source_table),
                     B.ptr(target_table), None), "cast to float32")
    B.synchronize()
    for kind, o, t, v in zip(kinds, originals, targets, values):
        got = B.get(t)
        if kind == 0:
            assert (got == -7.0).all()  # a float32 tensor is not touched
        elif kind == 2:
            expected = (o.astype(np.uint32) << 16).view(np.float32)
            np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
        else:
            np.testing.assert_array_equal(got, o.astype(np.float32))
    # Back: float32 values into each tensor's own dtype.
    back = [B.zeros(n, o.dtype) for n, o in zip(sizes, originals)]
    floats = [B.asarray(v) for v in values]
    float_table = B.asarray(np.array([B.ptr(f) for f in floats], np.uint64))
    back_table = B.asarray(np.array([B.ptr(b) for b in back], np.uint64))
    uncast = lib.mergecomp_group_cast_from_float_gpu
    uncast.restype = ctypes.c_int
    uncast.argtypes = [ctypes.c_void_p, P, P, P, P]
    _check(lib, uncast(ctypes.byref(group.struct), B.ptr(kinds_table), B.ptr(float_table),
                       B.ptr(back_table), None), "cast from float32")
    B.synchronize()
    for kind, b, v in zip(kinds, back, values):
        got = B.get(b)
        if kind == 0:
            assert not got.any()
        elif kind == 1:
            with np.errstate(over="ignore"):
                expected = v.astype(np.float16)
            np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))
        elif kind == 2:
            np.testing.assert_array_equal(got, _bfloat16_bits(v))
        else:
            np.testing.assert_array_equal(got, v.astype(np.float64))
    assert cast(ctypes.byref(group.struct), None, B.ptr(source_table), B.ptr(target_table),
                None) == launchers.BAD_ARGUMENT
