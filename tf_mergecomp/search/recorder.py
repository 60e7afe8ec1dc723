"""Measuring the parts of a training step that the step-time model (step_model.py) needs:
when each gradient is ready (``GradientOps``, ``StepProfiler``) and how long each group's
encode, collective and decode take alone (``ExchangeProbe``); docs/search.md, section 1.
"""

import glob
import os
import shutil
import tempfile
import time

import numpy as np
import tensorflow as tf

STEP_MARKER = "mergecomp_profiled_step"
# Ops behind a gradient followed when the op that outputs it does not appear
# in the profile (reshapes and identities are too cheap to be traced).
_PRODUCER_DEPTH = 4


class GradientOps:
    """Engine hook (``compression.step_recorder``): per gradient, the names of
    the op that outputs it and of the ops behind it, noted while tracing."""

    def __init__(self):
        self.producers = []  # per tensor in backprop order: [op name, ...]

    def group_inputs(self, index, start, grads, communicator):
        if index == 0:  # a new trace: tf.function may trace more than once
            self.producers = []
        for grad in grads:
            chain, tensor = [], grad
            for _ in range(_PRODUCER_DEPTH):
                chain.append(tensor.op.name)
                if not tensor.op.inputs:
                    break
                tensor = tensor.op.inputs[0]
            self.producers.append(chain)
        return grads, communicator

    def group_outputs(self, index, start, outputs):
        return outputs


class ProfiledStep:
    """What the profiler saw of one training step; times in seconds from its start."""

    def __init__(self, seconds, ready):
        self.seconds = seconds
        self.ready = ready  # [N] floats, NaN where the gradient's op was not seen


class StepProfiler:
    """TensorFlow's profiler around a few steps: ``start()``, then per step
    ``step_begins()`` / ``step_ends()``, then ``stop(producers)``.

    The profile holds when each gradient's op really ended; a ``tf.timestamp()`` after a
    gradient does not (with one inter-op thread TensorFlow runs such small ops late).
    """

    def __init__(self):
        self._directory = None
        self._marker = None
        self.error = None

    def start(self):
        self._directory = tempfile.mkdtemp(prefix="mergecomp_profile_")
        try:
            tf.profiler.experimental.start(self._directory)
        except Exception as error:  # e.g. another profiler is running
            self.error = "cannot start TensorFlow's profiler: %s" % error
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None
        return self.error is None

    def step_begins(self):
        if self._directory is not None:
            self._marker = tf.profiler.experimental.Trace(STEP_MARKER)
            self._marker.__enter__()

    def step_ends(self):
        if self._marker is not None:
            self._marker.__exit__(None, None, None)
            self._marker = None

    def stop(self, producers):
        """[ProfiledStep] of the marked steps, or [] (``error`` says why)."""
        if self._directory is None:
            return []
        try:
            tf.profiler.experimental.stop()
            return self._read(producers)
        except Exception as error:
            self.error = "cannot read the profile: %s" % error
            return []
        finally:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def _read(self, producers):
        xplane_pb2 = _xplane_module()
        paths = glob.glob(os.path.join(self._directory, "**", "*.xplane.pb"), recursive=True)
        if not paths:
            raise RuntimeError("the profiler wrote no trace")
        steps = []  # (start, end) in picoseconds
        ops = {}  # op name -> [(start, end)]
        for path in paths:
            space = xplane_pb2.XSpace()
            with open(path, "rb") as f:
                space.ParseFromString(f.read())
            for plane in space.planes:
                if not plane.name.startswith("/host:"):
                    continue
                metadata = plane.event_metadata
                for line in plane.lines:
                    origin = line.timestamp_ns * 1000
                    for event in line.events:
                        name = metadata[event.metadata_id].name
                        start = origin + event.offset_ps
                        span = (start, start + event.duration_ps)
                        if name == STEP_MARKER:
                            steps.append(span)
                        elif ":" in name:  # TensorFlow ops are "name:type"
                            ops.setdefault(name.rsplit(":", 1)[0], []).append(span)
        ops = _by_traced_name(ops, {name for chain in producers for name in chain})
        profiled = []
        for begin, end in sorted(steps):
            def last_end(name):
                spans = [e for s, e in ops.get(name, ()) if begin <= s and e <= end]
                return max(spans) if spans else None

            ready = []
            for chain in producers:
                found = None
                for name in chain:
                    found = last_end(name)
                    if found is not None:
                        break
                ready.append(np.nan if found is None else (found - begin) * 1e-12)
            profiled.append(ProfiledStep((end - begin) * 1e-12, np.array(ready, dtype=np.float64)))
        return profiled


