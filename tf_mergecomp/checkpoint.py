"""Checkpoints that resume MergeComp exactly under Horovod's rank-0 practice.

MergeComp's error-feedback state is each rank's own, so rank 0's checkpoint cannot
resume the other ranks. Here every rank writes its own state beside rank 0's
checkpoint, as ``<path>.mergecomp-rank<r>-of-<W>``, and finds it again on restore.
Without these files the state is reset on every rank at the first step, with one
warning (docs/checkpoints.md, "Whose state a checkpoint holds").

Keras (``fit``), on every rank, instead of a ModelCheckpoint on rank 0 alone::

    callbacks.append(MergeCompModelCheckpoint("ckpt/epoch{epoch}"))   # any ModelCheckpoint options
    ...
    model.load_weights(path)             # every rank (or hvd.load_model / load_model below)
    restore_rank_state(model, path)      # every rank

Custom loops with ``tf.train.Checkpoint`` (or a ``CheckpointManager``)::

    path = save(checkpoint, compression, "ckpt/step")   # every rank; rank 0 writes the checkpoint
    restore(checkpoint, path, compression)              # every rank
"""

import tensorflow as tf

from tf_mergecomp.keras2 import keras
from tf_mergecomp.mergecomp import mergecomp_of
from tf_mergecomp.rank_state import rank_state_path

__all__ = ["MergeCompModelCheckpoint", "load_model", "rank_state_path", "restore",
           "restore_rank_state", "save", "save_rank_state"]


_COMPILED_WITH = ("a Keras optimizer or model compiled with "
                  "hvd.DistributedOptimizer(..., compression=MergeComp(...))")


def _mergecomp_of(owner):
    """The MergeComp of a MergeComp, a Keras optimizer or a compiled Keras model."""
    return mergecomp_of(owner, _COMPILED_WITH)


def save_rank_state(compression, path):
    """Writes this rank's MergeComp state beside checkpoint ``path``; call it on every rank.

    ``compression``: a MergeComp, or the Keras optimizer or model using it.
    Returns the file written (``<path>.mergecomp-rank<r>-of-<W>``).
    """
    return _mergecomp_of(compression).rank_state.save_beside(path)


def restore_rank_state(compression, path):
    """Finds this rank's state beside checkpoint ``path``; call it on every rank.

    The ranks use their saved states only if every rank finds its own (saved in
    a world of the same size, at the same step); otherwise the state is reset to
    its initial value on every rank, with one warning. Called before the first
    step, the ranks decide at the first step (after the checkpoint has been
    restored into the state variables); after it, right away, in a collective of
    all ranks. Returns the file found, or None.
    """
    return _mergecomp_of(compression).rank_state.restore_from(path)


def save(checkpoint, compression, file_prefix=None, root_rank=0):
    """Saves a ``tf.train.Checkpoint`` on rank ``root_rank`` and every rank's state beside it.

    Call it on every rank. ``checkpoint`` is a ``tf.train.Checkpoint`` (saved with
    ``save(file_prefix)``) or a ``tf.train.CheckpointManager`` (``save()``).
    Returns the checkpoint's path on every rank.
    """
    import horovod.tensorflow as hvd

    mergecomp = _mergecomp_of(compression)
    process_set = mergecomp.rank_state.process_set_or_global()
    path = None
    if process_set.rank() == root_rank:
        if isinstance(checkpoint, tf.train.CheckpointManager):
            path = checkpoint.save()
        else:
            if file_prefix is None:
                raise ValueError("save(tf.train.Checkpoint, ...) needs file_prefix")
            path = checkpoint.save(file_prefix)
    path = hvd.broadcast_object(path, root_rank=root_rank, name="mergecomp.checkpoint_path",
                                process_set=process_set)
    save_rank_state(mergecomp, path)
    _all_written(process_set)
    return path


def restore(checkpoint, path, compression):
    """``checkpoint.restore(path)`` then ``restore_rank_state``; call it on every rank.
    Returns the checkpoint's restore status."""
    status = checkpoint.restore(path)
    restore_rank_state(compression, path)
    return status


def load_model(filepath, compression, **kwargs):
    """``hvd.load_model(filepath, compression=compression, **kwargs)`` then
    ``restore_rank_state``; call it on every rank."""
    import horovod.tensorflow.keras as hvd_keras

    model = hvd_keras.load_model(filepath, compression=compression, **kwargs)
    restore_rank_state(compression, filepath)
    return model


class MergeCompModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keras ``ModelCheckpoint`` for Horovod with MergeComp: use it on EVERY rank.

    Rank 0 saves the model as ``tf.keras.callbacks.ModelCheckpoint`` with the same
    arguments would; at each of those moments every rank writes its MergeComp
    state beside it. Rank 0 decides when to save and the path (``save_best_only``
    and metrics in the file name may differ across ranks) and tells the others.

    Args:
      filepath, **kwargs: as for ``tf.keras.callbacks.ModelCheckpoint``.
      compression: the MergeComp (default: the model optimizer's).
      root_rank: the rank that saves the model.
    """

    def __init__(self, filepath, compression=None, root_rank=0, **kwargs):
        super().__init__(filepath, **kwargs)
        self._compression = compression
        self._root_rank = root_rank
        self._requested_path = None

    def _save_handler(self, filepath):
        # ModelCheckpoint's decision to save, on this rank; rank 0's is used.
        self._requested_path = filepath

    def _save_model(self, epoch, batch, logs):
        import horovod.tensorflow as hvd

        mergecomp = _mergecomp_of(self._compression if self._compression is not None
                                  else self.model)
        process_set = mergecomp.rank_state.process_set_or_global()
        self._requested_path = None
        verbose = self.verbose
        if process_set.rank() != self._root_rank:
            self.verbose = 0  # "saving model to ..." once, from the rank that saves it
        try:
            super()._save_model(epoch, batch, logs)
        finally:
            self.verbose = verbose
        path = hvd.broadcast_object(self._requested_path, root_rank=self._root_rank,
                                    name="mergecomp.model_checkpoint_path",
                                    process_set=process_set)
        if path is None:
            return
        if process_set.rank() == self._root_rank:
            super()._save_handler(path)
        save_rank_state(mergecomp, path)
        _all_written(process_set)


def _all_written(process_set):
    """Returns once every rank has written its part: a rank that goes on to
    read the checkpoint (or ends the job) then finds it complete."""
    import horovod.tensorflow as hvd

    hvd.allreduce(tf.constant(0, tf.int32), op=hvd.Sum, name="mergecomp.checkpoint_written",
                  process_set=process_set)
