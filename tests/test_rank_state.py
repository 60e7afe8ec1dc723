"""Per-rank compression state across checkpoints, broadcasts and elastic resizes, on real ranks."""

import os
import stat

import pytest

from tests import horovodrun

RESET = "was reset to its initial value on every rank"


def _one_warning(results, ranks):
    """Rank 0 logged exactly one reset warning; the other ranks none."""
    assert len([w for w in results[0] if RESET in w]) == 1, results[0]
    for rank in ranks:
        if rank:
            assert results[rank] == [], results[rank]


@pytest.mark.multiworker
def test_rank0_checkpoint_resets_state_or_resumes_exactly(tmp_path):
    # DGC: a memory of two buffers (momentum, accumulation); the files do not depend on it.
    compressors = ("dgc",)
    results, _ = horovodrun.run("checkpoint_rank0.py", np=2, args=[tmp_path, ",".join(compressors)],
                                timeout=300)
    for compressor in compressors:
        by_rank = [{r["scenario"]: r for r in results[rank] if r.get("compressor") == compressor}
                   for rank in (0, 1)]
        # Stock practice (rank 0 saves, every rank restores): every rank's own
        # state was non-zero, yet after the restore every rank holds zeros, not
        # rank 0's; rank 0 says so once.
        stock = [by_rank[rank]["stock"] for rank in (0, 1)]
        for r in stock:
            assert r["own_state_abs_sum"] > 0 and r["restored_abs_sum"] == 0.0, r
            assert not r["outcome"]["kept"] and r["outcome"]["statuses"] == [1, 2], r
            assert r["outcome"]["step"] == 6 and r["step"] == 12, r
        _one_warning({rank: stock[rank]["warnings"] for rank in (0, 1)}, (0, 1))
        assert "rank 1 restored the state saved by rank 0" in stock[0]["warnings"][0]
        # Every rank's state saved beside the checkpoint: the resumed run is
        # the uninterrupted one, bit for bit, with no warning.
        for scenario in ("keras_weights", "keras_h5", "tape"):
            for rank in (0, 1):
                r = by_rank[rank][scenario]
                assert r["max_difference"] == 0.0, (compressor, scenario, r)
                assert r["outcome"]["kept"] and r["warnings"] == [], (compressor, scenario, r)
        assert by_rank[1]["keras_weights"]["found"].endswith("epoch2.mergecomp-rank1-of-2")
        assert os.path.exists(by_rank[0]["tape"]["path"] + ".mergecomp-rank1-of-2")

    # The same checkpoints in a world of one rank: reset, with the reason named.
    results, _ = horovodrun.run("checkpoint_other_world.py", np=1, args=[tmp_path, "dgc"])
    stock, ours = results[0]
    for r in (stock, ours):
        assert r["state_abs_sum"] == 0.0 and r["step"] == 6 and not r["outcome"]["kept"], r
        assert len(r["warnings"]) == 1 and RESET in r["warnings"][0], r
    assert "rank 0 restored state saved in a world of 2 ranks" in stock["warnings"][0]
    assert ours["found"] is None
    assert "found no state file of its own" in ours["warnings"][0]
    assert "state files of a world of 2 ranks" in ours["warnings"][0]


@pytest.mark.multiworker
def test_step_travels_with_the_optimizer_variables_and_comes_from_rank0(tmp_path):
    results, _ = horovodrun.run("step_shared.py", np=2, args=[tmp_path])
    per_rank = [{r["check"]: r for r in results[rank]} for rank in (0, 1)]
    for rank in (0, 1):
        checks = per_rank[rank]
        listed = checks["variables"]
        assert listed["step_listed"] and not listed["state_listed"] and not listed["origin_listed"]
        assert listed["listed"] == listed["optimizer_own"] + 1
        assert checks["broadcast"]["step"] == 100  # rank 0's
        h5 = checks["h5"]
        assert h5["step"] == 42 and h5["same_optimizer_values"] and h5["state_abs_sum"] == 0.0, h5
        assert "resumes at rank 0's step 42 with no compression state" in h5["warning"], h5
    for check, steps in (("fit_steps_differ", 2), ("tape_steps_differ", 4)):
        # Ranks that started at steps 0 and 5 (3) draw rank 0's random-k indices.
        assert per_rank[0][check]["step"] == per_rank[1][check]["step"] == steps
        assert per_rank[0][check]["checksum"] == per_rank[1][check]["checksum"], check


def _elastic(tmp_path, start, target, compressor, hosts_text=None, extra=(), env=None,
             timeout=150):
    hosts = tmp_path / "hosts"
    hosts.write_text(hosts_text or "localhost:%d\n" % start)
    discovery = tmp_path / "discover.sh"
    discovery.write_text("#!/bin/sh\ncat %s\n" % hosts)
    discovery.chmod(discovery.stat().st_mode | stat.S_IXUSR)
    return horovodrun.run("elastic_resize.py", np=start,
                          args=[hosts, target, compressor] + list(extra),
                          elastic=(1, max(start, target), discovery), timeout=timeout, env=env)


