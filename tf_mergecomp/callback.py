"""Keras callback running MergeComp's partition search during the first steps of ``fit``.

    from tf_mergecomp import MergeComp, MergeCompCallback
    compression = MergeComp("efsignsgd")
    model.compile(hvd.DistributedOptimizer(opt, compression=compression), ...)
    model.fit(..., callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                              MergeCompCallback(compression, save_path="partition.json")])

The search (docs/search.md) is tf_mergecomp/search/fit.py's, shared with Keras 3.
"""

from tf_mergecomp.keras2 import keras
from tf_mergecomp.search.fit import FitSearchHooks


class MergeCompCallback(FitSearchHooks, keras.callbacks.Callback):
    """Searches the fastest partition for ``compression`` while the model trains.

    Args:
      compression: the ``MergeComp`` passed to ``hvd.DistributedOptimizer``.
      steps_per_candidate: timed steps of a candidate per confirm round.
      max_groups: the most groups a predicted candidate may have.
      save_path: JSON file to save the result to (and a PNG of the search
        beside it), and to reuse it from in a later run with the same model,
        world size and compression. Checked for writing before training starts.
      verbose: 1 logs the search's phases and its result (rank 0 only); 0 is quiet.
      log_dir: optional TensorBoard directory for the candidates' times (and
        the PNG when there is no save_path).
      **search_options: further ``PartitionSearchDriver`` arguments (rounds,
        finalists, warmup_steps, profiled_steps, ...).
    """

    def on_train_begin(self, logs=None):
        self._begin_search(self.model)
