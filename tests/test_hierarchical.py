"""The two-level reduce (tf_mergecomp/hierarchical.py): settings refused at construction,
the machine layout's checks, and real runs of 2 machines x 2 ranks on this host."""

import json

import numpy as np
import pytest

from tf_mergecomp import MergeComp
from tf_mergecomp import hierarchical

TWO_BY_TWO = "localhost:2,127.0.0.1:2"
DYNAMIC = {"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}


@pytest.mark.parametrize("value", ["yes", 1, 0, "auto"])
def test_bad_choice_is_refused_naming_the_choices(value):
    with pytest.raises(ValueError, match="hierarchical must be one of True.*False.*None"):
        MergeComp("efsignsgd", hierarchical=value)


def test_codec_with_its_own_group_reduce_is_refused():
    with pytest.raises(ValueError, match="hierarchical=True is not available for 'powersgd'"):
        MergeComp("powersgd", hierarchical=True)
    MergeComp("powersgd", hierarchical=False)


def test_default_is_flat_and_describe_unchanged():
    flat = MergeComp("efsignsgd")
    assert flat.hierarchical is None and "hierarchical" not in flat.describe()
    forced = MergeComp("efsignsgd", hierarchical=True)
    assert forced.describe()["hierarchical"] is True
    assert forced.describe()["machines"] is None  # known from the first trace


def test_two_level_group_codecs_only_when_the_search_may_choose():
    from tf_mergecomp.levels import split_level

    assert split_level("efsignsgd/two-level") == ("efsignsgd", True)
    assert split_level("none") == ("none", False)
    searched = MergeComp("topk")
    assert searched.group_codec_names == ("topk", "none", "fp16", "topk/two-level",
                                          "none/two-level", "fp16/two-level")
    assert searched.two_level_codec_choices == ()  # known from a trace on several machines
    assert searched.level_identity() == {}
    searched.set_partition([1], group_codecs=["topk/two-level", "none"])  # accepted
    for fixed in (MergeComp("topk", hierarchical=False), MergeComp("topk", hierarchical=True),
                  MergeComp("powersgd")):
        assert fixed.group_codec_names == fixed.codec_choices
        with pytest.raises(ValueError, match="not one of"):
            fixed.set_partition([1], group_codecs=[fixed.compressor_name + "/two-level"] * 2)


def test_layout_shards_and_process_set_ranks():
    layout = hierarchical.MachineLayout(rank=5, size=8, ranks_per_machine=4, machines=2)
    assert (layout.local_rank, layout.machine, layout.two_level) == (1, 1, True)
    assert layout.machine_ranks(1) == [4, 5, 6, 7]
    assert layout.cross_ranks(1) == [1, 5]
    assert layout.all_process_set_ranks() == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 4], [1, 5],
                                              [2, 6], [3, 7]]
    assert not hierarchical.MachineLayout(0, 4, 1, 4).two_level
    assert not hierarchical.MachineLayout(0, 4, 4, 1).two_level
    assert [hierarchical.piece_size(n, 4) for n in (1, 4, 5, 8)] == [1, 1, 2, 2]


def test_uneven_machines_are_refused():
    # 3 ranks seen as machines of 2 (horovodrun -H a:2,b:1): refused, saying how to fix it.
    with pytest.raises(ValueError, match="equal numbers of ranks.*-H host1:4,host2:4"):
        hierarchical.MachineLayout(rank=0, size=3, ranks_per_machine=2, machines=2).check()


def test_state_size_is_one_piece_per_tensor():
    mc = MergeComp("efsignsgd", hierarchical=True)
    mc.set_gradient_layout([[5, 3], [7]], ["float32", "float32"])
    mc._state_shards = 2  # as a trace on machines of 2 ranks sets it
    assert [v.shape.num_elements() for v in mc.state_variables()] == [8, 4]


def _flat_state_sizes(ranks_per_machine):
    """In backprop order (the reverse of SHAPES in the worker)."""
    return [hierarchical.piece_size(n, ranks_per_machine) for n in (3, 16, 7, 15)]


