"""The fastest layouts of one group count under a step-time model, and the
fastest codec assignment of a layout: how the partition search ranks candidates
before it times any (tf_mergecomp/search/algorithm.py)."""

import itertools
import math

import numpy as np

from tf_mergecomp.search import step_model

# On a grid, the best this many layouts are refined cut by cut.
REFINED_SEEDS = 8
# Codec assignments of one layout evaluated exhaustively up to this many (best_assignment).
ASSIGNMENTS_LIMIT = 4096
ASSIGNMENT_SWEEPS = 3


def best_layouts(model, groups, count=4, exhaustive_limit=20_000, sizes=None):
    """The ``count`` fastest layouts of exactly ``groups`` groups under ``model``:
    [(layout, seconds)] fastest first. All layouts are evaluated when there are
    at most ``exhaustive_limit``; otherwise a grid of cut positions (half at
    equal steps of cumulative size, half of tensor index) is evaluated and the
    best grid layouts are refined one cut at a time over every position
    between their neighbours until no cut moves. ``sizes`` (the tensors'
    element counts) place the grid; without them it is by index alone."""
    n = model.num_tensors
    if groups == 1:
        return [((), model.step_time(()))]
    if groups > n:
        return []
    cuts = groups - 1
    if math.comb(n - 1, cuts) <= exhaustive_limit:
        layouts = step_model.layouts_with_groups(n, groups)
        return _top(layouts, model.step_times(layouts), count)
    grid = _grid_positions(n, cuts, exhaustive_limit, sizes)
    layouts = step_model.layouts_with_groups(n, groups, grid)
    ranked = dict(_top(layouts, model.step_times(layouts), count))
    for layout, seconds in list(ranked.items())[:REFINED_SEEDS]:
        layout, seconds = _refine_cuts(model, layout, seconds)
        ranked[layout] = seconds
    return sorted(ranked.items(), key=lambda item: (item[1], item[0]))[:count]


def _grid_positions(n, cuts, limit, sizes):
    """Cut positions, as many as keep the grid's layouts within ``limit``."""
    points = cuts
    while points + 1 < n and math.comb(points + 1, cuts) <= limit:
        points += 1
    by_index = np.linspace(0, n, points + 2)[1:-1]
    if sizes is None:
        positions = by_index.round().astype(np.int64)
    else:
        cumulative = np.concatenate([[0.0], np.cumsum(np.asarray(sizes, dtype=np.float64))])
        half = points // 2
        by_size = np.searchsorted(cumulative, np.linspace(0, cumulative[-1], half + 2)[1:-1])
        by_index = np.linspace(0, n, points - half + 2)[1:-1].round().astype(np.int64)
        positions = np.concatenate([by_size, by_index])
    positions = np.unique(positions)
    return positions[(positions > 0) & (positions < n)]


def _refine_cuts(model, layout, seconds):
    n = model.num_tensors
    layout = list(layout)
    for _ in range(8):
        moved = False
        for index in range(len(layout)):
            lo = layout[index - 1] + 1 if index else 1
            hi = layout[index + 1] - 1 if index + 1 < len(layout) else n - 1
            options = np.arange(lo, hi + 1)
            trial = np.repeat(np.asarray([layout]), len(options), axis=0)
            trial[:, index] = options
            times = model.step_times(trial)
            best = int(np.argmin(times))
            if times[best] < seconds - 1e-15:
                layout[index], seconds, moved = int(options[best]), float(times[best]), True
        if not moved:
            break
    return tuple(layout), seconds


def _top(layouts, times, count):
    order = np.lexsort((np.arange(len(times)), times))[:count]
    return [(tuple(int(c) for c in layouts[i]), float(times[i])) for i in order]


def best_assignment(layout, costs_by_codec, model_of, cheapest):
    """(codec index per group, predicted seconds) of ``layout``'s fastest codec
    assignment; fewer codecs other than the first on a tie.

    ``costs_by_codec``: one cost function per codec; ``model_of(costs)``: the
    StepTimeModel of an ``AssignedCodecCosts``; ``cheapest()``: each group's
    cheapest codec on its own (asked only past the limit). Up to
    ``ASSIGNMENTS_LIMIT`` assignments, every one is evaluated; past it, from the
    best of ``cheapest`` and of each codec everywhere, one group at a time tries
    every codec, for at most ``ASSIGNMENT_SWEEPS`` sweeps or until none gains.
    """
    groups = len(layout) + 1
    codecs = len(costs_by_codec)
    splits = np.asarray([layout], dtype=np.int64).reshape(1, -1)

    def times_of(assignments):
        costs = step_model.AssignedCodecCosts(costs_by_codec, assignments)
        return model_of(costs).step_times(np.repeat(splits, len(assignments), axis=0))

    if codecs ** groups <= ASSIGNMENTS_LIMIT:
        assignments = np.array(list(itertools.product(range(codecs), repeat=groups)),
                               dtype=np.int64).reshape(-1, groups)
        times = times_of(assignments)
    else:
        starts = np.vstack([np.asarray(cheapest(), dtype=np.int64)[None],
                            np.repeat(np.arange(codecs)[:, None], groups, axis=1)])
        times = times_of(starts)
        current, best = starts[int(np.argmin(times))], float(times.min())
        for _ in range(ASSIGNMENT_SWEEPS):
            improved = False
            for group in range(groups):
                trial = np.repeat(current[None], codecs, axis=0)
                trial[:, group] = np.arange(codecs)
                times = times_of(trial)
                if times.min() < best - 1e-15:
                    current, best = trial[int(np.argmin(times))], float(times.min())
                    improved = True
            if not improved:
                break
        assignments, times = current[None], np.array([best])
    order = np.lexsort(((assignments != 0).sum(axis=1), times))
    return assignments[order[0]], float(times[order[0]])
