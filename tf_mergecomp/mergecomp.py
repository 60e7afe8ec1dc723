"""MergeComp: merge gradients into groups, compress each group once, one collective each.

    import horovod.tensorflow.keras as hvd
    from tf_mergecomp import MergeComp
    opt = hvd.DistributedOptimizer(opt, compression=MergeComp("efsignsgd", partitions=2))

Each group of a built-in codec costs three ops, whatever its number of tensors
(fused_groups.py); a codec of your own, or one wrapped by ``reference.plain``, runs the
plain-TF path (reference.py); PowerSGD reduces its groups itself (docs/design.md).

State (checkpointed with this ``tf.Module``; docs/checkpoints.md): the per-tensor variables
(state_variables.py), the step counter seeding the codecs' random draws, a count of
executed collectives.
"""


import tensorflow as tf

from tf_mergecomp import compressors
from tf_mergecomp import consistency
from tf_mergecomp import fused_groups
from tf_mergecomp import grouping
from tf_mergecomp import nonfinite_gradients
from tf_mergecomp import plain_groups
from tf_mergecomp import memory as memories
from tf_mergecomp import reference
from tf_mergecomp import seeds
from tf_mergecomp.communication import HorovodCommunicator
from tf_mergecomp.levels import TwoLevelGroups
from tf_mergecomp.rank_state import NO_ORIGIN, RankState
from tf_mergecomp.state_variables import StateVariables

# Codecs a group may use instead of the user's with ``plain_groups`` (plain_groups.py).
PLAIN_CODECS = plain_groups.PLAIN_CODECS


