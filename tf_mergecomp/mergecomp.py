"""MergeComp: merge gradients into groups, compress each group once, one collective each.

    import horovod.tensorflow.keras as hvd
    from tf_mergecomp import MergeComp
    opt = hvd.DistributedOptimizer(opt, compression=MergeComp("efsignsgd", partitions=2))

Per training step, with gradients in backprop order (the order they become
ready; for Keras models the reverse of ``trainable_variables``) cut into
contiguous groups by the partition, each group is:

  1. flattened into one float32 buffer (mixed-precision and float64 gradients
     are cast, ``IndexedSlices`` are densified);
  2. compensated by the error-feedback memory (g + residual, DGC's momentum
     correction, SIGNUM's momentum, ...);
  3. compressed by the codec's custom op into one payload;
  4. sent in one Horovod collective (allreduce-average when payloads can be
     summed, else allgather);
  5. decoded and combined (mean, or majority vote), and the memory updated from
     this worker's own payload;
  6. split back into the original shapes and dtypes.

Each group's ops depend only on its own gradients, so a group's communication
can start while backprop still computes the next groups.

State (all ``tf.Variable``s, tracked by this ``tf.Module`` so they checkpoint):
memory buffers kept per gradient tensor, independent of the partition (a
partition change needs no re-layout), the step counter that seeds the codecs'
random draws, the codec's own state (PowerSGD's Q), and a counter of executed
collectives. When MergeComp is given to ``hvd.DistributedOptimizer`` (Keras)
it is attached to the optimizer, so ``tf.train.Checkpoint(optimizer=opt)``
and ``model.save_weights`` carry it; with ``DistributedGradientTape`` add it
to your checkpoint: ``tf.train.Checkpoint(model=..., optimizer=..., mergecomp=mc)``.
"""

import numbers

import tensorflow as tf

from tf_mergecomp import compressors
from tf_mergecomp import consistency
from tf_mergecomp import grouping
from tf_mergecomp import memory as memories
from tf_mergecomp.communication import HorovodCommunicator

# Bit layout of the int64 seed given to codecs: step, group and worker never
# collide for steps < 2**24 per user seed, 4096 groups and 4095 workers.
_STEP_SHIFT = 24
_GROUP_SHIFT = 12
_USER_SEED_SHIFT = 48


class _Layout:
    """Shapes and dtypes of the gradient list, in backprop order."""

    def __init__(self, shapes, dtypes):
        self.shapes = [tf.TensorShape(s) for s in shapes]
        self.dtypes = list(dtypes)
        self.sizes = [s.num_elements() for s in self.shapes]

    def describe(self):
        return {
            "tensors": len(self.shapes),
            "shapes": [s.as_list() for s in self.shapes],
            "dtypes": [d.name for d in self.dtypes],
        }


