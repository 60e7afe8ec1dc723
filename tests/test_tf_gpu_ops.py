"""The group ops' TensorFlow GPU kernels against their CPU kernels.

Needs a GPU, a CUDA build of TensorFlow and the op library built with its GPU
kernels (a CUDA TensorFlow venv on a GPU host with a CUDA 12 toolkit:
`make setup build TF_PACKAGE=tensorflow==2.15.1`, docs/gpu.md); skipped
elsewhere, saying which is missing. Never run yet: no GPU has been lent to
this project's sessions with a CUDA TensorFlow on it.

For every group codec and gradient dtype, one group of mixed shapes (empty
and one-element tensors included) is encoded on the CPU and on the GPU, with
memory none and with a residual kept in variables on each device:

- dense codecs: the payloads are equal bit for bit, but for the float32
  header of onebit, efsignsgd, qsgd and terngrad (float64 sums added in
  another order: equal to float32 rounding) and the few qsgd / terngrad codes
  a header one ulp apart may move;
- sparse codecs: the same selection (indices, and the values sent);
- decoding the CPU's rows of two workers gives the same gradients on both
  devices; the residuals after the step agree.

PowerSGD's three group ops run on both devices on one rank (the allreduces
the identity) for every gradient dtype, with and without the residual and a
non-finite tensor: the same compensation and flags, the products,
Gram-Schmidt, outputs and state to float32 rounding (the GPU sums products
in float64, Eigen in float32), not bit for bit.

Then a one-rank exchange of one group (encode, the identity collective of one
rank, decode; and PowerSGD's P, Q, Finish) runs on the GPU under
TensorFlow's profiler: its trace must show no device-to-host copy and no
host-to-device copy larger than the group's tables.
"""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

pytest.importorskip("horovod", reason="tf_mergecomp needs Horovod (a full venv: make setup)")

from tf_mergecomp import ops as op_library, compressors  # noqa: E402
from tests._close import assert_close  # noqa: E402

GROUP_CODECS = ("none", "fp16", "signsgd", "onebit", "efsignsgd", "qsgd", "terngrad",
                "topk", "dgc", "randomk")
SPARSE = ("topk", "dgc", "randomk")
HEADER_BYTES = {"onebit": 8, "efsignsgd": 4, "qsgd": 4, "terngrad": 4}
DTYPES = (tf.float32, tf.float16, tf.bfloat16)
SHAPES = [(3, 5), (), (0,), (17,), (2, 3, 4), (1,), (1000,), (0, 7), (33, 8)]
PARAMS = {"topk": {"ratio": 0.1}, "dgc": {"ratio": 0.1, "sample_ratio": 0.5},
          "randomk": {"ratio": 0.1}}


def _why_skipped():
    if not tf.test.is_built_with_cuda():
        return "TensorFlow %s is not a CUDA build" % tf.__version__
    if not tf.config.list_physical_devices("GPU"):
        return "no GPU visible to TensorFlow"
    if not op_library.build_info().get("cuda"):
        return "the op library was built without its GPU kernels (docs/gpu.md)"
    return None


pytestmark = pytest.mark.skipif(_why_skipped() is not None, reason=_why_skipped() or "")


def _codec(name):
    return compressors.get(name, **PARAMS.get(name, {}))


def _grads(dtype, seed):
    rng = np.random.RandomState(seed)
    return [rng.standard_t(3, size=shape).astype(np.float32) for shape in SHAPES], dtype


def _encode(device, name, values, dtype, memory, seed):
    codec = _codec(name)
    sizes = [int(np.prod(s)) for s in SHAPES]
    with tf.device(device):
        grads = [tf.cast(tf.constant(v), dtype) for v in values]
        state = ([tf.Variable(tf.fill([n], 0.25)) for n in sizes] if memory == "residual"
                 else [])
        payload, context = op_library.load().mergecomp_group_encode(
            grads, [v.handle for v in state], tf.constant(seed, tf.int64),
            payload_type=codec.payload_dtype, memory=memory, codec=codec.group_codec,
            **codec.group_op_attrs(sizes))
    return payload.numpy(), context.numpy(), [v.numpy() for v in state]


