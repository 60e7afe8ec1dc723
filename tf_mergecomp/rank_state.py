"""Whose compression state a MergeComp holds, and what the ranks do about it.

Error-feedback residuals, SIGNUM's and DGC's momenta are each rank's own: they
hold what this rank's compressor has not sent yet. PowerSGD's Q is the same on
every rank. The step counter, which seeds the codecs' random draws, must be the
same on every rank. Horovod's usual practice (rank 0 saves, every rank restores
rank 0's checkpoint, rank 0 broadcasts) therefore gives every rank rank 0's
residuals, and an elastic resize leaves the survivors with state of another
world. This module makes the ranks agree instead:

* ``MergeComp.state_origin`` (checkpointed with the state) records the rank and
  world size whose state the variables hold.
* ``reconcile`` runs once at the first trace of the reduce function (all ranks
  trace their first step together: the rank agreement check relies on the
  same), at each elastic sync, and when ``restore_rank_state`` is called after
  the first step. Every rank says what it holds (``FRESH``: nothing restored;
  ``OWN``: its own state for this world size; or something it must not train
  on); the ranks keep their state only when every rank holds its own state (at
  the same step) or every rank is fresh. Otherwise the state is reset to its
  initial value on every rank and rank 0 logs one warning naming what each
  rank held. Either way every rank then takes rank 0's step.
* A decision taken before the state variables exist (they are created at the
  first trace, when a checkpoint restored earlier is restored into them)
  applies right after they are created.
* Rank-state files (``<checkpoint path>.mergecomp-rank<r>-of-<W>``, an ``.npz``
  archive written by ``write``) carry one rank's state, the step and the
  settings they belong to; ``tf_mergecomp.checkpoint`` saves and finds them.
"""

import io
import json
import logging
import os

import numpy as np
import tensorflow as tf

from tf_mergecomp import consistency

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


class Tracker:
    """One MergeComp's bookkeeping between a restore and the ranks' agreement.
    Plain Python state: nothing here is checkpointed."""

    def __init__(self):
        self.needs_reconcile = True
        self.pending_file = None   # a RankStateFile read by restore_rank_state, not yet agreed on
        self.missing_file = None   # the file restore_rank_state looked for and did not find
        self.other_worlds = []     # world sizes of the rank-state files found beside it instead
        self.continuing = False    # set by an elastic reset: this process trained the state it holds
        self.load_at_creation = None   # RankStateFile to load once the variables exist
        self.reset_at_creation = False
        self.process_set = None    # the MergeComp's process set, known from its first trace
        self.last_outcome = None   # what the last reconcile decided (for tests and debugging)


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


def find_mergecomp(owner):
    """The MergeComp of a MergeComp, of a Keras optimizer built by
    ``hvd.DistributedOptimizer(..., compression=MergeComp(...))`` (also inside a
    loss-scale optimizer), or of a Keras model compiled with one; else None."""
    from tf_mergecomp.mergecomp import MergeComp

    seen = 0
    while owner is not None and seen < 4:  # model -> optimizer -> inner optimizer
        if isinstance(owner, MergeComp):
            return owner
        if isinstance(getattr(owner, "mergecomp", None), MergeComp):
            return owner.mergecomp
        owner = getattr(owner, "inner_optimizer", None) or getattr(owner, "optimizer", None)
        seen += 1
    return None


def process_set_of(mergecomp):
    import horovod.tensorflow as hvd

    return mergecomp._rank_state.process_set or hvd.global_process_set


def settings_fingerprint(mergecomp):
    """Identifies what the state variables mean: the gradient list and the
    codec and memory settings (not the partition: the state does not depend
    on it). None before the first trace."""
    if mergecomp._layout is None:
        return None
    return consistency.fingerprint({
        "layout": mergecomp._layout.describe(),
        "compressor": [mergecomp.compressor.name, mergecomp.compressor.params],
        "memory": [mergecomp.memory.name, mergecomp.memory.params],
    })


def keeps_state(mergecomp):
    """Whether this MergeComp has per-tensor state at all (nothing to agree on otherwise)."""
    if mergecomp._layout is not None:
        return bool(mergecomp._state)
    from tf_mergecomp.compressors.base import Compressor

    codec_state = type(mergecomp.compressor).codec_state_size is not Compressor.codec_state_size
    return bool(mergecomp.memory.state_names) or codec_state


