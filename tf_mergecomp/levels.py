"""The level each group of a MergeComp reduces on: flat, or two levels (hierarchical.py).

``hierarchical=True``: every group takes two levels; each rank's state is its piece of
every tensor (1/L of the flat state, L ranks per machine), except where the compressor's
groups count every rank's vote with a state (SIGNUM's momentum): that state stays whole,
as flat, and a plain group sends it before its reduce-scatter.
``hierarchical=False``: every group is flat.
``hierarchical=None`` (default): flat, unless a group's codec name ends in ``TWO_LEVEL``
(``"efsignsgd/two-level"``), which the partition search offers
(``two_level_codec_choices``) when the ranks sit on machines of several ranks and the
process sets can be had. Each rank then keeps both states, the flat one and its piece of
every tensor; a group sends, with its gradients, what the other level's state has not
sent and clears it, so the state follows a group from one level to the other
(docs/scaling.md, §2g).
"""

import tensorflow as tf

from tf_mergecomp import fused_groups
from tf_mergecomp import hierarchical
from tf_mergecomp import plain_groups
from tf_mergecomp import reference

TWO_LEVEL = "/two-level"


def split_level(codec_name):
    """("efsignsgd", True) for "efsignsgd/two-level"; (name, False) otherwise."""
    if codec_name.endswith(TWO_LEVEL):
        return codec_name[:-len(TWO_LEVEL)], True
    return codec_name, False