def _decode(device, name, rows, context, dtype, num_rows):
    codec = _codec(name)
    sizes = [int(np.prod(s)) for s in SHAPES]
    with tf.device(device):
        outputs, nonfinite = op_library.load().mergecomp_group_decode(
            tf.constant(rows), tf.constant(context), T=[dtype] * len(SHAPES), shapes=SHAPES,
            num_rows=num_rows, codec=codec.group_codec, **codec.group_op_attrs(sizes))
    return [o.numpy() for o in outputs], nonfinite.numpy()


def _as_bytes(payload):
    return np.frombuffer(payload.tobytes(), np.uint8)


def _assert_same_payload(name, cpu, gpu):
    cpu_bytes, gpu_bytes = _as_bytes(cpu), _as_bytes(gpu)
    assert cpu_bytes.shape == gpu_bytes.shape, name
    header = HEADER_BYTES.get(name, 0)
    if header:
        np.testing.assert_allclose(np.frombuffer(gpu_bytes[:header].tobytes(), np.float32),
                                   np.frombuffer(cpu_bytes[:header].tobytes(), np.float32),
                                   rtol=1e-6, err_msg=name)
    codes_cpu, codes_gpu = cpu_bytes[header:], gpu_bytes[header:]
    if name in ("qsgd", "terngrad"):
        assert np.mean(codes_cpu != codes_gpu) <= 1e-3, name
    else:
        np.testing.assert_array_equal(codes_gpu, codes_cpu, err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("memory", ["none", "residual"])
@pytest.mark.parametrize("name", GROUP_CODECS)
def test_gpu_group_encode_equals_cpu(name, memory, dtype):
    values, dtype = _grads(dtype, seed=7)
    cpu_payload, cpu_context, cpu_state = _encode("/CPU:0", name, values, dtype, memory, 12345)
    gpu_payload, gpu_context, gpu_state = _encode("/GPU:0", name, values, dtype, memory, 12345)
    np.testing.assert_array_equal(gpu_context, cpu_context, err_msg=name)
    if name in SPARSE:
        # The same entries, values and indices, slot for slot.
        np.testing.assert_array_equal(_as_bytes(gpu_payload), _as_bytes(cpu_payload),
                                      err_msg=name)
    else:
        _assert_same_payload(name, cpu_payload, gpu_payload)
    for i, (c, g) in enumerate(zip(cpu_state, gpu_state)):
        np.testing.assert_allclose(g, c, rtol=1e-6, atol=1e-6, err_msg="%s state %d" % (name, i))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", GROUP_CODECS)
def test_gpu_group_decode_equals_cpu(name, dtype):
    codec = _codec(name)
    rows, contexts = [], None
    for worker in range(2):
        values, _ = _grads(dtype, seed=100 + worker)
        payload, context, _ = _encode("/CPU:0", name, values, dtype, "none", 99 + worker)
        rows.append(payload)
        contexts = context if contexts is None else contexts
    if codec.collective == compressors.ALLREDUCE:
        rows, num_rows = rows[0], 1
    else:
        rows, num_rows = np.concatenate(rows), 2
    cpu, cpu_flags = _decode("/CPU:0", name, rows, contexts, dtype, num_rows)
    gpu, gpu_flags = _decode("/GPU:0", name, rows, contexts, dtype, num_rows)
    np.testing.assert_array_equal(gpu_flags, cpu_flags)
    for i, (c, g) in enumerate(zip(cpu, gpu)):
        assert c.dtype == g.dtype and c.shape == g.shape, (name, i)
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(c, np.float64),
                                   rtol=1e-6, atol=1e-7, err_msg="%s tensor %d" % (name, i))


# ---- PowerSGD's group ops ---------------------------------------------------------------

PSGD_SHAPES = [(33, 8), (), (0,), (17,), (1, 40), (40, 1), (2, 3, 4), (0, 7), (64, 64)]
PSGD_RANK = 2
# One ulp of the output dtype, relative: the GPU sums the products in float64,
# Eigen in float32, so a value may round to the neighbouring one.
OUTPUT_RTOL = {"float32": 2e-5, "float16": 1e-3, "bfloat16": 8e-3}


