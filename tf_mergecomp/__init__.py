"""tf_mergecomp: MergeComp, a gradient-compression scheduler for TensorFlow/Keras on Horovod.

    import horovod.tensorflow.keras as hvd
    from tf_mergecomp import MergeComp, MergeCompCallback
    compression = MergeComp("dgc", ratio=0.01)
    opt = hvd.DistributedOptimizer(opt, compression=compression)
    model.fit(..., callbacks=[MergeCompCallback(compression)])  # searches the partition

Importing the package installs the Horovod hook (see ``horovod_hook``).
"""

from tf_mergecomp import horovod_hook as _horovod_hook
from tf_mergecomp.consistency import RankMismatchError
from tf_mergecomp.mergecomp import MergeComp
from tf_mergecomp.callback import MergeCompCallback

_horovod_hook.install()

__version__ = "0.1.0"
__all__ = ["MergeComp", "MergeCompCallback", "RankMismatchError", "__version__"]
