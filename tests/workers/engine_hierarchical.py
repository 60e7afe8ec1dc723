"""The two-level reduce on machines of several ranks (run with horovodrun -H a:2,b:2).

``two_by_two``: ``exact``, ``train``, then a level per group. ``exact``: one reduce per
codec of known per-rank gradients (the flat average is computed here from every rank's
seed), without dynamic process sets first (refused), then with them,
and of a gradient that rank 3 holds non-finite.
``train``: a few training steps per compressing codec, hierarchical against flat:
weights, state sizes, a rank-state checkpoint round trip of the sharded state, then a
group turned plain and MergeComp stepping aside (the sharded state flushed).
``two_by_three`` (horovodrun -H a:3,b:3): signSGD's and SIGNUM's votes, counted per machine.
``registered``: one exact reduce with the process sets given to ``hvd.init``.
``bitwise``: hierarchical=True against hierarchical=False, same steps (one rank per
machine, or one machine: both must be the flat reduce, bit for bit), then rank 0 asking
for two levels and the others not (refused on every rank).
"""

import os
import sys
import tempfile

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

from tests.horovodrun import report
from tests.workers.common import (classification_data, small_classifier, tape_train_step,
                                  weights_checksum)
from tf_mergecomp import MergeComp, RankMismatchError, compressors, reference
from tf_mergecomp import checkpoint as mergecomp_checkpoint
from tf_mergecomp.hierarchical import machine_process_sets
from tf_mergecomp.search.recorder import ExchangeProbe

mode = sys.argv[1]
if mode == "registered":  # the sets registered at start, no dynamic process sets
    hvd.init(process_sets=machine_process_sets())
else:
    hvd.init()
SHAPES = [[5, 3], [7], [4, 4], [3]]


def gradients_of(rank, step=0):
    rng = np.random.RandomState(10 + rank + 100 * step)
    return [rng.randn(*shape).astype(np.float32) for shape in SHAPES]


def reduce_once(mc):
    reduce = mc.make_reduce_fn()
    out = reduce([tf.constant(g) for g in gradients_of(hvd.rank())])
    return [o.numpy() for o in out]


def machine_votes():
    """signSGD's vote of the machines' averages (ties +1): what two levels would give
    if a machine's average voted for its ranks."""
    votes, ranks = [], hvd.local_size()
    for i in range(len(SHAPES)):
        total = sum(np.where(np.mean([gradients_of(r)[i] for r in range(m * ranks,
                                                                        (m + 1) * ranks)],
                                     axis=0) < 0, -1.0, 1.0) for m in range(hvd.cross_size()))
        votes.append(np.where(total >= 0, 1.0, -1.0))
    return votes


def in_float16(outputs):
    return all(bool(np.all(o.astype(np.float16).astype(np.float32) == o)) for o in outputs)


