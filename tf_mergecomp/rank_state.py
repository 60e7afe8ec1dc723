"""Whose compression state a MergeComp holds, and what the ranks do about it.

Error-feedback residuals, SIGNUM's and DGC's momenta are each rank's own; PowerSGD's Q is
the same on every rank; the step counter, which seeds the codecs' random draws, must be
the same on every rank. Restoring rank 0's checkpoint on every rank, or an elastic resize,
breaks this; the ranks agree instead, by the rules of docs/checkpoints.md ("Whose state a
checkpoint holds").

Each MergeComp owns a ``RankState`` (``MergeComp.rank_state``), which reads the MergeComp
through its public interface only (``step``, ``state_origin``,
``existing_state_variables``, ``reset_state``, ``settings_fingerprint``, ``keeps_state``,
``forget_traces``):

* ``reconcile``, a collective, runs once at the first trace of the reduce function (all
  ranks trace their first step together: the rank agreement check relies on the same), at
  each elastic sync, and when ``restore_rank_state`` is called after the first step.
* A decision taken before the state variables exist (they are created at the first
  trace, when a checkpoint restored earlier is restored into them) applies right after
  they are created.
* Rank-state files (``<checkpoint path>.mergecomp-rank<r>-of-<W>``, an ``.npz`` archive
  written by ``RankState.write``) carry one rank's state, the step and the settings they
  belong to; ``tf_mergecomp.checkpoint`` saves and finds them.
"""

import io
import json
import logging
import os

import numpy as np
import tensorflow as tf


logger = logging.getLogger("tf_mergecomp")

NO_ORIGIN = [-1, -1]
FILE_FORMAT = "tf_mergecomp.rank_state.v1"

# What a rank holds, as exchanged between the ranks.
FRESH = 0        # nothing restored, nothing trained yet: the initial state
OWN = 1          # its own state, for this world size
FOREIGN = 2      # state saved by another rank (rank 0's checkpoint restored on every rank)
OTHER_WORLD = 3  # state of a world of another size (restored, or trained before an elastic resize)
MISSING = 4      # restore_rank_state found no file of this rank beside the checkpoint
UNUSABLE = 5     # its rank-state file was written for another model or other settings


class RankStateFile:
    """One rank's saved state: ``arrays`` (one per state variable, none when it
    was saved before the first step), ``step``, ``rank``, ``world_size`` and
    ``settings`` (a fingerprint of the gradient list and the codec settings)."""

    def __init__(self, path, arrays, step, rank, world_size, settings):
        self.path = path
        self.arrays = arrays
        self.step = step
        self.rank = rank
        self.world_size = world_size
        self.settings = settings


def rank_state_path(path, rank, world_size):
    """Where rank ``rank`` of ``world_size`` keeps its state beside checkpoint ``path``."""
    return "%s.mergecomp-rank%d-of-%d" % (os.fspath(path), rank, world_size)


