"""Runs MergeComp's partition search from a training loop, one step at a time.

``PartitionSearch`` times training steps, feeds ``search.PartitionSearcher``
(tf_mergecomp/search.py has the algorithm and its cost), switches the
``MergeComp`` to each candidate partition, and fixes the fastest when done.
The Keras callback (tf_mergecomp/callback.py) wraps it; custom loops with
``hvd.DistributedGradientTape`` use it directly:

    search = PartitionSearch(compression, steps_per_candidate=5)
    step = search.function(train_step)   # a tf.function re-created per partition
    for x, y in dataset:
        search.before_step()
        loss = step(x, y)
        search.after_step(loss)          # waits for ``loss``, then times the step

Per candidate: the first step after a partition change re-traces and is not
timed; the next ``steps_per_candidate`` steps are, and their median is averaged
over all workers (``hvd.allreduce``) before it reaches the searcher, so every
worker takes the same decisions. The first training step is never timed either
(the gradient sizes are known only once it has been traced).

With ``save_path``, the result is written as JSON (model fingerprint, world
size, compressor and memory with their parameters, partition, every measured
time); a later run whose fingerprint, world size and compression match loads
it and skips the search; any mismatch is reported and the search runs again.
"""

import json
import os
import time

import tensorflow as tf

from tf_mergecomp import grouping
from tf_mergecomp import search as search_core

FILE_FORMAT = "tf_mergecomp.partition_search/1"


