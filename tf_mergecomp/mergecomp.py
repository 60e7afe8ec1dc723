"""MergeComp: merge gradients into groups, compress each group once, one collective each.

    import horovod.tensorflow.keras as hvd
    from tf_mergecomp import MergeComp
    opt = hvd.DistributedOptimizer(opt, compression=MergeComp("efsignsgd", partitions=2))

Per training step, with gradients in backprop order (the order they become
ready; for Keras models the reverse of ``trainable_variables``) cut into
contiguous groups by the partition, each group costs three ops whatever its
number of tensors:

  1. ``MergecompGroupEncode`` takes the group's gradients as a list (any float
     dtypes and shapes; ``IndexedSlices`` are densified) and each tensor's
     error-feedback state, and in one kernel compensates the gradients (g + e,
     SIGNUM's momentum, DGC's momentum correction and accumulation), encodes
     the group's one payload, decodes this worker's own payload and updates the
     state in place;
  2. one Horovod collective sends the payload (allreduce-average when payloads
     can be summed, else allgather);
  3. ``MergecompGroupDecode`` decodes and combines (mean, or majority vote)
     straight into per-tensor outputs of the original shapes and dtypes.

Each group's ops depend only on its own gradients, so a group's communication
can start while backprop still computes the next groups. Compressors built
with ``backend="reference"`` run the plain-TF path instead: concatenate,
compensate, compress, communicate, decompress, update, split; it is the
reference the fused ops are tested against. PowerSGD (a matrix per tensor, two
collectives per group) reduces its groups itself (``reduce_group``), with its
own fused ops and plain-TF reference.

State (all ``tf.Variable``s, tracked by this ``tf.Module`` so they checkpoint):
one flat float32 variable per gradient tensor holding the memory's buffers back
to back (the residual e; SIGNUM's momentum m; DGC's momentum u then
accumulation v), then the codec's own state of that tensor (PowerSGD's Q),
independent of the partition, so a partition change needs no re-layout; the
step counter that seeds the codecs' random draws; and a counter of executed
collectives. When MergeComp is given to ``hvd.DistributedOptimizer`` (Keras)
it is attached to the optimizer, so ``tf.train.Checkpoint(optimizer=opt)`` and
``model.save_weights`` carry it; with ``DistributedGradientTape`` add it to
your checkpoint: ``tf.train.Checkpoint(model=..., optimizer=..., mergecomp=mc)``.
"""

import numbers

import tensorflow as tf

from tf_mergecomp import _ops
from tf_mergecomp import compressors
from tf_mergecomp import consistency
from tf_mergecomp import grouping
from tf_mergecomp import memory as memories
from tf_mergecomp.communication import HorovodCommunicator

