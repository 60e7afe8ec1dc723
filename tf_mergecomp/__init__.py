"""tf_mergecomp: MergeComp, a gradient-compression scheduler for TensorFlow/Keras on Horovod.

    import horovod.tensorflow.keras as hvd
    from tf_mergecomp import MergeComp
    opt = hvd.DistributedOptimizer(opt, compression=MergeComp("dgc", ratio=0.01))

Importing the package installs the Horovod hook (see ``horovod_hook``).
"""

from tf_mergecomp import horovod_hook as _horovod_hook
from tf_mergecomp.consistency import RankMismatchError
from tf_mergecomp.mergecomp import MergeComp

_horovod_hook.install()

__version__ = "0.1.0"
__all__ = ["MergeComp", "RankMismatchError", "__version__"]
