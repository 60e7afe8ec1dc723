"""MergeComp's partition search: which contiguous groups make the fastest step.

  algorithm.py   explore with a step-time model, confirm by interleaved timed
                 rounds; requests and answers, no I/O (``PartitionSearchAlgorithm``)
  requests.py    the requests it makes (profile, probe, warm, time)
  candidates.py  the fastest layouts of a group count under the model
  step_model.py  one step's time for any partition, from measured parts
  recorder.py    what the search measures: gradient ready times, lone groups
  driver.py      answers the algorithm from a training loop, one step at a
                 time (``PartitionSearchDriver``)
  run.py         answers it from plain functions (tests, the simulator: ``run_search``)
  layout_functions.py  custom loops: one ``tf.function`` of the step per layout
  restart.py     Horovod restarted between candidates, and why
  store.py       the saved partition (JSON), reused by a later run
  report.py      log lines, the PNG, TensorBoard scalars

The Keras callback (tf_mergecomp/callback.py) wraps the driver.
"""

from tf_mergecomp.search.algorithm import PartitionSearchAlgorithm
from tf_mergecomp.search.driver import PartitionSearchDriver
from tf_mergecomp.search.run import run_search

__all__ = ["PartitionSearchAlgorithm", "PartitionSearchDriver", "run_search"]
