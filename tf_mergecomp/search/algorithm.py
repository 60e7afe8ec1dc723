"""MergeComp's partition search: explore with a step-time model, then confirm with real steps.

Explore: profile one group's steps, probe single groups of a few balanced layouts, fit
each part's costs and predict every layout with tf_mergecomp/search/step_model.py; after
probing the best layouts' groups too, the best predicted layouts of 2 to ``max_groups``
groups become the finalists. Confirm: the finalists and the sentinels (one group,
layer-wise; with ``plain_horovod`` also ``PLAIN_HOROVOD``) are timed in interleaved rounds,
each as a ratio to one group's time in the same round; clear losers are dropped, and the
leader replaces one group only if its gain is resolved (``standard_errors``). With
``codecs``, each group of a layout takes the codec the model predicts fastest; with
``fusion``, the layout Horovod's tensor fusion makes may replace the weakest finalist.
docs/search.md describes each step and its cost.

The algorithm is framework-free and driven by requests (tf_mergecomp/search/requests.py):
``start()`` returns the first request, ``answer(value)`` the next (None when done):

  ``Profile(splits)``  train with this layout, profile ``profiled_steps``
                       steps; answer a ``ProfileResult``.
  ``Probe(layouts)``   time every group of these layouts alone (with
                       ``codec``, None: the compressor); answer a [groups, 3]
                       array of encode, collective, decode seconds per layout.
  ``Warm(layouts)``    train with each layout in turn, untimed; answer None.
  ``Time(splits)``     one confirm round of this candidate: train with it
                       and answer its seconds per step.

Every worker must answer the same values (averaged over workers). The driver
(tf_mergecomp/search/driver.py) answers them from a training loop, ``run_search``
(tf_mergecomp/search/run.py) from plain functions. A layout is a sorted tuple of split
indices in (0, N) over the N tensors in backprop order: ``()`` is one group.
"""

import math
import numbers

import numpy as np

from tf_mergecomp.search import step_model, summary
from tf_mergecomp.search.summary import REFERENCE, mean_log_ratio, short
from tf_mergecomp.search.candidates import best_assignment, best_layouts
from tf_mergecomp.search.step_model import fill_ready
from tf_mergecomp.search.requests import PLAIN_HOROVOD, Probe, Profile, Time, Warm
from tf_mergecomp._validation import check_int
from tf_mergecomp.grouping import balanced_splits, check_fusion, fusion_splits, layerwise_splits


# Extra finalists of one group count cut at least this far from each other
# (see PartitionSearchAlgorithm._distance), when the predictions allow.
FINALIST_SPACING = 0.03
# Layouts ranked per group count, from which the finalists are chosen.
RANKED_PER_GROUP_COUNT = 16


