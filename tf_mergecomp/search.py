"""MergeComp's partition search: pick the grouping from measured step times.

MergeComp (Wang, Wu, Ng, "MergeComp: A Compression Scheduler for Scalable
Communication-Efficient Distributed Training", arXiv 2103.15195) merges the
gradient tensors, in backprop order, into a few contiguous groups and sends
one compressed collective per group. How many groups, and where to cut, trades
per-collective overhead (compression launches, latency) against overlap of
communication with the rest of backprop. The best choice depends on the model,
the codec and the network, so it is found by measuring step times during the
first training steps. This module is that search, free of any framework: it
sees only ``measure(splits) -> seconds`` and the tensor sizes.

Layouts
  N tensors in backprop order; a layout is a sorted tuple of split indices in
  (0, N): ``()`` is one group, ``(1, ..., N-1)`` is layer-wise, ``(s,)`` puts
  tensors [0, s) in the first group and [s, N) in the second.

Algorithm
  1. Sentinels: measure one group ``()`` and layer-wise ``(1, ..., N-1)``.
  2. Two groups: a discrete golden-section search for the split s in (0, N),
     assuming step time is roughly unimodal in s. Probes are placed on a
     coordinate that is mostly cumulative bytes (``byte_weight`` of it, the
     rest the tensor index, which keeps every step shrinking the bracket by
     tensors too), so the cut lands between the tensors that carry the bytes.
     When the two probes compare within ``close_call`` (relative), both are
     measured again (once per point at most ``max_repeats`` times) and their
     means compared. With at most ``exhaustive_below`` tensors left in the
     bracket, every remaining split is measured.
  3. y + 1 groups from the best y-group layout L. In a pipelined step the time
     is set by the slowest stage, so adding one cut while the others stay put
     seldom helps: they must move together. Two one-parameter families move
     every cut: "a new group in front" (a new first cut t, and L squeezed on
     the axis into [t, N)) and "a new group at the back" (L squeezed into
     [0, t), then t). Each gets one scout probe at a self-similar guess; the
     better family is golden-section searched over t (seeded with its scout);
     then each cut of the winner is refined alone (probes one sixteenth of
     its free range away on either side, doubling steps while it improves,
     then golden-section search in the bracket found).
  4. Stop when y + 1 groups are not faster than y groups by ``min_improvement``
     (relative), when no group can be split, or at ``max_groups``.
  The result is the fastest layout measured in any stage, sentinels included.
  Every measurement is cached: asking again for a measured layout is free,
  except close-call repeats, which are new measurements averaged into it.

State
  The measurement cache (layout -> list of seconds), the stage, the pending
  proposal, and the log of measurements. ``PartitionSearcher`` is a state
  machine: ``propose()`` returns the next layout to time (``None`` when
  ``done``), ``report(splits, seconds)`` gives its time. It never calls a
  clock itself, so a training loop drives it one candidate at a time and all
  workers stay in lockstep when they report the same (averaged) times.

Cost (in candidate measurements, M)
  With G = ``max_groups`` and B = ``max_measurements_per_stage`` (default
  ceil(2 * log2(N)) + 6, a hard cap per group count), M <= 2 + (G - 1) * B.
  The two-group stage takes about log_phi(N / exhaustive_below) + 2
  measurements (phi = 1.618) plus close-call repeats (at most
  ``max_repeats_per_stage``); later stages add 2 scouts and the refinement.
  A measurement of k steps (``steps_per_candidate``) costs k + 1 training steps
  when the layout changes (the first step after the change re-traces and is
  discarded) and k when it repeats the layout already in place, so the search
  costs at most M * (k + 1) steps, plus the first step of training.
  Example: ResNet50 has N = 214 gradient tensors, B = ceil(15.48) + 6 = 22.
  With G = 4: M <= 2 + 3 * 22 = 68, i.e. at most 408 steps at k = 5. On the
  synthetic pipeline model of ResNet50's sizes in tests/test_search.py the
  search took M = 49 (2 + 12 + 13 + 22; 292 steps at k = 5) without noise and
  M = 57 (340 steps) with 3% noise; with G = 3, M = 27 to 35 (162 to 208 steps).
  Every measured layout change also costs one re-trace of the train function.

Measuring one candidate
  ``robust_seconds(step_times)`` is the median of the step times after the
  discarded re-trace step; the callback (tf_mergecomp/callback.py) and the
  custom-loop driver (tf_mergecomp/search_driver.py) use it and average it
  over workers before reporting, so every worker takes the same decisions.
"""

