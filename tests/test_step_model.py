"""The step-time model against a plain one-event-at-a-time simulation, and its cost fits."""

import random

import numpy as np
import pytest

from tf_mergecomp.search.step_model import LinearGroupCosts, MeasuredGroupCosts, StepTimeModel, exhaustive_best, layouts_with_groups


def reference_step_time(ready, costs, tail, codec_on_compute, splits, decodes_after_backprop=False):
    """The same rules as StepTimeModel, one gradient and one task at a time."""
    n = len(ready)
    ready = list(np.maximum.accumulate(np.maximum(ready, 0.0)))
    bounds = [0] + list(splits) + [n]
    groups = len(bounds) - 1
    lo = np.array(bounds[:-1])
    hi = np.array(bounds[1:])
    encode, collective, decode = (np.broadcast_to(np.asarray(p, float), (groups,))
                                  for p in costs(lo, hi))
    collective_end = [None] * groups
    network_free = 0.0
    next_encode = next_decode = 0

    def start_collective(g, at):
        nonlocal network_free
        begin = max(at, network_free)
        collective_end[g] = begin + collective[g]
        network_free = collective_end[g]

    if not codec_on_compute:
        clock = 0.0
        while next_decode < groups:
            encode_release = ready[hi[next_encode] - 1] if next_encode < groups else np.inf
            decode_release = collective_end[next_decode] if next_decode < next_encode else np.inf
            if decodes_after_backprop:
                decode_release = max(decode_release, ready[-1])
            if (decode_release < encode_release if decodes_after_backprop
                    else decode_release <= encode_release):
                clock = max(clock, decode_release) + decode[next_decode]
                next_decode += 1
            else:
                clock = max(clock, encode_release) + encode[next_encode]
                start_collective(next_encode, clock)
                next_encode += 1
        return max(clock, ready[-1]) + tail

    clock = 0.0
    computed = 0  # gradients done
    encode_released_at = None
    while next_decode < groups:
        encode_runnable = next_encode < groups and hi[next_encode] <= computed
        decode_release = collective_end[next_decode] if next_decode < next_encode else None
        if decodes_after_backprop and (computed < n or encode_runnable):
            decode_release = None  # not runnable yet
        if encode_runnable and decode_release is not None and decode_release <= encode_released_at:
            clock += decode[next_decode]
            next_decode += 1
        elif encode_runnable:
            clock += encode[next_encode]
            start_collective(next_encode, clock)
            next_encode += 1
        elif decode_release is not None and decode_release <= clock:
            clock += decode[next_decode]
            next_decode += 1
        elif computed < n:
            clock += ready[computed] - (ready[computed - 1] if computed else 0.0)
            computed += 1
            if next_encode < groups and hi[next_encode] == computed:
                encode_released_at = clock
        else:
            clock = max(clock, decode_release) + decode[next_decode]
            next_decode += 1
    return clock + tail


def random_model(rng, n, codec_on_compute):
    sizes = [int(10 ** rng.uniform(1, 6)) for _ in range(n)]
    ready = np.cumsum([rng.uniform(0.0, 0.01) for _ in range(n)]) + rng.uniform(0, 0.05)
    coefficients = [[rng.uniform(0, 0.003), rng.uniform(0, 2e-8), rng.uniform(0, 1e-4)]
                    for _ in range(3)]
    costs = LinearGroupCosts(sizes, coefficients)
    return sizes, StepTimeModel(ready, costs, tail=rng.uniform(0, 0.02),
                                codec_on_compute=codec_on_compute)


@pytest.mark.parametrize("codec_on_compute,decodes_after_backprop",
                         [(False, False), (True, False), (False, True), (True, True)])
def test_vectorized_model_matches_the_reference_simulation(codec_on_compute,
                                                            decodes_after_backprop):
    rng = random.Random(3)
    for trial in range(30):
        n = rng.choice([1, 2, 3, 7, 16])
        _, model = random_model(rng, n, codec_on_compute)
        model.decodes_after_backprop = decodes_after_backprop
        for groups in range(1, min(n, 4) + 1):
            layouts = layouts_with_groups(n, groups)
            got = model.step_times(layouts)
            for layout, seconds in zip(layouts, got):
                expected = reference_step_time(model.ready, model.costs, model.tail,
                                               codec_on_compute, tuple(layout),
                                               decodes_after_backprop)
                assert seconds == pytest.approx(expected, rel=1e-12, abs=1e-15), (trial, layout)
        layerwise = tuple(range(1, n))
        assert model.step_time(layerwise) == pytest.approx(reference_step_time(
            model.ready, model.costs, model.tail, codec_on_compute, layerwise,
            decodes_after_backprop), rel=1e-12)


def test_one_group_waits_for_backprop_and_pays_every_part_after_it():
    costs = LinearGroupCosts([100, 100], [[0.01, 0, 0], [0.02, 0, 0], [0.03, 0, 0]])
    for on_compute in (False, True):
        model = StepTimeModel([0.1, 0.2], costs, tail=0.005, codec_on_compute=on_compute)
        assert model.step_time(()) == pytest.approx(0.2 + 0.06 + 0.005)


