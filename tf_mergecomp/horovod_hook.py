"""Lets a ``MergeComp`` stand where Horovod expects a ``compression``.

Horovod's ``DistributedOptimizer`` (TensorFlow and Keras) and
``DistributedGradientTape`` all build their gradient reduction with one
module-level factory, ``horovod.tensorflow._make_allreduce_grads_fn``, which
reduces tensor by tensor. ``install()`` replaces that factory with one that,
only when ``compression`` is a ``MergeComp``, returns MergeComp's own reduce
function, which receives the whole gradient list; for every other
``compression`` it calls Horovod's original. It also wraps the Keras
``DistributedOptimizer`` factories so that the optimizer tracks the MergeComp
and lists its step in ``optimizer.variables()``, and makes
``hvd.elastic.KerasState`` track MergeComp's state (``tf_mergecomp/elastic.py``).

The hook reads one private Horovod name, so it is tied to ``HOROVOD_VERSION``;
``check_horovod`` decides whether another Horovod can take it.

Importing ``tf_mergecomp`` calls ``install()``; calling it again does nothing.
Code that did ``from horovod.tensorflow.keras import DistributedOptimizer``
before importing ``tf_mergecomp`` keeps the unwrapped factory: it still
reduces with MergeComp, but must checkpoint the MergeComp explicitly.
"""

import functools
import inspect
import warnings

_INSTALLED_MARK = "_tf_mergecomp_original"
# The Horovod release the hook was written and tested for (Horovod's last), and
# the arguments of its gradient-reduction factory that the hook reads.
HOROVOD_VERSION = "0.28.1"
FACTORY_NAME = "_make_allreduce_grads_fn"
FACTORY_ARGUMENTS = ("compression", "op", "process_set", "device_dense", "sparse_as_dense",
                     "gradient_predivide_factor", "groups")


def check_horovod(version, module):
    """The factory to wrap, from Horovod ``version``'s ``horovod.tensorflow``
    (``module``). Raises RuntimeError when the hook cannot work there; warns
    when it can but ``version`` is not the one it was written for."""
    advice = ("install horovod==%s (`make setup` builds it), or use Horovod's own "
              "compression= instead of MergeComp" % HOROVOD_VERSION)
    factory = getattr(module, FACTORY_NAME, None)
    if factory is None:
        raise RuntimeError(
            "tf_mergecomp cannot hook into Horovod %s: horovod.tensorflow.%s, which MergeComp "
            "replaces to receive the whole gradient list, is gone; %s" % (
                version, FACTORY_NAME, advice))
    original = getattr(factory, _INSTALLED_MARK, factory)
    parameters = inspect.signature(original).parameters
    # A wrapper taking **kwargs (another library's, or a test's spy) hands
    # its arguments on: there is nothing to check there.
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        parameters = FACTORY_ARGUMENTS
    missing = [name for name in FACTORY_ARGUMENTS if name not in parameters]
    if missing:
        raise RuntimeError(
            "tf_mergecomp cannot hook into Horovod %s: horovod.tensorflow.%s no longer takes "
            "%s; %s" % (version, FACTORY_NAME, ", ".join(missing), advice))
    if version != HOROVOD_VERSION:
        warnings.warn(
            "tf_mergecomp was written for Horovod %s and runs here on Horovod %s, whose "
            "gradient-reduction factory still takes the arguments it reads. Run the test suite "
            "(make test) on this Horovod before trusting it, or %s."
            % (HOROVOD_VERSION, version, advice), RuntimeWarning, stacklevel=3)
    return factory


def _is_mergecomp(compression):
    from tf_mergecomp.mergecomp import MergeComp

    return isinstance(compression, MergeComp)


def _check_arguments(gradient_predivide_factor, groups):
    """Refuses the Horovod arguments MergeComp cannot honour. ``sparse_as_dense`` needs no
    check: MergeComp always densifies IndexedSlices (see mergecomp.py).
    ``gradient_predivide_factor`` only moves where Horovod divides by the world size inside
    one allreduce; MergeComp's average is the same for any factor > 0."""
    if groups is not None:
        raise ValueError(
            "MergeComp does its own grouping; do not pass Horovod's groups= "
            "(use MergeComp(..., partitions=...))"
        )
    if gradient_predivide_factor <= 0:
        raise ValueError("gradient_predivide_factor must be > 0, got %r" % gradient_predivide_factor)


