"""Restarting Horovod between the partition search's candidates.

A restart empties Horovod's response cache, which keeps every collective name the
candidates ran (layer-wise alone: one per tensor) and syncs them across the ranks in every
background cycle (docs/search.md, section 3). The driver (driver.py) restarts Horovod at
each switch of candidate and once the partition is fixed, where ``restart_blocker``
allows; ``restart_horovod=False`` turns it off.
"""

import os

from tf_mergecomp import rendezvous
from tf_mergecomp.hierarchical import dynamic_process_sets, listed_process_sets

# {id: ranks} of the process sets besides the global one, or None where Horovod does not
# list them: a name of this module, so that tests can replace it here.
_process_sets = listed_process_sets


def restart_blocker(hvd=None, environ=None):
    """Why Horovod cannot be restarted safely here, or None when it can.

    A restart (``hvd.shutdown(); hvd.init()``) is safe when every rank does it between
    the same two steps with no collective pending, and the re-init rebuilds everything
    the first init made: a Gloo world started by ``horovodrun``, no elastic driver (it
    owns resets), process sets that can be made again under the same ids (1 to n, none
    removed), no timeline (it would be truncated), no autotuning (it would start over)
    and a response cache to empty. The answer depends only on the launch and the process
    sets, so it is the same on every rank; ask while Horovod runs on every rank (before
    any restart).
    """
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
    process_sets = _process_sets()
    if process_sets is None:
        return "process sets that Horovod does not list"
    if sorted(process_sets) != list(range(1, len(process_sets) + 1)):
        return ("process sets of which some were removed (ids %s): a restart would number "
                "them afresh" % sorted(process_sets))
    return None


def _init_with_process_sets(hvd, process_sets):
    """``hvd.init`` that makes ``process_sets`` ({id: ranks}, ids 1 to n) again under the
    same ids, so that every ProcessSet object held before (MergeComp's two-level reduce
    holds some) stays valid: registered at init, or added in id order where dynamic
    process sets are on (each id is then the next free one)."""
    from horovod.common.process_sets import ProcessSet

    ordered = [process_sets[i] for i in sorted(process_sets)]
    if dynamic_process_sets():
        hvd.init()
        for ranks in ordered:
            hvd.add_process_set(ranks)
    else:
        hvd.init(process_sets=[ProcessSet(ranks) for ranks in ordered])
    if _process_sets() != process_sets:
        raise RuntimeError("Horovod restarted with process sets %s, not %s as before: the "
                           "ProcessSet objects held would name the wrong ranks"
                           % (_process_sets(), process_sets))


def restart_horovod():
    """Empties Horovod's response cache by restarting it. Every rank must call this
    between the same two steps, and only where ``restart_blocker()``, asked before the
    first restart, answered None (a rank's shutdown stops the other ranks' Horovod too,
    which would then answer differently).

    Returns None once restarted, or (the same on every rank) why Horovod was left
    running: the launcher's rendezvous server still held the previous world's
    addresses, which the re-init could read (tf_mergecomp/rendezvous.py).
    """
    import horovod.tensorflow as hvd

    # Listed before the rendezvous' collectives: once they return, a faster rank's
    # shutdown may already have stopped Horovod here.
    process_sets = _process_sets()
    if process_sets is None:  # restart_blocker said they could be listed: the same everywhere
        return "Horovod did not list its process sets"
    problem = clear_rendezvous(hvd)
    if problem is not None:
        return problem
    hvd.shutdown()
    _init_with_process_sets(hvd, process_sets)
    return None


_placements = {}  # (rank, size) -> every rank's (host name, local rank)


def clear_rendezvous(hvd, environ=None):
    """Empties the rendezvous scopes the last ``hvd.init()`` left stale, from
    rank 0 while the other ranks wait for its answer. A collective: every rank
    calls it. Returns None, or why Horovod must not be initialized again."""
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
