"""One Horovod collective per call, named identically on every rank, and counted.

The engine hands each codec a communicator; codecs never import Horovod, so
they can be tested with a simulated one.
"""

import tensorflow as tf


class HorovodCommunicator:
    """Runs collectives on a Horovod process set.

    ``counter`` (an int64 tf.Variable) is incremented once per collective that
    actually executes, so tests and benchmarks can check the number of
    collectives per step.
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
            with tf.control_dependencies([result]):
                self._counter.assign_add(1)
        return result

    def _checked_world(self):
        # Rank and world size are fixed when the step is traced (payload rows,
        # seeds, the Sum scaling). After an elastic resize, a step traced for the
        # old world must fail saying so, before its collectives, rather than
        # with a payload-shape error or a wrong result. One check per trace.
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

    def allgather(self, tensor, key):
        with self._checked_world():
            result = self._hvd.allgather(tensor, name=self._name(key), process_set=self.process_set)
        return self._counted(result)


def _flat_parts(key):
    """A (possibly nested) tuple key as name parts: ((0, 84), "P") -> ["0", "84", "P"]."""
    if isinstance(key, tuple):
        return [part for item in key for part in _flat_parts(item)]
    return [str(key)]