class RankState:
    """One MergeComp's bookkeeping between a restore and the ranks' agreement,
    and the operations on whose state it holds. Plain Python state: nothing
    here is checkpointed (the variables it looks after are the MergeComp's)."""

    def __init__(self, mergecomp):
        self.mergecomp = mergecomp
        self.needs_reconcile = True
        self.pending_file = None   # a RankStateFile read by restore_rank_state, not yet agreed on
        self.missing_file = None   # the file restore_rank_state looked for and did not find
        self.other_worlds = []     # world sizes of the rank-state files found beside it instead
        self.continuing = False    # after an elastic reset: this process trained what it holds
        self.load_at_creation = None   # RankStateFile to load once the variables exist
        self.reset_at_creation = False
        self.process_set = None    # the MergeComp's process set, known from its first trace
        self.last_outcome = None   # what the last reconcile decided (for tests and debugging)

    def process_set_or_global(self):
        import horovod.tensorflow as hvd

        return self.process_set or hvd.global_process_set

    def save_beside(self, path):
        """Writes this rank's state beside checkpoint ``path``; returns the file written."""
        process_set = self.process_set_or_global()
        return self.write(path, process_set.rank(), process_set.size())

    def restore_from(self, path):
        """Finds this rank's state beside checkpoint ``path``; returns the file found, or
        None. Before the first step the ranks decide at it; once the MergeComp has traced,
        right away, in a collective of all ranks."""
        process_set = self.process_set_or_global()
        rank, world_size = process_set.rank(), process_set.size()
        saved = read(path, rank, world_size)
        self.set_restored_file(saved, rank_state_path(path, rank, world_size), path)
        if self.mergecomp.num_tensors is not None:
            self.reconcile(process_set)
        return None if saved is None else saved.path

    def write(self, path, rank, world_size):
        """Writes this rank's state to ``rank_state_path(path, rank, world_size)``;
        returns that path."""
        target = rank_state_path(path, rank, world_size)
        state = self.mergecomp.existing_state_variables() or []
        arrays = {"state_%d" % i: v.numpy() for i, v in enumerate(state)}
        meta = {
            "format": FILE_FORMAT, "rank": int(rank), "world_size": int(world_size),
            "step": int(self.mergecomp.step.numpy()),
            "settings": self.mergecomp.settings_fingerprint(), "tensors": len(arrays),
        }
        buffer = io.BytesIO()
        np.savez(buffer, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
        directory = os.path.dirname(target)
        if directory and not tf.io.gfile.exists(directory):
            tf.io.gfile.makedirs(directory)
        # Written aside and renamed, so a reader never sees half a file.
        partial = "%s.partial-%d" % (target, os.getpid())
        with tf.io.gfile.GFile(partial, "wb") as f:
            f.write(buffer.getvalue())
        tf.io.gfile.rename(partial, target, overwrite=True)
        return target

    def load(self, saved):
        """Assigns a RankStateFile's arrays to the (existing) state variables."""
        if not saved.arrays:  # saved before the first step: the initial state
            self.mergecomp.reset_state()
            return
        state = self.mergecomp.existing_state_variables() or []
        if (saved.settings != self.mergecomp.settings_fingerprint()
                or len(saved.arrays) != len(state)):
            raise ValueError(
                "%s was written for another model or other MergeComp settings (%d state tensors, "
                "this MergeComp has %d)" % (saved.path, len(saved.arrays), len(state)))
        with tf.init_scope():
            for variable, value in zip(state, saved.arrays):
                variable.assign(value)

    def _local_status(self, rank, world_size):
        if self.pending_file is not None:
            saved = self.pending_file
            current = self.mergecomp.settings_fingerprint()
            if saved.arrays and current is not None and saved.settings != current:
                return UNUSABLE
            return OWN
        if self.missing_file is not None:
            return MISSING
        origin_rank, origin_size = (int(v) for v in self.mergecomp.state_origin.numpy())
        if self.continuing:
            # An elastic reset: this process trained what it holds (its rank
            # number may change, it is still its own), unless it trained nothing.
            if self.mergecomp.existing_state_variables() is None:
                return FRESH
            return OWN if origin_size == world_size else OTHER_WORLD
        if origin_size < 0:
            return FRESH
        if origin_size != world_size:
            return OTHER_WORLD
        return OWN if origin_rank == rank else FOREIGN

    def reconcile_if_needed(self, communicator):
        """Called by the engine at each trace: reconciles at the first one."""
        self.process_set = communicator.process_set
        if not self.needs_reconcile:
            return
        with tf.init_scope():
            if not tf.executing_eagerly():
                # TF1-style graphs: no collectives at trace time; nothing to agree on.
                self.needs_reconcile = False
                return
            self.reconcile()

    def reconcile(self, process_set=None):
        """Collective over the MergeComp's process set: every rank must call it.

        Every rank says what it holds (``FRESH``, ``OWN``, or a status it must not
        train on). The ranks keep their state only when every rank holds its own (at
        the same step) or every rank is fresh; otherwise it is reset on every rank,
        with one warning on rank 0. Every rank then takes rank 0's step. Returns the
        outcome as a dict.
        """
        import horovod.tensorflow as hvd

        if process_set is None:
            process_set = self.process_set_or_global()
        rank, world_size = process_set.rank(), process_set.size()
        status = self._local_status(rank, world_size)
        step = self.pending_file.step if status == OWN and self.pending_file else None
        if step is None:
            step = int(self.mergecomp.step.numpy())
        origin = [int(v) for v in self.mergecomp.state_origin.numpy()]
        mine = tf.constant([[status, step, origin[0], origin[1], int(self.continuing)]], tf.int64)
        with tf.init_scope():
            everyone = hvd.allgather(mine, name="mergecomp.rank_state",
                                     process_set=process_set).numpy()
        statuses, steps = everyone[:, 0], everyone[:, 1]
        all_own = bool(np.all(statuses == OWN)) and bool(np.all(steps == steps[0]))
        all_fresh = bool(np.all(statuses == FRESH))
        keep = all_own or all_fresh
        has_state = self.mergecomp.keeps_state()

        with tf.init_scope():
            self.mergecomp.step.assign(int(steps[0]))
            if keep and self.pending_file is not None:
                if self.mergecomp.existing_state_variables() is not None:
                    self.load(self.pending_file)
                else:
                    self.load_at_creation = self.pending_file
            elif not keep:
                self.load_at_creation = None
                if self.mergecomp.existing_state_variables() is not None:
                    self.mergecomp.reset_state()
                else:
                    self.reset_at_creation = True
            self.mergecomp.state_origin.assign([rank, world_size])

        message = None
        elastic = bool(np.any(everyone[:, 4]))
        reason = ("after an elastic reset" if elastic
                  else "after a restore, not every rank holds its own state")
        if has_state and not keep:
            if bool(np.all(statuses == OWN)):
                held = "the ranks' states were saved at different steps (%s)" % ", ".join(
                    str(int(s)) for s in steps)
            else:
                held = "; ".join(_describe(r, int(s), int(o_rank), int(o_size), world_size,
                                           bool(c) or elastic)
                                 for r, (s, _, o_rank, o_size, c) in enumerate(everyone))
            if self.missing_file is not None and self.other_worlds:
                held += " (beside the checkpoint: state files of a world of %s ranks)" % (
                    " or ".join(str(n) for n in self.other_worlds))
            powersgd = self.mergecomp.compressor.name == "powersgd"
            message = (
                "tf_mergecomp: MergeComp's compression state (error-feedback memory%s) was reset "
                "to its initial value on every rank of this world of %d (%s: %s). Training "
                "continues at rank 0's step %d.%s"
                % ("; PowerSGD's Q" if powersgd else "", world_size,
                   reason, held, int(steps[0]),
                   "" if elastic else " To resume exactly, save each rank's state beside the "
                   "checkpoint and restore it on every rank (tf_mergecomp.checkpoint)."))
        elif has_state and all_fresh and int(steps[0]) > 0 and not elastic:
            message = (
                "tf_mergecomp: MergeComp's compression state was reset: training resumes at "
                "rank 0's step %d with no compression state on any rank (the checkpoint did not "
                "hold it: HDF5 and .keras files hold the optimizer's variables only, or "
                "MergeComp was not in the checkpoint). To resume exactly, save each rank's state "
                "beside the checkpoint (tf_mergecomp.checkpoint)." % int(steps[0]))
        if message and rank == 0:
            logger.warning(message)

        self.pending_file = None
        self.missing_file = None
        self.other_worlds = []
        self.continuing = False
        self.needs_reconcile = False
        self.last_outcome = {"kept": keep, "statuses": [int(s) for s in statuses],
                                "step": int(steps[0]), "warning": message}
        return self.last_outcome

    def on_state_created(self):
        """Applies a decision taken before the state variables existed."""
        if self.load_at_creation is not None:
            saved, self.load_at_creation = self.load_at_creation, None
            self.load(saved)
        elif self.reset_at_creation:
            self.reset_at_creation = False
            self.mergecomp.reset_state()

    def set_restored_file(self, saved, looked_for, path):
        """Records what restore_rank_state found (``saved``, or None) for the next reconcile."""
        self.pending_file = saved
        self.missing_file = None if saved is not None else looked_for
        self.other_worlds = [] if saved is not None else world_sizes_saved(path)
        self.continuing = False
        self.needs_reconcile = True

    def snapshot(self):
        """A copy of the state and the step, for an elastic commit."""
        state = self.mergecomp.existing_state_variables()
        with tf.init_scope():
            return {
                "step": self.mergecomp.step.read_value(),
                "state": None if state is None else [tf.identity(v) for v in state],
            }

    def restore_snapshot(self, saved):
        """Rolls the state and the step back to an elastic commit."""
        with tf.init_scope():
            self.mergecomp.step.assign(saved["step"])
            if self.mergecomp.existing_state_variables() is None:
                return
            if saved["state"] is None:  # committed before the first step
                self.mergecomp.reset_state()
                return
            for variable, value in zip(self.mergecomp.existing_state_variables(), saved["state"]):
                variable.assign(value)

    def on_elastic_reset(self):
        """After an elastic reset: the next trace sees the new world, and the next
        reconcile knows this process trained the state it holds."""
        self.continuing = True
        self.needs_reconcile = True
        self.pending_file = None
        self.missing_file = None
        self.other_worlds = []
        # A process that joined has not checked its description with this one.
        self.mergecomp.forget_traces()


def read(path, rank, world_size):
    """The RankStateFile of ``rank`` of ``world_size`` beside ``path``, or None if there is none."""
    target = rank_state_path(path, rank, world_size)
    if not tf.io.gfile.exists(target):
        return None
    with tf.io.gfile.GFile(target, "rb") as f:
        data = np.load(io.BytesIO(f.read()), allow_pickle=False)
        meta = json.loads(data["meta"].tobytes().decode())
        if meta.get("format") != FILE_FORMAT:
            raise ValueError("%s is not a tf_mergecomp rank-state file (format %r)"
                             % (target, meta.get("format")))
        arrays = [data["state_%d" % i] for i in range(meta["tensors"])]
    return RankStateFile(target, arrays, meta["step"], meta["rank"], meta["world_size"],
                         meta["settings"])


def world_sizes_saved(path):
    """The world sizes of the rank-state files beside checkpoint ``path``."""
    pattern = "%s.mergecomp-rank*-of-*" % os.fspath(path)
    sizes = set()
    for name in tf.io.gfile.glob(pattern):
        tail = name.rsplit("-of-", 1)[-1]
        if tail.isdigit():
            sizes.add(int(tail))
    return sorted(sizes)


def _describe(rank, status, origin_rank, origin_size, world_size, continuing):
    if status == FOREIGN:
        return "rank %d restored the state saved by rank %d" % (rank, origin_rank)
    if status == OTHER_WORLD:
        if continuing:
            return "rank %d trained its state in a world of %d ranks" % (rank, origin_size)
        return "rank %d restored state saved in a world of %d ranks" % (rank, origin_size)
    if status == MISSING:
        return "rank %d found no state file of its own (%s)" % (
            rank, os.path.basename(rank_state_path("<checkpoint>", rank, world_size)))
    if status == UNUSABLE:
        return "rank %d's state file was written for another model or other settings" % rank
    if status == FRESH:
        return "rank %d holds no state yet" % rank if continuing else (
            "rank %d holds no restored state" % rank)
    return "rank %d holds its own" % rank
