"""Runs MergeComp's partition search from a training loop, one step at a time.

``PartitionSearchDriver`` answers the requests of the framework-free search
(tf_mergecomp/search/algorithm.py) from the training itself. The Keras callback
(tf_mergecomp/callback.py) wraps it; custom loops with
``hvd.DistributedGradientTape`` use it directly:

    search = PartitionSearchDriver(compression)
    step = search.function(train_step)   # one tf.function per candidate partition
    for x, y in dataset:
        search.before_step()
        loss = step(x, y)
        search.after_step(loss)          # waits for ``loss``, then times the step
    search.finish()                      # if training ended before the search

Its steps, their cost and the saved file are described in docs/search.md. Every answer is
averaged over the workers, so every rank takes the same path; rank 0 logs.
"""


import os
import time

import numpy as np
import tensorflow as tf

from tf_mergecomp import communication
from tf_mergecomp import grouping
from tf_mergecomp import levels
from tf_mergecomp.search import algorithm as search_core
from tf_mergecomp.search import requests as search_requests
from tf_mergecomp.search import recorder
from tf_mergecomp.search import restart as horovod_restart
from tf_mergecomp.search.layout_functions import LayoutFunctions
from tf_mergecomp.search.report import STEPS_ASIDE, SearchNoise, SearchReport, describe
from tf_mergecomp.search import measure, store
from tf_mergecomp.search.settings import check_settings, horovod_fusion
from tf_mergecomp.search.store import PartitionStore
from tf_mergecomp.levels import TWO_LEVEL


