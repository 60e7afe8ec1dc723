"""Keras callback running MergeComp's partition search during the first steps of ``fit``.

    compression = MergeComp("efsignsgd")
    model.compile(hvd.DistributedOptimizer(opt, compression=compression), ...)
    model.fit(..., callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                              MergeCompCallback(compression, save_path="partition.json")])

Each step is timed between ``on_train_batch_begin`` and ``on_train_batch_end``
(Keras has already waited for the step's outputs when the latter runs). For
each candidate partition the callback calls ``compression.set_partition`` and
``model.make_train_function(force=True)``, so the next step re-traces with the
new grouping; it checks from ``compression.collectives_executed`` that every
timed step really ran ``num_groups * compressor.collectives_per_group()``
collectives. The search itself, its cost in steps and the saved-file format
are described in tf_mergecomp/search.py and tf_mergecomp/search_driver.py. If ``fit`` ends
before the search does, the best partition measured so far is kept (and not
saved).
"""

from tf_mergecomp._keras import keras
from tf_mergecomp.search_driver import PartitionSearch


class MergeCompCallback(keras.callbacks.Callback):
    """Searches the fastest partition for ``compression`` while the model trains.

    Args:
      compression: the ``MergeComp`` passed to ``hvd.DistributedOptimizer``.
      steps_per_candidate: timed steps per candidate partition.
      max_groups: the most groups tried.
      save_path: JSON file to save the result to, and to reuse it from in a
        later run with the same model, world size and compression.
      verbose: 1 logs each candidate and a summary (rank 0 only); 0 is quiet.
      log_dir: optional TensorBoard directory for the candidates' times.
      **search_options: further ``search.PartitionSearcher`` arguments.
    """

    def __init__(self, compression, steps_per_candidate=5, max_groups=4, save_path=None, verbose=1,
                 log_dir=None, **search_options):
        super().__init__()
        self.search = PartitionSearch(
            compression, steps_per_candidate=steps_per_candidate, max_groups=max_groups,
            save_path=save_path, verbose=verbose, on_partition_change=self._rebuild,
            log_dir=log_dir, **search_options)

    @property
    def compression(self):
        return self.search.compression

    @property
    def done(self):
        return self.search.done

    def _rebuild(self):
        if self.model is not None:
            self.model.make_train_function(force=True)

    def on_train_batch_begin(self, batch, logs=None):
        self.search.before_step()

    def on_train_batch_end(self, batch, logs=None):
        self.search.after_step()

    def on_train_end(self, logs=None):
        # Keep the fastest partition measured so far rather than an arbitrary candidate.
        self.search.finish()