def _powersgd_step(device, values, dtype, residual):
    """The three PowerSGD ops on one rank (the allreduces are the identity):
    every intermediate, the outputs (float64), flags and state after."""
    from gpu_check.launchers import powersgd_layout

    layout = powersgd_layout(PSGD_SHAPES, PSGD_RANK)["tensors"]
    initial = []
    for i, t in enumerate(layout):
        q = np.random.RandomState(50 + i).standard_normal(t["cols"] * t["rank"])
        initial.append(np.concatenate([np.full(t["size"] if residual else 0, 0.25), q])
                       .astype(np.float32))
    ops = op_library.load()
    with tf.device(device):
        grads = [tf.cast(tf.constant(v), dtype) for v in values]
        state = [tf.Variable(v) for v in initial]
        handles = [v.handle for v in state]
        p, m = ops.mergecomp_powersgd_group_p(grads, handles, rank=PSGD_RANK, residual=residual)
        p_orthonormal, q_local = ops.mergecomp_powersgd_group_q(p, m, shapes=PSGD_SHAPES,
                                                                rank=PSGD_RANK)
        outputs, flags = ops.mergecomp_powersgd_group_finish(
            p_orthonormal, q_local, q_local, m, handles, T=[dtype] * len(PSGD_SHAPES),
            shapes=PSGD_SHAPES, rank=PSGD_RANK, residual=residual)
    return {"p": p.numpy(), "compensated": m.numpy(), "p_orthonormal": p_orthonormal.numpy(),
            "q_local": q_local.numpy(), "flags": flags.numpy(),
            "outputs": [np.asarray(tf.cast(o, tf.float64).numpy()) for o in outputs],
            "dtypes": [o.dtype for o in outputs], "state": [v.numpy() for v in state]}


@pytest.mark.parametrize("nonfinite", [False, True], ids=["finite", "nonfinite"])
@pytest.mark.parametrize("dtype", DTYPES + (tf.float64,), ids=lambda d: d.name)
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_gpu_powersgd_group_equals_cpu(residual, dtype, nonfinite):
    """MergecompPowersgdGroupP / Q / Finish on the GPU against the CPU, one
    rank, mixed shapes (empty, scalar, 1 x n, n x 1, rank 3): the same
    compensation, flags and dtypes; products, Gram-Schmidt, outputs and state
    to float32 rounding (float64 sums on the GPU), not bit for bit."""
    rng = np.random.RandomState(11)
    values = [rng.standard_t(3, size=shape).astype(np.float32) for shape in PSGD_SHAPES]
    if nonfinite:
        values[0].flat[3] = np.inf
    cpu = _powersgd_step("/CPU:0", values, dtype, residual)
    gpu = _powersgd_step("/GPU:0", values, dtype, residual)
    np.testing.assert_array_equal(gpu["flags"], cpu["flags"])
    assert gpu["flags"][0] == int(nonfinite) and not gpu["flags"][1:].any()
    assert gpu["dtypes"] == cpu["dtypes"]
    np.testing.assert_array_equal(gpu["compensated"], cpu["compensated"])
    for key in ("p", "p_orthonormal", "q_local"):
        assert_close(gpu[key], cpu[key], key)
    for i, (c, g) in enumerate(zip(cpu["outputs"], gpu["outputs"])):
        assert c.shape == g.shape, i
        if nonfinite and i == 0:
            assert np.isnan(g).all() and np.isnan(c).all()
            continue
        assert_close(g, c, "output %d" % i, rtol=OUTPUT_RTOL.get(dtype.name, 2e-5))
    for i, (c, g) in enumerate(zip(cpu["state"], gpu["state"])):
        assert_close(g, c, "state %d" % i)


