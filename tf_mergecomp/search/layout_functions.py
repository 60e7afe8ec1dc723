"""Custom training loops during the search: one ``tf.function`` per layout.

A layout changes the traced reduce, so each layout's step is its own ``tf.function``;
``PartitionSearchDriver.function`` (driver.py) wraps a step so that each call runs the
active layout's. In ``fit`` the search keeps Keras' own train functions instead (fit.py).
"""

import tensorflow as tf


class LayoutFunctions:
    """Each registered step's ``tf.function`` per layout; ``use`` selects the layout."""

    def __init__(self, driver):
        self.driver = driver
        self.registered = []  # [(python function, kwargs, {layout: tf.function})]
        self.active = None
        self._tracings = 0  # of the functions dropped

    def register(self, python_step_fn, kwargs):
        functions = {}
        self.registered.append((python_step_fn, kwargs, functions))

        def call(*args, **call_kwargs):
            layout = self.active
            function = functions.get(layout)
            if function is None:
                function = functions[layout] = tf.function(python_step_fn, **kwargs)
            return function(*args, **call_kwargs)

        call.python_function = python_step_fn
        return call

    def use(self, layout, fresh=False):
        self.driver.apply_layout(layout)
        self.active = layout
        if fresh:
            for _, _, functions in self.registered:
                self._tracings += pop_traced(functions, layout)
        # True when some registered step traces at its next call (a step not made
        # through ``function()`` is not re-traced: the collectives check then says so).
        return any(layout not in functions for _, _, functions in self.registered)

    def keep_only(self, layout):
        for _, _, functions in self.registered:
            for other in [l for l in functions if l != layout]:
                self._tracings += pop_traced(functions, other)

    def tracings(self):
        """Traces of every function made, those dropped included."""
        return self._tracings + sum(tracing_count(f) for _, _, functions in self.registered
                                    for f in functions.values())


def pop_traced(functions, layout):
    """Removes ``layout``'s function from ``functions`` ({layout: function}); returns the
    traces it made (0 when there was none), for the caller's count of dropped traces."""
    function = functions.pop(layout, None)
    return 0 if function is None else tracing_count(function)


def tracing_count(function):
    """Traces of a ``tf.function``, or of the one a Python function closes over
    (Keras 3's train function wraps its ``tf.function`` in a Python one)."""
    counter = getattr(function, "experimental_get_tracing_count", None)
    if counter is not None:
        return int(counter())
    counts = []
    for cell in getattr(function, "__closure__", None) or ():
        try:
            counter = getattr(cell.cell_contents, "experimental_get_tracing_count", None)
        except ValueError:  # an empty cell
            continue
        if counter is not None:
            counts.append(int(counter()))
    return max(counts, default=0)