class MergeComp(tf.Module):
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
      **compressor_params: passed to the compressor (e.g. ``ratio=0.01``).
    """

    def __init__(self, compressor, memory=None, partitions=None, seed=0, name="mergecomp",
                 **compressor_params):
        super().__init__(name=name)
        self.compressor = compressors.get(compressor, **compressor_params)
        if memory is None:
            self.memory = memories.get(
                self.compressor.default_memory, **self.compressor.default_memory_params()
            )
        else:
            self.memory = memories.get(memory)
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**14:
            raise ValueError("seed must be an integer in [0, 16384), got %r" % (seed,))
        self.seed = int(seed)
        self._partition_spec = grouping.check_partition_spec(partitions)
        self._splits = None
        self.partition_version = 0
        self._layout = None
        self._state = {}
        self._eager_reduce = None
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.collectives_executed = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="collectives_executed"
        )

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
    def splits(self):
        if self._splits is None and self._layout is not None:
            self._splits = grouping.resolve_splits(self._partition_spec, self._layout.sizes)
        return self._splits

    @property
    def num_groups(self):
        splits = self.splits
        return None if splits is None else len(splits) + 1

    def set_partition(self, partitions):
        """Sets the grouping used from the next trace of the reduce function on.

        Keras: call ``model.make_train_function(force=True)`` after it (the
        partition search callback does). Custom loops: re-create the
        ``tf.function`` of the train step (``PartitionSearch.function`` does).
        """
        spec = grouping.check_partition_spec(partitions)
        if self._layout is not None:
            splits = grouping.resolve_splits(spec, self._layout.sizes)
        else:
            splits = None
        self._partition_spec = spec
        self._splits = splits
        self.partition_version += 1
        self._eager_reduce = None

    def describe(self):
        return {
            "compressor": self.compressor.name,
            "compressor_params": self.compressor.params,
            "memory": self.memory.name,
            "memory_params": self.memory.params,
            "splits": None if self.splits is None else list(self.splits),
        }

    def model_fingerprint(self):
        if self._layout is None:
            return None
        return consistency.fingerprint(self._layout.describe())

    # ---- the reduce function Horovod calls ------------------------------------------

    def make_reduce_fn(self, op=None, process_set=None, device_dense=""):
        """Returns Horovod's ``allreduce_grads(grads, vars=None, use_generic_names=False)``."""
        import horovod.tensorflow as hvd

        op = hvd.Average if op is None else op
        if op not in (hvd.Average, hvd.Sum):
            raise ValueError(
                "MergeComp supports op=hvd.Average or hvd.Sum, got %r (compressed gradients "
                "cannot be combined with Adasum, Min, Max or Product)" % (op,)
            )
        scale_by_size = op == hvd.Sum

        def reduce_in_graph(grads):
            communicator = HorovodCommunicator(process_set, counter=self.collectives_executed)
            with tf.device(device_dense or None):
                return self._reduce(grads, communicator, scale_by_size)

        def allreduce_grads(grads, vars=None, use_generic_names=False):  # noqa: A002 (Horovod's names)
            # Groups are formed from the gradients alone, and their collectives
            # are named by group, identically on every rank.
            del vars, use_generic_names
            grads = list(grads)
            if not tf.executing_eagerly():
                return reduce_in_graph(grads)
            if self._eager_reduce is None:
                # A new tf.function per partition version, so a changed
                # partition is traced afresh.
                self._eager_reduce = tf.function(reduce_in_graph)
            present = [i for i, g in enumerate(grads) if g is not None]
            reduced = self._eager_reduce([grads[i] for i in present])
            out = [None] * len(grads)
            for i, r in zip(present, reduced):
                out[i] = r
            return out

        return allreduce_grads

    def _reduce(self, grads, communicator, scale_by_size):
        present = [i for i, g in enumerate(grads) if g is not None]
        # Gradients of the last layers are ready first: reverse the list.
        order = present[::-1]
        if not order:
            return list(grads)
        dense = [_densify(grads[i]) for i in order]
        self._set_layout(_Layout([g.shape for g in dense], [g.dtype for g in dense]))
        splits = self.splits
        guards = consistency.check_ranks_agree(
            dict(self._layout.describe(), world_size=communicator.size, **self.describe()),
            communicator.process_set,
        )
        state = self._state_variables()
        step = self.step.read_value()
        reduced = [None] * len(order)
        with tf.control_dependencies(guards):
            for index, (start, end) in enumerate(grouping.group_bounds(splits, len(order))):
                with tf.name_scope("mergecomp_group%d" % index):
                    outputs = self._reduce_group(
                        index, dense[start:end],
                        {name: vs[start:end] for name, vs in state.items()},
                        step, communicator,
                    )
                    if scale_by_size:
                        outputs = [o * communicator.size for o in outputs]
                    reduced[start:end] = outputs
        self.step.assign_add(1)
        out = [None] * len(grads)
        for position, i in enumerate(order):
            out[i] = reduced[position]
        return out

    def _reduce_group(self, index, grads, state_vars, step, communicator):
        flat = grouping.flatten(grads)
        state = {name: grouping.flatten(vs) for name, vs in state_vars.items()}
        compensated, state = self.memory.compensate(flat, state)
        worker = 0 if self.compressor.shared_seed else communicator.rank + 1
        seed = (
            step * (1 << _STEP_SHIFT)
            + tf.constant((index << _GROUP_SHIFT) + worker + (self.seed << _USER_SEED_SHIFT), tf.int64)
        )
        averaged, sent = self.compressor.reduce(
            compensated, seed, communicator, (index, int(flat.shape[0]))
        )
        if self.memory.needs_sent:
            state = self.memory.update(compensated, sent(), state)
        for name, variables in state_vars.items():
            parts = grouping.unflatten(state[name], [v.shape for v in variables], [tf.float32] * len(variables))
            for variable, part in zip(variables, parts):
                variable.assign(part)
        return grouping.unflatten(
            averaged, [g.shape for g in grads], [g.dtype for g in grads]
        )

    # ---- layout and state ----------------------------------------------------------

    def _set_layout(self, layout):
        if self._layout is None:
            self._layout = layout
            return
        old, new = self._layout.describe(), layout.describe()
        if old != new:
            difference = consistency.first_difference(old, new)
            raise ValueError(
                "this MergeComp was first used with a different gradient list (%s: %r, now %r); "
                "use one MergeComp per optimizer or tape" % difference
            )

    def _state_variables(self):
        """name -> [one float32 variable per gradient tensor, in backprop order]."""
        for name in self.memory.state_names:
            if name not in self._state:
                with tf.init_scope():
                    self._state[name] = [
                        tf.Variable(tf.zeros(shape, tf.float32), trainable=False,
                                    name="%s_%d" % (name, i))
                        for i, shape in enumerate(self._layout.shapes)
                    ]
        return {name: list(self._state[name]) for name in self.memory.state_names}

    def __repr__(self):
        return "MergeComp(%r, memory=%r, splits=%r)" % (self.compressor, self.memory, self.splits)


def _densify(grad):
    if isinstance(grad, tf.IndexedSlices):
        # Embedding gradients: merged groups need dense buffers; the codec then
        # compresses the dense gradient (zeros included).
        return tf.convert_to_tensor(grad)
    return grad