def run_exact():
    expected = [np.mean([gradients_of(r)[i] for r in range(hvd.size())], axis=0, dtype=np.float64)
                for i in range(len(SHAPES))]
    # Without dynamic process sets (and none registered at hvd.init), refused on every rank.
    dynamic = os.environ.pop("HOROVOD_DYNAMIC_PROCESS_SETS", None)
    try:
        reduce_once(MergeComp("none", partitions=2, hierarchical=True))
        refused = None
    except ValueError as error:
        refused = str(error)
    if dynamic is not None:
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = dynamic
    for codec in ("none", "fp16", "efsignsgd", "topk", "dgc", "qsgd", "randomk", "signum",
                  "terngrad", "onebit", "signsgd"):
        params = {"ratio": 0.5} if codec in ("topk", "dgc", "randomk") else {}
        mc = MergeComp(codec, partitions=2, hierarchical=True, **params)
        before = int(mc.collectives_executed.numpy())
        out = reduce_once(mc)
        if codec in ("efsignsgd", "signsgd"):
            # The search's probe times a two-level group as it runs in training.
            probe = ExchangeProbe(mc)
            times = probe.run([2], repeats=2)
            report(codec="probe" + ("" if codec == "efsignsgd" else "_signsgd"),
                   two_level=probe.mergecomp.two_level, shape=list(times.shape),
                   finite=bool(np.all(np.isfinite(times))),
                   collective_s=float(times[:, :, 1].min()))
        report(codec=codec, refused=refused, two_level=mc.two_level,
               describe=mc.describe(), in_float16=in_float16(out),
               collectives=int(mc.collectives_executed.numpy()) - before,
               max_error=max(float(np.max(np.abs(o - e))) for o, e in zip(out, expected)),
               checksum=float(sum(np.float64(o).sum() * (i + 1) for i, o in enumerate(out))),
               state_sizes=[int(v.shape.num_elements()) for v in mc.state_variables()])
    run_votes()
    # Opted out: each machine's average votes.
    by_machines = machine_votes()
    for codec in ("signsgd", "signum"):
        by_machine = MergeComp(codec, partitions=2, hierarchical=True, two_level_vote="machine")
        machine_out = reduce_once(by_machine)
        report(codec=codec + "_machine_votes",
               votes_by_machine=all(np.array_equal(a, b)
                                    for a, b in zip(machine_out, by_machines)),
               describe=by_machine.describe().get("compressor_params"),
               state_sizes=[int(v.shape.num_elements()) for v in by_machine.state_variables()])
    # A NaN in one tensor of rank 3: that tensor all NaN everywhere, the others exact.
    mc = MergeComp("efsignsgd", partitions=2, hierarchical=True)
    grads = gradients_of(hvd.rank())
    if hvd.rank() == 3:
        grads[1][2] = np.nan
    out = [o.numpy() for o in mc.make_reduce_fn()([tf.constant(g) for g in grads])]
    report(codec="nonfinite", nan_tensors=[bool(np.all(np.isnan(o))) for o in out],
           any_nan=[bool(np.any(np.isnan(o))) for o in out], step=int(mc.step.numpy()))
    # float16 inside the machine: every value ends as the float16 the allgather carried.
    for codec in ("none", "efsignsgd"):
        mc = MergeComp(codec, partitions=2, hierarchical=True, machine_dtype="float16")
        out = reduce_once(mc)
        report(codec=codec + "_machine_float16", describe=mc.describe(),
               in_float16=in_float16(out),
               max_error=max(float(np.max(np.abs(o - e))) for o, e in zip(out, expected)),
               checksum=float(sum(np.float64(o).sum() * (i + 1) for i, o in enumerate(out))))


def run_votes(configs=("ops", "reference", "searched")):
    """signSGD and SIGNUM on two levels count every rank's vote (with 3 ranks per machine
    or more, as counts): the flat reduce's result bit for bit, step after step (SIGNUM's
    momentum whole on each rank), through ``configs``: the fused ops, the plain-TF path and
    a search's two-level groups. Rank 3 holds a NaN at the second step of three."""
    by_machines = machine_votes()
    steps = 3
    for codec in ("signsgd", "signum"):
        results, collectives, states = {}, {}, {}
        for name, compressor, hierarchical_choice in (
                ("flat", codec, False), ("ops", codec, True),
                ("reference", reference.plain(compressors.get(codec)), True),
                ("searched", codec, None)):
            if name != "flat" and name not in configs:
                continue
            mc = MergeComp(compressor, partitions=[2], hierarchical=hierarchical_choice)
            if hierarchical_choice is None:
                mc.set_partition([2], group_codecs=[codec + "/two-level"] * 2)
            reduce = mc.make_reduce_fn()
            before = int(mc.collectives_executed.numpy())
            results[name] = []
            for step in range(steps):
                grads = gradients_of(hvd.rank(), step)
                if step == 1 and hvd.rank() == 3:
                    grads[1][2] = np.nan
                results[name].append([o.numpy() for o in reduce([tf.constant(g)
                                                                  for g in grads])])
            collectives[name] = int(mc.collectives_executed.numpy()) - before
            states[name] = [v.numpy() for v in
                            (mc.existing_state_variables() or [])[:mc.num_tensors]]
        report(codec=codec + "_votes", collectives=collectives,
               nan_tensors=[[bool(np.all(np.isnan(o))) for o in outputs]
                            for outputs in results["flat"]],
               matches_flat={name: all(np.array_equal(a, b, equal_nan=True)
                                       for step in range(steps)
                                       for a, b in zip(results["flat"][step],
                                                       results[name][step]))
                             for name in configs},
               state_matches_flat={name: len(states[name]) == len(states["flat"]) and all(
                   np.array_equal(a, b) for a, b in zip(states["flat"], states[name]))
                   for name in configs},
               state_nonzero=float(sum(np.abs(v).sum() for v in states["flat"])),
               differs_from_machine_votes=not all(
                   np.array_equal(a, b) for a, b in zip(results["flat"][0], by_machines)))