# ---- files ---------------------------------------------------------------------------

def write(mergecomp, path, rank, world_size):
    """Writes this rank's state to ``rank_state_path(path, rank, world_size)``; returns that path."""
    target = rank_state_path(path, rank, world_size)
    arrays = {"state_%d" % i: v.numpy() for i, v in enumerate(mergecomp._state or [])}
    meta = {
        "format": FILE_FORMAT, "rank": int(rank), "world_size": int(world_size),
        "step": int(mergecomp.step.numpy()), "settings": settings_fingerprint(mergecomp),
        "tensors": len(arrays),
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


def _load(mergecomp, saved):
    """Assigns a RankStateFile's arrays to the (existing) state variables."""
    if not saved.arrays:  # saved before the first step: the initial state
        mergecomp.reset_state()
        return
    state = mergecomp._state or []
    if saved.settings != settings_fingerprint(mergecomp) or len(saved.arrays) != len(state):
        raise ValueError(
            "%s was written for another model or other MergeComp settings (%d state tensors, "
            "this MergeComp has %d)" % (saved.path, len(saved.arrays), len(state)))
    with tf.init_scope():
        for variable, value in zip(state, saved.arrays):
            variable.assign(value)


# ---- the ranks' agreement ------------------------------------------------------------

def _local_status(mergecomp, rank, world_size):
    tracker = mergecomp._rank_state
    if tracker.pending_file is not None:
        saved = tracker.pending_file
        current = settings_fingerprint(mergecomp)
        if saved.arrays and current is not None and saved.settings != current:
            return UNUSABLE
        return OWN
    if tracker.missing_file is not None:
        return MISSING
    origin_rank, origin_size = (int(v) for v in mergecomp.state_origin.numpy())
    if tracker.continuing:
        # An elastic reset: this process trained what it holds (its rank
        # number may change, it is still its own), unless it trained nothing.
        if mergecomp._state is None:
            return FRESH
        return OWN if origin_size == world_size else OTHER_WORLD
    if origin_size < 0:
        return FRESH
    if origin_size != world_size:
        return OTHER_WORLD
    return OWN if origin_rank == rank else FOREIGN


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


def reconcile_if_needed(mergecomp, communicator):
    """Called by the engine at each trace: reconciles at the first one."""
    tracker = mergecomp._rank_state
    tracker.process_set = communicator.process_set
    if not tracker.needs_reconcile:
        return
    with tf.init_scope():
        if not tf.executing_eagerly():
            # TF1-style graphs: no collectives at trace time; nothing to agree on.
            tracker.needs_reconcile = False
            return
        reconcile(mergecomp)


def reconcile(mergecomp, process_set=None):
    """Collective over the MergeComp's process set: every rank must call it.

    Decides whether the ranks keep the state they hold (each its own, or all
    fresh) or reset it everywhere (with one warning, on rank 0), and gives every
    rank rank 0's step. Returns the outcome as a dict.
    """
    import horovod.tensorflow as hvd

    tracker = mergecomp._rank_state
    if process_set is None:
        process_set = process_set_of(mergecomp)
    rank, world_size = process_set.rank(), process_set.size()
    status = _local_status(mergecomp, rank, world_size)
    step = tracker.pending_file.step if status == OWN and tracker.pending_file else None
    if step is None:
        step = int(mergecomp.step.numpy())
    origin = [int(v) for v in mergecomp.state_origin.numpy()]
    mine = tf.constant([[status, step, origin[0], origin[1], int(tracker.continuing)]], tf.int64)
    with tf.init_scope():
        everyone = hvd.allgather(mine, name="mergecomp.rank_state", process_set=process_set).numpy()
    statuses, steps = everyone[:, 0], everyone[:, 1]
    all_own = bool(np.all(statuses == OWN)) and bool(np.all(steps == steps[0]))
    all_fresh = bool(np.all(statuses == FRESH))
    keep = all_own or all_fresh
    has_state = keeps_state(mergecomp)

    with tf.init_scope():
        mergecomp.step.assign(int(steps[0]))
        if keep and tracker.pending_file is not None:
            if mergecomp._state is not None:
                _load(mergecomp, tracker.pending_file)
            else:
                tracker.load_at_creation = tracker.pending_file
        elif not keep:
            tracker.load_at_creation = None
            if mergecomp._state is not None:
                mergecomp.reset_state()
            else:
                tracker.reset_at_creation = True
        mergecomp.state_origin.assign([rank, world_size])

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
        if tracker.missing_file is not None and tracker.other_worlds:
            held += " (beside the checkpoint: state files of a world of %s ranks)" % " or ".join(
                str(n) for n in tracker.other_worlds)
        message = (
            "tf_mergecomp: MergeComp's compression state (error-feedback memory%s) was reset "
            "to its initial value on every rank of this world of %d (%s: %s). Training "
            "continues at rank 0's step %d.%s"
            % ("; PowerSGD's Q" if mergecomp.compressor.name == "powersgd" else "", world_size,
               reason, held, int(steps[0]),
               "" if elastic else " To resume exactly, save each rank's state beside the "
               "checkpoint and restore it on every rank (tf_mergecomp.checkpoint)."))
    elif has_state and all_fresh and int(steps[0]) > 0 and not elastic:
        message = (
            "tf_mergecomp: MergeComp's compression state was reset: training resumes at rank "
            "0's step %d with no compression state on any rank (the checkpoint did not hold it: "
            "HDF5 and .keras files hold the optimizer's variables only, or MergeComp was not "
            "in the checkpoint). To resume exactly, save each rank's state beside the "
            "checkpoint (tf_mergecomp.checkpoint)." % int(steps[0]))
    if message and rank == 0:
        logger.warning(message)

    tracker.pending_file = None
    tracker.missing_file = None
    tracker.other_worlds = []
    tracker.continuing = False
    tracker.needs_reconcile = False
    tracker.last_outcome = {"kept": keep, "statuses": [int(s) for s in statuses],
                            "step": int(steps[0]), "warning": message}
    return tracker.last_outcome


def on_state_created(mergecomp):
    """Applies a decision taken before the state variables existed."""
    tracker = mergecomp._rank_state
    if tracker.load_at_creation is not None:
        saved, tracker.load_at_creation = tracker.load_at_creation, None
        _load(mergecomp, saved)
    elif tracker.reset_at_creation:
        tracker.reset_at_creation = False
        mergecomp.reset_state()


def world_sizes_saved(path):
    """The world sizes of the rank-state files beside checkpoint ``path``."""
    pattern = "%s.mergecomp-rank*-of-*" % os.fspath(path)
    sizes = set()
    for name in tf.io.gfile.glob(pattern):
        tail = name.rsplit("-of-", 1)[-1]
        if tail.isdigit():
            sizes.add(int(tail))
    return sorted(sizes)


def set_restored_file(mergecomp, saved, looked_for, path):
    """Records what restore_rank_state found (``saved``, or None) for the next reconcile."""
    tracker = mergecomp._rank_state
    tracker.pending_file = saved
    tracker.missing_file = None if saved is not None else looked_for
    tracker.other_worlds = [] if saved is not None else world_sizes_saved(path)
    tracker.continuing = False
    tracker.needs_reconcile = True


# ---- elastic training ----------------------------------------------------------------

def snapshot(mergecomp):
    """A copy of the state and the step, for an elastic commit."""
    with tf.init_scope():
        return {
            "step": mergecomp.step.read_value(),
            "state": None if mergecomp._state is None else [tf.identity(v) for v in mergecomp._state],
        }


def restore_snapshot(mergecomp, saved):
    """Rolls the state and the step back to an elastic commit."""
    with tf.init_scope():
        mergecomp.step.assign(saved["step"])
        if mergecomp._state is None:
            return
        if saved["state"] is None:  # committed before the first step
            mergecomp.reset_state()
            return
        for variable, value in zip(mergecomp._state, saved["state"]):
            variable.assign(value)


def on_elastic_reset(mergecomp):
    """After an elastic reset: the next trace sees the new world, and the next
    reconcile knows this process trained the state it holds."""
    tracker = mergecomp._rank_state
    tracker.continuing = True
    tracker.needs_reconcile = True
    tracker.pending_file = None
    tracker.missing_file = None
    tracker.other_worlds = []
    mergecomp._eager_reduce = None
    # A process that joined has not checked its description with this one.
    mergecomp._agreed_description = None