class PartitionSearchDriver:
    """Drives the partition search of one ``MergeComp`` from a training loop.

    Args:
      compression: the ``MergeComp`` given to Horovod.
      max_groups: the most groups a predicted candidate may have (>= 1).
      steps_per_candidate: timed steps of a candidate per confirm round.
      rounds: confirm rounds.
      finalists: predicted candidates confirmed beside the sentinels.
      warmup_steps: steps discarded after every trace of the train step.
      profiled_steps: profiled one-group steps.
      probe_repeats: timed calls per probed layout.
      save_path: JSON file to write the result to and to reuse it from.
      verbose: 1 prints the search's phases and its result on rank 0; 0 is quiet.
      log_dir: TensorBoard scalars of the candidates, and the PNG.
      codec_on_compute, decodes_after_backprop: the step-time model's codec
        placement (tf_mergecomp/search/step_model.py); by default on the backprop
        stream on hosts without a GPU, and decodes after backprop when
        TensorFlow runs ops on one inter-op thread.
      min_turn_seconds: the least a confirm turn should last, in seconds: where
        ``steps_per_candidate`` steps of the profiled step take less, a turn
        times more of them (at most ``MAX_TURN_FACTOR`` times as many). 0 (the
        default) times ``steps_per_candidate``.
      restart_horovod: restart Horovod (``hvd.shutdown(); hvd.init()``) at
        each switch of candidate and once the partition is fixed, where that is
        safe (``restart_blocker`` in tf_mergecomp/search/restart.py), so that no
        candidate's collectives stay in Horovod's response cache (docs/search.md,
        section 3).
      plain_codecs: the codecs a group may use instead of the compressor,
        where the MergeComp has ``plain_groups`` on: ``("none",)`` (default,
        exact), or ``("none", "fp16")`` (fp16 groups too, at half the bytes).
      **search_options: more ``PartitionSearchAlgorithm`` arguments.
    """

    def __init__(self, compression, max_groups=4, steps_per_candidate=3, rounds=4, finalists=3,
                 warmup_steps=2, profiled_steps=4, probe_repeats=3, save_path=None, verbose=1,
                 log_dir=None, codec_on_compute=None, decodes_after_backprop=None,
                 min_turn_seconds=0.0, restart_horovod=True, plain_codecs=("none",),
                 **search_options):
        check_settings(compression, max_groups, steps_per_candidate, rounds, finalists,
                       warmup_steps, profiled_steps, probe_repeats, save_path, verbose,
                       min_turn_seconds, restart_horovod, plain_codecs, search_options)
        self.plain_codecs = tuple(plain_codecs)
        self.compression = compression
        self.max_groups = max_groups
        self.steps_per_candidate = steps_per_candidate
        self.rounds = rounds
        self.finalists = finalists
        self.warmup_steps = warmup_steps
        self.profiled_steps = profiled_steps
        self.probe_repeats = probe_repeats
        self.save_path = None if save_path is None else os.fspath(save_path)
        self.verbose = int(verbose)
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        # Timings and decisions averaged over the ranks, rank 0's file answers.
        self._values = communication.WorkerValues("mergecomp_search")
        self.store = None if save_path is None else PartitionStore(self.save_path, self._values)
        self.report = SearchReport(verbose, self.log_dir)
        self.codec_on_compute = codec_on_compute
        self.decodes_after_backprop = decodes_after_backprop
        self.min_turn_seconds = float(min_turn_seconds)
        self.turn_steps = steps_per_candidate  # set from the profiled step
        self.restart_horovod = bool(restart_horovod)
        self.restart_blocker = None  # why Horovod is not restarted, once the search began
        self._search_options = dict(search_options)

        self.train_functions = None  # how a layout's train step is selected (Keras or loop)
        # layout -> codec per group where not all the compressor (the search's, or the file's)
        self.layout_codecs = {}
        self._loop_functions = LayoutFunctions(self)
        self.algorithm = None
        self.loaded_from = None  # save_path when a saved partition was reused
        self.reason_for_search = None
        self.history = []  # one record per confirmed candidate, in the order first timed
        self.cost = {"traces": 0, "steps": 0, "seconds": 0.0, "horovod_restarts": 0,
                     "restart_seconds": 0.0}
        self.steps_seen = 0
        self.final_collectives_per_step = None
        self.profile_note = None
        self._phase = "first_step"
        self._noise = SearchNoise()
        self._plan = None
        self._role = None
        self._started = None
        self._step_start = None
        self._collectives_before = None
        self._step_kind = None  # "plan", "detour" (untimed, on one group) or "switch"
        self._switch_back = False
        self._current_layout = None
        self._last_collectives = None
        self._profiler = None
        self._producers = None
        self._probe = None
        self.plot_path = None

    # ------------------------------------------------------------ step hooks
    @property
    def done(self):
        return self._phase == "done"

    def before_step(self, timeable=True):
        """Call before each step. ``timeable=False`` marks a step that must not
        be timed (Keras: an epoch's last, possibly smaller, batch)."""
        if self._phase == "done":
            if self.final_collectives_per_step is None:
                self._begin_timing()
            return
        if self._phase == "first_step":
            self._begin_search()
        self._step_kind = "plan"
        if not timeable and self._role != "first":
            # On the one-group function (traced for a smaller batch at most
            # once); the next step switches back and is discarded.
            self._step_kind = "detour"
            self.train_functions.use((), fresh=False)
        elif self._switch_back:
            self._step_kind = "switch"
            self.train_functions.use(self._current_layout, fresh=False)
        if self._step_kind == "plan" and self._role == "profiled":
            self._profiler.step_begins()
        self._begin_timing()

    def after_step(self, outputs=None):
        """Call after each step; ``outputs`` (tensors) are waited for before timing."""
        if outputs is not None:
            tf.nest.map_structure(_wait_for, outputs)
        if self._step_start is None:
            return
        seconds = time.perf_counter() - self._step_start
        self._step_start = None
        self.steps_seen += 1
        collectives = self._collectives() - self._collectives_before
        if self._phase == "done":
            self.final_collectives_per_step = collectives
            self._check_collectives(collectives, "the chosen partition")
            return
        self.cost["steps"] += 1
        if self._step_kind != "plan":
            self._switch_back = self._step_kind == "detour"
            return
        if self._role in ("timed", "profiled"):
            if self._role == "profiled":
                self._profiler.step_ends()
            self._check_collectives(collectives,
                                    "candidate %s" % self.describe_layout(self._current_layout))
        try:
            self._role = self._plan.send(seconds)
        except StopIteration:
            self._role = None

    def finish(self):
        """Ends a search early (e.g. training ends first): keeps the fastest
        candidate of the confirm rounds so far if its gain over one group is
        resolved, else one group, and saves nothing."""
        if self._phase in ("first_step", "done"):
            return
        if self._profiler is not None:
            self._profiler.stop([])
        choice = ()
        if self.algorithm is not None and self.algorithm.relative_seconds():
            choice = self.algorithm.resolved_choice(self.algorithm.fastest())
        self.report.log("search stopped early after %d steps: keeping %s" % (
            self.cost["steps"], self.describe_layout(choice)))
        self._conclude(choice, save=False)

    # ------------------------------------------------------------- custom loops
    def function(self, python_step_fn, **tf_function_kwargs):
        """A callable running the train step as a ``tf.function``, one per
        candidate partition: a candidate's turn after its first reuses its trace."""
        return self._loop_functions.register(python_step_fn, tf_function_kwargs)

    # ---------------------------------------------------------------- the plan
    def _begin_search(self):
        self.check_save_path()
        self._started = time.perf_counter()
        if self.train_functions is None:
            self.train_functions = self._loop_functions
        # The first step traces one group and notes the ops producing the gradients.
        self._producers = recorder.GradientOps()
        self.compression.step_recorder = self._producers
        self.restart_blocker = self._why_not_restart()
        self._activate((), fresh=True, restart=False)
        self._phase = "searching"
        self._noise.install()
        self._role = "first"
        self._plan = self._steps()
        next(self._plan)

    def _steps(self):
        """Generator: yields the role of each next step, receives its seconds."""
        yield "first"  # primes the generator; the first step's time arrives next
        self.compression.step_recorder = None
        sizes = self.compression.tensor_sizes
        if sizes is None:
            raise RuntimeError(
                "the MergeComp was not used in the first step: pass it to "
                "hvd.DistributedOptimizer/DistributedGradientTape as compression=")
        saved, reason = self._load_decision()
        if saved is not None:
            self.loaded_from = self.save_path
            if saved["plain_horovod"]:
                layout = search_requests.PLAIN_HOROVOD
            else:
                layout = tuple(saved["partition"])
                if saved["group_codecs"] is not None:
                    self.layout_codecs[layout] = tuple(saved["group_codecs"])
            self.report.log("reusing the partition saved in %s: %s" % (
                self.save_path, self.describe_layout(layout)))
            self._conclude(layout, save=False)
            return
        self.reason_for_search = reason
        self.report.log("searching the partition of %d gradient tensors%s" % (
            len(sizes), ": %s" % reason if reason else ""))
        self.report.log("restarting Horovod at each switch of candidate, so that no candidate's "
                  "cached collectives slow down the others" if self.restart_blocker is None
                  else "not restarting Horovod between candidates: %s" % self.restart_blocker)
        codec_on_compute, decodes_after = self._codec_placement()
        codecs = self.searched_codecs()
        two_level = codecs is not None and any(c.endswith(TWO_LEVEL) for c in codecs)
        self.algorithm = search_core.PartitionSearchAlgorithm(
            sizes, max_groups=self.max_groups, finalists=self.finalists, rounds=self.rounds,
            codec_on_compute=codec_on_compute, decodes_after_backprop=decodes_after,
            codecs=codecs, plain_horovod=self.compression.plain_groups,
            fusion=horovod_fusion() if two_level else None, **self._search_options)
        request = self.algorithm.start()
        while request is not None:
            if request.kind == "profile":
                answer = yield from measure.profile(self)
            elif request.kind == "probe":
                answer = measure.probe_layouts(self, request.layouts, request.codec)
            elif request.kind == "warm":
                self.report.finalists(self.algorithm, self.compression.num_tensors, self.rounds)
                answer = yield from self._warm(request.layouts)
            else:
                answer = yield from self._time(request.splits)
            request = self.algorithm.answer(answer)
            if self.algorithm.rounds_measured:
                self.report.rounds(self.algorithm, self.compression.num_tensors, self.rounds)
        self.report.rounds(self.algorithm, self.compression.num_tensors, self.rounds, final=True)
        self._conclude(self.algorithm.choice, save=True)

    def searched_codecs(self):
        """The codecs the search chooses from per group: the compressor and, with
        ``plain_groups``, ``plain_codecs``, each also on two levels where the MergeComp
        offers it (``two_level_codec_choices``); None: the compressor only, flat."""
        compression = self.compression
        name = compression.compressor.name
        plain = [c for c in self.plain_codecs if c in compression.codec_choices and c != name]
        flat = (name,) + (tuple(plain) if compression.plain_groups else ())
        two_level = tuple(getattr(compression, "two_level_codec_choices", ()))
        flat_and_two_level = flat + tuple(c + TWO_LEVEL for c in flat if c + TWO_LEVEL in two_level)
        return None if len(flat_and_two_level) == 1 else flat_and_two_level

    def apply_layout(self, layout):
        """Sets the MergeComp to train with ``layout`` from the next trace on:
        its splits and groups' codecs, or plain Horovod (MergeComp steps aside)."""
        if layout == search_requests.PLAIN_HOROVOD:
            self.compression.set_plain_horovod()
            return
        codecs = self.codecs_of(layout)
        self.compression.set_partition(list(layout) if layout else 1,
                                       group_codecs=None if codecs is None else list(codecs))

    def codecs_of(self, layout):
        codecs = self._searched_codecs_of(layout)
        return self.layout_codecs.get(layout) if codecs is None else codecs

    def _searched_codecs_of(self, layout):
        """The search's codec per group of ``layout``, or None (no search, or every group
        the compressor)."""
        return None if self.algorithm is None else self.algorithm.codecs_of(layout)

    def describe_layout(self, layout):
        return describe(layout, self.codecs_of(layout))

    def _warm(self, layouts):
        """An untimed turn of each candidate, which traces it, so that no timed turn
        follows a trace (the steps after one run slow, whatever was traced)."""
        for layout in layouts:
            yield from self._discard_turn(layout)
        return None

    def _time(self, layout):
        yield from self._discard_turn(layout)
        seconds = []
        for _ in range(self.turn_steps):
            seconds.append((yield "timed"))
        local = float(np.median(seconds))
        averaged = float(self._values.average(local, "seconds"))
        record = self._history_record(layout)
        record["rounds_s"].append(averaged)
        record["local_rounds_s"].append(local)
        record["collectives_per_step"] = self._last_collectives
        return averaged

    # --------------------------------------------------------------- internals
    def _discard_turn(self, layout):
        """Switches to ``layout`` and discards its first steps: 1 + ``warmup_steps``
        where that traces, else the one switch step."""
        new = self._activate(layout)
        for _ in range(1 + self.warmup_steps if new else 1):
            yield "discard"

    def _history_record(self, layout):
        for record in self.history:
            if record["layout"] == layout:
                return record
        plain = layout == search_requests.PLAIN_HOROVOD
        codecs = self.codecs_of(layout)
        record = {"candidate": len(self.history) + 1, "layout": layout,
                  "splits": None if plain else list(layout),
                  "groups": None if plain else len(layout) + 1, "plain_horovod": plain,
                  "group_codecs": None if codecs is None else list(codecs),
                  "role": _role_of(layout, self.compression.num_tensors),
                  "predicted_s": None if plain else self.algorithm.predictions.get(tuple(layout)),
                  "rounds_s": [], "local_rounds_s": [], "collectives_per_step": None}
        self.history.append(record)
        return record

    def _activate(self, layout, fresh=False, restart=True):
        """Makes the next step train with ``layout``; True when that traces.

        Called between two steps at the same step on every rank, after the
        last collective of the step before (the previous turn's averaged time,
        the probe's or the decision's): the one point where every rank can
        restart Horovod together."""
        if restart and self.restart_blocker is None:
            started = time.perf_counter()
            problem = horovod_restart.restart_horovod()
            self.cost["restart_seconds"] += time.perf_counter() - started
            if problem is None:
                self.cost["horovod_restarts"] += 1
            else:
                self.restart_blocker = problem
                self.report.log("no longer restarting Horovod between candidates: %s" % problem)
        self._current_layout = layout if isinstance(layout, str) else tuple(layout)
        new = self.train_functions.use(self._current_layout, fresh=fresh)
        if new:
            self.cost["traces"] += 1
        return new

    def _begin_timing(self):
        self._collectives_before = self._collectives()
        self._step_start = time.perf_counter()

    def _conclude(self, choice, save):
        choice = choice if isinstance(choice, str) else tuple(choice)
        codecs = self._searched_codecs_of(choice)
        if codecs is not None:
            self.layout_codecs[choice] = codecs
        self._activate(choice)
        self.train_functions.keep_only(choice)
        self._phase = "done"
        self._noise.remove()
        self._role = None
        self._switch_back = False
        self.cost["seconds"] = time.perf_counter() - self._started
        self.cost["probe_traces"] = self._probe.traces if self._probe is not None else 0
        self.cost["tracings"] = self.train_functions.tracings()
        self._probe = None
        if self.algorithm is None or not self.algorithm.rounds_measured:
            self.report.log("%s, after %d traces of the train step, %d steps, %.1f s" % (
                self.describe_layout(choice), self.cost["traces"], self.cost["steps"],
                self.cost["seconds"]))
            if choice == search_requests.PLAIN_HOROVOD:
                self.report.log(STEPS_ASIDE)
            return
        self.report.choice(self.algorithm, choice, self.compression.num_tensors, self.cost)
        self.report.tensorboard(self.algorithm, self.history, choice)
        if save and self.store is not None:
            if self.store.save(store.identity(self.compression), store.record(self, choice)):
                self.report.log("saved the partition to %s" % self.save_path)
        self.plot_path = self.report.plot(self.algorithm, choice, self.save_path)

    def _codec_placement(self):
        on_compute = self.codec_on_compute
        if on_compute is None:
            on_compute = not tf.config.list_physical_devices("GPU")
        after = self.decodes_after_backprop
        if after is None:
            after = bool(on_compute) and tf.config.threading.get_inter_op_parallelism_threads() == 1
        return bool(on_compute), bool(after)

    def _why_not_restart(self):
        if not self.restart_horovod:
            return "restart_horovod=False"
        if communication.running_horovod() is None:
            return "Horovod is not initialized"
        return horovod_restart.restart_blocker()

    def _check_collectives(self, collectives, what):
        self._last_collectives = collectives
        groups = self.compression.num_groups
        if groups is None:
            return
        if self.compression.steps_aside:
            expected = 0  # Horovod's own collectives: MergeComp counts only its own
        else:
            compressor = self.compression.compressor
            # A two-level group adds a reduce-scatter and an allgather inside the machine.
            expected = sum((compressor.collectives_per_group()
                            if levels.split_level(name)[0] == compressor.name else 1)
                           + (2 if self.compression.runs_two_levels(name) else 0)
                           for name in self.compression.group_codecs)
        if collectives != expected:
            raise RuntimeError(
                "%s has %d groups (%d collectives per step) but the step ran %d collectives: "
                "the train step was not re-traced for the partition (Keras: use "
                "MergeCompCallback; custom loops: PartitionSearchDriver.function)"
                % (what, groups, expected, collectives))

    def _collectives(self):
        return int(self.compression.collectives_executed.numpy())

    # ------------------------------------------------------- ranks and files
    def check_save_path(self):
        """Fails on every rank, before training, when rank 0 cannot write
        ``save_path`` (every rank must call it). Runs once."""
        if self.store is not None:
            self.store.check_writable()

    def _load_decision(self):
        """(saved layout or None, why a search is needed), the same on every rank."""
        if self.store is None:
            return None, None
        return self.store.load(store.identity(self.compression), self.compression.num_tensors)


def _wait_for(value):
    if isinstance(value, (tf.Tensor, tf.Variable)) and not isinstance(value, tf.SparseTensor):
        value.numpy()
    return value


def _role_of(layout, n):
    if layout == search_requests.PLAIN_HOROVOD:
        return "plain Horovod"
    if not layout:
        return "one group"
    if tuple(layout) == grouping.layerwise_splits(n):
        return "layer-wise"
    return "predicted"