class PartitionSearchAlgorithm:
    """The search of the module docstring, one request at a time.

    Args:
      sizes: element counts of the N gradient tensors in backprop order.
      max_groups: the most groups a finalist may have (>= 1).
      finalists: how many predicted layouts are confirmed beside the sentinels.
      rounds: confirm rounds.
      codec_on_compute, decodes_after_backprop: where the codec runs, for the
        step-time model (see tf_mergecomp/search/step_model.py).
      exhaustive_limit: evaluate every layout of a group count when there are
        at most this many, else search a grid and refine.
      refinements: how many times the finalists' groups are probed and the
        prediction repeated.
      resolve_rounds: the most extra rounds (the leader and one group only)
        while the leader's gain over one group is unresolved.
      standard_errors: how many standard errors of the mean per-round log
        ratio a leader's gain over one group must exceed.
      codecs: None (every group with the compressor), or the codec names a
        group may use, the compressor's first (module docstring).
      plain_horovod: confirm plain Horovod as a third sentinel.
      fusion: None, or Horovod's (cycle seconds, fusion buffer bytes): the model
        waits for the cycle, and with ``codecs`` the fusion layout may be a
        finalist (module docstring).
    """

    def __init__(self, sizes, max_groups=4, finalists=3, rounds=4, codec_on_compute=True,
                 decodes_after_backprop=False, exhaustive_limit=20_000, refinements=2,
                 resolve_rounds=4, standard_errors=2.0, codecs=None, plain_horovod=False,
                 fusion=None):
        sizes = list(sizes)
        if not sizes:
            raise ValueError("sizes must list at least one tensor size")
        for size in sizes:
            if isinstance(size, bool) or not isinstance(size, numbers.Real) or size < 0:
                raise ValueError("sizes must be non-negative numbers, got %r" % (size,))
        check_int("max_groups", max_groups, 1)
        check_int("finalists", finalists, 0)
        check_int("rounds", rounds, 1)
        check_int("exhaustive_limit", exhaustive_limit, 1)
        check_int("refinements", refinements, 0)
        check_int("resolve_rounds", resolve_rounds, 0)
        if isinstance(standard_errors, bool) or not isinstance(standard_errors, numbers.Real) \
                or not 0 <= standard_errors < math.inf:
            raise ValueError("standard_errors must be a finite number >= 0, got %r"
                             % (standard_errors,))
        self.sizes = sizes
        self.num_tensors = len(sizes)
        self.max_groups = min(max_groups, self.num_tensors)
        self.finalists = finalists
        self.rounds = rounds
        self.codec_on_compute = bool(codec_on_compute)
        self.decodes_after_backprop = bool(decodes_after_backprop)
        self.exhaustive_limit = exhaustive_limit
        self.refinements = refinements
        self.resolve_rounds = resolve_rounds
        self.standard_errors = float(standard_errors)
        if codecs is not None:
            codecs = tuple(codecs)
            if (not codecs or len(set(codecs)) != len(codecs)
                    or not all(isinstance(c, str) and c for c in codecs)):
                raise ValueError("codecs must be distinct codec names, the compressor's first, "
                                 "got %r" % (codecs,))
        self.codecs = codecs
        if plain_horovod not in (True, False, 0, 1):
            raise ValueError("plain_horovod must be True or False, got %r" % (plain_horovod,))
        self.plain_horovod = bool(plain_horovod)
        self.fusion = None if fusion is None else check_fusion(fusion)
        self.fusion_layout = None  # the fusion layout, once the ready times are known

        self.phase = None  # "explore", "confirm", "done"
        self.profile = None  # ProfileResult of one group
        self.ready = None  # the ready times the model used
        # codec (None without codecs) -> {(lo, hi) -> [encode, collective, decode] seconds}
        self.probed_by_codec = {codec: {} for codec in self._codec_keys()}
        self.probed = self.probed_by_codec[self._codec_keys()[0]]  # the compressor's
        self.layout_codecs = {}  # layout -> codec per group, where codecs are searched
        self._costs_by_codec = None
        self.model = None  # the final StepTimeModel
        self.predictions = {}  # layout -> predicted seconds (every layout ranked)
        self.finalist_layouts = []
        self.candidates = []  # confirmed layouts: sentinels first
        self.rounds_measured = []  # per round: {layout: seconds}
        self.dropped = {}  # layout -> round after which it was dropped
        self.leader = None  # the fastest candidate of the confirm rounds
        self.extra_rounds = 0  # rounds run to resolve the leader's gain
        self.choice = None
        self.notes = []
        self._plan = None
        self._pending = None
        self._axis = None

    # ------------------------------------------------------------------ driving
    def start(self):
        if self._plan is not None:
            raise RuntimeError("the search has started already")
        self._plan = self._run()
        return self._advance(None)

    def answer(self, value):
        if self._pending is None:
            raise RuntimeError("no request is pending (the search is done)")
        return self._advance(value)

    @property
    def pending(self):
        return self._pending

    @property
    def done(self):
        return self.phase == "done"

    def _advance(self, value):
        try:
            self._pending = self._plan.send(value) if self._pending is not None else next(self._plan)
        except StopIteration:
            self._pending = None
            self.phase = "done"
        return self._pending

    # ------------------------------------------------------------------ results
    @property
    def sentinels(self):
        n = self.num_tensors
        sentinels = [()] if n == 1 or self.max_groups == 1 else [(), layerwise_splits(n)]
        return sentinels + ([PLAIN_HOROVOD] if self.plain_horovod else [])

    def codecs_of(self, layout):
        """The codec of each group of ``layout`` (a tuple of names), None where
        every group uses the compressor, or for ``PLAIN_HOROVOD``."""
        if isinstance(layout, str):
            return None
        return self.layout_codecs.get(tuple(layout))

    def _codec_keys(self):
        return [None] if self.codecs is None else list(self.codecs)

    def measured_seconds(self):
        """{layout: median seconds over its confirm rounds}."""
        values = {}
        for measured in self.rounds_measured:
            for layout, seconds in measured.items():
                values.setdefault(layout, []).append(seconds)
        return {layout: float(np.median(v)) for layout, v in values.items()}

    def relative_seconds(self):
        """{layout: median over its confirm rounds of its time / one group's in that round}:
        what the choice is made on."""
        values = {}
        for measured in self.rounds_measured:
            for layout, ratio in summary.relative_to_reference(measured).items():
                values.setdefault(layout, []).append(ratio)
        return {layout: float(np.median(v)) for layout, v in values.items()}

    def gain_over_reference(self, layout):
        """``mean_log_ratio`` of ``layout``'s per-round times to one group's.
        Resolved faster than one group when the sum of the two is below zero."""
        return mean_log_ratio(self.relative_rounds_of(layout), self.standard_errors)

    def resolved_choice(self, layout):
        """``layout`` if its gain over one group is resolved, else one group."""
        if layout == REFERENCE:
            return REFERENCE
        mean, half_width = self.gain_over_reference(layout)
        return layout if mean + half_width < 0 else REFERENCE

    def fastest(self, layouts=None):
        """Of ``layouts`` (every candidate timed so far by default), the one with
        the lowest median ratio to one group, the fewer groups on a tie."""
        estimates = self.relative_seconds()
        return min(estimates if layouts is None else layouts,
                   key=lambda l: (estimates[l], len(l)))

    def rounds_of(self, layout):
        return [measured[layout] for measured in self.rounds_measured if layout in measured]

    def relative_rounds_of(self, layout):
        rounds = [summary.relative_to_reference(measured) for measured in self.rounds_measured]
        return [ratios[layout] for ratios in rounds if layout in ratios]

    # --------------------------------------------------------------------- plan
    def _run(self):
        self.phase = "explore"
        if self.max_groups == 1:
            if not self.plain_horovod:
                self.choice = ()
                self.notes.append("one group is the only layout allowed")
                return
            self.notes.append("one group is the only layout allowed: confirmed against "
                              "plain Horovod")
            yield from self._confirm()
            return
        n = self.num_tensors
        profiled = yield Profile(())
        self.profile = profiled
        probe_layouts = _unique([balanced_splits(self.sizes, g)
                                 for g in (1, 2, 4, 8, 16) if g <= n])
        for codec in self._codec_keys():
            yield from self._probe(probe_layouts, codec)
        self._predict()
        for _ in range(self.refinements):
            unmeasured = {}
            for layout in self._best_per_group_count():
                names = self.codecs_of(layout) or (self._codec_keys()[0],) * (len(layout) + 1)
                for group, codec in zip(_groups(layout, n), names):
                    if group not in self.probed_by_codec[codec]:
                        unmeasured.setdefault(codec, [])
                        if layout not in unmeasured[codec]:
                            unmeasured[codec].append(layout)
            if not unmeasured:
                break
            for codec in self._codec_keys():
                if codec in unmeasured:
                    yield from self._probe(unmeasured[codec], codec)
            self._predict()
        self.finalist_layouts = self._choose_finalists()
        yield from self._confirm()

    def _probe(self, layouts, codec=None):
        results = yield Probe(layouts, codec)
        if len(results) != len(layouts):
            raise ValueError("a probe answer must hold one array per layout")
        for layout, seconds in zip(layouts, results):
            seconds = np.array(seconds, dtype=np.float64).reshape(-1, 3)
            groups = _groups(layout, self.num_tensors)
            if len(seconds) != len(groups):
                raise ValueError("layout %r has %d groups but %d were timed"
                                 % (layout, len(groups), len(seconds)))
            if self.fusion is not None:
                # Each probed collective, timed alone, waited about one whole cycle
                # for Horovod's next pass; the model adds the cycle's ticks itself.
                seconds[:, 1] = np.maximum(0.0, seconds[:, 1] - self.fusion[0])
            for group, parts in zip(groups, seconds):
                self.probed_by_codec[codec][group] = parts

    def _predict(self):
        costs_by_codec = []
        for codec in self._codec_keys():
            probed = self.probed_by_codec[codec]
            groups = sorted(probed)
            fitted = step_model.LinearGroupCosts.fit(self.sizes, groups,
                                                     [probed[g] for g in groups])
            costs_by_codec.append(step_model.MeasuredGroupCosts(fitted, probed))
        self._costs_by_codec = costs_by_codec
        self.ready = fill_ready(self.profile.ready, self.sizes)
        compressor_model = self._model(costs_by_codec[0], 0.0)
        # The tail (optimizer update, per-step overhead) is what the measured
        # one-group step leaves unexplained; one constant for every layout.
        tail = max(0.0, self.profile.seconds - compressor_model.step_time(()))
        compressor_model.tail = tail
        if len(costs_by_codec) == 1:
            model = compressor_model
        else:
            model = self._model(step_model.CheapestCodecCosts(costs_by_codec), tail)
        self.model = model
        self.predictions = {}
        self.layout_codecs = {}
        if self.num_tensors > self.max_groups:
            # The layer-wise sentinel too, for the record (it is confirmed anyway).
            layerwise = layerwise_splits(self.num_tensors)
            self.predictions[layerwise] = compressor_model.step_time(layerwise)
        for groups_count in range(1, self.max_groups + 1):
            for layout, seconds in best_layouts(model, groups_count,
                                                count=RANKED_PER_GROUP_COUNT,
                                                exhaustive_limit=self.exhaustive_limit,
                                                sizes=self.sizes):
                self.predictions[layout] = seconds
        if self.fusion is not None and self.codecs is not None:
            # Horovod's buffer counts bytes; the groups' buffers are float32.
            layout = fusion_splits(self.ready, [4.0 * size for size in self.sizes], *self.fusion)
            if layout:  # one group is the reference: the compressor's
                self.fusion_layout = layout
                self.predictions.setdefault(layout, model.step_time(layout))
        if len(costs_by_codec) > 1:
            sentinels = set(self.sentinels)
            for layout in list(self.predictions):
                if layout in sentinels and layout != self.fusion_layout:
                    # confirmed with the compressor everywhere
                    self.predictions[layout] = compressor_model.step_time(layout)
                    continue
                names, seconds = self._best_assignment(layout, tail)
                self.predictions[layout] = seconds
                if any(name != self.codecs[0] for name in names):
                    self.layout_codecs[layout] = names

    def _model(self, costs, tail):
        # Ticks from the step's start: a steady state's whole cycles would
        # quantise every prediction to the cycle, leaving the ranking to ties.
        cycle_s = 0.0 if self.fusion is None else self.fusion[0]
        return step_model.StepTimeModel(self.ready, costs, tail, self.codec_on_compute,
                                        self.decodes_after_backprop, cycle_s=cycle_s)

    def _best_assignment(self, layout, tail):
        """(codec names per group, predicted seconds) of ``layout``'s fastest
        codec assignment under the model; fewer codec changes on a tie."""
        def cheapest():
            bounds = np.array(_groups(layout, self.num_tensors))
            return self.model.costs.choices(bounds[:, 0], bounds[:, 1])

        chosen, seconds = best_assignment(
            layout, self._costs_by_codec, lambda costs: self._model(costs, tail), cheapest)
        return tuple(self.codecs[i] for i in chosen), seconds

    def _best_per_group_count(self):
        best = {}
        for layout, seconds in self.predictions.items():
            count = len(layout) + 1
            if 2 <= count <= self.max_groups and (count not in best or seconds < best[count][1]):
                best[count] = (layout, seconds)
        return [best[count][0] for count in sorted(best)]

    def _choose_finalists(self):
        """The predicted best of each group count, then the best predicted
        layouts that are not near one already chosen: finalists spread out
        hedge against the model being wrong about where to cut."""
        sentinels = set(self.sentinels)
        ranked = sorted((l for l in self.predictions if l not in sentinels),
                        key=lambda l: (self.predictions[l], len(l)))
        per_count = sorted((l for l in self._best_per_group_count() if l not in sentinels),
                           key=lambda l: self.predictions[l])
        chosen = per_count[:self.finalists]
        for near_limit in (FINALIST_SPACING, 0.0):
            for layout in ranked:
                if len(chosen) >= self.finalists:
                    break
                if layout not in chosen and all(self._distance(layout, other) > near_limit
                                                for other in chosen):
                    chosen.append(layout)
        chosen.sort(key=lambda l: self.predictions[l])
        fusion = self.fusion_layout
        if fusion is not None and fusion not in chosen and fusion not in sentinels \
                and self.finalists:
            # In place of the weakest finalist where predicted faster: no more traces.
            if len(chosen) < self.finalists:
                chosen.append(fusion)
            elif self.predictions[fusion] < self.predictions[chosen[-1]]:
                chosen[-1] = fusion
        return sorted(chosen, key=lambda l: self.predictions[l])

    def _distance(self, a, b):
        """How far apart two layouts cut, on an axis half cumulative size, half
        tensor index (each from 0 to 1); layouts of different group counts are 1 apart."""
        if len(a) != len(b):
            return 1.0
        if self._axis is None:
            cumulative = np.concatenate([[0.0], np.cumsum(np.asarray(self.sizes, dtype=float))])
            total = cumulative[-1] if cumulative[-1] > 0 else 1.0
            index = np.arange(self.num_tensors + 1) / self.num_tensors
            self._axis = 0.5 * cumulative / total + 0.5 * index
        return max((abs(self._axis[x] - self._axis[y]) for x, y in zip(a, b)), default=0.0)

    def _confirm(self):
        self.phase = "confirm"
        self.candidates = list(self.sentinels) + list(self.finalist_layouts)
        active = list(self.candidates)
        yield Warm(active)
        for round_index in range(self.rounds):
            yield from self._time_round(active, round_index)
            if round_index >= 1 and round_index + 1 < self.rounds:
                active = self._drop_clear_losers(active, round_index)
                if active == [REFERENCE]:
                    break
        # Among the candidates still timed only: a dropped one's median covers just the
        # rounds it ran, which is no match for a survivor's over all of them.
        self.leader = self.fastest(active)
        while (self.leader != REFERENCE and self.extra_rounds < self.resolve_rounds
               and self._unresolved(self.leader)):
            yield from self._time_round([REFERENCE, self.leader], len(self.rounds_measured))
            self.extra_rounds += 1
        self.choice = self.resolved_choice(self.leader)
        if self.choice != self.leader:
            mean, half_width = self.gain_over_reference(self.leader)
            self.notes.append(
                "the leader, %s, measured %.3fx one group's step (+-%.1f%% over %d rounds): "
                "not resolved, one group kept" % (
                    short(self.leader, self.num_tensors, self.codecs_of(self.leader),
                          self.fusion_layout), math.exp(mean), 100 * (math.exp(half_width) - 1),
                    len(self.relative_rounds_of(self.leader))))

    def _time_round(self, layouts, round_index):
        measured = {}
        self.rounds_measured.append(measured)
        for layout in _rotated(layouts, round_index):
            seconds = yield Time(layout)
            if not (isinstance(seconds, numbers.Real) and 0 < seconds < math.inf):
                raise ValueError("a confirm turn must answer positive, finite seconds per "
                                 "step, got %r for %r" % (seconds, layout))
            measured[layout] = float(seconds)

    def _unresolved(self, layout):
        """Neither resolved faster nor resolved slower than one group."""
        mean, half_width = self.gain_over_reference(layout)
        return abs(mean) <= half_width

    def _drop_clear_losers(self, active, round_index):
        leader = self.fastest(active)
        leader_worst = max(self.relative_rounds_of(leader))
        kept = []
        for layout in active:
            if (layout not in (leader, REFERENCE)
                    and min(self.relative_rounds_of(layout)) > leader_worst):
                self.dropped[layout] = round_index + 1
            else:
                kept.append(layout)
        return kept

    # --------------------------------------------------------------- reporting
    def summary(self):
        """A JSON-able account of the search (tf_mergecomp/search/summary.py)."""
        return summary.summary(self)


def _groups(layout, n):
    bounds = (0,) + tuple(layout) + (n,)
    return list(zip(bounds[:-1], bounds[1:]))


def _unique(layouts):
    seen = []
    for layout in layouts:
        layout = tuple(layout)
        if layout not in seen:
            seen.append(layout)
    return seen


def _rotated(items, shift):
    if not items:
        return []
    shift %= len(items)
    return items[shift:] + items[:shift]