def train(mc, steps, model=None, optimizer=None):
    model = model or small_classifier()
    optimizer = optimizer or tf.keras.optimizers.SGD(0.1)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = tf.function(tape_train_step(model, optimizer, loss_fn, mc))
    x, y = classification_data(hvd.rank(), n=64)
    for i in range(steps):
        step(x[(i % 2) * 32:(i % 2) * 32 + 32], y[(i % 2) * 32:(i % 2) * 32 + 32])
    return model, optimizer


def state_of(mc):
    return [v.numpy() for v in mc.state_variables()]


def run_train():
    directory = hvd.broadcast_object(tempfile.mkdtemp() if hvd.rank() == 0 else None,
                                     root_rank=0, name="directory")
    for codec, params in (("efsignsgd", {}), ("topk", {"ratio": 0.3})):
        results = {}
        for hierarchical in (True, False):
            mc = MergeComp(codec, partitions=2, hierarchical=hierarchical, **params)
            model, optimizer = train(mc, 4)
            results[hierarchical] = (mc, model, optimizer)
        mc, model, optimizer = results[True]
        flat_mc, flat_model, _ = results[False]
        # Checkpoint round trip of the sharded state (docs/checkpoints.md's per-rank files).
        saved_state = state_of(mc)
        path = "%s/%s/ckpt" % (directory, codec)
        path = mergecomp_checkpoint.save(tf.train.Checkpoint(model=model), mc, path)
        mc.reset_state()
        zeroed = float(sum(np.abs(s).sum() for s in state_of(mc)))
        mergecomp_checkpoint.restore_rank_state(mc, path)  # after the first step: at once
        restored_matches = all(np.array_equal(a, b) for a, b in zip(saved_state, state_of(mc)))
        report(codec=codec + "_train", two_level=mc.two_level,
               checksum=weights_checksum(model), flat_checksum=weights_checksum(flat_model),
               state_sizes=[len(s) for s in saved_state],
               flat_state_sizes=[len(s) for s in state_of(flat_mc)],
               restore_kept=mc.rank_state.last_outcome["kept"], zeroed=zeroed,
               restored_matches=restored_matches,
               state_nonzero=float(sum(np.abs(s).sum() for s in saved_state)),
               settings_differ=mc.settings_fingerprint() != flat_mc.settings_fingerprint())
        # Group 0 plain, then plain Horovod: what the shards' memory held goes out, then zero.
        mc.set_partition([2], group_codecs=["none", codec])
        train(mc, 1, model, optimizer)
        plain_group = [float(np.abs(s).max()) for s in state_of(mc)[:2]]
        mc.set_plain_horovod()
        train(mc, 1, model, optimizer)
        report(codec=codec + "_switches", plain_group_state=plain_group,
               stepped_aside_state=float(sum(np.abs(s).sum() for s in state_of(mc))),
               checksum=weights_checksum(model))


def run_whole_state_switches():
    """SIGNUM with hierarchical=True keeps each rank's whole momentum (its votes per rank):
    a group turned plain sends it and clears it, so does stepping aside for plain Horovod."""
    mc = MergeComp("signum", partitions=2, hierarchical=True)
    model, optimizer = train(mc, 3)
    sizes = [len(s) for s in state_of(mc)]
    trained = float(sum(np.abs(s).sum() for s in state_of(mc)))
    mc.set_partition([2], group_codecs=["none", "signum"])
    train(mc, 1, model, optimizer)
    plain_group = [float(np.abs(s).max()) for s in state_of(mc)[:2]]
    voting_group = [float(np.abs(s).max()) for s in state_of(mc)[2:]]
    mc.set_plain_horovod()
    train(mc, 1, model, optimizer)
    report(codec="signum_switches", two_level=mc.two_level, state_sizes=sizes,
           flat_state_sizes=[int(w.shape.num_elements()) for w in model.trainable_variables],
           trained_state=trained, plain_group_state=plain_group,
           voting_group_state=voting_group,
           stepped_aside_state=float(sum(np.abs(s).sum() for s in state_of(mc))),
           checksum=weights_checksum(model))


