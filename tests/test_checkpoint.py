"""tf_mergecomp.checkpoint's per-rank files, in one process (no horovodrun, no collectives).

Rank and world size come from a stand-in process set, so that one process plays rank 1 of 4.
tests/test_rank_state.py runs the same files on real ranks.
"""

import numpy as np
import pytest
import tensorflow as tf

from tf_mergecomp import MergeComp, checkpoint, rank_state


class _ProcessSet:
    def rank(self):
        return 1

    def size(self):
        return 4


def _mergecomp(traced):
    mc = MergeComp("dgc", ratio=0.5)
    mc.rank_state.process_set = _ProcessSet()
    if traced:
        mc.set_gradient_layout([tf.TensorShape((4, 3)), tf.TensorShape((7,))], [tf.float32] * 2)
        for i, v in enumerate(mc.state_variables()):
            v.assign(np.arange(v.shape[0], dtype=np.float32) + i)
    return mc


def test_save_and_restore_rank_state_beside_a_checkpoint(tmp_path, monkeypatch):
    saved = _mergecomp(traced=True)
    saved.step.assign(11)
    path = tmp_path / "ckpt-3"
    written = checkpoint.save_rank_state(saved, path)
    assert written == rank_state.rank_state_path(path, 1, 4)
    found = rank_state.read(path, 1, 4)
    assert (found.rank, found.world_size, found.step) == (1, 4, 11)

    fresh = _mergecomp(traced=False)  # before the first step: decided at it
    assert checkpoint.restore_rank_state(fresh, path) == written
    assert fresh.rank_state.pending_file.path == written and fresh.rank_state.needs_reconcile

    traced = _mergecomp(traced=True)  # after it: the ranks decide at once
    reconciled = []
    monkeypatch.setattr(traced.rank_state, "reconcile", reconciled.append)
    assert checkpoint.restore_rank_state(traced, tmp_path / "other") is None
    assert reconciled == [traced.rank_state.process_set]
    assert traced.rank_state.missing_file == rank_state.rank_state_path(
        tmp_path / "other", 1, 4)


def test_an_owner_without_a_mergecomp_is_refused(tmp_path):
    message = ("expected a MergeComp, or a Keras optimizer or model compiled with "
               "hvd.DistributedOptimizer(..., compression=MergeComp(...)); got 'sgd'")
    for call in (checkpoint.save_rank_state, checkpoint.restore_rank_state):
        with pytest.raises(TypeError) as error:
            call("sgd", tmp_path / "ckpt")
        assert str(error.value) == message