def _check_elastic_end(results, target, before):
    ends = {rank: [r for r in results[rank] if r["check"] == "end"] for rank in results}
    finished = [e[0] for e in ends.values() if e]
    assert sorted(r["rank"] for r in finished) == list(range(target)), ends
    for r in finished:
        assert r["size"] == target and r["finite"], r
        assert r["checksum"] == finished[0]["checksum"], finished
        assert r["step"] == finished[0]["step"], finished
    assert any(r["sizes"][0] == before for r in finished), finished  # a rank of the first world
    assert all(r["sizes"][-1] == target for r in finished), finished
    _one_warning({r["rank"]: [w for w in r["warnings"] if RESET in w] for r in finished},
                 [r["rank"] for r in finished])
    warning = [w for r in finished for w in r["warnings"] if RESET in w][0]
    assert "after an elastic reset" in warning
    assert "trained its state in a world of %d ranks" % before in warning
    return finished, warning


@pytest.mark.multiworker
def test_elastic_shrink_from_two_ranks_to_one(tmp_path):
    results, _ = _elastic(tmp_path, 2, 1, "efsignsgd")
    restores = [r for rank in (0, 1) for r in results[rank] if r["check"] == "restore"]
    assert len(restores) == 2, results
    for r in restores:  # state.restore() brings back the model, the step and the state
        assert r["moved"] and r["weights"] and r["step"] and r["state"], r
    _check_elastic_end(results, target=1, before=2)
    # A custom-loop step traced for two ranks and not rebuilt says so.
    (stale,) = [r for rank in results for r in results[rank] if r["check"] == "stale"]
    assert "this training step was traced for a world of 2 ranks" in stale["error"], stale


@pytest.mark.multiworker
def test_elastic_hierarchical_from_two_machines_to_one(tmp_path):
    # 2 machines x 2 ranks (two-level, each rank keeping its half of each tensor's residual),
    # then one machine of 2 (flat): the state restores at a rollback and restarts after.
    results, _ = _elastic(tmp_path, 4, 2, "efsignsgd", hosts_text="localhost:2\n127.0.0.1:2\n",
                          extra=["hierarchical"], env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"},
                          timeout=300)
    restores = [r for rank in range(4) for r in results[rank] if r["check"] == "restore"]
    assert len(restores) == 4, results
    for r in restores:  # in the first world: two levels, half of every tensor's residual
        assert r["moved"] and r["weights"] and r["step"] and r["state"], r
        assert r["two_level"] and r["state_size"] == 484 // 2, r
    finished, _ = _check_elastic_end(results, target=2, before=4)
    for r in finished:
        assert not r["two_level"]  # one machine now: the flat reduce, the full state
        assert r["state_sizes"] == finished[0]["state_sizes"]
    assert sum(finished[0]["state_sizes"]) == 484  # every element of the 6 tensors


@pytest.mark.multiworker
def test_elastic_grow_from_one_rank_to_two(tmp_path):
    results, _ = _elastic(tmp_path, 1, 2, "dgc")
    finished, warning = _check_elastic_end(results, target=2, before=1)
    joined = [r for r in finished if r["sizes"][0] == 2]
    assert len(joined) == 1, finished
    assert "rank %d holds no state yet" % joined[0]["rank"] in warning


# ---- in one process, no collectives ----------------------------------------------------

def _traced_layout(mc, shapes):
    import tensorflow as tf

    mc.set_gradient_layout([tf.TensorShape(s) for s in shapes], [tf.float32] * len(shapes))
    return mc.state_variables()


def test_reset_state_gives_the_initial_state_powersgd_q_included():
    import numpy as np

    from tf_mergecomp import MergeComp

    shapes = [(6, 4), (5,), (3, 3)]
    mc = MergeComp("powersgd", rank=2)
    state = _traced_layout(mc, shapes)
    initial = [v.numpy().copy() for v in state]
    assert any(np.any(a != 0) for a in initial)  # PowerSGD's Q is not zero
    for v in state:
        v.assign(v + 3.0)
    mc.step.assign(9)
    mc.reset_state()
    for v, a in zip(state, initial):
        np.testing.assert_array_equal(v.numpy(), a)
    assert int(mc.step.numpy()) == 9  # the step is not part of the compression state


def test_rank_state_file_round_trip_and_refusal_of_other_settings(tmp_path):
    import numpy as np
    import pytest

    from tf_mergecomp import MergeComp, rank_state

    shapes = [(4, 3), (7,)]
    mc = MergeComp("dgc", ratio=0.5)
    state = _traced_layout(mc, shapes)
    for i, v in enumerate(state):
        v.assign(np.arange(v.shape[0], dtype=np.float32) + i)
    mc.step.assign(11)
    written = mc.rank_state.write(tmp_path / "ckpt-3", rank=1, world_size=4)
    assert written.endswith("ckpt-3.mergecomp-rank1-of-4") and os.path.exists(written)
    assert rank_state.read(tmp_path / "ckpt-3", 0, 4) is None
    assert rank_state.world_sizes_saved(tmp_path / "ckpt-3") == [4]
    saved = rank_state.read(tmp_path / "ckpt-3", 1, 4)
    assert (saved.rank, saved.world_size, saved.step) == (1, 4, 11)

    other = MergeComp("dgc", ratio=0.5)
    other_state = _traced_layout(other, shapes)
    other.rank_state.load(saved)
    for a, b in zip(state, other_state):
        np.testing.assert_array_equal(a.numpy(), b.numpy())

    different = MergeComp("dgc", ratio=0.5)
    _traced_layout(different, [(4, 3), (8,)])
    with pytest.raises(ValueError, match="another model or other MergeComp settings"):
        different.rank_state.load(saved)