class MergeComp(StateVariables, TwoLevelGroups, tf.Module):
    """A compression scheduler usable as Horovod's ``compression=`` argument.

    Args:
      compressor: registry name (see ``tf_mergecomp.compressors.NAMES``) or a
        ``Compressor`` instance.
      memory: error-feedback memory name (``tf_mergecomp.memory.NAMES``) or
        instance; None takes the compressor's documented default.
      partitions: an int y (y contiguous groups balanced by bytes), a list of
        split indices, ``"layerwise"`` (one group per tensor), 1 (whole model),
        or None (2 balanced groups until a partition search fixes it).
      seed: user part of the seed of every random draw.
      nonfinite: what a gradient tensor holding an inf or a NaN does (docs/design.md,
        "Non-finite gradients"). ``"propagate"`` (default): it comes out all NaN on
        every rank, the other tensors are reduced as usual, and the step and its
        group's state on the rank that held it stay as they were. ``"raise"``: the
        same, then every rank raises ``InvalidArgumentError`` naming the tensors,
        after the step's collectives (so no rank waits).
      plain_groups: True (default): a group may be sent plain instead of
        compressed (``none``: a float32 allreduce, exact; or ``fp16``), as the
        partition search decides per group (``set_partition(..., group_codecs=)``);
        its error-feedback state goes with it (plain_groups.py). False: every
        group uses the compressor.
      hierarchical: True: each group is averaged inside the machine (in
        ``machine_dtype``: "float32", or "float16"), compressed by shards across
        machines, gathered inside the machine; state per shard (hierarchical.py).
        False: flat. None (default): flat, unless the search sets a group two-level.
      **compressor_params: passed to the compressor, whose module lists them (e.g.
        top-k's ``ratio=0.01``, signSGD's ``two_level_vote="machine"``).
    """

    def __init__(self, compressor, memory=None, partitions=None, seed=0, nonfinite="propagate",
                 plain_groups=True, hierarchical=None, machine_dtype="float32", name="mergecomp",
                 **compressor_params):
        super().__init__(name=name)
        self.compressor = compressors.get(compressor, **compressor_params)
        self.memory = memories.for_compressor(self.compressor, memory, compressor_params)
        self.compressor.check_memory(self.memory)
        if reference.runs_fused_ops(self.compressor) and not memories.is_builtin(self.memory):
            raise ValueError(
                "memory %r is not one of the memories the fused group ops implement (%s); "
                "run a memory of your own with the plain-TF path: "
                "MergeComp(tf_mergecomp.reference.plain(compressors.get(%r, ...)), memory=...) "
                "(tf_mergecomp/reference.py)"
                % (self.memory, ", ".join(memories.NAMES), self.compressor.name))
        self.seed = seeds.check_user_seed(seed)
        self.nonfinite = nonfinite_gradients.check_choice(nonfinite)
        if not isinstance(plain_groups, bool):
            raise ValueError("plain_groups must be True or False, got %r" % (plain_groups,))
        self.plain_groups = plain_groups
        self._init_levels(hierarchical, machine_dtype)
        self._plain_codecs = {name: compressors.get(name) for name in PLAIN_CODECS
                              if name != self.compressor.name}
        self._partition_spec = grouping.check_partition_spec(partitions)
        self._splits = None
        self._group_codecs_spec = None
        self._group_codecs = None
        self._steps_aside = False
        self._layout = None
        self._state = None
        self._eager_reduce = None
        # On the host: the seeds are computed from it there, so the encode
        # kernels' host `seed` input needs no device-to-host copy on a GPU.
        with tf.device(seeds.HOST):
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.collectives_executed = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="collectives_executed"
        )
        # (rank, world size) whose state the state variables hold, (-1, -1) before
        # the first step; checkpointed with them (rank_state.py).
        self.state_origin = tf.Variable(
            NO_ORIGIN, dtype=tf.int64, trainable=False, name="state_origin"
        )
        self.rank_state = RankState(self)
        self._agreed_description = None
        # The partition search's recorder (search/recorder.py) while it traces a
        # profiled step or an exchange probe; None otherwise.
        self.step_recorder = None

    # ---- partition ---------------------------------------------------------------

    @property
    def compressor_name(self):
        return self.compressor.name

    @property
    def num_tensors(self):
        return None if self._layout is None else len(self._layout.sizes)

    @property
    def tensor_sizes(self):
        return None if self._layout is None else list(self._layout.sizes)

    @property
    def tensor_shapes(self):
        """Shapes of the gradient tensors in backprop order (None before the first trace)."""
        return None if self._layout is None else [s.as_list() for s in self._layout.shapes]

    @property
    def tensor_dtypes(self):
        return None if self._layout is None else [d.name for d in self._layout.dtypes]

    @property
    def splits(self):
        if self._splits is None and self._layout is not None:
            self._splits = grouping.resolve_splits(self._partition_spec, self._layout.sizes)
        return self._splits

    @property
    def num_groups(self):
        splits = self.splits
        return None if splits is None else len(splits) + 1

    @property
    def codec_choices(self):
        """The codecs a group may use: the compressor, then the plain ones if enabled."""
        if not self.plain_groups:
            return (self.compressor.name,)
        return (self.compressor.name,) + tuple(self._plain_codecs)

    @property
    def group_codecs(self):
        """The codec name of each group (a tuple), None before the first trace."""
        if self._group_codecs is None and self.splits is not None:
            self._group_codecs = plain_groups.resolve_group_codecs(
                self._group_codecs_spec, len(self.splits) + 1, self.group_codec_names)
        return self._group_codecs

    def set_partition(self, partitions, group_codecs=None):
        """Sets the grouping used from the next trace of the reduce function on.

        ``group_codecs``: one codec name per group, each one of
        ``group_codec_names``; None: the compressor for every group.

        Keras: call ``model.make_train_function(force=True)`` after it (the
        partition search callback does). Custom loops: re-create the
        ``tf.function`` of the train step (``PartitionSearchDriver.function`` does).
        """
        spec = grouping.check_partition_spec(partitions)
        codecs_spec = plain_groups.check_group_codecs_spec(group_codecs, self.group_codec_names)
        if self._layout is not None:
            splits = grouping.resolve_splits(spec, self._layout.sizes)
            codecs = plain_groups.resolve_group_codecs(codecs_spec, len(splits) + 1,
                                                       self.group_codec_names)
        else:
            splits = codecs = None
        self._partition_spec = spec
        self._group_codecs_spec = codecs_spec
        self._splits = splits
        self._group_codecs = codecs
        self._steps_aside = False
        self._eager_reduce = None

    @property
    def steps_aside(self):
        """Whether MergeComp steps aside for plain Horovod (``set_plain_horovod``)."""
        return self._steps_aside

    def set_plain_horovod(self):
        """From the next trace on, plain Horovod reduces the gradients (its own reduce
        function and tensor fusion, no compression). What the memory had not sent goes
        out with the first step; ``set_partition`` brings MergeComp back, its state from
        zero. Needs the Horovod hook, which importing tf_mergecomp installs."""
        self._steps_aside = True
        self._eager_reduce = None

    def describe(self):
        return {
            "compressor": self.compressor.name,
            "compressor_params": self.compressor.params,
            "memory": self.memory.name,
            "memory_params": self.memory.params,
            "splits": None if self.splits is None else list(self.splits),
            "plain_groups": self.plain_groups,
            "group_codecs": None if self.group_codecs is None else list(self.group_codecs),
            "plain_horovod": self._steps_aside,
            **self.describe_levels(),
        }

    def model_fingerprint(self):
        if self._layout is None:
            return None
        return consistency.fingerprint(self._layout.describe())

    def settings_fingerprint(self):
        """Identifies what the state variables mean: the gradient list and the
        codec and memory settings (not the partition: the state does not depend
        on it). None before the first trace."""
        if self._layout is None:
            return None
        settings = {
            "layout": self._layout.describe(),
            "compressor": [self.compressor.name, self.compressor.params],
            "memory": [self.memory.name, self.memory.params],
        }
        settings.update(self.level_settings())
        return consistency.fingerprint(settings)

    # ---- the reduce function Horovod calls ------------------------------------------

    def make_reduce_fn(self, op=None, process_set=None, device_dense="", plain_horovod=None):
        """Returns Horovod's ``allreduce_grads(grads, vars=None, use_generic_names=False)``.

        ``plain_horovod``: a callable returning Horovod's own reduce function
        without compression (tf_mergecomp/horovod_hook.py passes it), used
        while MergeComp steps aside (``set_plain_horovod``)."""
        import horovod.tensorflow as hvd

        op = hvd.Average if op is None else op
        if op not in (hvd.Average, hvd.Sum):
            raise ValueError(
                "MergeComp supports op=hvd.Average or hvd.Sum, got %r (compressed gradients "
                "cannot be combined with Adasum, Min, Max or Product)" % (op,)
            )
        scale_by_size = op == hvd.Sum

        def reduce_in_graph(grads, names):
            communicator = HorovodCommunicator(process_set, counter=self.collectives_executed)
            with tf.device(device_dense or None):
                return self._reduce(grads, communicator, scale_by_size, names)

        def allreduce_grads(grads, vars=None, use_generic_names=False):  # noqa: A002 (Horovod's names)
            # Groups and their collectives' names come from the gradients alone,
            # identically on every rank; ``vars`` only label non-finite gradients.
            if self._steps_aside:
                if plain_horovod is None:
                    raise RuntimeError(
                        "MergeComp was set to step aside for plain Horovod, but this reduce "
                        "function was not made by the Horovod hook (import tf_mergecomp before "
                        "building the DistributedOptimizer or DistributedGradientTape)")
                return self._reduce_plain_horovod(list(grads), vars, use_generic_names,
                                                  plain_horovod(), process_set)
            del use_generic_names
            grads = list(grads)
            names = grouping.tensor_names(grads, vars)
            if not tf.executing_eagerly():
                return reduce_in_graph(grads, names)
            if self._eager_reduce is None:
                # A new tf.function per partition version, so a changed
                # partition is traced afresh.
                self._eager_reduce = tf.function(reduce_in_graph)
            present = [i for i, g in enumerate(grads) if g is not None]
            reduced = self._eager_reduce([grads[i] for i in present],
                                         tuple(names[i] for i in present))
            return grouping.put_back(grads, present, reduced)

        return allreduce_grads

    def _begin_step(self, dense, communicator):
        """Before a traced step's collectives: fixes the gradient layout, checks that
        the ranks agree on it and on the settings, creates the state and settles whose
        it is (rank_state.py). Returns the state variables and the agreement check's
        guards, which the step's collectives wait for."""
        self.set_gradient_layout([g.shape for g in dense], [g.dtype for g in dense])
        self._plan_levels(communicator)
        description = dict(self._layout.describe(), world_size=communicator.size, seed=self.seed,
                           nonfinite=self.nonfinite, **self.describe())
        guards = []
        # Once per description: a retrace that only this rank makes (a last partial
        # batch of its own; a joining elastic worker retracing a step whose first trace
        # created variables) must not wait in a collective the others never join. An
        # elastic reset forgets it, so that every rank checks again.
        if description != self._agreed_description:
            guards = consistency.check_ranks_agree(description, communicator.process_set)
            if not guards:  # checked at trace time (eagerly), not in the graph
                self._agreed_description = description
        self._connect_levels(communicator)
        state = self.state_variables(self._state_device(dense))
        self.rank_state.reconcile_if_needed(communicator)
        return state, guards

    def _reduce_plain_horovod(self, grads, variables, use_generic_names, plain_reduce,
                              process_set):
        """Plain Horovod's reduction of ``grads`` plus what the memory holds unsent,
        which is then cleared: stepping aside loses no error-feedback state."""
        order, dense = grouping.in_backprop_order(grads)
        if not order:
            return plain_reduce(grads, variables, use_generic_names)
        communicator = HorovodCommunicator(process_set, counter=self.collectives_executed)
        state, guards = self._begin_step(dense, communicator)
        with tf.control_dependencies(guards):
            sent, clear_sent_state = self._flush_before_plain_horovod(state, dense)
        reduced = plain_reduce(grouping.put_back(grads, order, sent), variables,
                               use_generic_names)
        with tf.control_dependencies(clear_sent_state()):
            return [None if r is None else tf.identity(r) for r in reduced]

    def _reduce(self, grads, communicator, scale_by_size, names):
        order, dense = grouping.in_backprop_order(grads)
        if not order:
            return list(grads)
        seeds.check_layout(len(order), communicator.size)
        state, guards = self._begin_step(dense, communicator)
        splits, group_codecs = self.splits, self.group_codecs
        step = seeds.step_in_cycle(self.step)
        reduced = [None] * len(order)
        nonfinite = []
        with tf.control_dependencies(guards):
            for index, (start, end) in enumerate(grouping.group_bounds(splits, len(order))):
                with tf.name_scope("mergecomp_group%d" % index):
                    group, group_communicator = dense[start:end], communicator
                    if self.step_recorder is not None:
                        group, group_communicator = self.step_recorder.group_inputs(
                            index, start, group, communicator)
                    outputs, flags = self._reduce_group_in_levels(
                        index, start, group, state[start:end], step, group_communicator,
                        group_codecs[index])
                    if self.step_recorder is not None:
                        outputs = self.step_recorder.group_outputs(index, start, outputs)
                    if scale_by_size:
                        outputs = [o * communicator.size for o in outputs]
                    reduced[start:end] = outputs
                    nonfinite.append(flags)
        nonfinite = nonfinite_gradients.join_flags(nonfinite)
        self.step.assign_add(nonfinite_gradients.step_increment(nonfinite))
        if self.nonfinite == "raise":
            reduced = nonfinite_gradients.raise_if_flagged(reduced, nonfinite,
                                                       [names[i] for i in order])
        return grouping.put_back(grads, order, reduced)

    def _group_seed(self, step, start, communicator):
        worker = 0 if self.compressor.shared_seed else communicator.rank + 1
        return seeds.group_seed(step, start, worker, self.seed)

    def reduce_group(self, grads, communicator, step=0, start=0, index=0, codec=None):
        """Reduces one group on its own, for benchmarks and tests (training goes
        through ``make_reduce_fn``): ``grads`` are gradient tensors ``start, start + 1,
        ...`` of the layout (``set_gradient_layout``), in backprop order, reduced with
        their state variables through ``communicator`` at ``step``, with ``codec`` (one
        of ``group_codec_names``; None: the compressor). ``index`` names the group's
        collectives.

        Returns the group's reduced gradients and an int32 vector, 1 for each
        tensor that some rank held non-finite (its output is then all NaN).
        """
        grads = list(grads)
        codec = self.compressor.name if codec is None else codec
        if codec not in self.group_codec_names:
            raise ValueError("codec must be one of %s, got %r"
                             % (", ".join(self.group_codec_names), codec))
        state = self.state_variables(self._state_device(grads))[start:start + len(grads)]
        step = tf.cast(step, tf.int64)
        return self._reduce_group_in_levels(index, start, grads, state, step, communicator,
                                            codec)

    def _reduce_group(self, index, start, grads, state_vars, step, communicator, codec_name):
        seed = self._group_seed(step, start, communicator)
        key = (index, sum(self._layout.sizes[start:start + len(grads)]))
        if codec_name != self.compressor.name:
            return self._reduce_plain_group(grads, state_vars, seed, communicator,
                                            key + (codec_name,), self._plain_codecs[codec_name])
        if self._sent_by_horovod(codec_name, grads):  # the compressor none, no memory
            return plain_groups.reduce_by_horovod(grads, communicator, key,
                                                  self.nonfinite == "raise")
        if self.compressor.reduces_own_groups:
            return self.compressor.reduce_group(grads, state_vars, self.memory, seed, communicator,
                                                key)
        if reference.runs_fused_ops(self.compressor):
            return fused_groups.reduce_group(self.compressor, self.memory, grads, state_vars,
                                             seed, communicator, key)
        return reference.reduce_group(self.compressor, self.memory, grads, state_vars, seed,
                                      communicator, key)

    def _sent_by_horovod(self, codec_name, grads):
        """Whether a group of ``codec_name`` goes to Horovod's grouped collectives
        (plain_groups.py): a plain ``none`` group, or the compressor ``none`` with a
        memory that keeps nothing."""
        return plain_groups.goes_to_horovods_groups(codec_name, grads) and (
            codec_name != self.compressor.name or not self.memory.state_names)

    def _reduce_plain_group(self, grads, state_vars, seed, communicator, key, codec):
        """A group sent with a plain codec: what the memory has not sent goes out with
        the gradients and is then zero (plain_groups.py)."""
        flush = plain_groups.StateFlush(self.memory, state_vars, grads)
        sent = flush.gradients_to_send()

        def reduce_plainly(tensors):
            # On the plain-TF path when the user's codec is (reference.plain).
            if self.compressor.backend != reference.PLAIN_BACKEND:
                return fused_groups.reduce_group(codec, plain_groups.NO_MEMORY, tensors, [],
                                                 seed, communicator, key)
            return reference.reduce_group(codec, plain_groups.NO_MEMORY, tensors, [], seed,
                                          communicator, key)

        if self._sent_by_horovod(codec.name, sent):
            outputs, nonfinite = plain_groups.reduce_by_horovod(sent, communicator, key,
                                                                self.nonfinite == "raise")
        else:
            outputs, nonfinite = reduce_plainly(sent)
        with tf.control_dependencies(flush.clear_sent_state()):
            outputs = [tf.identity(o) for o in outputs]
        return outputs, nonfinite

    # ---- after an elastic reset (layout and state: state_variables.py) ---------------
    def forget_traces(self):
        """After an elastic reset: the next call traces the reduce function afresh
        and checks its description with the (new) other ranks again."""
        self._eager_reduce = None
        self._agreed_description = None
        self._forget_levels()

    def __repr__(self):
        return "MergeComp(%r, memory=%r, splits=%r)" % (self.compressor, self.memory, self.splits)


def find_mergecomp(owner):
    """The MergeComp of a MergeComp, of a Keras optimizer built by
    ``hvd.DistributedOptimizer(..., compression=MergeComp(...))`` (also inside a
    loss-scale optimizer), or of a Keras model compiled with one; else None."""
    seen = 0
    while owner is not None and seen < 4:  # model -> optimizer -> inner optimizer
        if isinstance(owner, MergeComp):
            return owner
        if isinstance(getattr(owner, "mergecomp", None), MergeComp):
            return owner.mergecomp
        owner = getattr(owner, "inner_optimizer", None) or getattr(owner, "optimizer", None)
        seen += 1
    return None


def mergecomp_of(owner, compiled_with):
    """``find_mergecomp(owner)``, or TypeError naming what carries one (``compiled_with``:
    the optimizers and models of the caller's Keras)."""
    found = find_mergecomp(owner)
    if found is None:
        raise TypeError("expected a MergeComp, or %s; got %r" % (compiled_with, owner))
    return found
