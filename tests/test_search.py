"""The partition search on synthetic step-time models with known optima.

The main model is a backprop/communication pipeline: tensor i's gradient is
ready after the compute of tensors 0..i (backprop order), a group is sent once
its last gradient is ready and the previous group's transfer is over, and every
group costs a fixed overhead. That is the trade-off MergeComp's search faces,
and its optima for 2 and 3 groups are found here by exhaustive enumeration.
"""

import math
import random

import pytest

from tf_mergecomp.search import PartitionSearcher, robust_seconds, search

STAGE_ALLOWANCE = 6  # the c in "at most 2 * log2(N) + c measurements per group count"


def resnet50_sizes():
    """Element counts of Keras ResNet50's 214 gradients (10 classes), backprop order."""
    forward = []

    def conv(kernel, cin, cout):
        forward.extend([kernel * kernel * cin * cout, cout])

    def batch_norm(channels):
        forward.extend([channels, channels])

    conv(7, 3, 64)
    batch_norm(64)
    cin = 64
    for blocks, filters in ((3, 64), (4, 128), (6, 256), (3, 512)):
        for block in range(blocks):
            if block == 0:
                conv(1, cin, 4 * filters)
                batch_norm(4 * filters)
            conv(1, cin, filters)
            batch_norm(filters)
            conv(3, filters, filters)
            batch_norm(filters)
            conv(1, filters, 4 * filters)
            batch_norm(4 * filters)
            cin = 4 * filters
    forward.extend([2048 * 10, 10])
    return forward[::-1]


def random_sizes(n, seed):
    rng = random.Random(seed)
    return [int(10 ** rng.uniform(1, 6)) for _ in range(n)]


class Pipeline:
    """Step time of a layout: forward + overlapped backprop and transfers + per-group cost."""

    def __init__(self, sizes, overhead=0.003, noise=0.0, seed=0):
        total = float(sum(sizes))
        self.n = len(sizes)
        self.cumulative = [0.0]
        self.ready = [0.0]
        for size in sizes:
            self.cumulative.append(self.cumulative[-1] + size)
            self.ready.append(self.ready[-1] + 1e-5 + 0.15 * size / total)
        self.seconds_per_element = 0.3 / total
        self.overhead = overhead
        self.latency = 0.0005
        self.forward = 0.1
        self.noise = noise
        self.rng = random.Random(seed)
        self.calls = 0

    def cost(self, splits):
        bounds = (0,) + tuple(splits) + (self.n,)
        transfer_end = 0.0
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            start = max(self.ready[hi] + self.overhead, transfer_end)
            transfer_end = start + self.latency + (self.cumulative[hi] - self.cumulative[lo]) * self.seconds_per_element
        return self.forward + max(transfer_end, self.ready[-1]) + self.overhead * (len(bounds) - 1)

    def measure(self, splits):
        self.calls += 1
        seconds = self.cost(splits)
        return seconds * (1.0 + self.rng.gauss(0.0, self.noise)) if self.noise else seconds

    def optimum(self, groups):
        """The exhaustive minimum over layouts of exactly ``groups`` groups (1, 2 or 3)."""
        n = self.n
        if groups == 1:
            return self.cost(())
        if groups == 2:
            return min(self.cost((s,)) for s in range(1, n))
        return min(self.cost((s1, s2)) for s1 in range(1, n - 1) for s2 in range(s1 + 1, n))


def stage_bound(n):
    return math.ceil(2.0 * math.log2(n)) + STAGE_ALLOWANCE


PIPELINE_CASES = [
    ("resnet50", resnet50_sizes, 0.0),
    ("resnet50", resnet50_sizes, 0.01),
    ("resnet50", resnet50_sizes, 0.03),
    ("random500", lambda: random_sizes(500, 3), 0.0),
    ("random500", lambda: random_sizes(500, 3), 0.03),
    ("uniform500", lambda: [1000] * 500, 0.0),
    ("uniform500", lambda: [1000] * 500, 0.01),
]


@pytest.mark.parametrize("name,make_sizes,noise", PIPELINE_CASES)
def test_pipeline_within_5_percent_of_exhaustive_optimum(name, make_sizes, noise):
    sizes = make_sizes()
    model = Pipeline(sizes, noise=noise, seed=1)
    result = search(model.measure, sizes, max_groups=3)
    n = len(sizes)

    assert model.cost(result.stage_best[2]) <= 1.05 * model.optimum(2)
    assert model.cost(result.stage_best[3]) <= 1.05 * model.optimum(3)
    best_up_to_3 = min(model.optimum(g) for g in (1, 2, 3))
    assert model.cost(result.splits) <= 1.05 * best_up_to_3

    assert result.per_stage["sentinels"] == 2
    for groups in (2, 3):
        assert result.per_stage[groups] <= stage_bound(n), (groups, result.per_stage)
    assert model.calls == len(result.measurements)