def _by_traced_name(ops, traced_names):
    """``ops`` (profiled op name -> spans) with each of ``traced_names`` not profiled
    under its own name also looked up as the end of a longer one: TensorFlow inlines a
    tf.function called from another (Keras 3's ``fit``) and runs its ops under the
    caller's node name, ``<call>/<traced name>``."""
    missing = {name for name in traced_names if name not in ops}
    if not missing:
        return ops
    found = dict(ops)
    for profiled_name, spans in ops.items():
        parts = profiled_name.split("/")
        for i in range(1, len(parts)):
            suffix = "/".join(parts[i:])
            if suffix in missing:
                found.setdefault(suffix, []).extend(spans)
                break
    return found


def _xplane_module():
    for module in ("tensorflow.tsl.profiler.protobuf.xplane_pb2",
                   "tsl.profiler.protobuf.xplane_pb2",
                   "tensorflow.core.profiler.protobuf.xplane_pb2"):
        try:
            return __import__(module, fromlist=["XSpace"])
        except ImportError:
            continue
    raise ImportError("no XSpace protocol buffer module in this TensorFlow")


# Columns of the probe's per-group record.
GROUP_START, ENCODE_END, COLLECTIVE_END, DECODE_END = range(4)
GROUP_EVENTS = 4


class _SerializedGroupRecorder:
    """Engine hook for the exchange probe: a ``tf.timestamp()`` between the parts of each
    group, every op waiting for the stamp before it, so that each stamp is the only
    runnable op when it runs; the stamps are stored in a variable."""

    def __init__(self, compression, groups):
        self.compression = compression
        # Made before tracing: a variable created while tracing makes
        # tf.function trace a second time.
        self.variable = tf.Variable(tf.zeros([groups * GROUP_EVENTS], tf.float64),
                                    trainable=False, name="probe_record")
        self._stamps = []
        self._previous = None

    def group_inputs(self, index, start, grads, communicator):
        if index == 0:
            self._stamps, self._previous = [], None
        with tf.control_dependencies([self._previous] if self._previous is not None else []):
            began = _stamp_after(grads)
        stamps = [began, None, None, None]
        self._stamps.append(stamps)
        return _after(grads, began), _ChainedCommunicator(communicator, stamps)

    def group_outputs(self, index, start, outputs):
        stamps = self._stamps[index]
        stamps[DECODE_END] = _stamp_after(outputs)
        for column in (ENCODE_END, COLLECTIVE_END):
            if stamps[column] is None:  # a group without a collective
                stamps[column] = stamps[GROUP_START]
        self._previous = stamps[DECODE_END]
        if start + len(outputs) == self.compression.num_tensors:
            self.variable.assign(tf.stack([s for group in self._stamps for s in group]))
        return outputs

    @property
    def last_stamp(self):
        """The last group's decode-end timestamp: it waits for every group."""
        return self._previous

    def read(self):
        return self.variable.numpy().reshape(-1, GROUP_EVENTS)


class _ChainedCommunicator:
    """The engine's communicator, with a timestamp before a group's first
    collective (its payload is encoded) and after its last; the collective
    waits for the first, what follows for the second."""

    def __init__(self, inner, stamps):
        self._inner = inner
        self._stamps = stamps

    def __getattr__(self, name):  # size, rank, process_set
        return getattr(self._inner, name)

    def _collective(self, method, tensor, key):
        """``method`` on a tensor, or on a list of them (a grouped collective)."""
        grouped = isinstance(tensor, list)
        tensors = tensor if grouped else [tensor]
        stamp = _stamp_after(tensors)
        if self._stamps[ENCODE_END] is None:
            self._stamps[ENCODE_END] = stamp
        inputs = _after(tensors, stamp)
        # A name apart from the training's collectives of the same group.
        result = method(inputs if grouped else inputs[0], ("probe", key))
        results = result if grouped else [result]
        self._stamps[COLLECTIVE_END] = _stamp_after(results)
        outputs = _after(results, self._stamps[COLLECTIVE_END])
        return outputs if grouped else outputs[0]

    def around(self, inner):
        """Another communicator (a two-level group's, tf_mergecomp/hierarchical.py),
        stamped into the same group's times."""
        return _ChainedCommunicator(inner, self._stamps)

    def allreduce_mean(self, tensor, key):
        return self._collective(self._inner.allreduce_mean, tensor, key)

    def reducescatter_mean(self, tensor, key):
        return self._collective(self._inner.reducescatter_mean, tensor, key)

    def alltoall(self, tensor, key):
        return self._collective(self._inner.alltoall, tensor, key)

    def allgather(self, tensor, key):
        return self._collective(self._inner.allgather, tensor, key)

    def grouped_allreduce_mean(self, tensors, key):
        return self._collective(self._inner.grouped_allreduce_mean, list(tensors), key)

    def grouped_reducescatter_mean(self, tensors, key):
        return self._collective(self._inner.grouped_reducescatter_mean, list(tensors), key)

    def grouped_allgather(self, tensors, key):
        return self._collective(self._inner.grouped_allgather, list(tensors), key)


