"""The step-time model: one training step's time for any partition, from measured parts.

The partition search (tf_mergecomp/search/algorithm.py) and the simulator
(benchmarks/simulate.py) predict with it; it knows nothing of TensorFlow.
An event-level model of one step:

- Backprop releases the N gradients in backprop order; ``ready[i]`` is when
  gradient i is ready, in seconds from the start of the step (forward pass
  included), as measured in a step where nothing else delays backprop.
- A group (tensors [lo, hi)) is encoded when its last gradient is ready and
  the codec stream is free; its collective starts when the encode is done and
  the network is free (collectives run one at a time, in group order, as
  Horovod's background thread runs them); its decode runs when the collective
  is done and the codec stream is free. The codec stream serves encodes and
  decodes first come, first served (by the time they became runnable; a tie
  goes to the decode).
- ``codec_on_compute``: where the codec kernels run. True: on the stream that
  runs backprop (a CPU host, where one thread pool runs every op): a codec
  task runs at the next gradient boundary once it is runnable, ahead of the
  remaining backprop, which it delays by its duration. False: on a stream of
  their own (the group kernels on the host CPU while a GPU runs backprop).
- ``decodes_after_backprop``: no decode starts before backprop, and the
  encodes it released, have ended, as TensorFlow runs a step with one
  inter-op thread: an op made runnable by a collective's completion (on
  Horovod's thread) waits until the executor's thread has run out of other
  runnable ops.
- The step ends ``tail`` seconds (the optimizer update and the framework's
  per-step work) after the later of the last decode and the end of backprop.

Each group's encode, collective and decode seconds come from a cost function
``costs(lo, hi) -> (encode, collective, decode)`` over integer arrays of
group bounds: those of tf_mergecomp/search/group_costs.py, or the simulator's
network and Horovod costs (benchmarks/network_model.py). Horovod's background
cycle, its passes and consecutive steps are ``StepTimeModel``'s options.

Layouts are sorted split tuples as in tf_mergecomp/grouping.py: ``()`` is one
group, ``(1, ..., N - 1)`` layer-wise. ``StepTimeModel.step_times`` evaluates
many layouts of one group count at once with numpy.
"""

import itertools
import math

import numpy as np

from tf_mergecomp.search.group_costs import (  # noqa: F401 (imported from here too)
    AssignedCodecCosts, CheapestCodecCosts, LinearGroupCosts, MeasuredGroupCosts, fit_coefficients)

_INF = np.inf
# Consecutive steps simulated for a steady state; the mean of the last few
# where the ticks never settle.
_STEADY_STEPS = 8
_STEADY_MEAN = 4


