"""MergeComp's partition search: which contiguous groups make the fastest step.

``PartitionSearchAlgorithm`` (algorithm.py) explores with a step-time model and
confirms by interleaved timed rounds, with no I/O; ``PartitionSearchDriver``
(driver.py) answers it from a training loop, one step at a time, and ``run_search``
(run.py) from plain functions (tests, the simulator). The Keras callback
(tf_mergecomp/callback.py) wraps the driver; docs/search.md describes the method.
"""

from tf_mergecomp.search.algorithm import PartitionSearchAlgorithm
from tf_mergecomp.search.driver import PartitionSearchDriver
from tf_mergecomp.search.run import run_search

__all__ = ["PartitionSearchAlgorithm", "PartitionSearchDriver", "run_search"]
