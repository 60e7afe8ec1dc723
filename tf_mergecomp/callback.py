"""Keras callback running MergeComp's partition search during the first steps of ``fit``.

    from tf_mergecomp import MergeComp, MergeCompCallback
    compression = MergeComp("efsignsgd")
    model.compile(hvd.DistributedOptimizer(opt, compression=compression), ...)
    model.fit(..., callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                              MergeCompCallback(compression, save_path="partition.json")])

Each step is timed between ``on_train_batch_begin`` and ``on_train_batch_end``
(Keras has already waited for the step's outputs when the latter runs). The
callback keeps one Keras train function per partition it trains with and
swaps it into ``model.train_function``, which ``fit`` looks up at every step:
a candidate is traced once, however many confirm rounds it takes part in.
It checks from ``compression.collectives_executed`` that every timed step ran
``num_groups * compressor.collectives_per_group()`` collectives. The search,
its cost and the saved file are described in tf_mergecomp/search/algorithm.py and
tf_mergecomp/search/driver.py. If ``fit`` ends before the search does, the
fastest candidate measured so far is kept (and not saved).
"""

from tf_mergecomp.keras2 import keras
from tf_mergecomp.search.driver import PartitionSearchDriver
from tf_mergecomp.search.layout_functions import tracing_count
from tf_mergecomp.search.report import SearchNoise


class MergeCompCallback(keras.callbacks.Callback):
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

    def __init__(self, compression, steps_per_candidate=3, max_groups=4, save_path=None, verbose=1,
                 log_dir=None, **search_options):
        super().__init__()
        self.search = PartitionSearchDriver(
            compression, steps_per_candidate=steps_per_candidate, max_groups=max_groups,
            save_path=save_path, verbose=verbose, log_dir=log_dir, **search_options)
        # Over the whole fit the search runs in: Keras times the callbacks of its first
        # batches and warns after them, when a search reusing a saved partition is over.
        self._noise = SearchNoise()

    @property
    def compression(self):
        return self.search.compression

    @property
    def done(self):
        return self.search.done

    def on_train_begin(self, logs=None):
        if self.search.train_functions is None:
            self.search.train_functions = KerasTrainFunctions(self.model, self.search)
        self.search.check_save_path()
        if not self.search.done:
            self._noise.install()

    def on_train_batch_begin(self, batch, logs=None):
        steps = self.params.get("steps") if self.params else None
        # An epoch's last batch may be smaller, which traces the function that
        # runs it again: not timed, and run on the one-group function.
        last_of_epoch = steps is not None and steps > 1 and batch == steps - 1
        self.search.before_step(timeable=not last_of_epoch)

    def on_train_batch_end(self, batch, logs=None):
        self.search.after_step()

    def on_train_end(self, logs=None):
        # Keep the fastest partition measured so far rather than an arbitrary candidate.
        self.search.finish()
        self._noise.remove()


class KerasTrainFunctions:
    """Keras: one train function per layout, swapped into ``model.train_function``
    (``fit`` looks it up at every step)."""

    def __init__(self, model, driver):
        self.model = model
        self.driver = driver
        self.compression = driver.compression
        self.functions = {}
        self._tracings = 0

    def use(self, layout, fresh=False):
        """Makes ``model`` train with ``layout`` from its next step; True when
        that needs a new train function (a trace)."""
        self.driver.apply_layout(layout)
        if layout in self.functions and not fresh:
            self.model.train_function = self.functions[layout]
            return False
        self.model.make_train_function(force=True)
        self.functions[layout] = self.model.train_function
        return True

    def keep_only(self, layout):
        for other in [l for l in self.functions if l != layout]:
            self._tracings += tracing_count(self.functions.pop(other))

    def tracings(self):
        return self._tracings + sum(tracing_count(f) for f in self.functions.values())