def _plain_horovod_reduce_fn(original, arguments):
    """Horovod's own reduce function for these arguments, without compression:
    what runs while a MergeComp steps aside for plain Horovod."""
    import horovod.tensorflow as hvd_tf

    plain = dict(arguments.arguments, compression=hvd_tf.Compression.none)
    return original(**plain)


def install():
    """Installs the hook once; returns True if it was installed by this call."""
    import horovod
    import horovod.tensorflow as hvd_tf

    original = check_horovod(getattr(horovod, "__version__", "unknown"), hvd_tf)
    if hasattr(original, _INSTALLED_MARK):
        return False

    signature = inspect.signature(original)

    @functools.wraps(original)
    def make_allreduce_grads_fn(*args, **kwargs):
        # Arguments are read by name from Horovod's own signature and handed on
        # untouched, so a stock compression never depends on this hook.
        arguments = signature.bind(*args, **kwargs)
        arguments.apply_defaults()
        compression = arguments.arguments.get("compression")
        if not _is_mergecomp(compression):
            return original(*args, **kwargs)
        get = arguments.arguments.get
        _check_arguments(get("gradient_predivide_factor", 1.0), get("groups"))
        return compression.make_reduce_fn(
            op=get("op"), process_set=get("process_set"), device_dense=get("device_dense", ""),
            plain_horovod=functools.partial(_plain_horovod_reduce_fn, original, arguments))

    setattr(make_allreduce_grads_fn, _INSTALLED_MARK, original)
    hvd_tf._make_allreduce_grads_fn = make_allreduce_grads_fn
    _wrap_keras_optimizer_factories()
    from tf_mergecomp import elastic

    elastic.install()
    return True


def _wrap_keras_optimizer_factories():
    from tf_mergecomp import keras2

    modules = []
    # Only Horovod's wrappers of a Keras 2 (horovod.tensorflow.keras wraps tf.keras,
    # horovod.keras the keras package): never load a Keras 3 for them.
    if keras2.tf_keras_is_keras2():
        import horovod.tensorflow.keras as hvd_keras
        modules.append(hvd_keras)
        keras2.fix_horovod_keras_backend()
    if keras2.keras_package_is_keras2():
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
                _list_step_in_optimizer_variables(optimizer)
            return optimizer

        setattr(distributed_optimizer, _INSTALLED_MARK, factory)
        module.DistributedOptimizer = distributed_optimizer


def _list_step_in_optimizer_variables(optimizer):
    """Appends MergeComp's step, never its per-rank state, to ``optimizer.variables()``.

    Horovod's broadcasts, ``hvd.elastic.KerasState`` and Keras' HDF5 and .keras
    files use ``optimizer.variables()``: the step, which seeds shared random
    draws, must travel with them. Horovod builds a new optimizer class per
    ``DistributedOptimizer`` call, whose ``variables`` property this extends.
    The optimizer's own ``_variables`` list is left alone: TF checkpoints track
    it by position, and the step checkpoints as ``mergecomp/step`` already.
    """
    cls = type(optimizer)
    horovod_variables = cls.__dict__.get("variables")
    if not isinstance(horovod_variables, property) or "_tf_mergecomp_step" in cls.__dict__:
        return  # an unknown Horovod layout: leave it as it is
    from horovod._keras import CallableList

    def variables(self):
        return CallableList(list(horovod_variables.fget(self)) + [self.mergecomp.step])

    cls.variables = property(variables, doc="The optimizer's variables, then MergeComp's step.")
    cls._tf_mergecomp_step = True
    if not hasattr(optimizer, "_variables"):
        return  # legacy Keras optimizers save and load their own weights list
    base_set_weights = cls.set_weights

    def set_weights(self, weights):
        # HDF5 files saved with this class hold the step last; files saved
        # without MergeComp do not.
        weights = list(weights)
        if len(weights) == len(self.variables):
            self.mergecomp.step.assign(weights.pop())
        base_set_weights(self, weights)

    cls.set_weights = set_weights