import bisect
import math
import numbers

from tf_mergecomp.grouping import layerwise_splits

GOLDEN_FRACTION = (3.0 - math.sqrt(5.0)) / 2.0  # 0.381966...: the golden-section probe


def robust_seconds(step_seconds):
    """Median of a candidate's step times (the re-trace step already removed)."""
    values = sorted(float(s) for s in step_seconds)
    if not values:
        raise ValueError("no step times to summarize")
    middle = len(values) // 2
    if len(values) % 2:
        return values[middle]
    return 0.5 * (values[middle - 1] + values[middle])


class _StageBudgetExhausted(Exception):
    pass


class PartitionSearcher:
    """Step-by-step search for the fastest partition of N gradient tensors.

    Args:
      sizes: element counts (or bytes) of the N tensors in backprop order.
      max_groups: the most groups a candidate may have (>= 1).
      min_improvement: relative gain y + 1 groups must show over y groups to
        go on to y + 2.
      close_call: relative difference below which two golden-section probes
        are measured again before one side of the bracket is dropped.
      max_repeats: the most times one layout is measured by close-call repeats
        (its first measurement included).
      max_measurements_per_stage: hard cap on measurements per group count
        (default ceil(2 * log2(N)) + 4); a stage that reaches it ends with the
        best layout it measured.
      exhaustive_below: with at most this many candidate cuts left in a
        bracket, all of them are measured.
      byte_weight: weight of cumulative bytes (vs. tensor index) in the axis on
        which probes are placed, in [0, 1].
    """

    def __init__(
        self,
        sizes,
        max_groups=4,
        min_improvement=0.02,
        close_call=0.02,
        max_repeats=2,
        max_repeats_per_stage=4,
        max_measurements_per_stage=None,
        exhaustive_below=3,
        byte_weight=0.75,
    ):
        sizes = list(sizes)
        if not sizes:
            raise ValueError("sizes must list at least one tensor size")
        for size in sizes:
            if isinstance(size, bool) or not isinstance(size, numbers.Real) or size < 0:
                raise ValueError("sizes must be non-negative numbers, got %r" % (size,))
        _check_int("max_groups", max_groups, 1)
        _check_fraction("min_improvement", min_improvement)
        _check_fraction("close_call", close_call)
        _check_int("max_repeats", max_repeats, 1)
        _check_int("max_repeats_per_stage", max_repeats_per_stage, 0)
        _check_int("exhaustive_below", exhaustive_below, 1)
        _check_fraction("byte_weight", byte_weight)
        n = len(sizes)
        if max_measurements_per_stage is None:
            max_measurements_per_stage = int(math.ceil(2.0 * math.log2(max(n, 2)))) + 6
        _check_int("max_measurements_per_stage", max_measurements_per_stage, 2)

        self.sizes = sizes
        self.num_tensors = n
        self.max_groups = max_groups
        self.min_improvement = float(min_improvement)
        self.close_call = float(close_call)
        self.max_repeats = max_repeats
        self.max_repeats_per_stage = max_repeats_per_stage
        self.max_measurements_per_stage = max_measurements_per_stage
        self.exhaustive_below = exhaustive_below
        self.byte_weight = float(byte_weight)

        cumulative = [0.0]
        for size in sizes:
            cumulative.append(cumulative[-1] + float(size))
        total = cumulative[-1]
        self._axis = [
            self.byte_weight * (c / total if total > 0 else i / n) + (1.0 - self.byte_weight) * i / n
            for i, c in enumerate(cumulative)
        ]

        self._samples = {}  # layout -> [seconds, ...]
        self.measurements = []  # [(stage, layout, seconds)] in the order measured
        self.stage = None  # group count being searched; "sentinels" first
        self.stage_best = {}  # group count -> best layout of that stage
        self._stage_counts = {}
        self._stage_repeats = {}
        self._pending = None
        self._plan = self._run()
        self.done = False
        self._advance()

    # ----------------------------------------------------------------- driving
    def propose(self):
        """The layout to measure next (a tuple of splits), or None when done."""
        return self._pending

    def report(self, splits, seconds):
        """Gives the measured time of the layout ``propose()`` returned."""
        splits = tuple(int(s) for s in splits)
        if self._pending is None:
            raise ValueError("no measurement is pending (the search is done)")
        if splits != self._pending:
            raise ValueError("reported %r but the pending proposal is %r" % (splits, self._pending))
        seconds = float(seconds)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError("seconds must be a finite non-negative number, got %r" % (seconds,))
        self._samples.setdefault(splits, []).append(seconds)
        self.measurements.append((self.stage, splits, seconds))
        self._stage_counts[self.stage] = self._stage_counts.get(self.stage, 0) + 1
        self._pending = None
        self._advance()

    @property
    def best(self):
        """The fastest layout measured so far (None before any measurement)."""
        if not self._samples:
            return None
        return min(self._samples, key=lambda layout: (self.estimate(layout), len(layout)))

    @property
    def best_seconds(self):
        best = self.best
        return None if best is None else self.estimate(best)

    def estimate(self, splits):
        """Mean measured seconds of a layout, or None if never measured."""
        samples = self._samples.get(tuple(splits))
        return None if not samples else sum(samples) / len(samples)

    def measured_layouts(self):
        """{layout: mean seconds} of every layout measured."""
        return {layout: self.estimate(layout) for layout in self._samples}

    def measurements_per_stage(self):
        """{stage: number of measurements}; stages are "sentinels", 2, 3, ..."""
        return dict(self._stage_counts)

    # ---------------------------------------------------------------- the plan
    def _advance(self):
        try:
            self._pending = next(self._plan)
        except StopIteration:
            self._pending = None
            self.done = True

    def _measure(self, layout, repeat=False):
        """Generator: measures ``layout`` unless cached (or repeat=True); returns its mean."""
        if layout in self._samples and not repeat:
            return self.estimate(layout)
        if self.stage != "sentinels" and self._stage_counts.get(self.stage, 0) >= self.max_measurements_per_stage:
            raise _StageBudgetExhausted()
        yield layout
        return self.estimate(layout)

    def _run(self):
        n = self.num_tensors
        self.stage = "sentinels"
        yield from self._measure(())
        if n == 1 or self.max_groups == 1:
            return
        yield from self._measure(layerwise_splits(n))
        previous = ()
        for groups in range(2, min(self.max_groups, n) + 1):
            self.stage = groups
            self._stage_counts.setdefault(groups, 0)
            stage_layouts = []
            try:
                yield from self._add_one_split(previous, stage_layouts)
            except _StageBudgetExhausted:
                pass
            stage_layouts = [layout for layout in stage_layouts if layout in self._samples]
            if not stage_layouts:
                return
            best = min(stage_layouts, key=self.estimate)
            self.stage_best[groups] = best
            if self.estimate(best) > self.estimate(previous) * (1.0 - self.min_improvement):
                return
            previous = best

    def _add_one_split(self, parent, stage_layouts):
        """Generator: searches the best layout with one group more than ``parent``.

        Adding a cut while the old ones stay put rarely helps on its own: in a
        pipelined step, the time is set by the slowest stage, so the old cuts
        have to move too. The search therefore runs along two one-parameter
        families that move every cut: a new group in front (the parent's
        layout squeezed, on the axis, into what follows the new first cut t),
        and a new group at the back (the parent squeezed before a new last cut
        t). One scout per family picks the family, a golden-section search
        finds t, and the cuts are then refined one at a time.
        """
        n = self.num_tensors
        if not parent:
            yield from self._line_search(lambda cut: (cut,), 0, n, None, stage_layouts)
            return
        count = len(parent)
        total = self._axis[n]
        parent_positions = [self._axis[c] / total for c in parent]

        def in_front(cut):
            start = self._axis[cut]
            targets = [start + z * (total - start) for z in parent_positions]
            return self._fit((cut,), targets, cut + 1, n - 1, after=True)

        def at_back(cut):
            end = self._axis[cut]
            targets = [z * end for z in parent_positions]
            return self._fit((cut,), targets, 1, cut - 1, after=False)

        first, last = parent_positions[0], parent_positions[-1]
        families = []
        if n - count > 1:  # room for t in (0, n - count)
            scout = self._place(0, n - count, 0.0, first * first * total)
            families.append((in_front, 0, n - count, scout))
        if n - count > 1:  # room for t in (count, n)
            scout = self._place(count, n, 0.0, (1.0 - (1.0 - last) ** 2) * total)
            families.append((at_back, count, n, scout))
        scouted = []
        for layout_of, lo, hi, scout in families:
            seconds = yield from self._value(layout_of(scout), stage_layouts)
            scouted.append((seconds, len(scouted), layout_of, lo, hi, scout))
        if not scouted:
            return
        _, _, layout_of, lo, hi, scout = min(scouted, key=lambda entry: entry[:2])
        yield from self._line_search(layout_of, lo, hi, scout, stage_layouts)
        best = min(stage_layouts, key=self.estimate)
        for position in range(len(best)):
            # A refined cut stays between its neighbours, so positions hold.
            best = yield from self._refine(best, best[position], stage_layouts)

    def _fit(self, fixed, targets, low, high, after):
        """Cuts nearest to the axis ``targets``, made strictly increasing within [low, high]."""
        cuts = []
        for target in targets:
            cut = self._place(low - 1, high + 1, 0.0, target)
            cuts.append(min(max(cut, low), high))
        for i in range(1, len(cuts)):
            cuts[i] = max(cuts[i], cuts[i - 1] + 1)
        if cuts and cuts[-1] > high:
            cuts[-1] = high
            for i in range(len(cuts) - 2, -1, -1):
                cuts[i] = min(cuts[i], cuts[i + 1] - 1)
        return tuple(fixed) + tuple(cuts) if after else tuple(cuts) + tuple(fixed)

    def _refine(self, layout, cut, stage_layouts):
        """Generator: moves one cut of ``layout`` to a local optimum; returns the new layout."""
        others = tuple(c for c in layout if c != cut)
        position = layout.index(cut)
        lo = layout[position - 1] if position > 0 else 0
        hi = layout[position + 1] if position + 1 < len(layout) else self.num_tensors
        if hi - lo <= 2:
            return layout

        def layout_of(c):
            return _with_cut(others, c)

        current = yield from self._value(layout, stage_layouts)
        step = (self._axis[hi] - self._axis[lo]) / 16.0
        neighbours = []
        for direction in (1, -1):
            probe = self._step(cut, direction, step, lo, hi)
            if probe is not None:
                neighbours.append(((yield from self._value(layout_of(probe), stage_layouts)), direction, probe))
        improving = [entry for entry in neighbours if entry[0] < current]
        if improving:
            seconds, direction, at = min(improving)
            behind = cut
            while True:
                step *= 2.0
                ahead = self._step(at, direction, step, lo, hi)
                if ahead is None:
                    ahead = hi if direction > 0 else lo
                    break
                ahead_seconds = yield from self._value(layout_of(ahead), stage_layouts)
                if ahead_seconds >= seconds:
                    break
                behind, at, seconds = at, ahead, ahead_seconds
            left, right = sorted((behind, ahead))
            yield from self._line_search(layout_of, left, right, at, stage_layouts)
        return min((l for l in stage_layouts if set(others) <= set(l) and len(l) == len(layout)),
                   key=self.estimate)

    def _value(self, layout, stage_layouts, repeat=False):
        """Generator: the mean time of a layout of this stage, measuring it if needed."""
        seconds = yield from self._measure(layout, repeat=repeat)
        stage_layouts.append(layout)
        return seconds

    def _line_search(self, layout_of, lo, hi, seed, stage_layouts):
        """Generator: golden-section search of one cut in the open range (lo, hi).

        ``seed``, when given, is a cut in (lo, hi) to start from (already measured).
        """

        def value(cut, repeat=False):
            return (yield from self._value(layout_of(cut), stage_layouts, repeat=repeat))

        a, b = lo, hi
        if b - a - 1 > self.exhaustive_below:
            first = seed if seed is not None else self._place(a, b, GOLDEN_FRACTION)
            x1, x2 = sorted((first, self._partner(a, b, first)))
            while True:
                f1 = yield from value(x1)
                f2 = yield from value(x2)
                if self._is_close(f1, f2) and self._repeats_left() >= 2:
                    # The later-measured probe first: it is usually still in place.
                    for cut in (x2, x1):
                        if len(self._samples[layout_of(cut)]) < self.max_repeats:
                            self._stage_repeats[self.stage] = self._stage_repeats.get(self.stage, 0) + 1
                            yield from value(cut, repeat=True)
                    f1 = self.estimate(layout_of(x1))
                    f2 = self.estimate(layout_of(x2))
                if f1 <= f2:
                    b, kept = x2, x1
                else:
                    a, kept = x1, x2
                if b - a - 1 <= self.exhaustive_below:
                    break
                x1, x2 = sorted((kept, self._partner(a, b, kept)))
        for cut in range(a + 1, b):
            yield from value(cut)

    def _repeats_left(self):
        return self.max_repeats_per_stage - self._stage_repeats.get(self.stage, 0)

    def _is_close(self, f1, f2):
        return abs(f1 - f2) <= self.close_call * min(f1, f2)

    def _partner(self, lo, hi, kept):
        """The second golden-section probe in (lo, hi): on the wider side of ``kept``."""
        middle = 0.5 * (self._axis[lo] + self._axis[hi])
        fraction = 1.0 - GOLDEN_FRACTION if self._axis[kept] <= middle else GOLDEN_FRACTION
        cut = self._place(lo, hi, fraction)
        if cut == kept:
            cut = kept + 1 if hi - kept > kept - lo else kept - 1
        return cut

    def _step(self, cut, direction, distance, lo, hi):
        """The cut about ``distance`` along the axis from ``cut`` (at least one tensor), or None."""
        target = self._axis[cut] + direction * distance
        if direction > 0:
            if cut + 1 >= hi:
                return None
            return max(cut + 1, self._place(cut, hi, 0.0, target))
        if cut - 1 <= lo:
            return None
        return min(cut - 1, self._place(lo, cut, 0.0, target))

    def _place(self, lo, hi, fraction, target=None):
        """The cut in (lo, hi) nearest to ``fraction`` of the way along the axis (or to ``target``)."""
        if target is None:
            target = self._axis[lo] + fraction * (self._axis[hi] - self._axis[lo])
        right = bisect.bisect_left(self._axis, target, lo + 1, hi)
        best = None
        for cut in (right - 1, right):
            if lo < cut < hi and (
                best is None or abs(self._axis[cut] - target) < abs(self._axis[best] - target)
            ):
                best = cut
        return best if best is not None else (lo + hi) // 2


def _with_cut(parent, cut):
    return tuple(sorted(set(parent) | {cut}))


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError("%s must be an integer >= %d, got %r" % (name, minimum, value))


def _check_fraction(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
        raise ValueError("%s must be a number in [0, 1], got %r" % (name, value))


class SearchResult:
    """What ``search`` returns: the best layout, its time, and every measurement."""

    def __init__(self, searcher):
        self.splits = searcher.best
        self.seconds = searcher.best_seconds
        self.num_groups = len(self.splits) + 1
        self.measurements = list(searcher.measurements)
        self.per_stage = searcher.measurements_per_stage()
        self.stage_best = dict(searcher.stage_best)

    def __repr__(self):
        return "SearchResult(splits=%r, seconds=%.6g, measurements=%d)" % (
            self.splits,
            self.seconds,
            len(self.measurements),
        )


def search(measure, sizes, **options):
    """Runs the whole search with ``measure(splits) -> seconds``; returns a SearchResult.

    ``options`` are PartitionSearcher's keyword arguments.
    """
    searcher = PartitionSearcher(sizes, **options)
    while not searcher.done:
        splits = searcher.propose()
        searcher.report(splits, measure(splits))
    return SearchResult(searcher)