class StepTimeModel:
    """Predicts one training step's seconds for a partition (module docstring).

    Args:
      ready: seconds from the step's start at which each of the N gradients
        (backprop order) is ready; made non-decreasing.
      costs: ``costs(lo, hi) -> (encode, collective, decode)`` arrays.
      tail: seconds from the end of the exchange and backprop to the step's end.
      codec_on_compute: whether codec tasks delay backprop (CPU hosts).
      decodes_after_backprop: whether decodes wait for the end of backprop.
      cycle_s: Horovod's cycle time, or 0. With it, a collective is taken up
        by the background thread's first pass that begins after its encode
        ends: at the next multiple of ``cycle_s`` from the step's start, or
        when the thread is done with the last pass's collectives if that is
        later; the collectives of one pass run back to back, so many small
        ones cost one wait, not one each.
      host_cpu: ``host_cpu(lo, hi) -> seconds`` of the CPU work each group's
        collectives do on a CPU host whose cores all run backprop (Gloo's
        copies and sums), or None (other hosts). With codec_on_compute that
        work cannot overlap backprop: a step then takes at least backprop,
        every codec task, all of it, ``host_cpu_per_pass`` for each pass and
        the tail.
      pass_fixed_s: the part of each group's collective cost that one pass of
        Horovod's background thread pays once for all the collectives it takes
        up (its negotiation; Horovod fuses them): with ``cycle_s``, a group
        taken up by the same pass as the group before it does not pay it again.
      host_cpu_per_pass: a pass's CPU work on such a host (see host_cpu).
      steady_state: with ``cycle_s``, the step as one of many consecutive
        ones. Horovod's thread keeps ticking across steps (a tick ``cycle_s``
        after the last one began, or as soon as its collectives are done), so
        the ticks a step sees follow from where the previous step's last pass
        left them, and a step whose passes fit in one cycle takes a whole
        number of cycles. Consecutive steps are simulated until the ticks fall
        where they did one step before; a layout whose steps alternate gets
        their mean. False: ticks at multiples of ``cycle_s`` from the step's
        start (a first step after idling).
    """

    def __init__(self, ready, costs, tail=0.0, codec_on_compute=True,
                 decodes_after_backprop=False, cycle_s=0.0, host_cpu=None,
                 pass_fixed_s=0.0, host_cpu_per_pass=0.0, steady_state=False):
        ready = np.maximum.accumulate(np.maximum(np.asarray(ready, dtype=np.float64), 0.0))
        if ready.ndim != 1 or len(ready) == 0:
            raise ValueError("ready must list at least one gradient's ready time")
        self.ready = ready
        self.num_tensors = len(ready)
        # boundary[k]: when k gradients are done (boundary[0] = 0).
        self.boundary = np.concatenate([[0.0], ready])
        self.costs = costs
        self.tail = float(tail)
        self.codec_on_compute = bool(codec_on_compute)
        self.decodes_after_backprop = bool(decodes_after_backprop)
        if not cycle_s >= 0:
            raise ValueError("cycle_s must be non-negative seconds, got %r" % (cycle_s,))
        self.cycle_s = float(cycle_s)
        for name, value in (("pass_fixed_s", pass_fixed_s),
                            ("host_cpu_per_pass", host_cpu_per_pass)):
            if not value >= 0:
                raise ValueError("%s must be non-negative seconds, got %r" % (name, value))
        self.pass_fixed_s = float(pass_fixed_s)
        self.host_cpu = host_cpu
        self.host_cpu_per_pass = float(host_cpu_per_pass)
        self.steady_state = bool(steady_state)

    # ------------------------------------------------------------------ public
    def step_time(self, splits):
        return float(self.step_times(_one_layout(splits))[0])

    def step_times(self, splits):
        """Seconds per layout for a [B, G - 1] array of layouts with G groups each."""
        splits = np.asarray(splits, dtype=np.int64)
        if splits.ndim != 2:
            raise ValueError("splits must be a [layouts, groups - 1] array")
        return self._simulate(splits)["step"]

    def cycle_phase(self, splits):
        """Where Horovod's ticks fall in this layout's step: at ``k * cycle_s - phase``
        seconds from its start (0 without ``steady_state``)."""
        return float(self._simulate(_one_layout(splits))["phase"][0])

    def timeline(self, splits):
        """{encode, collective, decode: [(start, end)] per group, backprop_end, step} of one layout."""
        events = self._simulate(_one_layout(splits), record=True)
        return {
            "encode": [tuple(map(float, pair)) for pair in events["encode"][0]],
            "collective": [tuple(map(float, pair)) for pair in events["collective"][0]],
            "decode": [tuple(map(float, pair)) for pair in events["decode"][0]],
            "backprop_end": float(events["backprop_end"][0]),
            "step": float(events["step"][0]),
        }

    # --------------------------------------------------------------- simulation
    def _simulate(self, splits, record=False):
        n = self.num_tensors
        layouts, cuts = splits.shape
        groups = cuts + 1
        if cuts and (np.any(splits <= 0) or np.any(splits >= n)
                     or np.any(np.diff(splits, axis=1) <= 0)):
            raise ValueError("splits must be strictly increasing integers in (0, %d)" % n)
        lo = np.concatenate([np.zeros((layouts, 1), np.int64), splits], axis=1)
        hi = np.concatenate([splits, np.full((layouts, 1), n, np.int64)], axis=1)
        encode, collective, decode = (np.broadcast_to(np.asarray(p, dtype=np.float64),
                                                      (layouts, groups))
                                      for p in self.costs(lo, hi))
        # On a CPU host, the work a step cannot overlap, but each pass's own (added per pass).
        busy = None
        if (self.host_cpu is not None or self.host_cpu_per_pass) and self.codec_on_compute:
            cpu = (0.0 if self.host_cpu is None else np.broadcast_to(
                np.asarray(self.host_cpu(lo, hi), dtype=np.float64), (layouts, groups)).sum(axis=1))
            busy = cpu + self.boundary[-1] + encode.sum(axis=1) + decode.sum(axis=1) + self.tail
        parts = (layouts, groups, record, hi, encode, collective, decode, busy)
        if not (self.steady_state and self.cycle_s > 0):
            return self._simulate_step(*parts, np.zeros(layouts), np.zeros(layouts))
        phase = np.zeros(layouts)
        thread_free = np.zeros(layouts)
        steps = []
        for _ in range(_STEADY_STEPS):
            result = self._simulate_step(*parts, phase, thread_free)
            steps.append(result["step"])
            # The thread's first tick after the step's last pass, from the next step's start.
            next_tick = np.maximum(result["last_pass"] + self.cycle_s,
                                   result["thread_free"]) - result["step"]
            next_phase = np.mod(-next_tick, self.cycle_s)
            next_free = np.maximum(next_tick, 0.0)
            settled = ((np.abs(next_phase - phase) < 1e-9) | (np.abs(np.abs(next_phase - phase)
                                                                      - self.cycle_s) < 1e-9))
            settled &= np.abs(next_free - thread_free) < 1e-9
            if settled.all():
                return result
            phase, thread_free = next_phase, next_free
        result["step"] = np.where(settled, steps[-1], np.mean(steps[-_STEADY_MEAN:], axis=0))
        return result

    def _simulate_step(self, layouts, groups, record, hi, encode, collective, decode, busy,
                       phase, thread_free):
        """One step whose Horovod ticks fall at ``k * cycle_s - phase`` and not before
        ``thread_free`` (seconds from the step's start, per layout)."""
        rows = np.arange(layouts)
        state = _State(layouts, groups, record, self.cycle_s, self.pass_fixed_s, phase,
                       thread_free)
        if self.codec_on_compute:
            self._run_on_compute(state, rows, hi, encode, collective, decode)
        else:
            self._run_on_own_stream(state, rows, hi, encode, collective, decode)
        step = state.step + self.tail
        if busy is not None:
            step = np.maximum(step, busy + self.host_cpu_per_pass * state.passes)
        result = {"step": step, "backprop_end": state.backprop_end, "passes": state.passes,
                  "last_pass": state.last_pass, "thread_free": state.network_free,
                  "phase": phase}
        if record:
            result.update(encode=state.encode_span, collective=state.collective_span,
                          decode=state.decode_span)
        return result

    def _run_on_own_stream(self, s, rows, hi, encode, collective, decode):
        boundary = self.boundary
        groups = hi.shape[1]
        clock = np.zeros(len(rows))  # the codec stream's
        for _ in range(2 * groups):
            e = np.minimum(s.next_encode, groups - 1)
            d = np.minimum(s.next_decode, groups - 1)
            encode_release = np.where(s.next_encode < groups, boundary[hi[rows, e]], _INF)
            decode_release = np.where(s.next_decode < s.next_encode,
                                      s.collective_end[rows, d], _INF)
            if self.decodes_after_backprop:
                # After backprop, and after the encode its last gradient released.
                decode_release = np.maximum(decode_release, boundary[-1])
                run_decode = decode_release < encode_release
            else:
                run_decode = decode_release <= encode_release
            release = np.minimum(encode_release, decode_release)
            start = np.maximum(clock, release)
            clock = start + np.where(run_decode, decode[rows, d], encode[rows, e])
            self._finish_tasks(s, rows, run_decode, start, clock, e, d, collective)
        s.backprop_end = np.full(len(rows), boundary[-1])
        s.step = np.maximum(clock, boundary[-1])

    def _run_on_compute(self, s, rows, hi, encode, collective, decode):
        """Codec tasks share the backprop stream; they run at gradient boundaries.

        State per layout: ``done`` gradients are computed, the stream is at
        time ``clock``; while backprop is unfinished, clock = boundary[done] +
        delay, ``delay`` being the codec time inserted into backprop so far.
        Each iteration either runs one codec task (an encode whose last
        gradient is done, or a decode whose collective has returned, the
        earlier released first) or advances backprop to the next boundary at
        which one becomes runnable.
        """
        boundary = self.boundary
        n = self.num_tensors
        groups = hi.shape[1]
        done = np.zeros(len(rows), np.int64)
        delay = np.zeros(len(rows))
        clock = np.zeros(len(rows))
        backprop_end = np.full(len(rows), _INF)
        encode_released_at = np.full(len(rows), _INF)  # when the next encode became runnable
        for _ in range(4 * groups + 2):
            active = s.next_decode < groups
            if not active.any():
                break
            e = np.minimum(s.next_encode, groups - 1)
            d = np.minimum(s.next_decode, groups - 1)
            encode_hi = np.where(s.next_encode < groups, hi[rows, e], n + 1)
            encode_runnable = encode_hi <= done
            decode_known = s.next_decode < s.next_encode
            decode_release = np.where(decode_known, s.collective_end[rows, d], _INF)
            finished = done >= n
            # First come, first served: a runnable encode yields only to a
            # decode released no later than it; with no encode runnable, a
            # released decode runs, and after backprop one is waited for.
            run_decode = active & decode_known & np.where(
                encode_runnable, decode_release <= encode_released_at,
                (decode_release <= clock) | finished)
            if self.decodes_after_backprop:
                run_decode = active & decode_known & finished & ~encode_runnable
            run_encode = active & ~run_decode & encode_runnable
            run_task = run_decode | run_encode
            start = np.where(run_decode, np.maximum(clock, decode_release), clock)
            duration = np.where(run_decode, decode[rows, d], encode[rows, e])
            end = start + duration
            # Advance backprop where no task runs: to the encode's boundary or
            # the first boundary at or after the decode's release, whichever
            # comes first.
            advance = active & ~run_task & ~finished
            decode_boundary = np.searchsorted(boundary, decode_release - delay, side="left")
            if self.decodes_after_backprop:  # a decode's release stops nothing
                target = encode_hi
            else:
                target = np.minimum(encode_hi, np.maximum(decode_boundary, done + 1))
            target = np.minimum(target, n)
            new_done = np.where(advance, target, done)
            advanced_clock = boundary[new_done] + delay
            encode_released_at = np.where(advance & (new_done >= encode_hi), advanced_clock,
                                          encode_released_at)
            just_finished = advance & (new_done >= n)
            backprop_end = np.where(just_finished, advanced_clock, backprop_end)
            delay = np.where(run_task & ~finished, delay + duration, delay)
            clock = np.where(run_task, end, np.where(advance, advanced_clock, clock))
            done = new_done
            self._finish_tasks(s, rows, run_decode, start, end, e, d, collective,
                               run_encode=run_encode)
        s.backprop_end = backprop_end
        s.step = np.maximum(clock, backprop_end)

    @staticmethod
    def _finish_tasks(s, rows, run_decode, start, end, e, d, collective, run_encode=None):
        if run_encode is None:
            run_encode = ~run_decode
        if run_encode.any():
            r = rows[run_encode]
            ge = e[run_encode]
            taken_up = end[run_encode]
            cost = collective[r, ge]
            if s.cycle_s > 0:
                # Queued before the last pass began: that pass took it up (and
                # fused it). Else the next pass (``cycle_s`` in the class docstring).
                last_pass = s.last_pass[run_encode]
                same_pass = taken_up <= last_pass
                phase = s.phase[run_encode]
                next_pass = np.maximum(
                    np.ceil((taken_up + phase) / s.cycle_s - 1e-9) * s.cycle_s - phase,
                    s.network_free[run_encode])
                taken_up = np.where(same_pass, last_pass, next_pass)
                cost = np.where(same_pass, np.maximum(cost - s.pass_fixed_s, 0.0), cost)
                s.passes[run_encode] += ~same_pass
                s.last_pass[run_encode] = taken_up
            else:
                s.passes[run_encode] += 1
            collective_start = np.maximum(taken_up, s.network_free[run_encode])
            collective_end = collective_start + cost
            s.collective_end[r, ge] = collective_end
            s.network_free[run_encode] = collective_end
            s.next_encode[run_encode] += 1
            if s.record:
                s.encode_span[r, ge, 0] = start[run_encode]
                s.encode_span[r, ge, 1] = end[run_encode]
                s.collective_span[r, ge, 0] = collective_start
                s.collective_span[r, ge, 1] = collective_end
        if run_decode.any():
            r = rows[run_decode]
            s.next_decode[run_decode] += 1
            if s.record:
                gd = d[run_decode]
                s.decode_span[r, gd, 0] = start[run_decode]
                s.decode_span[r, gd, 1] = end[run_decode]