def test_codec_on_compute_delays_backprop():
    # Two groups; the first group's encode (0.05 s) runs on the backprop stream.
    costs = LinearGroupCosts([1, 1], [[0.05, 0, 0], [0.0, 0, 0], [0.0, 0, 0]])
    own = StepTimeModel([0.1, 0.2], costs, codec_on_compute=False).timeline((1,))
    shared = StepTimeModel([0.1, 0.2], costs, codec_on_compute=True).timeline((1,))
    assert own["backprop_end"] == pytest.approx(0.2)
    assert own["step"] == pytest.approx(0.25)
    assert shared["backprop_end"] == pytest.approx(0.25)  # 0.2 + the first encode
    assert shared["step"] == pytest.approx(0.30)
    assert shared["encode"][0] == pytest.approx((0.1, 0.15))


def test_a_cpu_hosts_collective_work_bounds_the_step_from_below():
    # Two groups whose collectives overlap backprop (0.01 s each on the network),
    # but cost the host 0.04 s of CPU each: on a CPU host (codec_on_compute) the
    # step takes at least backprop + codec tasks + that CPU work + the tail.
    costs = LinearGroupCosts([1, 1], [[0.01, 0, 0], [0.01, 0, 0], [0.0, 0, 0]])
    host_cpu = lambda lo, hi: np.full(np.shape(lo), 0.04)  # noqa: E731
    plain = StepTimeModel([0.1, 0.2], costs, tail=0.005)
    cpu_bound = StepTimeModel([0.1, 0.2], costs, tail=0.005, host_cpu=host_cpu)
    assert plain.step_time((1,)) == pytest.approx(0.2 + 0.01 + 0.01 + 0.01 + 0.005)
    assert cpu_bound.step_time((1,)) == pytest.approx(0.2 + 2 * 0.01 + 2 * 0.04 + 0.005)
    assert cpu_bound.step_time(()) == pytest.approx(0.2 + 0.01 + 0.04 + 0.005)
    own_stream = StepTimeModel([0.1, 0.2], costs, tail=0.005, codec_on_compute=False,
                               host_cpu=host_cpu)
    assert own_stream.step_time((1,)) == pytest.approx(
        StepTimeModel([0.1, 0.2], costs, tail=0.005, codec_on_compute=False).step_time((1,)))


def test_one_horovod_pass_pays_its_fixed_costs_once_for_the_collectives_it_fuses():
    # Three gradients; each group's collective costs 0.01 s, all of it the
    # fixed cost a pass of Horovod's thread pays once (its negotiation).
    costs = LinearGroupCosts([1, 1, 1], [[0, 0, 0], [0.01, 0, 0], [0, 0, 0]])

    def model(ready, **kwargs):
        return StepTimeModel(ready, costs, codec_on_compute=False, cycle_s=1e-3, **kwargs)

    together = [0.0001, 0.0002, 0.0003]  # all queued before the first pass
    assert model(together).step_time((1, 2)) == pytest.approx(0.001 + 3 * 0.01)
    fused = model(together, pass_fixed_s=0.01)
    assert fused.step_time((1, 2)) == pytest.approx(0.001 + 0.01)
    assert fused.step_time(()) == pytest.approx(0.001 + 0.01)
    # Queued while the first pass's collective runs: the next pass takes up
    # the other two when the thread is free, and fuses them.
    apart = model([0.0001, 0.0015, 0.0025], pass_fixed_s=0.01)
    assert apart.step_time((1, 2)) == pytest.approx(0.001 + 2 * 0.01)
    timeline = apart.timeline((1, 2))
    assert [round(start, 6) for start, _ in timeline["collective"]] == [0.001, 0.011, 0.021]
    assert apart._simulate(np.asarray([[1, 2]]))["passes"][0] == 2
    # On a CPU host, the passes' CPU work bounds the step from below.
    cpu = StepTimeModel(together, costs, tail=0.005, cycle_s=1e-3, pass_fixed_s=0.01,
                        host_cpu_per_pass=0.05)
    assert cpu.step_time((1, 2)) == pytest.approx(0.0003 + 0.05 + 0.005)
    with pytest.raises(ValueError, match="pass_fixed_s"):
        StepTimeModel(together, costs, pass_fixed_s=-1)


