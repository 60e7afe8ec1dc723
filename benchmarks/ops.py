"""The codec benchmark: encode and decode throughput of the custom ops vs plain TF.

For each algorithm and size n, both backends (the codec as ``compressors.get``
gives it, "op": the group ops on a group of one tensor; and its plain-TF path,
``tf_mergecomp.reference.plain``, "reference") are timed on the same float32
input, each call a ``tf.function``:

- encode: ``compress(flat, seed)`` -> the payload;
- decode: ``combine(payload, ctx, world_size=1)``, the engine's decode path
  (for allgather codecs a one-worker batch; for allreduce codecs the
  already-averaged payload);
- codecs with several collectives per group (PowerSGD) cannot be split into
  encode and decode: their whole ``reduce_group()`` on one worker
  (collectives are the identity) of the input viewed as one near-square
  matrix is timed and shown in the encode columns.

With ``group_tensors`` T > 0, every algorithm is also timed as MergeComp runs
it on a merged group: the n elements split into T float32 tensors, one call of
the engine's group reduction on one worker (the fused MergecompGroupEncode,
the identity collective, MergecompGroupDecode, with the default memory's state
updated in the kernel): "group enc+dec GB/s". Target at n = 25M: >= 0.5x copy
bandwidth for every codec.

Throughput is input float32 bytes (4n) / seconds: median of repeats after
warmup calls, at most ``budget_s`` per measurement. The physical limit is the
machine's copy bandwidth in the same run (``numpy.copyto`` of a 25M float32
array: 100 MB read + 100 MB written, reported as 100 MB / seconds, so the same
units). Targets, at n = 25M:
elementwise codecs (fp16, signsgd, signum, onebit, efsignsgd, terngrad,
qsgd): op >= 10x reference and >= 0.5x copy bandwidth; topk and dgc at
ratio 0.01: op encode >= 5x faster than ``tf.math.top_k`` of |x|.
"""

import statistics
import time

import numpy as np

ELEMENTWISE = ("fp16", "signsgd", "signum", "onebit", "efsignsgd", "terngrad", "qsgd")
SELECTION = ("topk", "dgc")
TARGET_SIZE = 25_000_000
ELEMENTWISE_REFERENCE_RATIO = 10.0
ELEMENTWISE_COPY_FRACTION = 0.5
SELECTION_TOPK_RATIO = 5.0


def parse_sizes(text):
    """'1e4,1e6,25e6' -> [10000, 1000000, 25000000]; sizes are integers >= 1."""
    sizes = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = float(part)
        except ValueError:
            raise ValueError("sizes must be numbers like 1e4,1e6,25e6, got %r" % part) from None
        if value < 1 or value != int(value) or value > 2e9:
            raise ValueError("each size must be an integer in [1, 2e9], got %r" % part)
        sizes.append(int(value))
    return sizes


def time_call(fn, warmup=2, repeats=7, budget_s=10.0):
    """Median seconds of fn() over up to `repeats` calls within about budget_s."""
    for _ in range(warmup):
        fn()
    times = []
    deadline = time.perf_counter() + budget_s
    while len(times) < repeats:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        if time.perf_counter() > deadline and len(times) >= 1:
            break
    return statistics.median(times)