def _one_layout(splits):
    """One layout as the [1, groups - 1] array ``_simulate`` takes."""
    splits = tuple(splits)
    return np.asarray([splits], dtype=np.int64).reshape(1, len(splits))


class _State:
    def __init__(self, layouts, groups, record, cycle_s, pass_fixed_s, phase, thread_free):
        self.cycle_s = cycle_s
        self.pass_fixed_s = pass_fixed_s
        self.phase = phase
        # Passes of Horovod's thread that took up collectives (each group's
        # own without cycle_s), and when the last one began.
        self.passes = np.zeros(layouts)
        self.last_pass = np.full(layouts, -_INF)
        self.next_encode = np.zeros(layouts, np.int64)
        self.next_decode = np.zeros(layouts, np.int64)
        self.collective_end = np.full((layouts, groups), _INF)
        self.network_free = np.array(thread_free, dtype=np.float64)
        self.record = record
        if record:
            self.encode_span = np.zeros((layouts, groups, 2))
            self.collective_span = np.zeros((layouts, groups, 2))
            self.decode_span = np.zeros((layouts, groups, 2))
        self.step = None
        self.backprop_end = None


def monotone_fit(values):
    """The non-decreasing sequence closest to ``values`` in least squares (pool
    adjacent violators): ready times measured with jitter, made monotone
    without the upward bias of a running maximum."""
    blocks = []  # [mean, count]
    for value in np.asarray(values, dtype=np.float64):
        blocks.append([value, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, count = blocks.pop()
            blocks[-1][0] = (blocks[-1][0] * blocks[-1][1] + mean * count) / (blocks[-1][1] + count)
            blocks[-1][1] += count
    return np.concatenate([np.full(count, mean) for mean, count in blocks]) if blocks else \
        np.zeros(0)


def layouts_with_groups(n, groups, cut_positions=None):
    """Every layout of ``groups`` groups whose cuts are in ``cut_positions``
    (default: all of 1..n-1), as a [count, groups - 1] array."""
    positions = np.arange(1, n) if cut_positions is None else np.unique(
        np.asarray(cut_positions, dtype=np.int64))
    positions = positions[(positions > 0) & (positions < n)]
    if groups == 1:
        return np.zeros((1, 0), np.int64)
    if groups - 1 > len(positions):
        return np.zeros((0, groups - 1), np.int64)
    combos = itertools.combinations(positions.tolist(), groups - 1)
    count = math.comb(len(positions), groups - 1)
    return np.fromiter(itertools.chain.from_iterable(combos), dtype=np.int64,
                       count=count * (groups - 1)).reshape(count, groups - 1)


def exhaustive_best(model, groups, chunk=200_000):
    """(layout, seconds): the model's fastest layout of exactly ``groups`` groups, by
    evaluating every one (C(N - 1, groups - 1) layouts, about a microsecond each)."""
    n = model.num_tensors
    if groups == 1:
        return (), model.step_time(())
    if groups > n:
        return None, _INF
    best, best_seconds = None, _INF
    for block in _all_layouts(n, groups - 1, chunk):
        times = model.step_times(block)
        index = int(np.argmin(times))
        if times[index] < best_seconds:
            best, best_seconds = tuple(int(c) for c in block[index]), float(times[index])
    return best, best_seconds


def _all_layouts(n, cuts, chunk):
    """Every sorted ``cuts``-tuple of cut positions in (0, n), as [count, cuts]
    arrays of about ``chunk`` rows: the last two cuts from numpy's pair indices,
    the ones before them from a Python loop."""
    if cuts == 1:
        positions = np.arange(1, n, dtype=np.int64).reshape(-1, 1)
        for start in range(0, len(positions), chunk):
            yield positions[start:start + chunk]
        return
    pending, size = [], 0

    def prefixes(first, depth):
        # Sorted prefixes of ``depth`` cuts starting after ``first``.
        if depth == 0:
            yield ()
            return
        for cut in range(first + 1, n - depth - 1):
            for rest in prefixes(cut, depth - 1):
                yield (cut,) + rest

    for prefix in prefixes(0, cuts - 2):
        low = prefix[-1] + 1 if prefix else 1
        m = n - low  # positions low .. n - 1
        if m < 2:
            continue
        i, j = np.triu_indices(m, 1)
        pairs = np.stack([i + low, j + low], axis=1).astype(np.int64)
        block = np.concatenate([np.tile(np.asarray(prefix, np.int64), (len(pairs), 1)), pairs],
                               axis=1) if prefix else pairs
        pending.append(block)
        size += len(block)
        if size >= chunk:
            yield np.concatenate(pending)
            pending, size = [], 0
    if pending:
        yield np.concatenate(pending)


def fill_ready(ready, sizes):
    """Ready times with the gaps (gradients the profile did not see) filled
    from their neighbours, made non-decreasing by ``monotone_fit``."""
    ready = np.asarray(ready, dtype=np.float64)
    seen = np.isfinite(ready)
    if not seen.any():
        return np.zeros(len(ready))
    if not seen.all():
        index = np.arange(len(ready))
        ready = np.interp(index, index[seen], ready[seen])
    return monotone_fit(np.maximum(ready, 0.0))