class PartitionSearch:
    """Drives the partition search of one ``MergeComp`` from a training loop.

    Args:
      compression: the ``MergeComp`` given to Horovod.
      steps_per_candidate: timed steps per candidate (>= 1).
      max_groups: the most groups the search tries (>= 1).
      save_path: JSON file to write the result to and to reuse it from.
      verbose: 1 prints one line per candidate and a summary on rank 0; 0 is quiet.
      on_partition_change: called with no arguments after each partition change,
        to re-create the traced step (the Keras callback rebuilds the train
        function). ``function()`` needs none.
      log_dir: if given, TensorBoard scalars of every candidate's time.
      **search_options: more ``PartitionSearcher`` arguments (min_improvement, ...).
    """

    def __init__(self, compression, steps_per_candidate=5, max_groups=4, save_path=None, verbose=1,
                 on_partition_change=None, log_dir=None, **search_options):
        from tf_mergecomp.mergecomp import MergeComp

        if not isinstance(compression, MergeComp):
            raise ValueError("compression must be a tf_mergecomp.MergeComp, got %r" % (compression,))
        _check_int("steps_per_candidate", steps_per_candidate, 1)
        _check_int("max_groups", max_groups, 1)
        if verbose not in (0, 1, True, False):
            raise ValueError("verbose must be 0 or 1, got %r" % (verbose,))
        if save_path is not None and not isinstance(save_path, (str, os.PathLike)):
            raise ValueError("save_path must be a path or None, got %r" % (save_path,))
        unknown = set(search_options) - _SEARCHER_OPTIONS
        if unknown:
            raise ValueError("unknown search options %s; valid: %s"
                             % (sorted(unknown), ", ".join(sorted(_SEARCHER_OPTIONS))))
        self.compression = compression
        self.steps_per_candidate = steps_per_candidate
        self.max_groups = max_groups
        self.save_path = None if save_path is None else os.fspath(save_path)
        self.verbose = int(verbose)
        self.on_partition_change = on_partition_change
        self.log_dir = log_dir
        self._search_options = dict(search_options)

        self.searcher = None
        self.history = []  # one dict per measured candidate
        self.loaded_from = None  # save_path when a saved partition was reused
        self.reason_for_search = None
        self.steps_seen = 0
        self.search_steps = 0
        self._phase = "first_step"
        self._skip_next = True
        self._samples = []
        self._step_start = None
        self._collectives_before = None
        self._collectives_seen = []  # collectives per timed step of this candidate
        self.final_collectives_per_step = None
        self._writer = None

    # ------------------------------------------------------------ step hooks
    @property
    def done(self):
        return self._phase == "done"

    def before_step(self):
        if self._phase == "done" and self.final_collectives_per_step is not None:
            return
        self._collectives_before = self._collectives()
        self._step_start = time.perf_counter()

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
        self.search_steps += 1
        if self._phase == "first_step":
            self._start()
            return
        if self._skip_next:  # the step that re-traced
            self._skip_next = False
            return
        self._check_collectives(collectives, "candidate %r" % (self.compression.splits,))
        self._collectives_seen.append(collectives)
        self._samples.append(seconds)
        if len(self._samples) >= self.steps_per_candidate:
            self._finish_candidate()

    def finish(self):
        """Ends a search early (e.g. training ends first): keeps the best measured partition."""
        if self._phase == "searching":
            self._log("search stopped early after %d candidates" % len(self.history))
            self._conclude(save=False)

    # ------------------------------------------------------------- custom loops
    def function(self, python_step_fn, **tf_function_kwargs):
        """A callable running ``tf.function(python_step_fn)``, re-created per partition version."""
        state = {"version": None, "fn": None}

        def call(*args, **kwargs):
            if state["fn"] is None or state["version"] != self.compression.partition_version:
                state["fn"] = tf.function(python_step_fn, **tf_function_kwargs)
                state["version"] = self.compression.partition_version
            return state["fn"](*args, **kwargs)

        call.python_function = python_step_fn
        return call

    # ---------------------------------------------------------------- internals
    def _start(self):
        sizes = self.compression.tensor_sizes
        if sizes is None:
            raise RuntimeError(
                "the MergeComp was not used in the first step: pass it to "
                "hvd.DistributedOptimizer/DistributedGradientTape as compression="
            )
        saved, reason = self._load_decision()
        if saved is not None:
            self.loaded_from = self.save_path
            self._log("reusing the partition saved in %s: %s" % (self.save_path, _describe(saved)))
            self._apply(tuple(saved))
            self._phase = "done"
            return
        self.reason_for_search = reason
        if reason:
            self._log("searching the partition: %s" % reason)
        self.searcher = search_core.PartitionSearcher(sizes, max_groups=self.max_groups,
                                                      **self._search_options)
        self._phase = "searching"
        self._skip_next = False
        self._next_candidate()

    def _next_candidate(self):
        proposal = self.searcher.propose()
        if proposal is None:
            self._conclude(save=True)
            return
        self._samples = []
        self._collectives_seen = []
        if tuple(proposal) != tuple(self.compression.splits):
            self._apply(proposal)
            self._skip_next = True

    def _finish_candidate(self):
        local = search_core.robust_seconds(self._samples)
        seconds = self._average_over_workers(local)
        splits = tuple(self.compression.splits)
        stage = self.searcher.stage
        self.searcher.report(splits, seconds)
        record = {
            "candidate": len(self.history) + 1,
            "stage": stage,
            "splits": list(splits),
            "groups": len(splits) + 1,
            "seconds": seconds,
            "local_seconds": local,
            "collectives_per_step": self._collectives_seen[-1] if self._collectives_seen else None,
        }
        self.history.append(record)
        self._log("candidate %d (%s): %s -> %.2f ms/step (median of %d steps%s)" % (
            record["candidate"], _stage_name(stage), _describe(splits), 1e3 * seconds,
            len(self._samples), self._workers_note()))
        self._tensorboard(record)
        self._next_candidate()

    def _conclude(self, save):
        best = tuple(self.searcher.best)
        if tuple(self.compression.splits) != best:
            self._apply(best)
        self._phase = "done"
        measured = self.searcher.measured_layouts()
        n = self.compression.num_tensors
        extra = []
        if () in measured:
            extra.append("1 group %.2f ms" % (1e3 * measured[()]))
        layerwise = grouping.layerwise_splits(n)
        if n > 1 and layerwise in measured:
            extra.append("layer-wise %.2f ms" % (1e3 * measured[layerwise]))
        self._log("best partition: %s, %.2f ms/step (%s); %d candidates in %d steps" % (
            _describe(best), 1e3 * self.searcher.best_seconds, ", ".join(extra),
            len(self.history), self.search_steps))
        if save and self.save_path is not None:
            self._save(best)

    def _apply(self, splits):
        self.compression.set_partition(list(splits) if splits else 1)
        if self.on_partition_change is not None:
            self.on_partition_change()

    def _check_collectives(self, collectives, what):
        groups = self.compression.num_groups
        if groups is None:
            return
        expected = groups * self.compression.compressor.collectives_per_group()
        if collectives != expected:
            raise RuntimeError(
                "%s has %d groups (%d collectives per step) but the step ran %d collectives: "
                "the train step was not re-traced after set_partition (Keras: "
                "model.make_train_function(force=True); custom loops: PartitionSearch.function)"
                % (what, groups, expected, collectives))

    def _collectives(self):
        return int(self.compression.collectives_executed.numpy())

    # ---------------------------------------------------------- ranks and files
    def _hvd(self):
        try:
            import horovod.tensorflow as hvd
        except ImportError:
            return None
        return hvd if hvd.is_initialized() else None

    def _rank(self):
        hvd = self._hvd()
        return 0 if hvd is None else hvd.rank()

    def _world_size(self):
        hvd = self._hvd()
        return 1 if hvd is None else hvd.size()

    def _workers_note(self):
        size = self._world_size()
        return ", mean of %d workers" % size if size > 1 else ""

    def _average_over_workers(self, seconds):
        hvd = self._hvd()
        if hvd is None or hvd.size() == 1:
            return float(seconds)
        averaged = hvd.allreduce(tf.constant(seconds, tf.float64), op=hvd.Average,
                                 name="mergecomp_search_seconds")
        return float(averaged.numpy())

    def _load_decision(self):
        """(saved splits or None, why a search is needed), decided on rank 0 for all ranks."""
        if self.save_path is None:
            return None, None
        decision = self._read_saved() if self._rank() == 0 else None
        hvd = self._hvd()
        if hvd is not None and hvd.size() > 1:
            decision = hvd.broadcast_object(decision, root_rank=0,
                                            name="mergecomp_search_saved_partition")
        return decision

    def _read_saved(self):
        path = self.save_path
        if not os.path.exists(path):
            return None, "no saved partition at %s" % path
        try:
            with open(path) as f:
                saved = json.load(f)
        except (OSError, ValueError) as exc:
            return None, "cannot read %s (%s)" % (path, exc)
        expected = self._identity()
        if not isinstance(saved, dict) or saved.get("format") != FILE_FORMAT:
            return None, "%s is not a saved partition (format %r)" % (path, FILE_FORMAT)
        for key, value in expected.items():
            if saved.get(key) != value:
                return None, "%s was saved for a different %s (%r there, %r here)" % (
                    path, key.replace("_", " "), saved.get(key), value)
        partition = saved.get("partition")
        n = self.compression.num_tensors
        if (not isinstance(partition, list) or any(not isinstance(s, int) for s in partition)
                or partition != sorted(set(partition)) or any(not 0 < s < n for s in partition)):
            return None, "%s holds an invalid partition %r" % (path, partition)
        return partition, None

    def _identity(self):
        description = dict(self.compression.describe())
        description.pop("splits", None)
        return {
            "model_fingerprint": self.compression.model_fingerprint(),
            "world_size": self._world_size(),
            "compression": json.loads(json.dumps(description)),
        }

    def _save(self, best):
        if self._rank() != 0:
            return
        document = {"format": FILE_FORMAT}
        document.update(self._identity())
        document.update({
            "partition": list(best),
            "num_groups": len(best) + 1,
            "seconds_per_step": self.searcher.best_seconds,
            "tensor_sizes": self.compression.tensor_sizes,
            "steps_per_candidate": self.steps_per_candidate,
            "search_steps": self.search_steps,
            "measurements": [
                {"stage": str(stage), "splits": list(splits), "seconds": seconds}
                for stage, splits, seconds in self.searcher.measurements
            ],
        })
        directory = os.path.dirname(os.path.abspath(self.save_path))
        os.makedirs(directory, exist_ok=True)
        temporary = self.save_path + ".tmp"
        with open(temporary, "w") as f:
            json.dump(document, f, indent=1)
        os.replace(temporary, self.save_path)
        self._log("saved the partition to %s" % self.save_path)

    def _log(self, message):
        if self.verbose and self._rank() == 0:
            print("MergeComp search: " + message, flush=True)

    def _tensorboard(self, record):
        if self.log_dir is None or self._rank() != 0:
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        with self._writer.as_default():
            tf.summary.scalar("mergecomp_search/candidate_seconds", record["seconds"],
                              step=record["candidate"])
            tf.summary.scalar("mergecomp_search/candidate_groups", record["groups"],
                              step=record["candidate"])
            tf.summary.scalar("mergecomp_search/best_seconds", self.searcher.best_seconds,
                              step=record["candidate"])
        self._writer.flush()


_SEARCHER_OPTIONS = {
    "min_improvement", "close_call", "max_repeats", "max_repeats_per_stage",
    "max_measurements_per_stage", "exhaustive_below", "byte_weight",
}


def _wait_for(value):
    if isinstance(value, (tf.Tensor, tf.Variable)) and not isinstance(value, tf.SparseTensor):
        value.numpy()
    return value


def _describe(splits):
    splits = tuple(splits)
    if not splits:
        return "1 group"
    shown = ", ".join(str(s) for s in splits[:8]) + (", ..." if len(splits) > 8 else "")
    return "%d groups, splits (%s)" % (len(splits) + 1, shown)


def _stage_name(stage):
    return "sentinel" if stage == "sentinels" else "%d-group search" % stage


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError("%s must be an integer >= %d, got %r" % (name, minimum, value))
