"""Lets a ``MergeComp`` stand where Horovod expects a ``compression``.

Horovod's TensorFlow and Keras wrappers (``DistributedOptimizer`` in
``horovod.tensorflow`` and ``horovod.tensorflow.keras``, and
``DistributedGradientTape``) all build their gradient reduction with one
module-level factory, ``horovod.tensorflow._make_allreduce_grads_fn``, which
reduces tensor by tensor with ``compression.compress/decompress``. ``install()``
replaces that factory with one that, only when ``compression`` is a
``MergeComp``, returns MergeComp's own reduce function, which receives the
whole gradient list; for every other ``compression`` it calls Horovod's
original, so stock behaviour is unchanged. It also wraps the Keras
``DistributedOptimizer`` factories so that the optimizer tracks the MergeComp
(its error-feedback state then checkpoints with the optimizer).

Importing ``tf_mergecomp`` calls ``install()``; calling it again does nothing.
Code that did ``from horovod.tensorflow.keras import DistributedOptimizer``
before importing ``tf_mergecomp`` keeps the unwrapped factory: it still
reduces with MergeComp, but checkpoint MergeComp explicitly then.
"""

import functools

_INSTALLED_MARK = "_tf_mergecomp_original"


def _is_mergecomp(compression):
    from tf_mergecomp.mergecomp import MergeComp

    return isinstance(compression, MergeComp)


def _check_arguments(compression, sparse_as_dense, gradient_predivide_factor, groups):
    if groups is not None:
        raise ValueError(
            "MergeComp does its own grouping; do not pass Horovod's groups= "
            "(use MergeComp(..., partitions=...))"
        )
    if gradient_predivide_factor <= 0:
        raise ValueError("gradient_predivide_factor must be > 0, got %r" % gradient_predivide_factor)
    # sparse_as_dense: MergeComp always densifies IndexedSlices (see mergecomp.py).
    # gradient_predivide_factor only moves where Horovod divides by the world
    # size inside one allreduce; MergeComp's average is the same for any factor.
    del compression, sparse_as_dense


def install():
    """Installs the hook once; returns True if it was installed by this call."""
    import horovod.tensorflow as hvd_tf

    if hasattr(hvd_tf._make_allreduce_grads_fn, _INSTALLED_MARK):
        return False
    original = hvd_tf._make_allreduce_grads_fn

    @functools.wraps(original)
    def make_allreduce_grads_fn(name, device_dense, device_sparse, compression, sparse_as_dense,
                                op, gradient_predivide_factor, groups, process_set=None):
        if not _is_mergecomp(compression):
            return original(name, device_dense, device_sparse, compression, sparse_as_dense, op,
                            gradient_predivide_factor, groups, process_set=process_set)
        _check_arguments(compression, sparse_as_dense, gradient_predivide_factor, groups)
        return compression.make_reduce_fn(op=op, process_set=process_set, device_dense=device_dense)

    setattr(make_allreduce_grads_fn, _INSTALLED_MARK, original)
    hvd_tf._make_allreduce_grads_fn = make_allreduce_grads_fn
    _wrap_keras_optimizer_factories()
    return True


def _wrap_keras_optimizer_factories():
    from tf_mergecomp import _keras

    modules = []
    # Only Horovod's wrappers of a Keras 2 (horovod.tensorflow.keras wraps tf.keras,
    # horovod.keras the keras package): never load a Keras 3 for them.
    if _keras.tf_keras_is_keras2():
        import horovod.tensorflow.keras as hvd_keras
        modules.append(hvd_keras)
        _keras.fix_horovod_keras_backend()
    if _keras.keras_package_is_keras2():
        try:
            import horovod.keras as hvd_standalone_keras  # present only with standalone Keras
            modules.append(hvd_standalone_keras)
        except ImportError:
            pass
    for module in modules:
        factory = module.DistributedOptimizer
        if hasattr(factory, _INSTALLED_MARK):
            continue

        @functools.wraps(factory)
        def distributed_optimizer(*args, _factory=factory, **kwargs):
            optimizer = _factory(*args, **kwargs)
            compression = kwargs.get("compression")
            if _is_mergecomp(compression):
                # A tracked attribute: checkpoints of the optimizer include
                # MergeComp's memory and step.
                optimizer.mergecomp = compression
            return optimizer

        setattr(distributed_optimizer, _INSTALLED_MARK, factory)
        module.DistributedOptimizer = distributed_optimizer
