"""The partition search against the exhaustive optimum of synthetic pipelined systems.

Each synthetic system is a pipelined step (tf_mergecomp/search/step_model.py: backprop
releasing gradients, codec and network streams) whose true group costs the
search never sees: a fixed cost, a cost per element and per tensor, a random
extra cost per tensor, and cache and latency effects that no straight line
fits. The search sees what a training loop would give it: a profiled
one-group step, probes of single groups, and confirm rounds, each with
multiplicative noise. Its choice is scored by the true step time against the
exhaustive optimum over every layout of at most ``max_groups`` groups and
layer-wise.
"""

import math
import random

import numpy as np
import pytest

from tf_mergecomp.grouping import layerwise_splits
from tf_mergecomp.search.algorithm import PartitionSearchAlgorithm
from tf_mergecomp.search.candidates import best_layouts
from tf_mergecomp.search.requests import Probe, Profile, ProfileResult, Time, Warm
from tf_mergecomp.search.run import run_search
from tf_mergecomp.search.step_model import StepTimeModel, exhaustive_best

STEPS_PER_ROUND = 3  # a confirm round's time is the median of this many noisy steps


class TrueCosts:
    """A group's true encode, collective and decode seconds (module docstring)."""

    def __init__(self, rng, sizes, backprop_s):
        n = len(sizes)
        self.cumulative = np.concatenate([[0.0], np.cumsum(sizes)])
        total = self.cumulative[-1]
        log_uniform = lambda lo, hi: math.exp(rng.uniform(math.log(lo), math.log(hi)))  # noqa: E731
        # Whole-model transfer time relative to backprop: from hidden to dominant.
        self.network = [log_uniform(2e-4, 5e-3),  # latency per collective
                        backprop_s * log_uniform(0.03, 3.0) / total]
        self.encode = [log_uniform(1e-5, 2e-3), backprop_s * log_uniform(0.01, 0.4) / total]
        self.decode_share = rng.uniform(0.2, 1.0)
        self.cache_elements = log_uniform(1e4, 1e7)
        self.cache_penalty = rng.uniform(0.0, 0.6)
        extra = np.array([rng.uniform(0.0, 3e-5) for _ in range(n)])
        self.extra_cumulative = np.concatenate([[0.0], np.cumsum(extra)])

    def __call__(self, lo, hi):
        lo, hi = np.asarray(lo), np.asarray(hi)
        elements = self.cumulative[hi] - self.cumulative[lo]
        extra = self.extra_cumulative[hi] - self.extra_cumulative[lo]
        # Per-element cost grows once a group outgrows the cache.
        cache = 1.0 + self.cache_penalty * elements / (elements + self.cache_elements)
        encode = self.encode[0] + self.encode[1] * elements * cache + extra
        # Small messages pay latency twice over (handshakes), large ones once.
        collective = (self.network[0] * (1.0 + 1.0 / (1.0 + elements / 1e5))
                      + self.network[1] * elements)
        decode = self.decode_share * encode
        return encode, collective, decode


class SyntheticSystem:
    """A random model, codec and network; answers the search's requests with noise."""

    def __init__(self, seed, n, noise):
        rng = random.Random(seed)
        self.rng = np.random.default_rng(seed)
        self.noise = noise
        skew = rng.uniform(0.0, 2.0)  # later tensors (first in backprop) larger or smaller
        self.sizes = [int(10 ** rng.uniform(1, 6) * (1 + i / n) ** skew) for i in range(n)]
        backprop = rng.uniform(0.05, 0.5)
        compute = np.array([rng.uniform(0.2, 1.0) * s ** rng.uniform(0.5, 1.0) + 1.0
                            for s in self.sizes])
        ready = backprop * rng.uniform(0.3, 0.6) + backprop * np.cumsum(compute) / compute.sum()
        self.costs = TrueCosts(rng, self.sizes, backprop)
        self.codec_on_compute = rng.random() < 0.5
        self.decodes_after_backprop = rng.random() < 0.5
        self.truth = StepTimeModel(ready, self.costs, tail=rng.uniform(0.0, 0.1) * backprop,
                                   codec_on_compute=self.codec_on_compute,
                                   decodes_after_backprop=self.decodes_after_backprop)

    def _noisy(self, value, size=None):
        if not self.noise:
            return value
        return value * np.maximum(0.0, 1.0 + self.rng.normal(0.0, self.noise, size))

    def profile(self, splits):
        ready = self._noisy(self.truth.ready, len(self.truth.ready))
        return ProfileResult(float(self._noisy(self.truth.step_time(splits))), ready)

    def probe(self, splits):
        bounds = (0,) + tuple(splits) + (len(self.sizes),)
        parts = np.stack(self.costs(np.array(bounds[:-1]), np.array(bounds[1:])), axis=1)
        return self._noisy(parts, parts.shape)

    def time(self, splits):
        steps = self._noisy(self.truth.step_time(splits), STEPS_PER_ROUND)
        return float(np.median(steps))

    def search(self, max_groups):
        return run_search(self.sizes, self.profile, self.probe, self.time, max_groups=max_groups,
                          codec_on_compute=self.codec_on_compute,
                          decodes_after_backprop=self.decodes_after_backprop)

    def optimum(self, max_groups):
        """The true fastest of every layout with at most ``max_groups`` groups and layer-wise."""
        candidates = [exhaustive_best(self.truth, g) for g in range(1, max_groups + 1)]
        if max_groups > 1:
            layerwise = layerwise_splits(len(self.sizes))
            candidates.append((layerwise, self.truth.step_time(layerwise)))
        return min(candidates, key=lambda c: c[1])


