"""Custom training loops during the search: one ``tf.function`` per layout.

A layout changes the traced reduce, so each layout's step is its own
``tf.function``; ``PartitionSearchDriver.function`` wraps a step in one of
these and switches them as the search moves between candidates
(tf_mergecomp/search/driver.py). The Keras callback keeps Keras' own train
functions instead (tf_mergecomp/callback.py).
"""

import tensorflow as tf


class LayoutFunctions:
    """Custom loops: one ``tf.function`` per layout for each registered step."""

    def __init__(self, driver):
        self.driver = driver
        self.registered = []  # [(python function, kwargs, {layout: tf.function})]
        self.active = None

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
                functions.pop(layout, None)
        # Traced at its first call (a step not made through ``function()``
        # is not re-traced: the collectives check then says so).
        return any(layout not in functions for _, _, functions in self.registered)

    def keep_only(self, layout):
        for _, _, functions in self.registered:
            for other in [l for l in functions if l != layout]:
                del functions[other]

    def tracings(self):
        return sum(tracing_count(f) for _, _, functions in self.registered
                   for f in functions.values())


def tracing_count(function):
    counter = getattr(function, "experimental_get_tracing_count", None)
    return int(counter()) if counter is not None else 0