# Bit layout of the int64 seed given to codecs: step, group and worker never
# collide for steps < 2**24 per user seed, 4096 tensors and 4095 workers. A
# group is named by its first tensor's index, and tensor i of a group draws
# with the seed + (i << TENSOR_SEED_SHIFT), so codecs that draw per tensor
# draw the same whatever the partition.
_STEP_SHIFT = 24
_TENSOR_SHIFT = compressors.TENSOR_SEED_SHIFT
_TENSOR_LIMIT = 1 << (_STEP_SHIFT - _TENSOR_SHIFT)
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
        self._state = None
        self._eager_reduce = None
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.collectives_executed = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="collectives_executed"
        )
        # The partition search's step recorder (tf_mergecomp/step_recorder.py),
        # set only while it traces the step it profiles or an exchange probe: it
        # sees each group's inputs, collectives and outputs. None otherwise, and
        # the step has only the engine's own ops.
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
                    group, group_communicator = dense[start:end], communicator
                    if self.step_recorder is not None:
                        group, group_communicator = self.step_recorder.group_inputs(
                            index, start, group, communicator)
                    outputs = self._reduce_group(
                        index, start, group, state[start:end] if state else [],
                        step, group_communicator,
                    )
                    if self.step_recorder is not None:
                        outputs = self.step_recorder.group_outputs(index, start, outputs)
                    if scale_by_size:
                        outputs = [o * communicator.size for o in outputs]
                    reduced[start:end] = outputs
        self.step.assign_add(1)
        out = [None] * len(grads)
        for position, i in enumerate(order):
            out[i] = reduced[position]
        return out

    def _group_seed(self, step, start, communicator):
        worker = 0 if self.compressor.shared_seed else communicator.rank + 1
        constant = (start % _TENSOR_LIMIT << _TENSOR_SHIFT) + worker + (self.seed << _USER_SEED_SHIFT)
        return step * (1 << _STEP_SHIFT) + tf.constant(constant, tf.int64)

    def _reduce_group(self, index, start, grads, state_vars, step, communicator):
        seed = self._group_seed(step, start, communicator)
        key = (index, sum(self._layout.sizes[start:start + len(grads)]))
        if self.compressor.reduces_own_groups:
            return self.compressor.reduce_group(grads, state_vars, self.memory, seed, communicator,
                                                key)
        if self.compressor.group_codec is not None and self.compressor.backend == "op":
            return self._reduce_group_fused(grads, state_vars, seed, communicator, key)
        return self._reduce_group_reference(grads, state_vars, seed, communicator, key)

    def _reduce_group_fused(self, grads, state_vars, seed, communicator, key):
        codec = self.compressor
        codec_attrs = dict(codec=codec.group_codec,
                           **codec.group_op_attrs([g.shape.num_elements() for g in grads]))
        ops = _ops.load()
        payload, codec_context = ops.mergecomp_group_encode(
            grads, [v.handle for v in state_vars], seed, payload_type=codec.payload_dtype,
            memory=self.memory.name, **self.memory.op_attrs(), **codec_attrs)
        if codec.collective == compressors.ALLREDUCE:
            collected, rows = communicator.allreduce_mean(payload, key), 1
        else:
            collected, rows = communicator.allgather(payload, key), communicator.size
        return ops.mergecomp_group_decode(
            collected, codec_context, T=[g.dtype for g in grads], shapes=[g.shape for g in grads],
            num_rows=rows, **codec_attrs)

    def _reduce_group_reference(self, grads, state_vars, seed, communicator, key):
        """The plain-TF group: flatten, compensate, compress, decode, update, split."""
        sizes = [g.shape.num_elements() for g in grads]
        flat = grouping.flatten(grads)
        state = {
            name: grouping.flatten([v[b * n:(b + 1) * n] for v, n in zip(state_vars, sizes)])
            for b, name in enumerate(self.memory.state_names)
        }
        compensated, state = self.memory.compensate(flat, state)
        averaged, sent = self.compressor.reduce(compensated, seed, communicator, key, sizes=sizes)
        if self.memory.needs_sent:
            state = self.memory.update(compensated, sent(), state)
        if state:
            per_name = [tf.split(state[name], sizes) if len(sizes) > 1 else [state[name]]
                        for name in self.memory.state_names]
            for variable, buffers in zip(state_vars, zip(*per_name)):
                variable.assign(tf.concat(buffers, 0) if len(buffers) > 1 else buffers[0])
        return grouping.unflatten(averaged, [g.shape for g in grads], [g.dtype for g in grads])

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
        """One flat float32 variable per gradient tensor (backprop order), holding
        the memory's buffers back to back, then the codec's own state of the
        tensor; [] when neither keeps anything."""
        names = self.memory.state_names
        codec = self.compressor
        codec_sizes = [codec.codec_state_size(shape) for shape in self._layout.shapes]
        if self._state is None and (names or any(codec_sizes)):
            # The group kernels are CPU kernels: their state lives in host
            # memory also on GPU hosts, where TensorFlow then runs the group
            # ops on the CPU and copies the gradients.
            with tf.init_scope(), tf.device("/device:CPU:0"):
                self._state = []
                for i, (shape, size) in enumerate(zip(self._layout.shapes, self._layout.sizes)):
                    initial = [tf.zeros([len(names) * size], tf.float32)]
                    if codec_sizes[i]:
                        codec_state = codec.initial_codec_state(shape, i)
                        initial.append(tf.zeros([codec_sizes[i]], tf.float32)
                                       if codec_state is None else codec_state)
                    self._state.append(tf.Variable(
                        tf.concat(initial, 0), trainable=False,
                        name="%s_%d" % ("_".join(names) or "codec_state", i)))
        return list(self._state or [])

    def __repr__(self):
        return "MergeComp(%r, memory=%r, splits=%r)" % (self.compressor, self.memory, self.splits)


def _densify(grad):
    if isinstance(grad, tf.IndexedSlices):
        # Embedding gradients: merged groups need dense buffers; the codec then
        # compresses the dense gradient (zeros included).
        return tf.convert_to_tensor(grad)
    return grad
