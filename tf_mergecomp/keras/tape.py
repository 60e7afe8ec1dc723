"""``DistributedGradientTape`` for custom loops over Keras 3 models.

    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    tape = tf_mergecomp.keras.DistributedGradientTape(tape, compression=MergeComp("dgc"))
    grads = tape.gradient(loss, model.trainable_variables)     # averaged across the ranks
    optimizer.apply(grads, model.trainable_variables)          # a plain Keras optimizer

Horovod's own ``hvd.DistributedGradientTape`` keys sources by ``.ref()``,
which Keras 3 variables lack; this one works on any sources (Keras 3
variables, ``tf.Variable``s, nested structures of them).
"""

import tensorflow as tf

from tf_mergecomp.keras.optimizer import _check_compression, make_reduce_fn


class DistributedGradientTape:
    """Wraps a ``tf.GradientTape``: ``gradient`` returns gradients averaged across
    the ranks with ``compression`` (a MergeComp, or None for Horovod's plain
    allreduce). Every other attribute is the tape's."""

    def __init__(self, tape, compression=None, op=None, process_set=None, device=""):
        if not isinstance(tape, tf.GradientTape):
            raise TypeError("DistributedGradientTape wraps a tf.GradientTape, got %r" % (tape,))
        self._tape = tape
        self.compression = _check_compression(compression)
        self._reduce = make_reduce_fn(compression, op, process_set, device)

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        flat_sources = tf.nest.flatten(sources)
        if len(flat_sources) != len(flat_grads):
            raise ValueError("gradient() returned %d gradients for %d sources"
                             % (len(flat_grads), len(flat_sources)))
        reduced = self._reduce(list(flat_grads), None)  # by position: see optimizer.py
        return tf.nest.pack_sequence_as(grads, list(reduced))

    def __getattr__(self, name):
        return getattr(self._tape, name)
