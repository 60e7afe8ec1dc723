"""The two-level reduce of a MergeComp group: dense inside a machine, compressed across machines.

A cluster of M machines with L ranks each (Horovod's ``local_size()`` L and
``cross_size()`` M; rank = machine * L + local rank) reduces one group in three steps:

1. Inside the machine, the group is reduce-scattered (averaged, uncompressed) over the L
   ranks of the machine: local rank l receives shard l of the machine's average.
   ``machine_dtype``: the collectives inside the machine (this one and step 3's) carry
   float32 (the default: exact) or float16 (half the bytes; a value beyond float16's range
   arrives as inf, which the step's non-finite handling sees).
2. Across machines, shard l goes through the group's flat path (``MergeComp._reduce_group``:
   encode, the codec's collective, decode) among the M ranks of local rank l.
3. Inside the machine, the decoded shards are allgathered: every rank holds the group's
   average over all L * M ranks.

An allgather codec then moves M - 1 payloads per rank across machines instead of
L * M - 1, and the codecs run on 1/L of the group. A codec whose combine is a vote
(signSGD, SIGNUM) counts every rank's vote instead of one per machine
(``TwoLevelReduce.reduce_group_by_votes``).

Shards. Each gradient tensor of n elements is cut into L pieces of ceil(n / L) elements
(the last one padded with zeros); shard l of a group is piece l of each of its tensors,
back to back, so a shard does not depend on the partition. A rank keeps the
error-feedback state of piece ``local_rank`` only: one variable per tensor, 1/L of the
flat state (docs/scaling.md, §2g; docs/checkpoints.md).

With one machine, or one rank per machine, a group takes the flat path, bit for bit.
Which groups take two levels, and MergeComp's state around them: levels.py.

Process sets. Steps 1 and 3 run on the machine's process set (its L ranks), step 2 on
the set of the ranks with this local rank: registered at ``hvd.init`` by
``machine_process_sets()``, or added by ``process_sets_for`` (docs/scaling.md, §2g).
"""

import math
import os
import re

import tensorflow as tf

from tf_mergecomp import plain_groups

CHOICES = (True, False, None)
MACHINE_DTYPES = ("float32", "float16")
# What asks for the two-level reduce, as its errors name it: hierarchical=True (every
# group), or with hierarchical=None a group codec on two levels (chosen by the search, or
# given to set_partition).
_TWO_LEVEL_REDUCE = ("a two-level reduce (hierarchical=True, or group codecs such as "
                     "\"efsignsgd/two-level\" with hierarchical=None)")
# Horovod 0.28.1 reads HOROVOD_DYNAMIC_PROCESS_SETS as C's strtol(value, NULL, 10) != 0:
# on for a nonzero integer, leading blanks and trailing text ignored ("1", " 2", "1x");
# off when unset or for anything else ("", "0", "true", "false").
_LEADING_INTEGER = re.compile(r"[ \t\n\v\f\r]*[+-]?([0-9]+)")


def check_choice(hierarchical):
    if hierarchical not in CHOICES or not isinstance(hierarchical, (bool, type(None))):
        raise ValueError("hierarchical must be one of True (two-level reduce: dense inside a "
                         "machine, compressed across machines), False (flat: every group "
                         "compressed across all ranks) or None (flat until a search chooses), "
                         "got %r" % (hierarchical,))
    return hierarchical


def check_machine_dtype(machine_dtype, hierarchical):
    if machine_dtype not in MACHINE_DTYPES:
        raise ValueError("machine_dtype must be one of %s (what the two-level reduce's "
                         "collectives inside a machine carry), got %r"
                         % (", ".join(MACHINE_DTYPES), machine_dtype))
    if machine_dtype != "float32" and hierarchical is False:
        raise ValueError("machine_dtype=%r applies to groups on two levels, and "
                         "hierarchical=False has none: use hierarchical=True or None"
                         % machine_dtype)
    return machine_dtype