def _thread_machines(machines, ranks_per_machine):
    """Machines of ranks as threads (tests/_fake_comm.py): (the world of each machine, the
    world of each local rank across machines, rank -> its ``TwoLevelReduce``)."""
    from tests._fake_comm import FakeWorld

    machine_worlds = [FakeWorld(ranks_per_machine) for _ in range(machines)]
    cross_worlds = [FakeWorld(machines) for _ in range(ranks_per_machine)]

    def two_level_of(rank):
        layout = hierarchical.MachineLayout(rank, machines * ranks_per_machine,
                                            ranks_per_machine, machines)
        return hierarchical.TwoLevelReduce(
            layout, machine_worlds[layout.machine].communicator(layout.local_rank),
            cross_worlds[layout.local_rank].communicator(layout.machine))

    return machine_worlds, cross_worlds, two_level_of


@pytest.mark.parametrize("route", ["ops", "reference"])
@pytest.mark.parametrize("machines, ranks_per_machine", [(2, 3), (3, 4), (2, 2)])
def test_votes_counted_per_machine_are_the_flat_vote(route, machines, ranks_per_machine):
    """Machines of L ranks (threads, tests/_fake_comm.py): with L >= 3 each rank sends the
    machine's count of "+" votes of its shard across machines, ceil(log2(L + 1)) bits per
    element; the vote of the counts is the flat signSGD vote of every rank, bit for bit,
    a tensor NaN on one rank NaN everywhere. With L = 2 the rows cross as they are."""
    import tensorflow as tf

    from tests._fake_comm import FakeWorld
    from tf_mergecomp import compressors, fused_groups, plain_groups, reference

    codec = compressors.get("signsgd")
    if route == "reference":
        codec = reference.plain(codec)
    shapes = [[5, 3], [7], [4, 4], [3]]
    size, seed = machines * ranks_per_machine, 5

    def gradients(rank):
        rng = np.random.RandomState(rank)
        grads = [rng.randn(*shape).astype(np.float32) for shape in shapes]
        if rank == size - 2:
            grads[1][3] = np.nan
        return [tf.constant(g) for g in grads]

    if route == "ops":
        encode = lambda pieces: fused_groups.encode_group(  # noqa: E731
            codec, plain_groups.NO_MEMORY, pieces, [], seed)
        decode = lambda rows, ctx, n, pieces: fused_groups.decode_group(  # noqa: E731
            codec, rows, ctx, n, pieces)
    else:
        encode = lambda pieces: reference.encode_group(codec, pieces, seed)  # noqa: E731
        decode = lambda rows, ctx, n, pieces: reference.decode_group(  # noqa: E731
            codec, rows, ctx, n, pieces)
    _, cross_worlds, two_level_of = _thread_machines(machines, ranks_per_machine)

    def run(rank, flat_communicator):
        two_level = two_level_of(rank)
        grads = gradients(rank)
        flat, _ = reference.reduce_group(codec, plain_groups.NO_MEMORY, grads, [], seed,
                                         flat_communicator, (0, 0))
        levels, flags = two_level.reduce_group_by_votes(grads, (0, 0), encode, decode,
                                                        counter=codec)
        return [o.numpy() for o in flat], [o.numpy() for o in levels], flags.numpy()

    for flat, levels, flags in FakeWorld(size).run(run):
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(flat, levels))
        assert [bool(np.all(np.isnan(o))) for o in levels] == [False, True, False, False]
        assert list(flags) == [0, 1, 0, 0]
    # What one rank sends across machines: its shard's counts (or L rows), then a marker
    # per tensor.
    shard = sum(hierarchical.piece_size(int(np.prod(s)), ranks_per_machine) for s in shapes)
    bits = codec.count_bits(ranks_per_machine)
    if bits < ranks_per_machine:
        across = (shard * bits + 7) // 8 + len(shapes)
    else:
        across = ranks_per_machine * ((shard + 7) // 8 + len(shapes))
    assert {b for world in cross_worlds for b in world.sent_bytes} == {across}


@pytest.mark.parametrize("check_finite", [True, False])
@pytest.mark.parametrize("machines, ranks_per_machine", [(2, 3), (2, 2)])
def test_plain_group_through_horovods_grouped_collectives(machines, ranks_per_machine,
                                                          check_finite):
    """A ``none`` group on two levels (threads, tests/_fake_comm.py): each tensor is
    reduce-scattered in Horovod's parts (a tensor of fewer elements than ranks padded), its
    part averaged across machines and the parts allgathered, with no concatenation: the
    flat average, each tensor's own bytes on each level, a NaN on one rank flagged when
    checked (nonfinite="raise"), not otherwise."""
    import tensorflow as tf

    from tests._fake_comm import FakeWorld

    shapes = [[5, 3], [7], [2], [4, 4]]  # [2]: fewer elements than 3 ranks
    size = machines * ranks_per_machine

    def gradients(rank):
        rng = np.random.RandomState(rank)
        grads = [rng.randn(*shape).astype(np.float32) for shape in shapes]
        if rank == size - 2:
            grads[1][3] = np.nan
        return grads

    machine_worlds, cross_worlds, two_level_of = _thread_machines(machines, ranks_per_machine)

    def run(rank, _):
        outputs, flags = two_level_of(rank).reduce_group_by_horovod(
            [tf.constant(g) for g in gradients(rank)], (0, 0), check_finite)
        return [o.numpy() for o in outputs], flags.numpy()

    want = [np.mean([gradients(r)[i] for r in range(size)], axis=0) for i in range(len(shapes))]
    for outputs, flags in FakeWorld(size).run(run):
        assert list(flags) == ([0, 1, 0, 0] if check_finite else [0, 0, 0, 0])
        for out, expected, shape in zip(outputs, want, shapes):
            assert list(out.shape) == shape
            np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
        assert np.isnan(outputs[1]).tolist() == [i == 3 for i in range(7)]
    # One collective per tensor and level in the fake world (Horovod fuses them into one):
    # reduce-scatter and allgather inside, the allreduce of the part across.
    assert len(machine_worlds[0].calls[0]) == 2 * len(shapes)
    assert len(cross_worlds[0].calls[0]) == len(shapes)
    elements = [max(int(np.prod(s)), ranks_per_machine) for s in shapes]
    part = sum(n // ranks_per_machine + (1 if n % ranks_per_machine else 0) for n in elements)
    assert cross_worlds[0].sent_bytes[0] == 4 * part  # local rank 0 holds the larger parts


def test_count_bits():
    from tf_mergecomp import compressors

    assert [compressors.get("signsgd").count_bits(v) for v in (1, 2, 3, 4, 7, 8, 15, 16)] == [
        1, 2, 2, 3, 3, 4, 4, 5]


@pytest.fixture(scope="module")
def two_by_two():
    """Every rank's results of one run of 2 machines x 2 ranks: {codec: [result per rank]}."""
    from tests import horovodrun

    results, _ = horovodrun.run("engine_hierarchical.py", np=4, args=["two_by_two"],
                                hosts=TWO_BY_TWO, env=DYNAMIC, timeout=420)
    by_codec = {}
    for rank in range(4):
        for result in results[rank]:
            by_codec.setdefault(result["codec"], []).append(result)
    return by_codec


@pytest.mark.multiworker
def test_two_by_two_matches_the_flat_average(two_by_two):
    by_codec = two_by_two
    for codec in ("none", "fp16", "efsignsgd", "topk", "dgc", "qsgd", "randomk", "signum",
                  "terngrad", "onebit", "signsgd"):
        ranks = by_codec[codec]
        assert len(ranks) == 4
        assert all(r["two_level"] for r in ranks)
        assert "HOROVOD_DYNAMIC_PROCESS_SETS=1" in ranks[0]["refused"]
        assert ranks[0]["describe"]["machines"] == [2, 2]
        # 2 groups x (reduce-scatter, exchange across, allgather)
        assert all(r["collectives"] == 6 for r in ranks)
        # Every rank holds the same result.
        assert len({r["checksum"] for r in ranks}) == 1, codec
    assert max(r["max_error"] for r in by_codec["none"]) < 1e-6
    assert max(r["max_error"] for r in by_codec["fp16"]) < 5e-3
    assert max(r["max_error"] for r in by_codec["efsignsgd"]) > 1e-2  # it does compress
    # The memory's residual of one piece of each tensor (1/2 of the flat state).
    assert by_codec["efsignsgd"][0]["state_sizes"] == _flat_state_sizes(2)
    assert by_codec["none"][0]["state_sizes"] == []
    # SIGNUM counts every rank's vote: each rank keeps its whole momentum, as flat.
    assert by_codec["signum"][0]["state_sizes"] == _flat_state_sizes(1)


def _check_votes_match_flat(by_codec, codec, ranks, configs=("ops", "reference", "searched")):
    """The flat vote, bit for bit, for 3 steps (SIGNUM's momentum kept whole on each rank,
    equal to flat's), through ``configs`` (the fused ops, plain TF, a search's two-level
    groups); the tensor that rank 3 holds NaN at the second step is NaN everywhere."""
    assert len(by_codec[codec + "_votes"]) == ranks
    for r in by_codec[codec + "_votes"]:
        assert r["matches_flat"] == dict.fromkeys(configs, True), r
        assert r["state_matches_flat"] == dict.fromkeys(configs, True), r
        # per step, flat: 2 groups x 1 allgather; two levels: 2 x (alltoall,
        # allgather across, allgather inside)
        assert r["collectives"] == dict({"flat": 6}, **dict.fromkeys(configs, 18)), r
        assert (r["state_nonzero"] > 0) == (codec == "signum")
        assert r["nan_tensors"] == [[False] * 4, [False, True, False, False], [False] * 4], r


@pytest.mark.multiworker
@pytest.mark.parametrize("codec", ["signsgd", "signum"])
def test_two_by_two_votes_count_every_rank(two_by_two, codec):
    """Two levels of signSGD and SIGNUM give the flat vote of the 4 ranks, not the vote of
    the 2 machines' averages, which differs on these inputs and is what
    ``two_level_vote="machine"`` gives."""
    _check_votes_match_flat(two_by_two, codec, 4)
    assert all(r["differs_from_machine_votes"] for r in two_by_two[codec + "_votes"])
    for r in two_by_two[codec + "_machine_votes"]:
        assert r["votes_by_machine"], r
        assert r["describe"] == ({"two_level_vote": "machine"} if codec == "signsgd"
                                 else {"beta": 0.9, "two_level_vote": "machine"})
        # signum's momentum: this rank's piece of each tensor
        assert r["state_sizes"] == ([] if codec == "signsgd" else _flat_state_sizes(2))


@pytest.mark.multiworker
def test_two_by_three_votes_are_counted_and_still_the_flat_vote():
    """3 ranks per machine: each rank sends the machine's counts of its shard across
    machines (2 bits per element, not 3 rows of 1), and the vote is still the flat one."""
    from tests import horovodrun

    results, _ = horovodrun.run("engine_hierarchical.py", np=6, args=["two_by_three"],
                                hosts="localhost:3,127.0.0.1:3", env=DYNAMIC, timeout=300)
    by_codec = {}
    for rank in range(6):
        for result in results[rank]:
            by_codec.setdefault(result["codec"], []).append(result)
    for codec in ("signsgd", "signum"):
        _check_votes_match_flat(by_codec, codec, 6, configs=("ops", "searched"))


@pytest.mark.multiworker
def test_two_by_two_float16_inside_the_machine(two_by_two):
    for codec in ("none", "efsignsgd"):
        ranks = two_by_two[codec + "_machine_float16"]
        assert len(ranks) == 4 and len({r["checksum"] for r in ranks}) == 1, codec
        assert all(r["in_float16"] for r in ranks), codec
        assert ranks[0]["describe"]["machine_dtype"] == "float16"
    # The float32 reduce's values are not all float16's; float16's are near the average.
    assert not any(r["in_float16"] for r in two_by_two["none"])
    assert 1e-6 < max(r["max_error"] for r in two_by_two["none_machine_float16"]) < 5e-3


def test_two_level_vote_is_checked_at_construction():
    assert MergeComp("signsgd").compressor.votes_per_rank
    assert MergeComp("signsgd").describe()["compressor_params"] == {}  # as before the setting
    assert not MergeComp("signsgd", two_level_vote="machine").compressor.votes_per_rank
    assert MergeComp("signum").compressor.votes_per_rank
    assert MergeComp("signum").describe()["compressor_params"] == {"beta": 0.9}
    assert not MergeComp("signum", two_level_vote="machine").compressor.votes_per_rank
    with pytest.raises(ValueError, match="signum two_level_vote must be one of rank, machine"):
        MergeComp("signum", two_level_vote="everyone")
    with pytest.raises(ValueError, match="two_level_vote must be one of rank, machine"):
        MergeComp("signsgd", two_level_vote="everyone")


def test_machine_dtype_is_checked_at_construction():
    assert MergeComp("efsignsgd").machine_dtype == "float32"
    assert "machine_dtype" not in MergeComp("efsignsgd", hierarchical=True).describe()
    half = MergeComp("efsignsgd", hierarchical=True, machine_dtype="float16")
    assert half.describe()["machine_dtype"] == "float16"
    with pytest.raises(ValueError, match="machine_dtype must be one of float32, float16"):
        MergeComp("efsignsgd", hierarchical=True, machine_dtype="bfloat16")
    with pytest.raises(ValueError, match="hierarchical=False has none"):
        MergeComp("efsignsgd", hierarchical=False, machine_dtype="float16")


@pytest.mark.multiworker
def test_two_by_two_search_probe_times_two_level_groups(two_by_two):
    for r in two_by_two["probe"] + two_by_two["probe_signsgd"]:  # signsgd: by votes
        assert r["two_level"] and r["shape"] == [2, 2, 3] and r["finite"], r
        assert r["collective_s"] > 0  # reduce-scatter to allgather, stamped


@pytest.mark.multiworker
def test_two_by_two_level_per_group_and_the_state_following_it(two_by_two):
    ranks = two_by_two["mixed"]
    assert len({r["checksum"] for r in ranks}) == 1  # weights identical on all 4
    for r in ranks:
        n = r["n"]
        assert r["two_level"] and n == 6
        assert r["choices"] == ["efsignsgd/two-level", "none/two-level", "fp16/two-level"]
        assert r["searched"] == ["efsignsgd", "none", "efsignsgd/two-level", "none/two-level"]
        assert r["describe"]["group_codecs"] == ["efsignsgd", "efsignsgd/two-level"]
        assert r["describe"]["machines"] == [2, 2]
        # The flat state whole, then this rank's piece of every tensor beside it.
        assert r["sizes"][n:] == [-(-size // 2) for size in r["sizes"][:n]]
        # Group 0 (tensors 0, 1) on two levels, group 1 flat: each fills its own state.
        assert r["full_before"][:2] == [0.0, 0.0] and min(r["full_before"][2:]) > 0
        assert min(r["pieces_before"][:2]) > 0 and r["pieces_before"][2:] == [0.0] * 4
        # Switched: what each held went out with the step, each fills the other.
        assert min(r["full_after"][:2]) > 0 and r["full_after"][2:] == [0.0] * 4
        assert r["pieces_after"][:2] == [0.0, 0.0] and min(r["pieces_after"][2:]) > 0


@pytest.mark.multiworker
def test_two_by_two_nonfinite_gradient(two_by_two):
    for r in two_by_two["nonfinite"]:
        # Tensor 1 of rank 3 held a NaN: all NaN on every rank, the others finite.
        assert r["nan_tensors"] == [False, True, False, False]
        assert r["any_nan"] == [False, True, False, False]
        assert r["step"] == 0  # the step is not counted, as on the flat path


@pytest.mark.multiworker
def test_two_by_two_training_and_sharded_checkpoint(two_by_two):
    for codec in ("efsignsgd", "topk"):
        ranks = two_by_two[codec + "_train"]
        assert all(r["two_level"] for r in ranks)
        assert len({r["checksum"] for r in ranks}) == 1, codec  # weights identical on all 4
        assert len({r["flat_checksum"] for r in ranks}) == 1, codec
        assert ranks[0]["checksum"] != ranks[0]["flat_checksum"]  # another reduce indeed
        for r in ranks:
            assert np.all(np.array(r["state_sizes"]) * 2 - np.array(r["flat_state_sizes"]) <= 1)
            assert sum(r["state_sizes"]) < 0.6 * sum(r["flat_state_sizes"])
            assert r["state_nonzero"] > 0 and r["zeroed"] == 0
            assert r["restore_kept"] and r["restored_matches"], (codec, r)
            assert r["settings_differ"]
        switches = two_by_two[codec + "_switches"]
        assert len({r["checksum"] for r in switches}) == 1, codec
        for r in switches:
            # Group 0 (split at 2): the first two tensors in backprop order, flushed.
            assert r["plain_group_state"] == [0.0, 0.0], (codec, r)
            assert r["stepped_aside_state"] == 0.0


@pytest.mark.multiworker
def test_two_by_two_signums_whole_momentum_flushes_when_plain(two_by_two):
    ranks = two_by_two["signum_switches"]
    assert len({r["checksum"] for r in ranks}) == 1  # weights identical on all 4
    for r in ranks:
        assert r["two_level"] and r["trained_state"] > 0
        # The whole momentum of every tensor, as flat (backprop order: reversed).
        assert r["state_sizes"] == r["flat_state_sizes"][::-1]
        assert r["plain_group_state"] == [0.0, 0.0], r  # sent and cleared
        assert min(r["voting_group_state"]) > 0, r      # still the group's momentum
        assert r["stepped_aside_state"] == 0.0


@pytest.mark.multiworker
def test_two_by_two_with_process_sets_registered_at_init():
    from tests import horovodrun

    # hvd.init(process_sets=tf_mergecomp.hierarchical.machine_process_sets()), not dynamic.
    results, _ = horovodrun.run("engine_hierarchical.py", np=4, args=["registered"],
                                hosts=TWO_BY_TWO, env={"HOROVOD_DYNAMIC_PROCESS_SETS": None},
                                timeout=240)
    for rank in range(4):
        r, restarted = results[rank]
        assert r["two_level"] and r["dynamic"] is None and r["max_error"] < 1e-6, r
        # Horovod restarted with the machines' sets under their ids; the reduce still exact.
        assert restarted["blocker"] is None, restarted
        assert restarted["sets_after"] == restarted["sets_before"]
        assert len(restarted["sets_before"]) == 4  # 2 machines + 2 local ranks across
        assert restarted["max_error"] < 1e-6, restarted


@pytest.mark.multiworker
@pytest.mark.parametrize("hosts", ["localhost:1,127.0.0.1:1", "localhost:2"],
                         ids=["one_rank_per_machine", "one_machine"])
def test_hierarchical_is_flat_bit_for_bit_without_two_levels(hosts):
    from tests import horovodrun

    codecs = ["efsignsgd", "topk"] if hosts.count(":1") else ["efsignsgd"]
    results, _ = horovodrun.run("engine_hierarchical.py", np=2, args=["bitwise", len(codecs)],
                                hosts=hosts, env=DYNAMIC, timeout=240)
    for rank in range(2):
        assert [r["codec"] for r in results[rank]] == codecs + ["disagreement"]
        # Rank 0 hierarchical=True, rank 1 False: refused on both, naming the setting.
        assert "hierarchical" in results[rank][-1]["error"], results[rank][-1]
        for r in results[rank][:-1]:
            assert not r["two_level"]
            assert r["weights_identical"] and r["state_identical"], (hosts, r)


@pytest.mark.multiworker
def test_the_search_chooses_a_level_per_group_on_two_by_two(tmp_path):
    from tests import horovodrun

    # hierarchical=None: the search probes each group codec flat and on two levels.
    results, output = horovodrun.run("search_callback.py", np=4,
                                     args=["efsignsgd", "tape", str(tmp_path / "log")],
                                     hosts=TWO_BY_TWO, env=DYNAMIC, timeout=420)
    ends = [results[rank][-1] for rank in range(4)]
    assert len({r["checksum"] for r in ends}) == 1  # weights identical on all 4
    assert len({json.dumps(r["group_codecs"]) for r in ends}) == 1
    # Horovod restarted between candidates, its dynamic process sets made again.
    assert "restarting Horovod at each switch of candidate" in output
    # The driver gave the search Horovod's fusion (two-level codecs are offered).
    assert len({json.dumps(r["fusion"]) for r in ends}) == 1
    fusion, fusion_layout, expected = ends[0]["fusion"]
    assert fusion == [1e-3, 128 * 2**20] and fusion_layout == (expected or None), ends[0]["fusion"]
    for r in ends:
        assert r["done"] and r["cost"]["traces"] <= 6, r["cost"]
        assert r["cost"]["horovod_restarts"] > 0, r["cost"]
        allowed = {"efsignsgd", "none", "efsignsgd/two-level", "none/two-level"}
        assert r["steps_aside"] or set(r["group_codecs"]) <= allowed, r
    assert "alone with efsignsgd/two-level" in output
    assert "alone with none/two-level" in output


def test_runs_two_levels_names_the_groups_with_three_more_collectives():
    # The search's check of the collectives a step ran counts a two-level group's
    # reduce-scatter and allgather: it asks MergeComp which groups run on two levels.
    mc = MergeComp("efsignsgd", partitions=2)
    assert not mc.runs_two_levels("efsignsgd/two-level")  # one machine: flat
    mc._two_level = object()  # as _connect_levels sets it on machines of several ranks
    assert mc.runs_two_levels("efsignsgd/two-level") and mc.runs_two_levels("none/two-level")
    assert not mc.runs_two_levels("efsignsgd") and not mc.runs_two_levels("none")
    forced = MergeComp("efsignsgd", partitions=2, hierarchical=True)
    forced._two_level = object()
    assert forced.runs_two_levels("efsignsgd")
