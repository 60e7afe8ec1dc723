"""MergeComp under Horovod's elastic training (``horovodrun --min-np/--max-np``).

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)   # nothing else to change

For a MergeComp, an elastic ``State``'s

* commit (``state.commit()``) copies each rank's compression state and the step;
* restore (after a worker failed) goes back to that copy on every surviving rank;
* reset (the world changed) rebuilds the Keras train function and MergeComp's own
  ``tf.function``, whose traces hold the old world size and this rank's old rank
  (the decode op reads one payload row per rank);
* sync (every rank, after a reset and when a worker joins) makes the ranks agree
  on the state as after a checkpoint restore (``tf_mergecomp.rank_state``): each
  keeps its state only if the world size is unchanged and no process joined,
  else it is reset on every rank with one warning; the step is rank 0's. Horovod
  skips the sync when workers were only removed; the ranks then agree at the
  first trace of the rebuilt step, which every rank runs.

``hvd.elastic.KerasState`` (and ``TensorFlowKerasState``) does all this by itself
when its optimizer is a ``DistributedOptimizer`` with a MergeComp. Other states
(a custom loop's ``hvd.elastic.TensorFlowState`` or ``ObjectState``) call ``track``:

    state = hvd.elastic.TensorFlowState(variables, batch=0)
    tf_mergecomp.elastic.track(state, compression, rebuild=make_train_step)
"""

import functools

from tf_mergecomp.mergecomp import find_mergecomp

_INSTALLED_MARK = "_tf_mergecomp_original"
_TRACKED_MARK = "_tf_mergecomp_tracked"


def track(state, compression, rebuild=None):
    """Makes an ``hvd.elastic`` State commit, restore and sync ``compression``'s state.

    Args:
      state: a ``horovod.common.elastic.State`` (KerasState, TensorFlowState,
        ObjectState, ...).
      compression: the MergeComp.
      rebuild: optional callable run after each reset, before the next sync,
        that re-creates the traced train step (Keras: ``KerasState`` passes
        ``model.make_train_function(force=True)``).
    """
    tracked = getattr(state, _TRACKED_MARK, None)
    if tracked is not None:
        if tracked is compression:
            return state
        raise ValueError("this elastic state already tracks another MergeComp")
    setattr(state, _TRACKED_MARK, compression)
    committed = {"snapshot": compression.rank_state.snapshot()}
    original_save, original_restore = state.save, state.restore
    original_sync, original_reset = state.sync, state.reset

    def save():
        original_save()
        committed["snapshot"] = compression.rank_state.snapshot()

    def restore():
        original_restore()
        compression.rank_state.restore_snapshot(committed["snapshot"])

    def reset():
        original_reset()
        compression.rank_state.on_elastic_reset()
        if rebuild is not None:
            rebuild()

    def sync():
        original_sync()
        compression.rank_state.reconcile()
        committed["snapshot"] = compression.rank_state.snapshot()

    # Instance attributes: the State's own commit(), on_reset() and Horovod's
    # elastic run loop call these.
    state.save, state.restore, state.sync, state.reset = save, restore, sync, reset
    return state


def install():
    """Makes ``TensorFlowKerasState`` (and so ``KerasState``) track the MergeComp
    of its optimizer. Idempotent; returns True if installed by this call."""
    try:
        from horovod.tensorflow.elastic import TensorFlowKerasState
    except ImportError:  # a Horovod without elastic support
        return False
    original_init = TensorFlowKerasState.__init__
    if hasattr(original_init, _INSTALLED_MARK):
        return False

    @functools.wraps(original_init)
    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        compression = find_mergecomp(optimizer or getattr(model, "optimizer", None))
        if compression is not None:
            _build_optimizer(optimizer or model.optimizer, model)
        original_init(self, model, optimizer=optimizer, backend=backend, **kwargs)
        if compression is not None:
            track(self, compression, rebuild=functools.partial(_rebuild_keras, self.model))

    setattr(__init__, _INSTALLED_MARK, original_init)
    TensorFlowKerasState.__init__ = __init__
    return True


def _build_optimizer(optimizer, model):
    # Keras >= 2.11 optimizers create their slot variables at the first step. A
    # worker that joins an elastic job has not stepped yet, so its
    # optimizer.variables() would be shorter than the others' and the sync's
    # broadcast of them would hang (docs/checkpoints.md, "Elastic training").
    if hasattr(optimizer, "build") and not getattr(optimizer, "_built", False):
        import tensorflow as tf

        with tf.init_scope():
            optimizer.build(model.trainable_variables)


def _rebuild_keras(model):
    # fit() reuses model.train_function; a fresh one traces for the new world.
    if hasattr(model, "make_train_function"):
        model.make_train_function(force=True)