class MachineLayout:
    """How the ranks sit on machines: ``ranks_per_machine`` (L) times ``machines`` (M)."""

    def __init__(self, rank, size, ranks_per_machine, machines, homogeneous=True):
        self.rank = rank
        self.size = size
        self.ranks_per_machine = ranks_per_machine
        self.machines = machines
        # Horovod's own answer, the same on every rank: whether every machine has as many
        # ranks. Where it does not, each rank sees other L and M (local and cross sizes).
        self.homogeneous = homogeneous
        self.local_rank = rank % ranks_per_machine
        self.machine = rank // ranks_per_machine

    @classmethod
    def from_horovod(cls):
        import horovod.tensorflow as hvd

        return cls(hvd.rank(), hvd.size(), hvd.local_size(), hvd.cross_size(),
                   hvd.is_homogeneous())

    def describe(self):
        return [self.ranks_per_machine, self.machines]

    @property
    def two_level(self):
        """Whether a two-level reduce differs from the flat one."""
        return self.ranks_per_machine > 1 and self.machines > 1

    def check(self):
        """Raises ValueError unless the ranks fill equal machines, contiguously.
        Called after the ranks agreed on ``describe()``, so every rank raises alike."""
        import horovod.tensorflow as hvd

        if self.ranks_per_machine * self.machines != self.size:
            raise ValueError(
                "%s needs machines with equal numbers of ranks: %d ranks are not %d machines "
                "of %d (give every host the same slots, e.g. horovodrun -H host1:4,host2:4), "
                "or use hierarchical=False"
                % (_TWO_LEVEL_REDUCE, self.size, self.machines, self.ranks_per_machine))
        if (hvd.local_rank(), hvd.cross_rank()) != (self.local_rank, self.machine):
            raise ValueError(
                "%s needs the ranks of one machine to be contiguous: rank %d is local rank %d "
                "on machine %d, expected local rank %d on machine %d"
                % (_TWO_LEVEL_REDUCE, self.rank, hvd.local_rank(), hvd.cross_rank(),
                   self.local_rank, self.machine))

    def machine_ranks(self, machine):
        return list(range(machine * self.ranks_per_machine,
                          (machine + 1) * self.ranks_per_machine))

    def cross_ranks(self, local_rank):
        return list(range(local_rank, self.size, self.ranks_per_machine))

    def all_process_set_ranks(self):
        """The ranks of every set the two-level reduce uses, in the order all ranks add them."""
        return ([self.machine_ranks(m) for m in range(self.machines)]
                + [self.cross_ranks(l) for l in range(self.ranks_per_machine)])


