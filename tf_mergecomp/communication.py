"""Communication: one Horovod collective per call, named identically on every rank, and counted.

The engine hands each codec a communicator (``HorovodCommunicator``); codecs
never import Horovod, so they can be tested with a simulated one. Outside the
training step, ``WorkerValues`` reduces plain values over the ranks.
"""

import numpy as np
import tensorflow as tf


class HorovodCommunicator:
    """Runs collectives on a Horovod process set.

    ``counter`` (an int64 tf.Variable) is incremented once per collective that
    actually executes.
    """

    def __init__(self, process_set=None, counter=None, name_prefix="mergecomp"):
        import horovod.tensorflow as hvd

        self._hvd = hvd
        self.process_set = process_set if process_set is not None else hvd.global_process_set
        self.size = self.process_set.size()
        self.rank = self.process_set.rank()
        self._counter = counter
        self._prefix = name_prefix
        self._world_check = None

    def _name(self, key):
        return ".".join([self._prefix] + _flat_parts(key))

    def _counted(self, result):
        # The increment waits for the collective but nothing waits for the
        # increment (tf.function runs stateful ops anyway), so counting adds
        # no dependency between groups.
        if self._counter is not None:
            with tf.control_dependencies(tf.nest.flatten(result)):
                self._counter.assign_add(1)
        return result

    def _checked_world(self):
        # Rank and world size are fixed when the step is traced (payload rows,
        # seeds, the Sum scaling): after an elastic resize, a step traced for the
        # old world fails saying so, before its collectives. One check per trace.
        if self._world_check is None:
            self._world_check = tf.debugging.assert_equal(
                self._hvd.size_op(process_set_id=self.process_set.process_set_id),
                tf.constant(self.size, tf.int32),
                message="tf_mergecomp: this training step was traced for a world of %d ranks, "
                "and Horovod now has another number of ranks (an elastic reset?). Re-trace the "
                "step: hvd.elastic.KerasState does it; a custom loop re-creates its tf.function "
                "after a reset (tf_mergecomp.elastic.track(state, compression, rebuild=...))"
                % self.size)
        return tf.control_dependencies([self._world_check])

    def allreduce_mean(self, tensor, key):
        with self._checked_world():
            result = self._hvd.allreduce(
                tensor, op=self._hvd.Average, name=self._name(key), process_set=self.process_set
            )
        return self._counted(result)

    def reducescatter_mean(self, tensor, key):
        """Rank r's part (the r-th of ``size`` equal parts of the first dimension) of
        the ranks' average of ``tensor``."""
        with self._checked_world():
            result = self._hvd.reducescatter(
                tensor, op=self._hvd.Average, name=self._name(key), process_set=self.process_set
            )
        return self._counted(result)

    def alltoall(self, tensor, key):
        """Row r of the result: row ``rank`` of rank r's ``tensor`` (one row per rank)."""
        with self._checked_world():
            result = self._hvd.alltoall(tensor, name=self._name(key), process_set=self.process_set)
        return self._counted(result)

    def allgather(self, tensor, key):
        with self._checked_world():
            result = self._hvd.allgather(tensor, name=self._name(key), process_set=self.process_set)
        return self._counted(result)

    # Horovod's grouped collectives: one collective for a list of tensors, copied on
    # Horovod's own thread (docs/design.md, "One group, three ops").

    def grouped_allreduce_mean(self, tensors, key):
        """The ranks' average of each of ``tensors`` (one dtype)."""
        with self._checked_world():
            results = self._hvd.grouped_allreduce(
                list(tensors), op=self._hvd.Average, name=self._name(key),
                process_set=self.process_set)
        return self._counted(list(results))

    def grouped_reducescatter_mean(self, tensors, key):
        """Rank r's part of the ranks' average of each 1-D tensor of ``tensors`` (one
        dtype): Horovod's split into ``size`` contiguous parts, in rank order, as
        ``grouped_allgather`` joins them back."""
        # hvd.grouped_reducescatter takes no name, and the collective must be named alike
        # on every rank: so Horovod 0.28.1's op wrapper, which takes one.
        from horovod.tensorflow import mpi_ops

        with self._checked_world():
            results = mpi_ops._grouped_reducescatter(
                list(tensors), name=self._name(key), op=self._hvd.Average,
                process_set=self.process_set)
        return self._counted(list(results))

    def grouped_allgather(self, tensors, key):
        """Each of ``tensors``, concatenated over the ranks in rank order."""
        with self._checked_world():
            results = self._hvd.grouped_allgather(list(tensors), name=self._name(key),
                                                  process_set=self.process_set)
        return self._counted(list(results))


def _flat_parts(key):
    """A (possibly nested) tuple key as name parts: ((0, 84), "P") -> ["0", "84", "P"]."""
    if isinstance(key, tuple):
        return [part for item in key for part in _flat_parts(item)]
    return [str(key)]


# ---- values the ranks agree on, outside the training step ------------------------------

def running_horovod():
    """``horovod.tensorflow`` when it is installed and initialized, else None
    (a single process: every reduction below is then the identity)."""
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return None
    return hvd if hvd.is_initialized() else None


def rank():
    hvd = running_horovod()
    return 0 if hvd is None else hvd.rank()


def world_size():
    hvd = running_horovod()
    return 1 if hvd is None else hvd.size()


class WorkerValues:
    """Eager reductions of numpy values over all ranks (the partition search's
    timings and decisions), each under a collective name of its own, as the
    shapes differ from call to call. Every rank must make the same calls in the
    same order."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.calls = 0

    def _allreduce(self, values, op_name, name):
        hvd = running_horovod()
        values = np.asarray(values, dtype=np.float64)
        if hvd is None or hvd.size() == 1:
            return values
        op = {"average": hvd.Average, "min": hvd.Min, "sum": hvd.Sum}[op_name]
        self.calls += 1
        return hvd.allreduce(tf.constant(values), op=op,
                             name="%s.%s.%d" % (self.prefix, name, self.calls)).numpy()

    def average(self, values, name):
        return self._allreduce(values, "average", name)

    def minimum(self, values, name):
        return self._allreduce(values, "min", name)

    def mean_of_finite(self, values, name):
        """Elementwise mean over the ranks that have a value (NaN where none has)."""
        values = np.asarray(values, dtype=np.float64)
        seen = np.isfinite(values)
        total = self._allreduce(np.where(seen, values, 0.0), "sum", name)
        count = self._allreduce(seen.astype(np.float64), "sum", name + "_count")
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, total / np.maximum(count, 1), np.nan)

    def from_rank0(self, value, name):
        """Rank 0's ``value`` (any picklable object) on every rank."""
        hvd = running_horovod()
        if hvd is None or hvd.size() == 1:
            return value
        return hvd.broadcast_object(value, root_rank=0, name="%s.%s" % (self.prefix, name))