def synthetic_cases(count, seed):
    rng = random.Random(seed)
    return [(rng.randrange(1 << 30), int(round(math.exp(rng.uniform(math.log(8), math.log(300))))),
             rng.randint(1, 4)) for _ in range(count)]


CASES = synthetic_cases(200, seed=12)


def test_confirmed_choice_is_near_the_exhaustive_optimum():
    """200 random systems (N from 8 to 300, max_groups 1 to 4), each searched at
    0% and 5% noise: the choice is within 5% of the exhaustive best in >= 95%
    of searches, and never slower than the better sentinel by more than the
    noise."""
    within = {0.0: 0, 0.05: 0}
    optimum_groups = {}
    failures = []
    for seed, n, max_groups in CASES:
        for noise in (0.0, 0.05):
            system = SyntheticSystem(seed, n, noise)
            if noise == 0.0:
                best_layout, best = system.optimum(max_groups)
                groups = len(best_layout) + 1
                optimum_groups[min(groups, 5)] = optimum_groups.get(min(groups, 5), 0) + 1
            result = system.search(max_groups)
            chosen = system.truth.step_time(result.splits)
            if chosen <= 1.05 * best:
                within[noise] += 1
            if max_groups > 1:
                sentinels = min(system.truth.step_time(()),
                                system.truth.step_time(layerwise_splits(n)))
                if chosen > (1.0 + noise) * sentinels * (1 + 1e-12):
                    failures.append((seed, n, max_groups, noise, chosen / sentinels))
            # Two sentinels and three finalists; the one-group profile trains the first.
            assert result.requests["traced"] <= (5 if max_groups > 1 else 0)
    assert not failures, failures
    for noise, count in within.items():
        assert count >= 0.95 * len(CASES), (noise, count, optimum_groups)
    # The systems cover every regime: optima of 1 to 4 groups and layer-wise (5 = more than 4).
    assert set(optimum_groups) == {1, 2, 3, 4, 5}, optimum_groups


def flat_system(n, seconds=0.1):
    """Every layout costs the same: nothing to gain."""
    sizes = [100] * n

    def profile(splits):
        return ProfileResult(seconds, np.linspace(0.01, 0.05, n))

    def probe(splits):
        return np.full((len(splits) + 1, 3), 1e-4)

    return sizes, profile, probe


def test_one_tensor_or_one_group_allowed_needs_no_measurement():
    for sizes, max_groups in (([123], 4), ([5, 6, 7], 1)):
        calls = []
        result = run_search(sizes, lambda s: calls.append(s), lambda s: calls.append(s),
                            lambda s: calls.append(s), max_groups=max_groups)
        assert result.splits == () and calls == []


def test_two_tensors_confirm_both_sentinels_only():
    times = {(): 2.0, (1,): 1.5}
    sizes, profile, probe = flat_system(2)
    result = run_search(sizes, profile, probe, lambda s: times[s], max_groups=4)
    assert result.splits == (1,)
    assert set(result.algorithm.candidates) == {(), (1,)}