def run_bitwise():
    codecs = (("efsignsgd", {}), ("topk", {"ratio": 0.3}))[:int(sys.argv[2])]
    for codec, params in codecs:
        outcome = {}
        for hierarchical in (True, False):
            mc = MergeComp(codec, partitions=2, hierarchical=hierarchical, **params)
            model, _ = train(mc, 3)
            outcome[hierarchical] = ([w.numpy() for w in model.trainable_variables], state_of(mc),
                                     mc.two_level)
        report(codec=codec, two_level=outcome[True][2],
               weights_identical=all(np.array_equal(a, b)
                                     for a, b in zip(outcome[True][0], outcome[False][0])),
               state_identical=all(np.array_equal(a, b)
                                   for a, b in zip(outcome[True][1], outcome[False][1])))


def run_mixed_levels():
    """hierarchical=None: a level per group, as the search sets it; the state follows a
    group from one level to the other."""
    from tf_mergecomp.search import PartitionSearchDriver

    mc = MergeComp("efsignsgd", partitions=[2], hierarchical=None)
    mc.set_partition([2], group_codecs=["efsignsgd/two-level", "efsignsgd"])
    model, optimizer = train(mc, 3)
    n = mc.num_tensors
    full_before = [float(np.abs(v.numpy()).max()) for v in mc.existing_state_variables()[:n]]
    pieces_before = [float(np.abs(v.numpy()).max()) for v in mc.existing_state_variables()[n:]]
    sizes = [int(v.shape.num_elements()) for v in mc.existing_state_variables()]
    mc.set_partition([2], group_codecs=["efsignsgd", "efsignsgd/two-level"])
    train(mc, 1, model, optimizer)
    full_after = [float(np.abs(v.numpy()).max()) for v in mc.existing_state_variables()[:n]]
    pieces_after = [float(np.abs(v.numpy()).max()) for v in mc.existing_state_variables()[n:]]
    report(codec="mixed", two_level=mc.two_level, n=n, sizes=sizes,
           choices=list(mc.two_level_codec_choices),
           searched=list(PartitionSearchDriver(mc, verbose=0).searched_codecs()),
           describe=mc.describe(), full_before=full_before, pieces_before=pieces_before,
           full_after=full_after, pieces_after=pieces_after, checksum=weights_checksum(model))


def run_disagreement():
    """Rank 0 asks for two levels, the others for the flat reduce: refused on every rank."""
    mc = MergeComp("efsignsgd", partitions=2, hierarchical=hvd.rank() == 0)
    try:
        reduce_once(mc)
        report(codec="disagreement", error=None)
    except RankMismatchError as error:
        report(codec="disagreement", error=str(error))


def run_registered():
    expected = [np.mean([gradients_of(r)[i] for r in range(hvd.size())], axis=0, dtype=np.float64)
                for i in range(len(SHAPES))]
    mc = MergeComp("none", partitions=2, hierarchical=True)
    out = reduce_once(mc)
    report(codec="registered", two_level=mc.two_level,
           dynamic=os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS"),
           max_error=max(float(np.max(np.abs(o - e))) for o, e in zip(out, expected)))
    # A restart (as the search does between candidates) makes the sets again, same ids:
    # the same MergeComp and its traced reduce keep working.
    from tf_mergecomp.search import restart

    before = restart._process_sets()
    blocker = restart.restart_blocker()
    problem = restart.restart_horovod() if blocker is None else blocker
    # Listed before the reduce: once a faster rank has its result and exits, its shutdown
    # stops Horovod here too, and the sets could no longer be listed.
    after = restart._process_sets()
    reduce = mc.make_reduce_fn()
    out = [o.numpy() for o in reduce([tf.constant(g) for g in gradients_of(hvd.rank())])]
    report(codec="restarted", blocker=problem, sets_before=before, sets_after=after,
           max_error=max(float(np.max(np.abs(o - e))) for o, e in zip(out, expected)))


if mode == "registered":
    run_registered()
elif mode == "two_by_three":
    run_votes(configs=("ops", "searched"))  # the plain-TF path: the thread tests' (2, 3)
elif mode == "two_by_two":
    run_exact()
    run_train()
    run_whole_state_switches()
    run_mixed_levels()
else:
    run_bitwise()
    run_disagreement()
# The last collectives ran on process sets: a machine that finished first would exit and
# shut Horovod down under the other one's pending allgather. Every rank waits for all here.
hvd.join()