def test_pipeline_noise_free_finds_exact_optima():
    sizes = resnet50_sizes()
    model = Pipeline(sizes)
    result = search(model.measure, sizes, max_groups=3)
    assert model.cost(result.stage_best[2]) == pytest.approx(model.optimum(2), rel=1e-12)
    assert model.cost(result.stage_best[3]) == pytest.approx(model.optimum(3), rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 17, 500])
def test_unimodal_two_group_curve(n):
    """A V-shaped curve in the split's cumulative-bytes position, minimum at 30%."""
    sizes = [1 + (i * 7919) % 13 for i in range(n)]
    cumulative = [0]
    for size in sizes:
        cumulative.append(cumulative[-1] + size)

    def seconds(splits):
        if len(splits) != 1:
            return 10.0
        return 1.0 + abs(cumulative[splits[0]] / cumulative[-1] - 0.3)

    result = search(seconds, sizes, max_groups=2)
    exhaustive = min(seconds((s,)) for s in range(1, n))
    assert seconds(result.splits) == exhaustive
    assert result.per_stage.get(2, 0) <= stage_bound(n)


def test_flat_curve_keeps_one_group_and_stops_after_two():
    sizes = random_sizes(500, 5)
    result = search(lambda splits: 0.25, sizes, max_groups=4)
    assert result.splits == ()  # ties go to the fewest groups
    assert set(result.per_stage) == {"sentinels", 2}
    assert result.per_stage[2] <= stage_bound(500)


def test_flat_noisy_curve_stays_within_bounds():
    sizes = random_sizes(500, 5)
    rng = random.Random(7)
    result = search(lambda splits: 0.25 * (1.0 + rng.gauss(0.0, 0.02)), sizes, max_groups=4)
    assert result.seconds <= 0.25 * 1.05
    for stage, count in result.per_stage.items():
        if stage != "sentinels":
            assert count <= stage_bound(500)


def test_single_tensor_has_only_one_layout():
    calls = []
    result = search(lambda splits: calls.append(splits) or 1.0, [123], max_groups=4)
    assert calls == [()]
    assert result.splits == ()


def test_two_tensors_measure_both_layouts_once():
    calls = []
    times = {(): 2.0, (1,): 1.5}
    result = search(lambda splits: calls.append(splits) or times[splits], [10, 20], max_groups=4)
    assert sorted(calls) == [(), (1,)]
    assert result.splits == (1,)


def test_layerwise_sentinel_can_win():
    sizes = [100] * 40
    result = search(lambda splits: 1.0 / (len(splits) + 1), sizes, max_groups=3)
    assert result.splits == tuple(range(1, 40))


def test_measurements_are_cached_except_close_call_repeats():
    sizes = resnet50_sizes()
    model = Pipeline(sizes, noise=0.02, seed=4)
    searcher = PartitionSearcher(sizes, max_groups=4, max_repeats=2, max_repeats_per_stage=4)
    while not searcher.done:
        splits = searcher.propose()
        searcher.report(splits, model.measure(splits))
    counts = {}
    for _, layout, _ in searcher.measurements:
        counts[layout] = counts.get(layout, 0) + 1
    assert max(counts.values()) <= 2
    repeated = sum(count - 1 for count in counts.values())
    stages = [stage for stage in searcher.measurements_per_stage() if stage != "sentinels"]
    assert repeated <= 4 * len(stages)


def test_stage_budget_is_a_hard_cap():
    sizes = random_sizes(300, 2)
    rng = random.Random(0)
    result = search(lambda splits: rng.uniform(1.0, 2.0), sizes, max_groups=4, max_measurements_per_stage=5)
    for stage, count in result.per_stage.items():
        if stage != "sentinels":
            assert count <= 5


def test_state_machine_protocol():
    searcher = PartitionSearcher([5, 5, 5, 5], max_groups=2)
    first = searcher.propose()
    assert first == ()
    assert searcher.propose() == first  # proposing again does not advance
    with pytest.raises(ValueError, match="pending proposal"):
        searcher.report((1,), 1.0)
    with pytest.raises(ValueError, match="finite non-negative"):
        searcher.report(first, float("nan"))
    while not searcher.done:
        splits = searcher.propose()
        searcher.report(splits, 1.0 + abs(splits[0] - 2) if len(splits) == 1 else 3.0)
    assert searcher.propose() is None
    assert searcher.best == (2,)
    with pytest.raises(ValueError, match="no measurement is pending"):
        searcher.report((2,), 1.0)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"sizes": []}, "at least one"),
        ({"sizes": [1, -2]}, "non-negative"),
        ({"sizes": [1, 2], "max_groups": 0}, "max_groups"),
        ({"sizes": [1, 2], "min_improvement": 1.5}, "min_improvement"),
        ({"sizes": [1, 2], "byte_weight": -0.1}, "byte_weight"),
        ({"sizes": [1, 2], "max_measurements_per_stage": 1}, "max_measurements_per_stage"),
    ],
)
def test_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PartitionSearcher(**kwargs)


def test_robust_seconds_is_the_median():
    assert robust_seconds([0.3, 0.1, 9.0]) == 0.3
    assert robust_seconds([0.1, 0.2, 0.4, 5.0]) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        robust_seconds([])
