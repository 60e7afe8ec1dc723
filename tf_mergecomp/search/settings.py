"""The partition search driver's settings: checked at construction, and the length of a
confirm turn (tf_mergecomp/search/driver.py)."""

import os

import numpy as np

from tf_mergecomp._validation import check_in_interval, check_int

_ALGORITHM_OPTIONS = {"exhaustive_limit", "refinements", "resolve_rounds", "standard_errors"}
# The most steps a turn may time where min_turn_seconds asks for longer turns, as a
# multiple of steps_per_candidate (docs/benchmarks.md, "Two speeds on two cores").
MAX_TURN_FACTOR = 10
# Horovod's tensor fusion defaults, where the job does not set them.
HOROVOD_CYCLE_S = 1e-3  # HOROVOD_CYCLE_TIME, 1 ms
HOROVOD_FUSION_BYTES = 128 * 2**20  # HOROVOD_FUSION_THRESHOLD, 128 MiB


def horovod_fusion(environ=None):
    """(cycle seconds, fusion buffer bytes) of Horovod's tensor fusion in the processes
    started from ``environ`` (default: this one's): HOROVOD_CYCLE_TIME (milliseconds) and
    HOROVOD_FUSION_THRESHOLD (bytes) where set, else Horovod's defaults."""
    environ = os.environ if environ is None else environ
    values = []
    for variable, unit, default, scale, minimum in (
            ("HOROVOD_CYCLE_TIME", "milliseconds", HOROVOD_CYCLE_S, 1e-3, "positive"),
            ("HOROVOD_FUSION_THRESHOLD", "bytes", HOROVOD_FUSION_BYTES, 1.0, "non-negative")):
        text = environ.get(variable, "")
        if text == "":
            values.append(default)
            continue
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (value > 0 if minimum == "positive" else value >= 0) or value == float("inf"):
            raise ValueError("%s must be %s %s, got %r" % (variable, minimum, unit, text))
        values.append(value * scale)
    return tuple(values)


def steps_per_turn(step_seconds, steps_per_candidate, min_turn_seconds):
    """Timed steps of a confirm turn: ``steps_per_candidate``, or as many more
    as make the turn last ``min_turn_seconds`` at ``step_seconds`` a step, at
    most ``MAX_TURN_FACTOR`` times ``steps_per_candidate``."""
    if min_turn_seconds <= 0 or not step_seconds > 0:
        return steps_per_candidate
    wanted = int(np.ceil(min_turn_seconds / step_seconds))
    return int(min(MAX_TURN_FACTOR * steps_per_candidate, max(steps_per_candidate, wanted)))


def check_settings(compression, max_groups, steps_per_candidate, rounds, finalists, warmup_steps,
                   profiled_steps, probe_repeats, save_path, verbose, min_turn_seconds,
                   restart_horovod, plain_codecs, search_options):
    """Raises ValueError naming the first ``PartitionSearchDriver`` argument that is wrong."""
    from tf_mergecomp.mergecomp import MergeComp

    if not isinstance(compression, MergeComp):
        raise ValueError("compression must be a tf_mergecomp.MergeComp, got %r" % (compression,))
    for name, value, minimum in (("max_groups", max_groups, 1),
                                 ("steps_per_candidate", steps_per_candidate, 1),
                                 ("rounds", rounds, 1), ("finalists", finalists, 0),
                                 ("warmup_steps", warmup_steps, 0),
                                 ("profiled_steps", profiled_steps, 1),
                                 ("probe_repeats", probe_repeats, 1)):
        check_int(name, value, minimum)
    for name, value in (("verbose", verbose), ("restart_horovod", restart_horovod)):
        if value not in (0, 1, True, False):
            raise ValueError("%s must be 0 or 1, got %r" % (name, value))
    check_in_interval("min_turn_seconds", min_turn_seconds, "[0, inf)")
    from tf_mergecomp.plain_groups import PLAIN_CODECS

    if (isinstance(plain_codecs, str) or not plain_codecs
            or any(c not in PLAIN_CODECS for c in plain_codecs)
            or len(set(plain_codecs)) != len(plain_codecs)):
        raise ValueError("plain_codecs must be distinct names among %s, got %r"
                         % (", ".join(PLAIN_CODECS), plain_codecs))
    if save_path is not None and not isinstance(save_path, (str, os.PathLike)):
        raise ValueError("save_path must be a path or None, got %r" % (save_path,))
    unknown = set(search_options) - _ALGORITHM_OPTIONS
    if unknown:
        raise ValueError("unknown search options %s; valid: %s"
                         % (sorted(unknown), ", ".join(sorted(_ALGORITHM_OPTIONS))))
