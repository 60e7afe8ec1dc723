"""The partition search in Keras ``fit``: what the Keras 2 and Keras 3 callbacks share.

Each step is timed between ``on_train_batch_begin`` and ``on_train_batch_end``
(Keras has already waited for the step's outputs when the latter runs).
tf_mergecomp/callback.py (Keras 2) and tf_mergecomp/keras/callbacks.py
(Keras 3) mix ``FitSearchHooks`` into their Keras' ``Callback``.
"""

from tf_mergecomp.search.driver import PartitionSearchDriver
from tf_mergecomp.search.layout_functions import pop_traced, tracing_count
from tf_mergecomp.search.report import SearchNoise


class KerasTrainFunctions:
    """Keras (2 or 3) ``fit``: one train function per layout, swapped into
    ``model.train_function``, which ``fit`` looks up at every step, so a
    candidate is traced once, however many confirm rounds it takes part in."""

    def __init__(self, model, driver):
        self.model = model
        self.driver = driver
        self.functions = {}
        self._tracings = 0  # of the train functions dropped

    def use(self, layout, fresh=False):
        """Makes ``model`` train with ``layout`` from its next step; True when
        that needs a new train function (a trace)."""
        self.driver.apply_layout(layout)
        if layout in self.functions and not fresh:
            self.model.train_function = self.functions[layout]
            return False
        self.model.make_train_function(force=True)
        self._tracings += pop_traced(self.functions, layout)
        self.functions[layout] = self.model.train_function
        return True

    def keep_only(self, layout):
        for other in [l for l in self.functions if l != layout]:
            self._tracings += pop_traced(self.functions, other)

    def tracings(self):
        """Traces of every train function made, those dropped included."""
        return self._tracings + sum(tracing_count(f) for f in self.functions.values())


class FitSearchHooks:
    """The batch and train hooks of a callback whose ``search`` is a
    ``PartitionSearchDriver``. While the search runs, over the whole ``fit``,
    TensorFlow's retracing and Keras' slow-callback warnings (the search's own
    doing) are kept out of the log: Keras times the callbacks of its first
    batches and warns after them, when a search reusing a saved partition is over."""

    def __init__(self, compression, steps_per_candidate=3, max_groups=4, save_path=None, verbose=1,
                 log_dir=None, **search_options):
        super().__init__()
        self.search = PartitionSearchDriver(
            compression, steps_per_candidate=steps_per_candidate, max_groups=max_groups,
            save_path=save_path, verbose=verbose, log_dir=log_dir, **search_options)
        self._noise = SearchNoise()

    @property
    def compression(self):
        return self.search.compression

    @property
    def done(self):
        return self.search.done

    def _begin_search(self, model):
        if self.search.train_functions is None:
            self.search.train_functions = KerasTrainFunctions(model, self.search)
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
        self.search.finish()
        self._noise.remove()
