"""One Horovod collective per call, named identically on every rank, and counted.

The engine hands each codec a communicator; codecs never import Horovod, so
they can be tested with a simulated one.
"""

import tensorflow as tf

from tf_mergecomp import rendezvous


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


# Horovod's response cache keeps an entry for every collective name it has run
# (up to HOROVOD_CACHE_CAPACITY, 1024 by default, evicting nothing below it),
# and every background cycle (HOROVOD_CYCLE_TIME) coordinates a bit per entry
# across the ranks. A partition search runs many candidates, each with its own
# collective names (layer-wise alone: one per tensor), so afterwards every
# cycle of the chosen partition's training carries all of them. Measured on
# ResNet50 with 2 ranks of 2 cores (docs/benchmarks.md, "The search's
# collectives outlive it"): one group's step 0.25 s before a search, 0.30-0.32 s
# after it, its background thread from 14 to 82 ms of system time per step.
# Restarting Horovod empties the cache.
def restart_blocker(hvd=None, environ=None):
    """Why Horovod cannot be restarted safely here, or None when it can.

    A restart (``hvd.shutdown(); hvd.init()``) is safe when every rank does it
    between the same two steps with no collective pending, and the re-init
    rebuilds everything the first init made: one Gloo-controlled world started
    by ``horovodrun`` (MPI cannot be initialized twice), no elastic driver
    (it owns resets), no process set besides the global one (their ids would
    be lost), no timeline (it would be truncated), no autotuning (it would
    start over) and a response cache to empty. The answer depends only on the
    launch, which is the same on every rank; ask while Horovod runs on every
    rank (before any restart).
    """
    import os

    if hvd is None:
        import horovod.tensorflow as hvd
    environ = os.environ if environ is None else environ
    if not hvd.is_initialized():
        return "Horovod is not initialized"
    if hvd.size() == 1:
        return "one rank"
    if hvd.mpi_enabled() or not hvd.gloo_enabled():
        return "Horovod runs on MPI, which cannot be initialized twice"
    if "HOROVOD_GLOO_RENDEZVOUS_ADDR" not in environ:
        return "not launched by horovodrun"
    if environ.get("HOROVOD_ELASTIC", "0") not in ("", "0"):
        return "elastic run"
    for variable, why in (("HOROVOD_TIMELINE", "a timeline is recorded"),
                          ("HOROVOD_AUTOTUNE", "Horovod autotunes")):
        if environ.get(variable, "") not in ("", "0"):
            return why + " (%s)" % variable
    if environ.get("HOROVOD_CACHE_CAPACITY", "1024").strip() == "0":
        return "the response cache is off (HOROVOD_CACHE_CAPACITY=0)"
    if environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "0") not in ("", "0") \
            or _process_set_count() != 1:
        return "process sets besides the global one"
    return None


def _process_set_count():
    # Horovod has no public listing of process sets; without this one, assume
    # there may be others.
    try:
        from horovod.common import process_sets

        return len(process_sets._basics._get_process_set_ids_and_ranks())
    except Exception:  # noqa: BLE001 (any failure means: do not restart)
        return -1


def restart_horovod():
    """Empties Horovod's response cache by restarting it. Every rank must call
    this between the same two steps, and only where ``restart_blocker()``
    answered None, asked before the first restart: a rank's shutdown stops the
    other ranks' Horovod too, which then answer differently.

    Returns None once restarted, or (the same on every rank) why Horovod was
    left running: the launcher's rendezvous server still held addresses of
    the world before, which the re-init could read (tf_mergecomp/rendezvous.py).
    """
    import horovod.tensorflow as hvd

    problem = clear_rendezvous(hvd)
    if problem is not None:
        return problem
    hvd.shutdown()
    hvd.init()
    return None


_placements = {}  # (rank, size) -> every rank's (host name, local rank)


def clear_rendezvous(hvd, environ=None):
    """Empties the rendezvous scopes the last ``hvd.init()`` left stale, from
    rank 0 while the other ranks wait for its answer. A collective: every rank
    calls it. Returns None, or why Horovod must not be initialized again."""
    import os

    environ = os.environ if environ is None else environ
    world = (hvd.rank(), hvd.size())
    if world not in _placements:
        # Gloo names a rank's local scope after HOROVOD_HOSTNAME, "localhost" unset.
        _placements[world] = hvd.allgather_object(
            (environ.get("HOROVOD_HOSTNAME", "localhost"), hvd.local_rank()),
            name="tf_mergecomp.rendezvous_placements")
    problem = None
    if hvd.rank() == 0:
        server = "%s:%s" % (environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                            environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
        try:
            _, left = rendezvous.clear_stale_scopes(
                server, rendezvous.job_scopes(_placements[world]))
            if left:
                problem = ("the rendezvous server at %s kept the old addresses in scope %s"
                           % (server, ", ".join(left)))
        except OSError as error:
            problem = "the rendezvous server at %s did not answer (%s)" % (server, error)
    return hvd.broadcast_object(problem, root_rank=0, name="tf_mergecomp.rendezvous_cleared")
