"""MergeComp's state in Keras 3 files, and the per-rank files of docs/checkpoints.md.

A distributed optimizer with a MergeComp carries a ``KerasMergeCompState``
(``optimizer.mergecomp_state``), which Keras 3 saves as a child of the
optimizer in ``.keras`` and ``.weights.h5`` files: MergeComp's step,
``state_origin`` (rank and world size) and this rank's compression state.

Loading it follows the per-rank rule of docs/checkpoints.md: the state is kept
only if, at the first step, every rank holds its own; otherwise it is reset on
every rank with one warning, and every rank takes rank 0's step
(docs/keras3.md, "Checkpoints"). Load before the first training step; a load
after it is a collective of all ranks.
"""

import json

import numpy as np
import tensorflow as tf

from tf_mergecomp import rank_state
from tf_mergecomp.mergecomp import mergecomp_of

try:
    from keras.src.saving.keras_saveable import KerasSaveable
except ImportError:  # a Keras 3 that moved it: no Keras-file saving of the state
    KerasSaveable = object

_META = "meta"


class KerasMergeCompState(KerasSaveable):
    """Saves and loads one MergeComp's step, origin and this rank's state in Keras files."""

    def __init__(self, mergecomp):
        self.mergecomp = mergecomp

    def _obj_type(self):
        # Keras walks a saveable's attributes except a skip set per type; this
        # type's is empty (set here: clear_session() forgets such settings).
        from keras.src.backend.common import global_state

        global_state.set_global_attribute("saving_attr_skiplist_MergeCompState", set())
        return "MergeCompState"

    def save_own_variables(self, store):
        mc = self.mergecomp
        state = mc.existing_state_variables() or []
        meta = {"format": rank_state.FILE_FORMAT, "tensors": len(state),
                "settings": mc.settings_fingerprint()}
        store[_META] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        store["step"] = np.array(mc.step.numpy())
        store["state_origin"] = mc.state_origin.numpy()
        for i, variable in enumerate(state):
            store["state_%d" % i] = variable.numpy()

    def load_own_variables(self, store):
        mc = self.mergecomp
        meta = json.loads(np.asarray(store[_META], np.uint8).tobytes().decode())
        step = int(np.asarray(store["step"]))
        origin = [int(v) for v in np.asarray(store["state_origin"])]
        arrays = [np.asarray(store["state_%d" % i]) for i in range(meta["tensors"])]
        with tf.init_scope():
            mc.step.assign(step)
            mc.state_origin.assign(origin)
        saved = rank_state.RankStateFile("the Keras file's MergeComp state", arrays, step,
                                         origin[0], origin[1], meta["settings"])
        state = mc.rank_state
        state.needs_reconcile = True
        if mc.existing_state_variables() is None:
            # Created at the first trace, loaded then; the ranks then agree on it.
            state.load_at_creation = saved if arrays else None
            return
        if arrays:
            state.load(saved)
        else:
            mc.reset_state()
        state.reconcile()


_COMPILED_WITH = ("a Keras 3 optimizer or model compiled with "
                  "tf_mergecomp.keras.DistributedOptimizer(..., compression=MergeComp(...))")


def save_rank_state(owner, path):
    """Writes this rank's MergeComp state beside checkpoint ``path``
    (``<path>.mergecomp-rank<r>-of-<W>``); call it on every rank. ``owner``: a
    MergeComp, or the model or optimizer using it. Returns the file written."""
    return mergecomp_of(owner, _COMPILED_WITH).rank_state.save_beside(path)


def restore_rank_state(owner, path):
    """Finds this rank's state beside checkpoint ``path``; call it on every rank,
    after loading the checkpoint. Returns the file found, or None (the state is
    then reset on every rank at the first step, with one warning)."""
    return mergecomp_of(owner, _COMPILED_WITH).rank_state.restore_from(path)