def _memcpy_events(logdir):
    """(kind, bytes) of every memcpy in the profiler's device trace."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    copies = []
    for path in glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True):
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
        for plane in space.planes:
            if not plane.name.startswith("/device:GPU"):
                continue
            names = {k: v.name for k, v in plane.event_metadata.items()}
            stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
            for line in plane.lines:
                for event in line.events:
                    name = names.get(event.metadata_id, "")
                    if "Memcpy" not in name and "memcpy" not in name:
                        continue
                    size = None
                    for stat in event.stats:
                        if stat_names.get(stat.metadata_id) == "memcpy_details":
                            for part in stat.str_value.split():
                                if part.startswith("size:"):
                                    size = int(part[5:])
                    copies.append((name, size))
    return copies


def _assert_copies_only_tables(tmp_path, step, table_bytes, *args):
    """Runs step(*args) once to trace and warm it up, then once under the
    profiler: no copy to the host, and none to the device larger than the
    step's tables (table_bytes)."""
    step(*args)  # traced and warmed up outside the trace
    tf.profiler.experimental.start(str(tmp_path))
    step(*args)
    tf.profiler.experimental.stop()
    copies = _memcpy_events(str(tmp_path))
    assert not [c for c in copies if "DtoH" in c[0] or "DeviceToHost" in c[0]], copies
    large = [c for c in copies if ("HtoD" in c[0] or "HostToDevice" in c[0])
             and (c[1] is None or c[1] > table_bytes)]
    assert not large, copies


def test_one_group_exchange_on_one_rank_copies_nothing_to_the_host(tmp_path):
    codec = _codec("efsignsgd")
    shapes = [(256, 128), (128,), (0,), (64, 64, 3)]
    sizes = [int(np.prod(s)) for s in shapes]
    with tf.device("/GPU:0"):
        grads = [tf.random.normal(s) for s in shapes]
        state = [tf.Variable(tf.zeros([n])) for n in sizes]
    ops = op_library.load()

    @tf.function
    def step(seed):
        with tf.device("/GPU:0"):
            payload, context = ops.mergecomp_group_encode(
                grads, [v.handle for v in state], seed, payload_type=codec.payload_dtype,
                memory="residual", codec=codec.group_codec, **codec.group_op_attrs(sizes))
            # One rank: the allgather is the payload itself.
            # (The int32 flags stay unread: TensorFlow's int32 GPU kernels
            # keep their tensors in host memory.)
            outputs, _ = ops.mergecomp_group_decode(
                payload, context, T=[tf.float32] * len(shapes), shapes=shapes, num_rows=1,
                codec=codec.group_codec, **codec.group_op_attrs(sizes))
            return [tf.reduce_sum(o) for o in outputs]

    with tf.device("/CPU:0"):
        seed = tf.constant(3, tf.int64)
    _assert_copies_only_tables(tmp_path, step, 8 * (5 * len(shapes) + 1), seed)


def test_powersgd_one_group_on_one_rank_copies_nothing_to_the_host(tmp_path):
    shapes = [(256, 128), (128,), (0,), (64, 64, 3)]
    from gpu_check.launchers import powersgd_layout

    layout = powersgd_layout(shapes, PSGD_RANK)["tensors"]
    with tf.device("/GPU:0"):
        grads = [tf.random.normal(s) for s in shapes]
        state = [tf.Variable(tf.random.normal([t["size"] + t["cols"] * t["rank"]]))
                 for t in layout]
    ops = op_library.load()
    handles = [v.handle for v in state]

    @tf.function
    def step():
        with tf.device("/GPU:0"):
            p, m = ops.mergecomp_powersgd_group_p(grads, handles, rank=PSGD_RANK, residual=True)
            p, q_local = ops.mergecomp_powersgd_group_q(p, m, shapes=shapes, rank=PSGD_RANK)
            outputs, _ = ops.mergecomp_powersgd_group_finish(
                p, q_local, q_local, m, handles, T=[tf.float32] * len(shapes), shapes=shapes,
                rank=PSGD_RANK, residual=True)
            return [tf.reduce_sum(o) for o in outputs]

    # The largest tables: P's, 9 words per tensor and 6 per matrix, plus 3.
    _assert_copies_only_tables(tmp_path, step, 8 * (15 * len(shapes) + 3))
