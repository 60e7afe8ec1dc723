"""The partition search's requests, and what a profile answers (algorithm.py lists the
answers each request expects)."""

import numpy as np

# The sentinel for plain Horovod (MergeComp steps aside): a candidate key, not a layout.
PLAIN_HOROVOD = "plain Horovod"


def _candidate_key(layout):
    """A candidate as the search keys it: a layout's tuple of cuts, or ``PLAIN_HOROVOD``."""
    return layout if isinstance(layout, str) else tuple(layout)


class Profile:
    """Request: profile training steps with ``splits``."""

    kind = "profile"

    def __init__(self, splits):
        self.splits = tuple(splits)

    def __repr__(self):
        return "Profile(%r)" % (self.splits,)


class Probe:
    """Request: time each group of each layout alone."""

    kind = "probe"

    def __init__(self, layouts, codec=None):
        self.layouts = [tuple(layout) for layout in layouts]
        self.codec = codec  # every group with this codec (None: the compressor)

    def __repr__(self):
        return "Probe(%d layouts%s)" % (len(self.layouts),
                                        "" if self.codec is None else ", " + self.codec)


class Warm:
    """Request: train each of ``layouts`` untimed, in turn, before the first confirm
    round, so that no timed turn traces."""

    kind = "warm"

    def __init__(self, layouts):
        self.layouts = [_candidate_key(layout) for layout in layouts]

    def __repr__(self):
        return "Warm(%d layouts)" % len(self.layouts)


class Time:
    """Request: one timed turn of ``splits`` in a confirm round."""

    kind = "time"

    def __init__(self, splits):
        self.splits = _candidate_key(splits)

    def __repr__(self):
        return "Time(%r)" % (self.splits,)


class ProfileResult:
    """What a profile measured.

    seconds: the step time; ready: per gradient (backprop order) seconds from
    the step's start until it was ready, NaN where not seen.
    """

    def __init__(self, seconds, ready):
        self.seconds = float(seconds)
        self.ready = np.asarray(ready, dtype=np.float64)