def test_request_protocol_and_interleaved_rotated_rounds():
    sizes, profile, probe = flat_system(40)
    algorithm = PartitionSearchAlgorithm(sizes, max_groups=3, finalists=2, rounds=3)
    request = algorithm.start()
    assert isinstance(request, Profile) and request.splits == ()
    with pytest.raises(RuntimeError, match="started"):
        algorithm.start()
    request = algorithm.answer(profile(()))
    assert isinstance(request, Probe) and () in request.layouts
    order, warmed = [], []
    while request is not None:
        if isinstance(request, Probe):
            assert not warmed  # every probe before the confirm phase
            request = algorithm.answer([probe(l) for l in request.layouts])
        elif isinstance(request, Warm):
            assert not order
            warmed.extend(request.layouts)
            request = algorithm.answer(None)
        else:
            assert isinstance(request, Time)
            order.append(request.splits)
            request = algorithm.answer(1.0)  # all equal: nobody is dropped
    assert algorithm.done and algorithm.pending is None
    candidates = algorithm.candidates
    assert candidates[:2] == [(), tuple(range(1, 40))] and len(candidates) == 4
    # Every candidate trains an untimed turn (its trace) before the first timed round.
    assert warmed == candidates
    rounds = [order[i * 4:(i + 1) * 4] for i in range(3)]
    for index, turns in enumerate(rounds):
        # Every candidate once per round, the order rotated by one each round.
        assert turns == candidates[index:] + candidates[:index]
    with pytest.raises(RuntimeError, match="no request is pending"):
        algorithm.answer(1.0)


def test_never_fixes_a_candidate_measured_slower_than_a_sentinel():
    """The model predicts the finalists fast; training says otherwise: a sentinel wins."""
    sizes, profile, probe = flat_system(30)

    def time_candidate(splits):
        return {(): 1.0, tuple(range(1, 30)): 1.2}.get(splits, 1.01)

    result = run_search(sizes, profile, probe, time_candidate, max_groups=4)
    assert result.splits == ()
    measured = result.algorithm.measured_seconds()
    assert measured[()] == min(measured.values())


def test_clear_losers_are_dropped_after_the_second_round():
    sizes, profile, probe = flat_system(30)
    layerwise = tuple(range(1, 30))

    def time_candidate(splits):
        return 1.0 if splits == layerwise else 2.0

    result = run_search(sizes, profile, probe, time_candidate, max_groups=4, rounds=4)
    algorithm = result.algorithm
    assert result.splits == layerwise
    # One group is the yardstick of every round: never dropped.
    assert set(algorithm.dropped) == set(algorithm.candidates) - {layerwise, ()}
    assert all(after == 2 for after in algorithm.dropped.values())
    # Two full rounds, then the winner against one group.
    assert result.requests["time"] == 2 * len(algorithm.candidates) + 2 * 2
    assert algorithm.relative_seconds()[layerwise] == pytest.approx(0.5)


def test_a_dropped_candidate_is_not_chosen_on_its_early_rounds():
    """Finalist A leads rounds 1-2 (0.67 of one group) and drops B (0.72), then runs
    at 0.80 of one group in rounds 3-4: A's median over its four rounds (0.735) is
    above B's over its two, but B lost to A on its rounds; A is chosen."""
    sizes, profile, probe = flat_system(30)
    layerwise = tuple(range(1, 30))
    roles, calls = {}, {}

    def time_candidate(splits):
        calls[splits] = calls.get(splits, 0) + 1
        if splits == ():
            return 1.0
        if splits == layerwise:
            return 2.0
        role = roles.setdefault(splits, "ABC"[min(len(roles), 2)])
        return {"A": 0.67 if calls[splits] <= 2 else 0.80, "B": 0.72, "C": 1.5}[role]

    result = run_search(sizes, profile, probe, time_candidate, max_groups=4, rounds=4)
    algorithm = result.algorithm
    a, b = (next(l for l, r in roles.items() if r == role) for role in "AB")
    assert algorithm.dropped[b] == 2 and algorithm.relative_seconds()[b] == pytest.approx(0.72)
    assert result.splits == a
    assert algorithm.relative_seconds()[a] == pytest.approx((0.67 + 0.80) / 2)


def leader_against_one_group(leader_ratios, rounds=4, **options):
    """A search whose first finalist runs at ``leader_ratios[i]`` of one group in its
    i-th timed turn (the last repeated), the other finalists and layer-wise clearly slower."""
    sizes, profile, probe = flat_system(30)
    layerwise = tuple(range(1, 30))
    leader, turns = [], []

    def time_candidate(splits):
        turns.append(splits)
        if splits in ((), layerwise):
            return {(): 1.0, layerwise: 2.0}[splits]
        if not leader:
            leader.append(splits)
        if splits != leader[0]:
            return 1.5
        timed = turns.count(splits) - 1
        return leader_ratios[min(timed, len(leader_ratios) - 1)]

    result = run_search(sizes, profile, probe, time_candidate, max_groups=4, rounds=rounds,
                        **options)
    return result, leader[0], turns