class TwoLevelGroups:
    """MergeComp's levels (a base class of MergeComp; its attributes are MergeComp's): the
    setting, the machine layout seen at the trace, the process sets, the shard count of the
    state (``_state_shards``: L with ``hierarchical=True``) and the pieces kept beside the
    flat state (``_piece_shards``, ``_piece_state``) with ``hierarchical=None``;
    state_variables.py creates both."""

    def _init_levels(self, hierarchical_choice, machine_dtype="float32"):
        self.hierarchical = hierarchical.check_choice(hierarchical_choice)
        self.machine_dtype = hierarchical.check_machine_dtype(machine_dtype, hierarchical_choice)
        if hierarchical_choice and not self.shardable:
            raise ValueError(
                "hierarchical=True is not available for %r: it reduces its groups itself with "
                "per-tensor state of its own (use hierarchical=False)" % self.compressor.name)
        self._machine_layout = None
        self._two_level = None       # a TwoLevelReduce while some group may take two levels
        self._level_sets = None      # (layout description, machine set, cross set)
        self._state_shards = 1
        self._piece_shards = 1
        self._piece_state = None

    @property
    def shardable(self):
        """Whether the compressor's groups can be cut into shards (not PowerSGD's)."""
        return not (self.compressor.reduces_own_groups or self.compressor.keeps_codec_state)

    @property
    def group_codec_names(self):
        """What ``set_partition(group_codecs=)`` accepts: ``codec_choices``, and with
        ``hierarchical=None`` each of them on two levels (``name + TWO_LEVEL``)."""
        choices = self.codec_choices
        if self.hierarchical is None and self.shardable:
            choices = choices + tuple(name + TWO_LEVEL for name in choices)
        return choices

    @property
    def two_level_codec_choices(self):
        """The two-level group codecs a search may choose from, once a trace found
        machines of several ranks and their process sets; () otherwise."""
        if self._piece_shards < 2:
            return ()
        return tuple(name + TWO_LEVEL for name in self.codec_choices)

    @property
    def two_level(self):
        """Whether the last trace could reduce groups in two levels."""
        return self._two_level is not None

    def _asks_two_levels(self):
        return bool(self.hierarchical) or any(
            split_level(name)[1] for name in (self.group_codecs or ()))

    def describe_levels(self):
        """The level for ``describe()``: nothing while every group is flat with
        ``hierarchical=None``, so that saved search results without a level match."""
        if self.hierarchical is None and not self._asks_two_levels():
            return {}
        return self._level_description()

    def _level_description(self):
        layout = self._machine_layout
        description = {"hierarchical": self.hierarchical,
                       "machines": None if layout is None else layout.describe()}
        if self.machine_dtype != "float32":  # so descriptions saved without it still match
            description["machine_dtype"] = self.machine_dtype
        return description

    def level_identity(self):
        """What a saved search result depends on besides the model and the codec: the
        setting and the machines, where groups may take two levels ({} otherwise)."""
        if self.hierarchical is None and self._piece_shards < 2:
            return {}
        return self._level_description()

    def level_settings(self):
        """What the state's shape depends on, for ``settings_fingerprint``."""
        settings = {}
        if self._state_shards != 1:  # each rank's state is its piece of every tensor
            settings["state_shards"] = self._state_shards
        if self._piece_shards != 1:  # pieces kept beside the flat state
            settings["piece_shards"] = self._piece_shards
        return settings

    def _plan_levels(self, communicator):
        """At a trace, before the ranks compare descriptions: the machine layout and the
        state's shard counts (which reset the state when they change: an elastic reset
        to another number of ranks per machine)."""
        import horovod.tensorflow as hvd

        global_set = (communicator.process_set.process_set_id
                      == hvd.global_process_set.process_set_id)
        if self.hierarchical and not global_set:
            raise ValueError("hierarchical=True reduces over all ranks: it cannot be combined "
                             "with a process_set of the optimizer or tape")
        if self.hierarchical is False or not self.shardable or not global_set:
            self._machine_layout = None
            return
        layout = self._machine_layout = hierarchical.MachineLayout.from_horovod()
        state_shards, piece_shards = 1, 1
        if layout.two_level and self.hierarchical and not self._votes_on_whole_state:
            state_shards = layout.ranks_per_machine
        elif (layout.two_level and layout.homogeneous
              and hierarchical.process_sets_available(layout)):
            # Machines of unequal rank counts stay flat (every rank decides alike).
            piece_shards = layout.ranks_per_machine
        if (state_shards, piece_shards) != (self._state_shards, self._piece_shards):
            self._state_shards, self._piece_shards = state_shards, piece_shards
            self._state = self._piece_state = None

    def _connect_levels(self, communicator):
        """After the ranks agreed on the layout: checks it and takes (or adds) the
        process sets of the two-level reduce."""
        from tf_mergecomp.communication import HorovodCommunicator

        layout = self._machine_layout
        if (layout is None or not layout.two_level
                or not (self._asks_two_levels() or self._piece_shards > 1)):
            self._two_level = None
            return
        layout.check()
        if self._level_sets is None or self._level_sets[0] != layout.describe():
            self._level_sets = (layout.describe(),) + hierarchical.process_sets_for(layout)
        counter = self.collectives_executed
        machine = HorovodCommunicator(self._level_sets[1], counter=counter,
                                      name_prefix="mergecomp.machine%d" % layout.machine)
        cross = HorovodCommunicator(self._level_sets[2], counter=counter,
                                    name_prefix="mergecomp.cross%d" % layout.local_rank)
        self._two_level = hierarchical.TwoLevelReduce(layout, machine, cross, self.machine_dtype)

    def _forget_levels(self):
        """After an elastic reset: Horovod's process sets are gone with its old world."""
        self._level_sets = None
        self._two_level = None

    def runs_two_levels(self, codec_name):
        """Whether a group of ``codec_name`` is reduced on two levels in this world
        (three collectives around the codec's own: reduce-scatter, exchange, allgather)."""
        return self._two_level is not None and (bool(self.hierarchical)
                                                or split_level(codec_name)[1])

    def _reduce_group_in_levels(self, index, start, grads, state_vars, step, communicator,
                                codec_name):
        two = self.runs_two_levels(codec_name)
        codec_name, _ = split_level(codec_name)
        votes = two and self._votes_per_rank(codec_name)
        pieces = list(self._piece_state or [])[start:start + len(grads)]
        clear = None
        if self._two_level is not None and self.hierarchical is None and self._piece_state:
            # Both states kept: the other level's goes out with this step, then is zero.
            # A group that votes per rank uses the whole state, as a flat one does.
            if two and not votes:
                flush = plain_groups.StateFlush(self.memory, state_vars, grads)
                grads, clear = flush.gradients_to_send(), flush.clear_sent_state
            else:
                grads, clear = self._spread_flush(pieces, grads)
        elif two and not votes and self.hierarchical and self._state_shards == 1:
            # The whole state (kept for the compressor's votes): a plain group sends it.
            flush = plain_groups.StateFlush(self.memory, state_vars, grads)
            grads, clear = flush.gradients_to_send(), flush.clear_sent_state
            state_vars = []
        if not two:
            outputs, flags = self._reduce_group(index, start, grads, state_vars, step,
                                                communicator, codec_name)
        else:
            shard_state = state_vars if self.hierarchical else pieces
            key = (index, sum(self._layout.sizes[start:start + len(grads)]))

            def reduce_shard(shard, cross):
                return self._reduce_group(index, start, shard, shard_state, step, cross,
                                          codec_name)

            # The search's recorder hands a communicator that times the group's
            # collectives: it times the three of a two-level group (``around``).
            wrap = getattr(communicator, "around", None)
            if self._sent_by_horovod(codec_name, grads):
                # What this rank's pieces of the state have not sent goes with the
                # gradients, spread as the reduce-scatter adds it.
                grads, clear_pieces = self._spread_flush(shard_state, grads)
                outputs, flags = self._two_level.reduce_group_by_horovod(
                    grads, key, self.nonfinite == "raise", wrap=wrap)
                with tf.control_dependencies(clear_pieces()):
                    outputs = [tf.identity(o) for o in outputs]
            elif votes:
                compensated, state_updates = self._compensate_whole(grads, state_vars)
                encode, decode = self._vote_coding(step, start, communicator)
                with tf.control_dependencies(state_updates):
                    outputs, flags = self._two_level.reduce_group_by_votes(
                        compensated, key, encode, decode, wrap=wrap, counter=self.compressor)
                outputs = [tf.cast(o, g.dtype) for o, g in zip(outputs, grads)]
            else:
                outputs, flags = self._two_level.reduce_group(grads, key, reduce_shard,
                                                              wrap=wrap)
        if clear is not None:
            with tf.control_dependencies(clear()):
                outputs = [tf.identity(o) for o in outputs]
        return outputs, flags

    def _votes_per_rank(self, codec_name):
        """Whether a two-level group of ``codec_name`` counts every rank's vote
        (``TwoLevelReduce.reduce_group_by_votes``): the compressor's own codec, when it
        votes (signSGD, SIGNUM) and its memory needs nothing of the payload (none, or
        SIGNUM's momentum: applied to the whole gradients before the encode)."""
        return (codec_name == self.compressor.name and self.compressor.votes_per_rank
                and not self.memory.needs_sent)

    @property
    def _votes_on_whole_state(self):
        """Whether the compressor's two-level groups vote per rank with each rank's whole
        state, as flat (SIGNUM's momentum): ``hierarchical=True`` then keeps no pieces."""
        return self._votes_per_rank(self.compressor.name) and bool(self.memory.state_names)

    def _compensate_whole(self, grads, state_vars):
        """(what this rank votes on: each gradient compensated by the memory with its
        whole state, as float32, all NaN where the gradient is non-finite; the state's
        assignments). A rank holding a non-finite tensor keeps its state, as flat."""
        if not self.memory.state_names:
            return grads, []
        bad = [tf.logical_not(tf.reduce_all(tf.math.is_finite(g))) for g in grads]
        keep = tf.reduce_any(tf.stack(bad))
        buffers = len(self.memory.state_names)
        compensated, updates = [], []
        for grad, variable, nonfinite in zip(grads, state_vars, bad):
            n = grad.shape.num_elements()
            value = variable.read_value()
            old = {name: value[b * n:(b + 1) * n]
                   for b, name in enumerate(self.memory.state_names)}
            flat = tf.reshape(tf.cast(tf.where(nonfinite, tf.zeros_like(grad), grad),
                                      tf.float32), [-1])
            values, state = self.memory.compensate(flat, old)
            kept = [tf.where(keep, old[name], state[name]) for name in self.memory.state_names]
            updates.append(variable.assign(tf.concat(kept + [value[buffers * n:]], 0)))
            values = tf.where(nonfinite, tf.fill([n], float("nan")), values)
            compensated.append(tf.reshape(values, grad.shape))
        return compensated, updates

    def _vote_coding(self, step, start, communicator):
        """(encode, decode) of the compressor's codec for ``reduce_group_by_votes``: the
        fused group ops, or the plain-TF path (reference.py)."""
        codec = self.compressor
        seed = self._group_seed(step, start, communicator)
        if reference.runs_fused_ops(codec):
            return (lambda pieces: fused_groups.encode_group(codec, plain_groups.NO_MEMORY,
                                                             pieces, [], seed),
                    lambda collected, context, num_rows, pieces: fused_groups.decode_group(
                        codec, collected, context, num_rows, pieces))
        return (lambda pieces: reference.encode_group(codec, pieces, seed),
                lambda collected, context, num_rows, pieces: reference.decode_group(
                    codec, collected, context, num_rows, pieces))

    def _spread_flush(self, pieces, dense):
        """(``dense`` plus what this rank's pieces of their state have not sent, spread
        so that each piece counts once per machine in the average over all ranks, and
        the function making the ops that clear them afterwards)."""
        if not pieces:
            return list(dense), list
        ranks = self._two_level.layout.ranks_per_machine
        # A rank holding a non-finite gradient sends nothing extra and keeps its state,
        # as on the flat path: its pieces are NaN for the flush, which then keeps it.
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in dense])
        marker = tf.where(finite, 0.0, float("nan"))
        markers = [tf.fill([hierarchical.piece_size(g.shape.num_elements(), ranks)], marker)
                   for g in dense]
        flush = plain_groups.StateFlush(self.memory, pieces, markers)
        pending = [tf.where(finite, p, tf.zeros_like(p)) for p in flush.gradients_to_send()]
        spread = self._two_level.spread_pieces(pending, [g.shape for g in dense])
        return ([g + tf.cast(s, g.dtype) for g, s in zip(dense, spread)],
                flush.clear_sent_state)

    def _flush_before_plain_horovod(self, state, dense):
        """(gradients plus what the memory has not sent, the function making the ops that
        clear it afterwards) for a step that plain Horovod reduces."""
        if self._state_shards > 1:  # each rank's state is its piece of every tensor
            return self._spread_flush(state, dense)
        flush = plain_groups.StateFlush(self.memory, state, dense)
        sent = flush.gradients_to_send()
        if self._two_level is None or not self._piece_state:
            return sent, flush.clear_sent_state
        sent, clear_pieces = self._spread_flush(list(self._piece_state), sent)
        return sent, lambda: flush.clear_sent_state() + clear_pieces()