def size_text(n):
    """25000000 -> '25M', 10000 -> '10k', 1234 -> '1234'."""
    for unit, value in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= value and n % (value // 100 or 1) == 0:
            return ("%.2f" % (n / value)).rstrip("0").rstrip(".") + unit
    return str(n)


def tf_elementwise_bandwidth(n=TARGET_SIZE, repeats=5):
    """Input bytes per second of a TF elementwise op (x * 2) writing a fresh n-float output.

    What any op producing a full-size float32 result (a decode) pays here for
    the output allocation and write, on top of the copy.
    """
    import tensorflow as tf

    flat = tf.random.stateless_normal([n], seed=[3, 4], dtype=tf.float32)
    double = tf.function(lambda x: x * 2.0)
    return 4.0 * n / time_call(lambda: double(flat), warmup=2, repeats=repeats, budget_s=5.0)


def copy_bandwidth(n=TARGET_SIZE, repeats=7):
    """Bytes per second of numpy copying a float32 array of n (input bytes / s)."""
    source = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    target = np.empty_like(source)
    seconds = time_call(lambda: np.copyto(target, source), warmup=2, repeats=repeats, budget_s=5.0)
    return source.nbytes / seconds


def topk_baseline_seconds(flat, ratio=0.01, budget_s=20.0):
    import tensorflow as tf

    k = max(1, int(np.ceil(ratio * int(flat.shape[0]))))
    topk = tf.function(lambda x: tf.math.top_k(tf.abs(x), k=k, sorted=False))
    return time_call(lambda: topk(flat), warmup=1, repeats=5, budget_s=budget_s)


class OneWorkerCommunicator:
    """Collectives of a one-worker job (identity), for codecs timed through reduce_group()."""

    size = 1
    rank = 0
    process_set = None

    def allreduce_mean(self, tensor, key):
        return tensor

    def allgather(self, tensor, key):
        return tensor

    def grouped_allreduce_mean(self, tensors, key):
        return list(tensors)


def _near_square(n):
    """[rows, cols] with rows * cols = n and cols the largest divisor <= sqrt(n)."""
    cols = int(n ** 0.5)
    while n % cols:
        cols -= 1
    return [n // cols, cols]


def _measure_round_trip(codec, flat, seed, budget_s):
    """For codecs with several collectives (PowerSGD): reduce_group() on one
    worker, of one tensor (the input as a near-square matrix), with the
    engine's state layout: the default memory's buffers, then the codec's."""
    import tensorflow as tf

    from tf_mergecomp import memory as memories

    communicator = OneWorkerCommunicator()
    n = int(flat.shape[0])
    matrix = tf.reshape(flat, _near_square(n))
    memory = memories.get(codec.default_memory, **codec.default_memory_params())
    initial = [tf.zeros([len(memory.state_names) * n])]
    codec_state = codec.initial_codec_state(matrix.shape, 0)
    if codec_state is not None:
        initial.append(codec_state)
    state = [tf.Variable(tf.concat(initial, 0), trainable=False)]
    round_trip = tf.function(
        lambda x, s: codec.reduce_group([x], state, memory, s, communicator, (0, n))[0][0])
    seconds = time_call(lambda: round_trip(matrix, seed), budget_s=budget_s)
    return {"round_trip_s": seconds}


def measure_group(name, flat, tensors, budget_s=10.0):
    """{'group_s'} or {'error'}: the engine's fused reduction of one group of
    `tensors` float32 tensors holding `flat`, on one worker."""
    import tensorflow as tf

    from tf_mergecomp import MergeComp
    from benchmarks.exchange import equal_split_sizes

    try:
        parts = tf.split(flat, equal_split_sizes(int(flat.shape[0]), tensors))
        mergecomp = MergeComp(name, partitions=1)
        # The engine's own group step, without Horovod: what one group costs
        # on this machine's CPU, state update included.
        mergecomp.set_gradient_layout([p.shape for p in parts], [p.dtype for p in parts])
        communicator = OneWorkerCommunicator()
        step = tf.constant(1, tf.int64)
        reduce_group = tf.function(
            lambda grads: mergecomp.reduce_group(grads, communicator, step))
        return {"group_s": time_call(lambda: reduce_group(parts), budget_s=budget_s)}
    except Exception as error:
        return {"error": "%s: %s" % (type(error).__name__, str(error).splitlines()[0][:120])}


def measure_codec(name, backend, flat, budget_s=10.0):
    """{'encode_s', 'decode_s'} or {'error'} for one codec/backend on `flat`."""
    import tensorflow as tf

    try:
        codec = _codec(name, backend=backend)
    except Exception as error:  # the op library missing or broken shows up here
        return {"error": "%s: %s" % (type(error).__name__, error)}
    seed = tf.constant(12345, tf.int64)
    try:
        if codec.collectives_per_group() > 1:
            return _measure_round_trip(codec, flat, seed, budget_s)
        encode = tf.function(lambda x, s: codec.compress(x, s)[0])
        # ctx of one eager call; its tensors are captured by the decode function.
        payload, ctx = codec.compress(flat, seed)
        decode = tf.function(lambda p: codec.combine(p, ctx, 1))
        encode_s = time_call(lambda: encode(flat, seed), budget_s=budget_s)
        decode_s = time_call(lambda: decode(payload), budget_s=budget_s)
    except Exception as error:
        return {"error": "%s: %s" % (type(error).__name__, str(error).splitlines()[0][:120])}
    return {"encode_s": encode_s, "decode_s": decode_s,
            "payload_bytes": int(payload.shape[0]) * payload.dtype.size}


def run(sizes, algorithms, budget_s=10.0, group_tensors=64, tensor_counts=(), matrix_columns=0,
        log=print):
    """Returns a result dict: copy bandwidth, per-(algorithm, size) measurements, baselines,
    and one group against layer-wise at each of ``tensor_counts`` (benchmarks/merging.py)."""
    import tensorflow as tf

    started = time.time()
    result = {"copy_bytes_per_s": copy_bandwidth(), "rows": [], "topk_baseline_s": {},
              "group_tensors": group_tensors,
              "threads": {"intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
                          "inter_op": tf.config.threading.get_inter_op_parallelism_threads()}}
    result["tf_elementwise_bytes_per_s"] = tf_elementwise_bandwidth()
    log("[ops] copy bandwidth %.2f GB/s, TF x*2 %.2f GB/s" % (
        result["copy_bytes_per_s"] / 1e9, result["tf_elementwise_bytes_per_s"] / 1e9))
    for n in sizes:
        flat = tf.random.stateless_normal([n], seed=[1, 2], dtype=tf.float32)
        if n >= TARGET_SIZE and any(a in SELECTION for a in algorithms):
            result["topk_baseline_s"][n] = topk_baseline_seconds(flat)
            log("[ops] n=%d tf.math.top_k(ratio 0.01): %.4f s" % (n, result["topk_baseline_s"][n]))
        for name in algorithms:
            row = {"algorithm": name, "n": n}
            for backend in ("op", "reference"):
                row[backend] = measure_codec(name, backend, flat, budget_s=budget_s)
            if group_tensors and n >= group_tensors:
                row["group"] = measure_group(name, flat, group_tensors, budget_s=budget_s)
            log("[ops] n=%d %s: %s" % (n, name, _short(row)))
            result["rows"].append(row)
    if tensor_counts:
        from benchmarks import merging

        result["merging"] = merging.run(algorithms, tensor_counts, matrix_columns=matrix_columns,
                                        log=log)
    result["seconds"] = time.time() - started
    return result


def _short(row):
    parts = []
    for backend in ("op", "reference"):
        m = row[backend]
        if "error" in m:
            parts.append("%s %s" % (backend, m["error"]))
        elif "round_trip_s" in m:
            parts.append("%s reduce %.4fs" % (backend, m["round_trip_s"]))
        else:
            parts.append("%s enc %.4fs dec %.4fs" % (backend, m["encode_s"], m["decode_s"]))
    group = row.get("group", {})
    if "group_s" in group:
        parts.append("group enc+dec %.4fs" % group["group_s"])
    elif "error" in group:
        parts.append("group %s" % group["error"])
    return "; ".join(parts)


def _gbps(n, seconds):
    return None if seconds is None else 4.0 * n / seconds / 1e9


def target_status(row, copy_bytes_per_s, topk_baseline_s):
    """'met', 'missed (...)' or '' when no target applies to this row."""
    name, n = row["algorithm"], row["n"]
    op, ref = row["op"], row["reference"]
    if n < TARGET_SIZE or "error" in op:
        return ""
    if name in ELEMENTWISE:
        misses = []
        for phase in ("encode", "decode"):
            seconds = op[phase + "_s"]
            if "error" not in ref and ref[phase + "_s"] / seconds < ELEMENTWISE_REFERENCE_RATIO:
                misses.append("%s %.1fx ref" % (phase, ref[phase + "_s"] / seconds))
            fraction = 4.0 * n / seconds / copy_bytes_per_s
            if fraction < ELEMENTWISE_COPY_FRACTION:
                misses.append("%s %.2fx copy" % (phase, fraction))
        return "met" if not misses else "missed (%s)" % ", ".join(misses)
    if name in SELECTION and topk_baseline_s:
        speedup = topk_baseline_s / op["encode_s"]
        if speedup >= SELECTION_TOPK_RATIO:
            return "met (%.1fx top_k)" % speedup
        return "missed (%.1fx top_k)" % speedup
    return ""


GROUP_COPY_FRACTION = 0.5


def group_columns(row, copy_bytes_per_s):
    """[group enc+dec GB/s, x copy, target note] of a row."""
    group = row.get("group")
    if not group:
        return ["-", "-", ""]
    if "error" in group:
        return ["-", "-", "group: " + group["error"]]
    gbps = _gbps(row["n"], group["group_s"])
    fraction = gbps * 1e9 / copy_bytes_per_s
    note = ""
    if row["n"] >= TARGET_SIZE:
        note = "group %s (%.2fx copy)" % (
            "met" if fraction >= GROUP_COPY_FRACTION else "missed", fraction)
    return [gbps, fraction, note]


def table(result):
    from benchmarks import report

    copy = result["copy_bytes_per_s"]
    rows = []
    for row in result["rows"]:
        group_gbps, group_fraction, group_note = group_columns(row, copy)
        op, ref = row["op"], row["reference"]
        if "round_trip_s" in op:
            # Encode, both collectives (identity on one worker) and decode in one call.
            op_rt = _gbps(row["n"], op["round_trip_s"])
            ref_rt = _gbps(row["n"], ref.get("round_trip_s"))
            rows.append([row["algorithm"], size_text(row["n"]), op_rt, ref_rt, report.ratio(op_rt, ref_rt),
                         "-", "-", "-", report.ratio(op_rt * 1e9, copy), "-",
                         group_gbps, group_fraction,
                         "; ".join(filter(None, [
                             "whole reduce_group() on 1 worker (several collectives): enc columns",
                             group_note]))])
            continue
        op_enc = _gbps(row["n"], op.get("encode_s"))
        op_dec = _gbps(row["n"], op.get("decode_s"))
        ref_enc = _gbps(row["n"], ref.get("encode_s"))
        ref_dec = _gbps(row["n"], ref.get("decode_s"))
        baselines = {int(k): v for k, v in result["topk_baseline_s"].items()}
        note = target_status(row, copy, baselines.get(row["n"]))
        errors = ["%s: %s" % (b, row[b]["error"]) for b in ("op", "reference") if "error" in row[b]]
        rows.append([
            row["algorithm"], size_text(row["n"]),
            op_enc, ref_enc, report.ratio(op_enc, ref_enc),
            op_dec, ref_dec, report.ratio(op_dec, ref_dec),
            report.ratio(op_enc * 1e9 if op_enc else None, copy),
            report.ratio(op_dec * 1e9 if op_dec else None, copy),
            group_gbps, group_fraction,
            "; ".join(filter(None, [note, group_note] + errors)),
        ])
    header = ("Copy bandwidth (numpy copy of 25M float32 into a preallocated array): %.2f GB/s. "
              "Group: n split into %s float32 tensors, one fused group reduction (encode, "
              "identity collective, decode, state update) on one worker. "
              "GB/s = input float32 bytes / second; median of repeats; TF threads intra %s / "
              "inter %s (0 = all cores).\n" % (copy / 1e9, result.get("group_tensors", "-"),
                                               result["threads"]["intra_op"],
                                               result["threads"]["inter_op"]))
    if result.get("tf_elementwise_bytes_per_s"):
        header += ("A TF elementwise op writing a fresh 25M float32 output (x * 2, the floor of any "
                   "decode): %.2f GB/s.\n" % (result["tf_elementwise_bytes_per_s"] / 1e9))
    for n, seconds in sorted((int(k), v) for k, v in result["topk_baseline_s"].items()):
        header += "tf.math.top_k(|x|, k=0.01 n) at n=%s: %.4f s (%.2f GB/s).\n" % (
            size_text(n), seconds, 4.0 * n / seconds / 1e9)
    merging_table = ""
    if result.get("merging"):
        from benchmarks import merging

        merging_table = "\n\n" + merging.table(result["merging"])
    return header + "\n" + report.markdown_table(
        ["algorithm", "n", "op enc GB/s", "ref enc GB/s", "enc op/ref", "op dec GB/s",
         "ref dec GB/s", "dec op/ref", "enc op/copy", "dec op/copy", "group enc+dec GB/s",
         "group/copy", "target"], rows) + merging_table


def _codec(name, backend):
    from tf_mergecomp import compressors, reference

    codec = compressors.get(name)
    return reference.plain(codec) if backend == "reference" else codec