def test_a_gain_within_the_rounds_spread_keeps_one_group():
    """The leader's per-round ratios 0.85, 1.15, 1.02, 0.88 (a qsgd search's, which chose
    three groups that trained slower than one): extra rounds of the two alone do not
    resolve a gain, so one group is kept and the log says why."""
    result, leader, turns = leader_against_one_group([0.85, 1.15, 1.02, 0.88] * 3)
    algorithm = result.algorithm
    assert algorithm.leader == leader and result.splits == ()
    assert algorithm.extra_rounds == 4 and len(algorithm.rounds_measured) == 8
    for measured in algorithm.rounds_measured[4:]:
        assert set(measured) == {(), leader}
    mean, half_width = algorithm.gain_over_reference(leader)
    assert mean < 0 < mean + half_width
    assert any("not resolved, one group kept" in note for note in algorithm.notes)
    assert algorithm.summary()["leader"] == list(leader)


def test_extra_rounds_resolve_a_real_gain():
    """Noisy first rounds (0.6, 1.1, 0.7, 1.0), then a steady 0.8: the extra rounds
    stop as soon as the gain is resolved, and the leader is chosen."""
    result, leader, _ = leader_against_one_group([0.6, 1.1, 0.7, 1.0, 0.8])
    algorithm = result.algorithm
    assert result.splits == leader
    assert 0 < algorithm.extra_rounds < 4
    mean, half_width = algorithm.gain_over_reference(leader)
    assert mean + half_width < 0
    # One round fewer would not have resolved it.
    fewer = PartitionSearchAlgorithm(algorithm.sizes)
    fewer.rounds_measured = algorithm.rounds_measured[:-1]
    assert fewer.resolved_choice(leader) == ()


def test_a_steady_gain_needs_no_extra_rounds():
    result, leader, _ = leader_against_one_group([0.9, 0.91, 0.89, 0.9])
    assert result.splits == leader and result.algorithm.extra_rounds == 0


def test_without_extra_rounds_an_unresolved_leader_gives_way_to_one_group():
    result, leader, _ = leader_against_one_group([0.85, 1.15, 1.02, 0.88], resolve_rounds=0)
    assert result.algorithm.leader == leader and result.splits == ()
    assert result.algorithm.extra_rounds == 0


def test_the_choice_is_judged_against_one_group_in_the_same_round():
    """Steps slow down over the process's life (1% per turn here) and one group's first turn
    hiccups (1.6x): every finalist is 3% slower than one group side by side, and is not
    chosen, though medians of absolute times from different rounds favour one of them."""
    sizes, profile, probe = flat_system(30)
    layerwise = tuple(range(1, 30))
    turns = []

    def time_candidate(splits):
        turns.append(splits)
        base = {(): 1.0, layerwise: 1.15}.get(splits, 1.03)
        hiccup = 1.6 if splits == () and turns.count(()) == 1 else 1.0
        return base * hiccup * (1 + 0.01 * len(turns))

    result = run_search(sizes, profile, probe, time_candidate, max_groups=4, rounds=4)
    algorithm = result.algorithm
    assert result.splits == ()
    assert () not in algorithm.dropped and turns.count(()) == 4
    measured = algorithm.measured_seconds()
    assert min(measured, key=measured.get) != ()  # absolute medians would have chosen wrong
    relative = algorithm.relative_seconds()
    assert all(relative[layout] > 1.0 for layout in relative if layout != ())


def test_a_confirm_turn_must_answer_positive_seconds():
    sizes, profile, probe = flat_system(10)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive, finite seconds"):
            run_search(sizes, profile, probe, lambda splits, bad=bad: bad, max_groups=2)


def test_best_layouts_on_a_grid_matches_the_exhaustive_optimum():
    system = SyntheticSystem(seed=4, n=120, noise=0.0)
    for groups in (2, 3, 4):
        exact, seconds = exhaustive_best(system.truth, groups)
        found = best_layouts(system.truth, groups, count=3, exhaustive_limit=500,
                             sizes=system.sizes)
        assert len(found) == 3 and found[0][1] <= found[1][1] <= found[2][1]
        assert found[0][1] <= seconds * 1.001, (groups, found[0], exact)


def test_probe_answers_must_match_the_layouts():
    sizes, profile, probe = flat_system(10)
    algorithm = PartitionSearchAlgorithm(sizes, max_groups=2)
    algorithm.start()
    algorithm.answer(profile(()))  # asks for probes
    with pytest.raises(ValueError, match="one array per layout"):
        algorithm.answer([])


