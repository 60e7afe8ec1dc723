"""Partitions: balanced splits, specs, and flatten/unflatten."""

import numpy as np
import pytest
import tensorflow as tf

from tf_mergecomp import grouping


@pytest.mark.parametrize("sizes, groups, expected", [
    ([10, 10, 10, 10], 2, (2,)),
    ([10, 10, 10, 10], 4, (1, 2, 3)),
    ([100, 1, 1, 1], 2, (1,)),
    ([1, 1, 1, 100], 2, (3,)),
    ([1, 1, 1, 100], 3, (2, 3)),
    ([5], 3, ()),
    ([], 2, ()),
])
def test_balanced_splits(sizes, groups, expected):
    assert grouping.balanced_splits(sizes, groups) == expected


def test_balanced_groups_are_nonempty_and_near_equal():
    rng = np.random.RandomState(0)
    sizes = list(rng.randint(1, 1000, size=200))
    for groups in range(1, 12):
        splits = grouping.balanced_splits(sizes, groups)
        bounds = grouping.group_bounds(splits, len(sizes))
        assert len(bounds) == groups and all(end > start for start, end in bounds)
        totals = [sum(sizes[s:e]) for s, e in bounds]
        assert max(totals) - min(totals) <= 2 * max(sizes)


def test_resolve_specs():
    sizes = [4, 4, 4, 4, 4]
    assert grouping.resolve_splits("layerwise", sizes) == (1, 2, 3, 4)
    assert grouping.resolve_splits(1, sizes) == ()
    assert grouping.resolve_splits(None, sizes) == grouping.balanced_splits(sizes, 2)
    assert grouping.resolve_splits([2], sizes) == (2,)
    with pytest.raises(ValueError, match="more groups"):
        grouping.resolve_splits(6, sizes)
    with pytest.raises(ValueError, match="< the number of gradient tensors"):
        grouping.resolve_splits([5], sizes)


def test_flatten_unflatten_round_trip_keeps_shapes_and_dtypes():
    tensors = [tf.ones([2, 3], tf.float16), tf.range(4, dtype=tf.float32), tf.constant(2.5, tf.float64)]
    flat = grouping.flatten(tensors)
    assert flat.dtype == tf.float32 and flat.shape == [11]
    back = grouping.unflatten(flat, [t.shape for t in tensors], [t.dtype for t in tensors])
    for a, b in zip(tensors, back):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.numpy(), b.numpy())
