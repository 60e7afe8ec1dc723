"""Saved partitions: the search's result as JSON, reused by a later run that matches.

A file holds what it was searched for (``identity``: model fingerprint, world size,
compression), the partition and the search's account (``record``). A run that does not
match is told why and searches again.
"""

import json
import os

import numpy as np

from tf_mergecomp import communication
from tf_mergecomp.search.requests import PLAIN_HOROVOD

FILE_FORMAT = "tf_mergecomp.partition_search/3"


class PartitionStore:
    """One ``save_path``: checked, read and written on rank 0, answered to all ranks
    through ``values`` (a ``communication.WorkerValues``), so that all take the same path."""

    def __init__(self, path, values):
        self.path = os.fspath(path)
        self._values = values
        self._checked = False

    def check_writable(self):
        """Fails on every rank, before training, when rank 0 cannot write the
        file (every rank must call it: it broadcasts rank 0's finding). Runs once."""
        if self._checked:
            return
        self._checked = True
        problem = unwritable_reason(self.path) if communication.rank() == 0 else None
        problem = self._values.from_rank0(problem, "save_path_check")
        if problem:
            raise ValueError("MergeComp search: save_path %r cannot be written on rank 0: %s"
                             % (self.path, problem))

    def load(self, identity, num_tensors):
        """(saved layout or None, why a search is needed), decided on rank 0 for all ranks.

        A saved layout is {"partition": splits, "group_codecs": a codec name per group or
        None, "plain_horovod": bool}. ``identity``: what the file must have been saved for
        (``identity()`` makes it); ``num_tensors`` bounds the splits."""
        decision = self._read(identity, num_tensors) if communication.rank() == 0 else None
        return tuple(self._values.from_rank0(decision, "saved_partition"))

    def _read(self, identity, num_tensors):
        path = self.path
        if not os.path.exists(path):
            return None, "no saved partition at %s" % path
        try:
            with open(path) as f:
                saved = json.load(f)
        except (OSError, ValueError) as exc:
            return None, "cannot read %s (%s)" % (path, exc)
        if not isinstance(saved, dict) or saved.get("format") != FILE_FORMAT:
            return None, "%s is not a saved partition (format %r)" % (path, FILE_FORMAT)
        for key, value in identity.items():
            if saved.get(key) != value:
                return None, "%s was saved for a different %s (%r there, %r here)" % (
                    path, key.replace("_", " "), saved.get(key), value)
        partition = saved.get("partition")
        if (not isinstance(partition, list) or any(not isinstance(s, int) for s in partition)
                or partition != sorted(set(partition))
                or any(not 0 < s < num_tensors for s in partition)):
            return None, "%s holds an invalid partition %r" % (path, partition)
        codecs = saved.get("group_codecs")
        if codecs is not None and (not isinstance(codecs, list) or len(codecs) != len(partition) + 1
                                   or not all(isinstance(c, str) for c in codecs)):
            return None, "%s holds invalid group codecs %r for %d groups" % (
                path, codecs, len(partition) + 1)
        plain_horovod = saved.get("plain_horovod", False)
        if not isinstance(plain_horovod, bool):
            return None, "%s holds an invalid plain_horovod %r" % (path, plain_horovod)
        return {"partition": partition, "group_codecs": codecs,
                "plain_horovod": plain_horovod}, None

    def save(self, identity, record):
        """Writes ``identity`` and ``record`` (rank 0 only; atomically). True once written."""
        if communication.rank() != 0:
            return False
        document = {"format": FILE_FORMAT}
        document.update(identity)
        document.update(record)
        document = json.loads(json.dumps(document, default=jsonable))
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        temporary = self.path + ".tmp"
        with open(temporary, "w") as f:
            json.dump(document, f, indent=1)
        os.replace(temporary, self.path)
        return True


def unwritable_reason(path):
    """Why ``path`` cannot be written (None if it can): tried by creating its
    folder and a file beside it, as the save will."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return "it is a directory"
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        trial = path + ".write_check"
        with open(trial, "w") as f:
            f.write("")
        os.remove(trial)
    except OSError as error:
        return "%s: %s" % (type(error).__name__, error)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return "the file exists and is read-only"
    return None


def jsonable(value):
    """``json.dumps``'s ``default=`` for numpy values and tuples."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError("not JSON-able: %r" % (value,))


def identity(compression):
    """What a saved partition was searched for: model fingerprint, world size, compression."""
    description = dict(compression.describe())
    for chosen in ("splits", "group_codecs", "plain_horovod"):  # the result, not the identity
        description.pop(chosen, None)
    # ``describe()`` names the levels only where the chosen groups take two; the identity
    # names the level setting and the machines wherever groups may (``level_identity``).
    for level in ("hierarchical", "machines"):
        description.pop(level, None)
    description.update(getattr(compression, "level_identity", dict)())
    return {
        "model_fingerprint": compression.model_fingerprint(),
        "world_size": communication.world_size(),
        "compression": json.loads(json.dumps(description)),
    }


def record(driver, choice):
    """What the saved file holds beside the identity (``driver``: the PartitionSearchDriver)."""
    measured = driver.algorithm.measured_seconds()
    plain = choice == PLAIN_HOROVOD
    codecs = driver.codecs_of(choice)
    return {
        "partition": [] if plain else list(choice),
        "num_groups": None if plain else len(choice) + 1,
        "group_codecs": None if codecs is None else list(codecs),
        "plain_horovod": plain,
        "seconds_per_step": measured.get(tuple(choice)),
        "tensor_sizes": driver.compression.tensor_sizes,
        "cost": dict(driver.cost),
        "settings": {"max_groups": driver.max_groups, "rounds": driver.rounds,
                     "finalists": driver.finalists,
                     "steps_per_candidate": driver.steps_per_candidate,
                     "min_turn_seconds": driver.min_turn_seconds,
                     "turn_steps": driver.turn_steps,
                     "warmup_steps": driver.warmup_steps,
                     "profiled_steps": driver.profiled_steps,
                     "resolve_rounds": driver.algorithm.resolve_rounds,
                     "standard_errors": driver.algorithm.standard_errors},
        "search": driver.algorithm.summary(),
    }
