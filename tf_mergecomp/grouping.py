"""Partitions of the gradient list into contiguous groups, and (un)flattening.

Tensors are indexed in backprop order (the order their gradients become
ready: for Keras models, the reverse of ``trainable_variables``). A partition
of N tensors is a sorted tuple of split indices in (0, N): group g holds
tensors ``order[bounds[g]:bounds[g + 1]]`` with bounds = (0, *splits, N).
``()`` is one group (the whole model); ``(1, ..., N - 1)`` is layer-wise.
"""

import math
import numbers

LAYERWISE = "layerwise"


def check_partition_spec(spec):
    """Validates what users may pass as ``partitions`` before N is known."""
    if spec is None or spec == LAYERWISE:
        return spec
    if isinstance(spec, bool):
        raise ValueError(_spec_error(spec))
    if isinstance(spec, numbers.Integral):
        if spec < 1:
            raise ValueError("partitions must be >= 1 groups, got %d" % spec)
        return int(spec)
    if isinstance(spec, (list, tuple)):
        if not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in spec):
            raise ValueError("split indices must be integers, got %r" % (spec,))
        splits = tuple(int(s) for s in spec)
        if any(b <= a for a, b in zip(splits, splits[1:])) or any(s < 1 for s in splits):
            raise ValueError(
                "split indices must be strictly increasing integers >= 1, got %r" % (spec,)
            )
        return splits
    raise ValueError(_spec_error(spec))


def _spec_error(spec):
    return (
        "partitions must be an int number of groups (>= 1), a list of split indices, "
        "%r, or None; got %r" % (LAYERWISE, spec)
    )


def resolve_splits(spec, sizes):
    """The split tuple that ``spec`` means for tensors of these element counts."""
    spec = check_partition_spec(spec)
    n = len(sizes)
    if spec is None:
        return balanced_splits(sizes, min(2, max(n, 1)))
    if spec == LAYERWISE:
        return layerwise_splits(n)
    if isinstance(spec, int):
        if spec > max(n, 1):
            raise ValueError("partitions=%d asks for more groups than the %d gradient tensors" % (spec, n))
        return balanced_splits(sizes, spec)
    if spec and spec[-1] >= n:
        raise ValueError(
            "split indices must be < the number of gradient tensors (%d), got %r" % (n, spec)
        )
    return spec


def layerwise_splits(n):
    """One group per tensor."""
    return tuple(range(1, n))


def balanced_splits(sizes, groups):
    """Splits into ``groups`` contiguous non-empty groups of about equal bytes.

    Each cut goes at the tensor boundary nearest to an equal share of the
    cumulative size, moved where needed to keep every group non-empty.
    """
    n = len(sizes)
    if groups <= 1 or n <= 1:
        return ()
    groups = min(groups, n)
    cumulative = [0]
    for size in sizes:
        cumulative.append(cumulative[-1] + size)
    total = cumulative[-1]
    splits = []
    for g in range(1, groups):
        target = total * g / groups
        best = min(range(1, n), key=lambda i: (abs(cumulative[i] - target), i))
        low = splits[-1] + 1 if splits else 1
        high = n - (groups - g)
        splits.append(min(max(best, low), high))
    return tuple(splits)


def fusion_splits(ready, nbytes, cycle_s, fusion_bytes, phase_s=0.0):
    """The groups Horovod's tensor fusion makes of per-tensor collectives, as splits.

    Horovod's background thread takes up, every ``cycle_s`` seconds, the
    tensors that became ready since its last pass (in backprop order: ready
    times are made non-decreasing) and fuses them into buffers of at most
    ``fusion_bytes``, one collective each. ``ready``: seconds from the step's
    start; ``nbytes``: each tensor's bytes; the passes fall at ``k * cycle_s -
    phase_s``.
    """
    latest = 0.0
    splits = []
    group_bytes = 0.0
    previous_tick = None
    for i, (when, size) in enumerate(zip(ready, nbytes)):
        latest = max(latest, float(when))
        tick = math.ceil((latest + phase_s) / cycle_s - 1e-9) if cycle_s > 0 else latest
        if i and (tick != previous_tick or group_bytes + size > fusion_bytes):
            splits.append(i)
            group_bytes = 0.0
        group_bytes += size
        previous_tick = tick
    return tuple(splits)


def check_fusion(fusion):
    """(cycle seconds, fusion buffer bytes) as floats, or ValueError: both
    finite and >= 0 (a threshold of 0 is Horovod's fusion turned off)."""
    try:
        cycle_s, fusion_bytes = (float(v) for v in fusion)
    except (TypeError, ValueError):
        cycle_s = fusion_bytes = math.nan
    if not (0 <= cycle_s < math.inf and 0 <= fusion_bytes < math.inf):
        raise ValueError("fusion must be None or (cycle seconds >= 0, fusion buffer bytes "
                         ">= 0), got %r" % (fusion,))
    return cycle_s, fusion_bytes


def group_bounds(splits, n):
    """[(start, end), ...] for each group."""
    bounds = (0,) + tuple(splits) + (n,)
    return list(zip(bounds[:-1], bounds[1:]))


def flatten(tensors, dtype=None):
    """Concatenates tensors into one flat buffer of ``dtype`` (float32 by default)."""
    # TensorFlow is imported here, not at the top, so that the partition
    # arithmetic above stays framework-free for the partition search.
    import tensorflow as tf

    dtype = tf.float32 if dtype is None else dtype
    flats = [tf.reshape(tf.cast(t, dtype), [-1]) for t in tensors]
    return flats[0] if len(flats) == 1 else tf.concat(flats, axis=0)


def unflatten(flat, shapes, dtypes):
    """Inverse of ``flatten``: splits and reshapes, casting back to each dtype."""
    import tensorflow as tf

    sizes = [shape.num_elements() for shape in shapes]
    parts = [flat] if len(sizes) == 1 else tf.split(flat, sizes)
    return [tf.cast(tf.reshape(p, shape), dtype) for p, shape, dtype in zip(parts, shapes, dtypes)]


def tensor_names(grads, variables):
    """A label per gradient: its variable's name when Horovod passes the variables."""
    if variables is not None and len(variables) == len(grads):
        return [getattr(v, "name", "gradient %d" % i) for i, v in enumerate(variables)]
    return ["gradient %d" % i for i in range(len(grads))]


def in_backprop_order(grads):
    """The positions of the gradients that are not None, last layer first (their
    gradients are ready first), and those gradients dense: merged groups need dense
    buffers, so an embedding's ``tf.IndexedSlices`` sends its zeros."""
    import tensorflow as tf

    order = [i for i, g in enumerate(grads) if g is not None][::-1]
    dense = [tf.convert_to_tensor(grads[i]) if isinstance(grads[i], tf.IndexedSlices)
             else grads[i] for i in order]
    return order, dense


def put_back(grads, order, values):
    """A copy of ``grads`` with ``values[j]`` at position ``order[j]``."""
    out = list(grads)
    for i, value in zip(order, values):
        out[i] = value
    return out