def _stamp_after(tensors):
    with tf.control_dependencies([t for t in tensors if t is not None]):
        return tf.timestamp()


def _after(tensors, stamp):
    with tf.control_dependencies([stamp]):
        return [tf.identity(t) for t in tensors]


class ExchangeProbe:
    """Times each group of a partition alone, on tensors of the real gradient shapes.

    A second ``MergeComp`` of the same codec and memory runs on fixed random tensors,
    with error-feedback state of its own (probing never changes the training's); its
    re-trace builds a small graph, not the model. ``run(splits, repeats)`` returns a
    [repeats, groups, 3] array: per call (after one that traces) and group, its encode,
    collective and decode seconds on this rank; ``cpu_s`` then holds each call's CPU
    seconds of the whole process, every thread included (benchmarks/profile.py reads
    it). Every rank must make the same calls (they run collectives). ``traces`` counts
    the probe's traced functions.
    """

    def __init__(self, compression, seed=0):
        from tf_mergecomp.mergecomp import MergeComp

        shapes, dtypes = compression.tensor_shapes, compression.tensor_dtypes
        if shapes is None:
            raise ValueError("the MergeComp has not reduced any gradients yet: its shapes are unknown")
        # Compressors and memories keep no state of their own (the engine
        # holds it in variables), so the probe may share them.
        self.mergecomp = MergeComp(compression.compressor, memory=compression.memory,
                                   seed=compression.seed, plain_groups=compression.plain_groups,
                                   hierarchical=compression.hierarchical,
                                   machine_dtype=compression.machine_dtype, name="mergecomp_probe")
        generator = tf.random.Generator.from_seed(seed)
        # The engine reverses the list it is given (Keras passes the forward
        # order): reverse it here so that the probe's tensor i is the real one.
        self.gradients = [tf.cast(generator.normal(shape), dtype)
                          for shape, dtype in zip(shapes[::-1], dtypes[::-1])]
        self._reduce = self.mergecomp.make_reduce_fn()
        self.traces = 0
        self.cpu_s = []

    def run(self, splits, repeats=3, codec=None):
        """``codec``: every group sent with this codec (one of the MergeComp's
        ``codec_choices``); None: the compressor."""
        self.mergecomp.set_partition(list(splits) if splits else 1,
                                     group_codecs=None if codec is None
                                     else [codec] * (len(splits) + 1))
        recorder = _SerializedGroupRecorder(self.mergecomp, len(splits) + 1)
        reduce_fn = self._reduce

        def exchange(grads):
            reduced = reduce_fn(grads)
            # One element of every output, returned: TensorFlow's graph optimizer
            # prunes an op whose outputs only feed control edges.
            firsts = [tf.cast(tf.reshape(g, [-1])[0], tf.float64) for g in reduced
                      if g.shape.num_elements()]
            return tf.stack(firsts + [recorder.last_stamp])

        # No autograph: the engine is plain Python, and converting it costs
        # more than tracing it.
        function = tf.function(exchange, autograph=False)
        self.mergecomp.step_recorder = recorder
        try:
            function(self.gradients).numpy()  # traces
        finally:
            self.mergecomp.step_recorder = None
        self.traces += 1
        samples = []
        self.cpu_s = []
        for _ in range(repeats):
            cpu_started = time.process_time()
            function(self.gradients).numpy()
            self.cpu_s.append(time.process_time() - cpu_started)
            groups = recorder.read()
            samples.append(np.stack([groups[:, ENCODE_END] - groups[:, GROUP_START],
                                     groups[:, COLLECTIVE_END] - groups[:, ENCODE_END],
                                     groups[:, DECODE_END] - groups[:, COLLECTIVE_END]], axis=1))
        return np.maximum(np.stack(samples), 0.0)
