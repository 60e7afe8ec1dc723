"""What the partition search's confirm rounds say (ratios to one group, their mean log and
its spread), the JSON account of a search (``PartitionSearchAlgorithm.summary``) and a
layout's name in a few words."""

import math

import numpy as np

from tf_mergecomp.search.requests import PLAIN_HOROVOD

# One group: timed in every confirm round, the yardstick of the others.
REFERENCE = ()


def mean_log_ratio(ratios, standard_errors=2.0):
    """(mean, half width) of the logs of ``ratios``: their mean and
    ``standard_errors`` standard errors of it (infinite from fewer than two)."""
    logs = np.log(np.asarray(ratios, dtype=np.float64))
    if len(logs) == 0:
        return 0.0, math.inf
    if len(logs) < 2:
        return float(logs[0]), math.inf
    spread = float(np.std(logs, ddof=1)) / math.sqrt(len(logs))
    return float(np.mean(logs)), standard_errors * spread


def relative_to_reference(measured):
    """One confirm round's times over one group's in that round; {} before one group's turn
    (times are positive: _confirm checks them)."""
    reference = measured.get(REFERENCE)
    if reference is None:
        return {}
    return {layout: seconds / reference for layout, seconds in measured.items()}


def summary(algorithm):
    """A JSON-able account of a ``PartitionSearchAlgorithm``'s search."""
    measured = algorithm.measured_seconds()
    relative = algorithm.relative_seconds()

    def entry(layout):
        plain = layout == PLAIN_HOROVOD
        codecs = algorithm.codecs_of(layout)
        return {"splits": None if plain else list(layout),
                "groups": None if plain else len(layout) + 1,
                "plain_horovod": plain,
                "group_codecs": None if codecs is None else list(codecs),
                "predicted_s": algorithm.predictions.get(layout),
                "measured_s": measured.get(layout),
                "rounds_s": algorithm.rounds_of(layout),
                "relative_to_one_group": relative.get(layout),
                "dropped_after_round": algorithm.dropped.get(layout)}

    return {
        "choice": (None if algorithm.choice is None else algorithm.choice
                   if algorithm.choice == PLAIN_HOROVOD else list(algorithm.choice)),
        "choice_group_codecs": (None if algorithm.choice is None or algorithm.codecs_of(algorithm.choice)
                                is None else list(algorithm.codecs_of(algorithm.choice))),
        "leader": (None if algorithm.leader is None else algorithm.leader
                   if algorithm.leader == PLAIN_HOROVOD else list(algorithm.leader)),
        "codecs": None if algorithm.codecs is None else list(algorithm.codecs),
        "extra_rounds": algorithm.extra_rounds,
        "standard_errors": algorithm.standard_errors,
        "candidates": [entry(layout) for layout in algorithm.candidates],
        "predictions": [{"splits": list(l), "groups": len(l) + 1, "predicted_s": s,
                         "group_codecs": (None if algorithm.codecs_of(l) is None
                                          else list(algorithm.codecs_of(l)))}
                        for l, s in sorted(algorithm.predictions.items(), key=lambda x: x[1])],
        "profile_step_s": None if algorithm.profile is None else algorithm.profile.seconds,
        "ready_s": None if algorithm.ready is None else [float(r) for r in algorithm.ready],
        "costs": (None if algorithm.model is None
                  else algorithm.model.costs.fitted.describe()),
        "probed_groups": len(algorithm.probed),
        "model": None if algorithm.model is None else {
            "tail_s": algorithm.model.tail, "codec_on_compute": algorithm.codec_on_compute,
            "decodes_after_backprop": algorithm.decodes_after_backprop},
        "fusion_layout": (None if algorithm.fusion_layout is None
                          else list(algorithm.fusion_layout)),
        "notes": list(algorithm.notes),
    }


def short(splits, n, codecs=None, fusion_layout=None):
    """A layout in a few words: one group, layer-wise, the search's fusion layout,
    or its splits, with the codec of each group where they differ from the compressor."""
    if isinstance(splits, str):
        return splits
    if not splits:
        return "one group" + codecs_text(codecs)
    if len(splits) == n - 1:
        return "layer-wise" + codecs_text(codecs)
    if tuple(splits) == fusion_layout:
        return "Horovod's fusion layout (%d groups)%s" % (len(splits) + 1, codecs_text(codecs))
    return "%s%s" % (list(splits), codecs_text(codecs))


def codecs_text(codecs):
    """The text ' codecs [...]' that names a layout's codec per group; '' for None."""
    if codecs is None:
        return ""
    shown = list(codecs[:8]) + (["..."] if len(codecs) > 8 else [])
    return " codecs [%s]" % ", ".join(shown)
