"""One group against layer-wise on one rank, at several tensor counts (``ops --tensor-counts``).

MergeComp's premise is that one merged group is never slower than compressing
tensor by tensor. Whether it holds on a CPU depends on the tensor count: the
multi-pass codecs read a group more than once, and a group larger than the
cache goes to memory on every pass. For each count the gradients are mixed
sizes around a mean (0.25x to 1.75x of it), 16 tensors of 1 MB down to 700 of
6 KB. Both ways run the engine's own ``MergeComp.reduce_group`` with identity
collectives (encode, decode, state update) in one ``tf.function``: one call
over all tensors, or one call per tensor. The two are timed round-robin, in
slots of at least ``slot_s``, the order alternating between rounds; each
row gives the medians and the range of the per-round ratios (the run's spread).

A third function in the same rounds takes the same tensors and returns a copy
of each, with no codec: the cost of calling a ``tf.function`` with that many
arguments and results, which both ways pay alike (at 700 tensors it is most
of a call on these machines, and its noise then decides the raw ratio). The
net ratio is the per-round (one group - call) / (layer-wise - call): what
merging changes in the work itself.
"""

import math
import statistics
import time

TENSOR_COUNTS = (16, 48, 128, 700)
# Mean tensor bytes per count: the regimes of a few large tensors to many small ones.
MEAN_BYTES = {16: 1 << 20, 48: 250_000, 128: 64_000, 700: 6_000}
_SPREAD = (0.25, 0.5, 1.0, 1.5, 1.75)


def tensor_sizes(count):
    """Float32 element counts of ``count`` mixed-size tensors (deterministic)."""
    mean = MEAN_BYTES.get(count, 250_000) / 4
    return [max(1, int(mean * _SPREAD[i % len(_SPREAD)])) for i in range(count)]


def tensor_shapes(count, matrix_columns=0):
    """The shapes of ``count`` mixed-size tensors: vectors, or (with ``matrix_columns``)
    matrices of that many columns and about the vectors' sizes."""
    if matrix_columns < 0:
        raise ValueError("matrix_columns must be >= 0 (0: vectors), got %r" % (matrix_columns,))
    if not matrix_columns:
        return [[n] for n in tensor_sizes(count)]
    return [[max(1, n // matrix_columns), matrix_columns] for n in tensor_sizes(count)]


def _reduce_functions(name, grads):
    import tensorflow as tf

    from benchmarks.ops import OneWorkerCommunicator
    from tf_mergecomp import MergeComp

    mergecomp = MergeComp(name, partitions=1)
    mergecomp.set_gradient_layout([g.shape for g in grads], [g.dtype for g in grads])
    communicator = OneWorkerCommunicator()
    step = tf.constant(1, tf.int64)

    @tf.function
    def one_group(tensors):
        return mergecomp.reduce_group(tensors, communicator, step)[0]

    @tf.function
    def layer_wise(tensors):
        return [mergecomp.reduce_group([t], communicator, step, start=i, index=i)[0][0]
                for i, t in enumerate(tensors)]

    @tf.function
    def call_only(tensors):
        return [tf.identity(t) for t in tensors]

    return {"one_group": one_group, "layer_wise": layer_wise, "call_only": call_only}


def _slot_seconds(fn, args, slot_s):
    calls, started = 0, time.perf_counter()
    while True:
        fn(args)
        calls += 1
        elapsed = time.perf_counter() - started
        if elapsed >= slot_s:
            return elapsed / calls


def compare(name, count, rounds=9, slot_s=0.05, matrix_columns=0):
    """{'one_group_s', 'layer_wise_s', 'call_s', 'ratio', 'ratio_min', 'ratio_max',
    'net_ratio', 'net_ratio_min', 'net_ratio_max'} or {'error'}."""
    import tensorflow as tf

    shapes = tensor_shapes(count, matrix_columns)
    try:
        generator = tf.random.Generator.from_seed(1)
        grads = [generator.normal(shape) for shape in shapes]
        functions = _reduce_functions(name, grads)
        for fn in functions.values():  # trace and warm up
            for _ in range(3):
                fn(grads)
        times = {key: [] for key in functions}
        for round_index in range(rounds):
            order = list(functions) if round_index % 2 == 0 else list(functions)[::-1]
            for key in order:
                times[key].append(_slot_seconds(functions[key], grads, slot_s))
    except Exception as error:
        return {"error": "%s: %s" % (type(error).__name__, str(error).splitlines()[0][:120])}
    ratios = [a / b for a, b in zip(times["one_group"], times["layer_wise"])]
    net_ratios = [(a - c) / (b - c) for a, b, c in
                  zip(times["one_group"], times["layer_wise"], times["call_only"]) if b > c]
    one, layer = statistics.median(times["one_group"]), statistics.median(times["layer_wise"])
    row = {"one_group_s": one, "layer_wise_s": layer, "call_s": statistics.median(times["call_only"]),
           "ratio": one / layer, "ratio_min": min(ratios), "ratio_max": max(ratios)}
    if net_ratios:
        row.update(net_ratio=statistics.median(net_ratios), net_ratio_min=min(net_ratios),
                   net_ratio_max=max(net_ratios))
    return row


def run(algorithms, counts=TENSOR_COUNTS, rounds=9, matrix_columns=0, log=print):
    rows = []
    for count in counts:
        shapes = tensor_shapes(count, matrix_columns)
        megabytes = 4 * sum(math.prod(shape) for shape in shapes) / 1e6
        for name in algorithms:
            row = dict(algorithm=name, tensors=count, megabytes=megabytes,
                       matrix_columns=matrix_columns,
                       **compare(name, count, rounds=rounds, matrix_columns=matrix_columns))
            log("[ops] %d tensors %s: %s" % (count, name, "error" if "error" in row else
                                              "one group / layer-wise %.3f, net of the call %s"
                                              % (row["ratio"], _net_text(row))))
            rows.append(row)
    return rows


def _net_text(row):
    return "%.3f" % row["net_ratio"] if "net_ratio" in row else "-"


def table(rows):
    from benchmarks import report

    lines = []
    for row in rows:
        if "error" in row:
            lines.append([row["algorithm"], row["tensors"], "%.1f" % row["megabytes"], "-", "-", "-",
                          row["error"], "-", "-", "-"])
            continue
        net_range = ("%.2f-%.2f" % (row["net_ratio_min"], row["net_ratio_max"])
                     if "net_ratio" in row else "-")
        lines.append([row["algorithm"], row["tensors"], "%.1f" % row["megabytes"],
                      "%.3f" % (row["one_group_s"] * 1e3), "%.3f" % (row["layer_wise_s"] * 1e3),
                      "%.3f" % row["ratio"], "%.2f-%.2f" % (row["ratio_min"], row["ratio_max"]),
                      "%.3f" % (row["call_s"] * 1e3), _net_text(row), net_range])
    columns = rows[0].get("matrix_columns", 0) if rows else 0
    shapes = "matrices of %d columns" % columns if columns else "vectors"
    return ("One group against layer-wise, one rank (engine reduce_group, identity collectives; "
            "tensors as %s; medians of interleaved slots, per-round ratio range = the run's "
            "spread; call = the same tensors through a tf.function that only copies them, "
            "net = per-round (one group - call) / (layer-wise - call)):\n\n" % shapes
            + report.markdown_table(["algorithm", "tensors", "MB", "one group ms", "layer-wise ms",
                                     "one/layer-wise", "per-round range", "call ms", "net one/layer-wise",
                                     "net per-round range"], lines))
