"""The partition search run with plain functions instead of a training loop.

Tests and the simulator (benchmarks/simulate.py) answer the search's requests
(tf_mergecomp/search/algorithm.py) from functions of a layout;
tf_mergecomp/search/driver.py answers the same requests from training steps.
"""

from tf_mergecomp.search.algorithm import PartitionSearchAlgorithm
from tf_mergecomp.search.requests import PLAIN_HOROVOD


class SearchResult:
    """What ``run_search`` returns."""

    def __init__(self, algorithm, requests):
        self.splits = algorithm.choice
        self.group_codecs = algorithm.codecs_of(algorithm.choice)
        self.plain_horovod = algorithm.choice == PLAIN_HOROVOD
        self.algorithm = algorithm
        self.requests = requests  # {"profile", "probe", "warm", "time", "traced": count}

    def __repr__(self):
        return "SearchResult(splits=%r, requests=%r)" % (self.splits, self.requests)


def run_search(sizes, profile, probe, time_candidate, **options):
    """Runs the whole search with plain functions:

      profile(splits) -> ProfileResult
      probe(splits) -> [groups, 3] seconds (encode, collective, decode)
      time_candidate(splits) -> seconds per step (one confirm round)

    With ``codecs``: probe(splits, codec), every group with ``codec``; and
    time_candidate(splits, group_codecs), ``group_codecs`` None for every
    group with the compressor; ``splits`` is ``PLAIN_HOROVOD`` for plain Horovod.

    ``options`` are PartitionSearchAlgorithm's. Returns a SearchResult; its
    ``requests["traced"]`` counts the layouts that trained (each a trace in
    real training).
    """
    algorithm = PartitionSearchAlgorithm(sizes, **options)
    counts = {"profile": 0, "probe": 0, "warm": 0, "time": 0, "traced": 0}
    trained = {()}  # the profile trains one group
    request = algorithm.start()
    while request is not None:
        if request.kind == "profile":
            counts["profile"] += 1
            counts["traced"] += 1
            answer = profile(request.splits)
        elif request.kind == "probe":
            counts["probe"] += len(request.layouts)
            if request.codec is None:
                answer = [probe(layout) for layout in request.layouts]
            else:
                answer = [probe(layout, request.codec) for layout in request.layouts]
        elif request.kind == "warm":
            counts["warm"] += len(request.layouts)
            counts["traced"] += len(set(request.layouts) - trained)
            trained.update(request.layouts)
            answer = None
        else:
            counts["time"] += 1
            if request.splits not in trained:
                counts["traced"] += 1
                trained.add(request.splits)
            if algorithm.codecs is None and not algorithm.plain_horovod:
                answer = time_candidate(request.splits)
            else:
                answer = time_candidate(request.splits, algorithm.codecs_of(request.splits))
        request = algorithm.answer(answer)
    return SearchResult(algorithm, counts)