@pytest.mark.parametrize("kwargs,message", [
    ({"sizes": []}, "at least one"),
    ({"sizes": [1, -2]}, "non-negative"),
    ({"sizes": [1, 2], "max_groups": 0}, "max_groups"),
    ({"sizes": [1, 2], "rounds": 0}, "rounds"),
    ({"sizes": [1, 2], "finalists": -1}, "finalists"),
    ({"sizes": [1, 2], "resolve_rounds": -1}, "resolve_rounds"),
    ({"sizes": [1, 2], "standard_errors": -1.0}, "standard_errors"),
    ({"sizes": [1, 2], "standard_errors": float("nan")}, "standard_errors"),
])
def test_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PartitionSearchAlgorithm(**kwargs)


def test_profiled_ops_are_found_under_the_callers_node_name():
    from tf_mergecomp.search.recorder import _by_traced_name

    ops = {"StatefulPartitionedCall/gradient_tape/dense/MatMul_1": [(1, 2)],
           "gradient_tape/conv/Conv2DBackpropFilter": [(3, 4)],
           "outer/inner/gradient_tape/dense/BiasAddGrad": [(5, 6)],
           "other/MatMul_1": [(7, 8)]}
    found = _by_traced_name(ops, {"gradient_tape/dense/MatMul_1",
                                  "gradient_tape/conv/Conv2DBackpropFilter",
                                  "gradient_tape/dense/BiasAddGrad", "never/ran"})
    assert found["gradient_tape/dense/MatMul_1"] == [(1, 2)]
    assert found["gradient_tape/conv/Conv2DBackpropFilter"] == [(3, 4)]
    assert found["gradient_tape/dense/BiasAddGrad"] == [(5, 6)]
    assert "never/ran" not in found and "MatMul_1" not in found
    assert _by_traced_name(ops, {"other/MatMul_1"}) is ops  # every name found as it is


class _LayoutsDriver:
    def apply_layout(self, layout):
        pass


def test_tracings_count_the_functions_of_every_layout_tried():
    import tensorflow as tf

    from tf_mergecomp.search.layout_functions import LayoutFunctions

    functions = LayoutFunctions(_LayoutsDriver())
    step = functions.register(lambda x: x + 1.0, {})
    for layout in [(), (1,), (1, 2)]:
        assert functions.use(layout)
        step(tf.constant(1.0))
    functions.keep_only((1,))  # as the search does once it chose
    assert functions.tracings() == 3
    assert functions.use((1,), fresh=True)
    step(tf.constant(1.0))
    assert functions.tracings() == 4


def test_keras_tracings_count_the_train_functions_of_every_layout_tried():
    import tensorflow as tf

    from tf_mergecomp.search.fit import KerasTrainFunctions

    class Model:
        def make_train_function(self, force=False):
            self.train_function = tf.function(lambda x: x * 2.0)

    model = Model()
    functions = KerasTrainFunctions(model, _LayoutsDriver())
    for layout in [(), (1,), (1, 2)]:
        assert functions.use(layout)
        model.train_function(tf.constant(1.0))
    functions.keep_only((1,))
    assert functions.tracings() == 3
    assert functions.use((1,), fresh=True)
    model.train_function(tf.constant(1.0))
    assert functions.tracings() == 4


def test_history_records_no_prediction_for_plain_horovod_and_codecs_by_precedence():
    from tf_mergecomp import MergeComp
    from tf_mergecomp.search.driver import PartitionSearchDriver
    from tf_mergecomp.search.requests import PLAIN_HOROVOD

    class Predictions(dict):
        def get(self, key, default=None):
            self.asked.append(key)
            return super().get(key, default)

    class Algorithm:
        predictions = Predictions({(2,): 0.5})
        predictions.asked = []

        def codecs_of(self, layout):
            return ("fp16", "none") if layout == (2,) else None

    mc = MergeComp("fp16", plain_groups=True)
    mc.set_gradient_layout([[5, 3], [7], [2]], ["float32"] * 3)
    driver = PartitionSearchDriver(mc, verbose=0)
    driver.layout_codecs = {(1,): ("none", "fp16"), (2,): ("none", "none")}
    assert driver.codecs_of((1,)) == ("none", "fp16")  # no search: the saved codecs
    driver.algorithm = Algorithm()
    assert driver.codecs_of((2,)) == ("fp16", "none")  # the search's first
    assert driver.codecs_of((1,)) == ("none", "fp16")
    assert driver.codecs_of(()) is None
    plain = driver._history_record(PLAIN_HOROVOD)
    assert plain["predicted_s"] is None and plain["splits"] is None
    assert driver._history_record((2,))["predicted_s"] == 0.5
    assert Algorithm.predictions.asked == [(2,)]  # never plain Horovod as a layout