def machine_process_sets(ranks_per_machine=None, size=None):
    """The process sets the two-level reduce uses, for ``hvd.init(process_sets=...)``
    (before ``hvd.init``, the machine layout is read from horovodrun's
    HOROVOD_LOCAL_SIZE and HOROVOD_SIZE unless given)."""
    import horovod.tensorflow as hvd

    if ranks_per_machine is None:
        ranks_per_machine = int(os.environ.get("HOROVOD_LOCAL_SIZE", "1"))
    if size is None:
        size = int(os.environ.get("HOROVOD_SIZE", "1"))
    layout = MachineLayout(0, size, ranks_per_machine, max(1, size // ranks_per_machine))
    if not layout.two_level:
        return []
    return [hvd.ProcessSet(ranks) for ranks in layout.all_process_set_ranks()]


def listed_process_sets():
    """{id: sorted ranks} of the process sets Horovod has registered besides the global one
    (id 0), or None where Horovod does not list them (Horovod 0.28.1 lists them only
    through its internal ``_basics``, and not once it is shut down)."""
    try:
        from horovod.common import process_sets

        listed = process_sets._basics._get_process_set_ids_and_ranks()
    except Exception:  # noqa: BLE001 (any failure means: not listed)
        return None
    return {int(i): sorted(int(r) for r in ranks) for i, ranks in listed.items() if int(i) != 0}


def _registered_process_sets():
    """{tuple of ranks: process set id} of the sets Horovod has registered ({} where it
    does not list them: the sets are then added, which needs dynamic process sets)."""
    return {tuple(ranks): set_id for set_id, ranks in (listed_process_sets() or {}).items()}


def dynamic_process_sets():
    """Whether process sets may be added after ``hvd.init``: HOROVOD_DYNAMIC_PROCESS_SETS
    read as Horovod reads it (``_LEADING_INTEGER``), so that "true" is off here as there."""
    match = _LEADING_INTEGER.match(os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", ""))
    return match is not None and int(match.group(1)) != 0


def process_sets_available(layout):
    """Whether ``process_sets_for`` can give the sets (no collective)."""
    registered = _registered_process_sets()
    return dynamic_process_sets() or all(
        tuple(ranks) in registered for ranks in layout.all_process_set_ranks())


def process_sets_for(layout):
    """(this machine's process set, the set of this local rank across machines). Takes
    sets already registered; adds missing ones when dynamic process sets are on (a
    collective: every rank calls it at the same trace); else raises ValueError."""
    import horovod.tensorflow as hvd

    registered = _registered_process_sets()
    wanted = layout.all_process_set_ranks()
    missing = [ranks for ranks in wanted if tuple(ranks) not in registered]
    if missing and not dynamic_process_sets():
        raise ValueError(
            "%s needs Horovod process sets for the machines and across them: "
            "run with HOROVOD_DYNAMIC_PROCESS_SETS=1 (or hvd.init(process_sets=\"dynamic\")) "
            "and MergeComp adds them, or register them at start: "
            "hvd.init(process_sets=tf_mergecomp.hierarchical.machine_process_sets())"
            % _TWO_LEVEL_REDUCE)
    sets = {}
    for ranks in wanted:
        if tuple(ranks) in registered:
            process_set = hvd.ProcessSet(ranks)
            process_set.process_set_id = registered[tuple(ranks)]
        else:
            process_set = hvd.add_process_set(ranks)
        sets[tuple(ranks)] = process_set
    return (sets[tuple(layout.machine_ranks(layout.machine))],
            sets[tuple(layout.cross_ranks(layout.local_rank))])


def piece_size(num_elements, ranks_per_machine):
    """Elements of each of the L pieces of a tensor (the last one zero-padded)."""
    return int(math.ceil(num_elements / ranks_per_machine))


class TwoLevelReduce:
    """The two-level reduce of groups, for one trace: ``machine`` and ``cross`` are
    ``HorovodCommunicator``s on this machine's set and on this local rank's set."""

    def __init__(self, layout, machine, cross, machine_dtype="float32"):
        self.layout = layout
        self.machine = machine
        self.cross = cross
        self.machine_dtype = tf.as_dtype(machine_dtype)

    def reduce_group(self, grads, key, reduce_shard, wrap=None):
        """The group's average over all ranks and its per-tensor non-finite flags.

        ``reduce_shard(pieces, cross)``: the flat reduce of this rank's pieces (one 1-D
        float32 tensor per gradient) across machines through communicator ``cross``,
        returning (decoded pieces, flags). ``wrap``: applied to both communicators (the
        search's recorder times the group's collectives through it)."""
        machine, cross = self._communicators(wrap)
        pieces, by_shard = self._by_shard(grads)
        within = self.machine_dtype
        shard = machine.reducescatter_mean(tf.cast(tf.reshape(by_shard, [-1]), within),
                                           key + ("scatter",))
        shard = tf.reshape(tf.cast(shard, tf.float32), [sum(pieces)])
        decoded, _ = reduce_shard(tf.split(shard, pieces) if len(pieces) > 1 else [shard],
                                  cross)
        return self._gather(decoded, grads, pieces, key, machine)

    def reduce_group_by_horovod(self, grads, key, check_finite, wrap=None):
        """``reduce_group`` for a ``none`` group through Horovod's grouped collectives,
        with no concatenation of ours (plain_groups.py): each tensor, flattened, is
        reduce-scattered inside the machine, its part averaged across machines and the
        parts allgathered. Returns the outputs and
        ``plain_groups.nonfinite_flags(outputs, check_finite)``."""
        machine, cross = self._communicators(wrap)
        ranks, within = self.layout.ranks_per_machine, self.machine_dtype
        flat = []
        for grad in grads:
            values = tf.cast(tf.reshape(grad, [-1]), within)
            # Every rank a part: a tensor of fewer elements than ranks is zero-padded.
            missing = ranks - grad.shape.num_elements()
            flat.append(tf.pad(values, [[0, missing]]) if missing > 0 else values)
        parts = machine.grouped_reducescatter_mean(flat, key + ("scatter",))
        averaged = cross.grouped_allreduce_mean([tf.cast(p, tf.float32) for p in parts], key)
        gathered = machine.grouped_allgather([tf.cast(a, within) for a in averaged],
                                             key + ("gather",))
        outputs = []
        for grad, values in zip(grads, gathered):
            values = tf.cast(values, tf.float32)[:grad.shape.num_elements()]
            outputs.append(tf.cast(tf.reshape(values, grad.shape), grad.dtype))
        return outputs, plain_groups.nonfinite_flags(outputs, check_finite)

    def reduce_group_by_votes(self, grads, key, encode, decode, wrap=None, counter=None):
        """``reduce_group`` for a codec whose combine is a vote of the ranks' payloads
        (``Compressor.votes_per_rank``): every rank's vote counts, as on the flat path,
        where a machine's average would cast one vote for its L ranks.

        Each rank encodes every shard of its own gradients (``encode(pieces)`` ->
        (payload row with its non-finite markers, codec context)); inside the machine an
        alltoall hands local rank l the L rows of shard l (1 bit per element for signs);
        across machines they are allgathered (M * L rows, in rank order, as the flat
        allgather orders them) and ``decode(rows, context, num_rows, pieces)`` ->
        (decoded pieces, flags) decodes them; the decoded shards are allgathered inside
        the machine. The result is the flat reduce's, bit for bit. Across machines a rank
        sends L shards' rows (the group's bytes) and receives M - 1 such, not L * M - 1.

        ``counter``: the codec, when it can count votes (``count_votes``,
        ``vote_of_counts``). Where a count of the machine's L votes takes fewer bits
        than L (L >= 3: 4 bits for 8 ranks), each rank sends across machines the counts
        of its shard instead of the L rows, and the vote of the M counts is still the
        flat one."""
        machine, cross = self._communicators(wrap)
        pieces, by_shard = self._by_shard(grads)
        columns = tf.split(by_shard, pieces, axis=1) if len(pieces) > 1 else [by_shard]
        shards = [[column[shard] for column in columns]
                  for shard in range(self.layout.ranks_per_machine)]
        encoded = [encode(shard) for shard in shards]
        mine = machine.alltoall(tf.stack([row for row, _ in encoded]), key + ("votes",))
        ranks, local = self.layout.ranks_per_machine, self.layout.local_rank
        if counter is not None and counter.count_bits(ranks) < ranks:
            shard_size = sum(pieces)
            counts = counter.count_votes(tf.reshape(mine, [ranks, -1]), shard_size, len(pieces))
            collected = tf.reshape(cross.allgather(counts, key), [self.layout.machines, -1])
            vote, marked = counter.vote_of_counts(collected, shard_size, len(pieces), ranks)
            votes = tf.split(vote, pieces) if len(pieces) > 1 else [vote]
            decoded = [tf.where(marked[i], tf.fill([piece], float("nan")), votes[i])
                       for i, piece in enumerate(pieces)]
        else:
            collected = cross.allgather(tf.reshape(mine, [-1]), key)
            decoded, _ = decode(collected, encoded[local][1], self.layout.size, shards[local])
        return self._gather(decoded, grads, pieces, key, machine)

    def _communicators(self, wrap):
        if wrap is None:
            return self.machine, self.cross
        return wrap(self.machine), wrap(self.cross)

    def _by_shard(self, grads):
        """(the piece size of each gradient, float32[L, sum of pieces] whose row l is
        shard l: piece l of every tensor, back to back)."""
        ranks = self.layout.ranks_per_machine
        pieces = [piece_size(g.shape.num_elements(), ranks) for g in grads]
        rows = []
        for grad, piece in zip(grads, pieces):
            flat = tf.reshape(tf.cast(grad, tf.float32), [-1])
            padded = tf.pad(flat, [[0, piece * ranks - grad.shape.num_elements()]])
            rows.append(tf.reshape(padded, [ranks, piece]))
        return pieces, tf.concat(rows, 1) if len(rows) > 1 else rows[0]

    def _gather(self, decoded, grads, pieces, key, machine):
        """Every rank's decoded shard, allgathered inside the machine, to the group's
        outputs and their non-finite flags."""
        ranks, within = self.layout.ranks_per_machine, self.machine_dtype
        decoded = [tf.reshape(tf.cast(d, tf.float32), [-1]) for d in decoded]
        joined = tf.concat(decoded, 0) if len(decoded) > 1 else decoded[0]
        # Every rank, this shard's own included, takes the gathered values: identical.
        gathered = machine.allgather(tf.cast(joined, within), key + ("gather",))
        gathered = tf.reshape(tf.cast(gathered, tf.float32), [ranks, -1])
        columns = tf.split(gathered, pieces, axis=1) if len(pieces) > 1 else [gathered]
        outputs, flags = [], []
        for grad, column in zip(grads, columns):
            values = tf.reshape(column, [-1])[:grad.shape.num_elements()]
            # Identical on every rank: a piece some rank held non-finite decodes to NaN.
            bad = tf.logical_not(tf.reduce_all(tf.math.is_finite(values)))
            values = tf.where(bad, tf.fill(tf.shape(values), float("nan")), values)
            outputs.append(tf.cast(tf.reshape(values, grad.shape), grad.dtype))
            flags.append(tf.cast(bad, tf.int32))
        return outputs, tf.stack(flags)

    def spread_pieces(self, pieces, shapes):
        """Tensors of ``shapes``, zero except for this rank's piece, which holds L times
        ``pieces`` (so that an average over all ranks adds each piece once per machine, as
        the two-level reduce does)."""
        ranks, local = self.layout.ranks_per_machine, self.layout.local_rank
        spread = []
        for piece, shape in zip(pieces, shapes):
            size, length = shape.num_elements(), piece.shape.num_elements()
            full = tf.pad(piece * float(ranks), [[local * length, (ranks - 1 - local) * length]])
            spread.append(tf.reshape(full[:size], shape))
        return spread