def test_consecutive_steps_lock_to_horovods_cycle():
    # One gradient ready at 15.3 ms, a 0.3 ms collective, 1.5 ms after it; 5 ms cycle.
    costs = LinearGroupCosts([1], [[0, 0, 0], [0.0003, 0, 0], [0, 0, 0]])

    def model(costs, **kwargs):
        return StepTimeModel([0.0153], costs, tail=0.0015, codec_on_compute=False,
                             cycle_s=0.005, **kwargs)

    # A first step: ticks at multiples of 5 ms from its start, so the pass at 20 ms.
    assert model(costs).step_time(()) == pytest.approx(0.020 + 0.0003 + 0.0015)
    # Consecutive steps: each begins 1.8 ms after the tick of the pass before it,
    # so its ticks fall at 3.2, 8.2, 13.2, 18.2 ms and the step takes 4 cycles.
    steady = model(costs, steady_state=True)
    assert steady.step_time(()) == pytest.approx(0.020)
    assert steady.cycle_phase(()) == pytest.approx(0.0018)
    assert model(costs).cycle_phase(()) == 0.0
    # A pass longer than the cycle: the thread's next tick comes when it is done
    # (7 ms after the pass began), so the steps no longer take whole cycles.
    slow = LinearGroupCosts([1], [[0, 0, 0], [0.007, 0, 0], [0, 0, 0]])
    assert model(slow, steady_state=True).step_time(()) == pytest.approx(0.0185 + 0.007 + 0.0015)
    # Without a cycle there are no ticks to lock to.
    plain = StepTimeModel([0.0153], costs, tail=0.0015, codec_on_compute=False,
                          steady_state=True)
    assert plain.step_time(()) == pytest.approx(0.0153 + 0.0003 + 0.0015)


def test_collectives_run_one_at_a_time_in_group_order():
    costs = LinearGroupCosts([1, 1, 1], [[0, 0, 0], [0.1, 0, 0], [0, 0, 0]])
    timeline = StepTimeModel([0.0, 0.01, 0.02], costs, codec_on_compute=False).timeline((1, 2))
    starts = [start for start, _ in timeline["collective"]]
    assert starts == pytest.approx([0.0, 0.1, 0.2])
    assert timeline["step"] == pytest.approx(0.3)


def test_fit_recovers_linear_costs_and_measured_groups_override():
    rng = np.random.default_rng(0)
    sizes = rng.integers(10, 10**6, 50)
    truth = LinearGroupCosts(sizes, [[1e-4, 2e-9, 5e-6], [2e-3, 8e-9, 0], [5e-5, 1e-9, 2e-6]])
    groups = [(i, i + 1) for i in range(50)] + [(0, 50), (0, 25), (25, 50), (10, 40)]
    lo, hi = np.array(groups).T
    seconds = np.stack(truth(lo, hi), axis=1)
    fitted = LinearGroupCosts.fit(sizes, groups, seconds)
    assert fitted.coefficients == pytest.approx(truth.coefficients, rel=1e-6, abs=1e-12)

    overlay = MeasuredGroupCosts(fitted, {(0, 25): (1.0, 2.0, 3.0)})
    parts = overlay(np.array([[0, 25]]), np.array([[25, 50]]))
    assert [p[0, 0] for p in parts] == [1.0, 2.0, 3.0]
    assert parts[0][0, 1] == pytest.approx(truth(25, 50)[0])

    # Some parts measured: the others are the fit's, for that group too.
    encode_only = MeasuredGroupCosts(fitted, {(0, 25): (1.0, 3.0)}, parts=("encode", "decode"))
    parts = encode_only(np.array([0, 25]), np.array([25, 50]))
    assert [p[0] for p in parts] == pytest.approx([1.0, truth(0, 25)[1], 3.0])
    assert [p[1] for p in parts] == pytest.approx(list(truth(25, 50)))


@pytest.mark.parametrize("parts, measured, message", [
    (("encode", "network"), (1.0, 2.0), "among encode, collective, decode"),
    (("encode", "encode"), (1.0, 2.0), "distinct"),
    ((), (), "distinct"),
    (("encode", "decode"), (1.0, 2.0, 3.0), "needs 2 seconds"),
])
def test_measured_parts_are_checked(parts, measured, message):
    fitted = LinearGroupCosts([10, 20], np.zeros((3, 3)))
    with pytest.raises(ValueError, match=message):
        MeasuredGroupCosts(fitted, {(0, 2): measured}, parts=parts)


def test_fit_keeps_coefficients_non_negative():
    groups = [(0, 1), (1, 2), (0, 2)]
    seconds = [[0.01, 0.01, 0.01], [0.011, 0.011, 0.011], [0.009, 0.009, 0.009]]
    fitted = LinearGroupCosts.fit([100, 200], groups, seconds)
    assert (fitted.coefficients >= 0).all()


def test_exhaustive_best_is_the_minimum_over_all_layouts():
    rng = random.Random(5)
    _, model = random_model(rng, 12, True)
    for groups in (1, 2, 3):
        layout, seconds = exhaustive_best(model, groups, chunk=7)
        every = layouts_with_groups(12, groups)
        assert seconds == pytest.approx(float(model.step_times(every).min()))
        assert model.step_time(layout) == pytest.approx(seconds)


def test_rejects_bad_layouts():
    model = StepTimeModel([0.1, 0.2, 0.3], LinearGroupCosts([1, 1, 1], np.zeros((3, 3))))
    for bad in ((0,), (3,), (2, 1), (1, 1)):
        with pytest.raises(ValueError):
            model.step_time(bad)
