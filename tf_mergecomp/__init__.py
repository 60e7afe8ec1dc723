"""tf_mergecomp: MergeComp, a gradient-compression scheduler for TensorFlow/Keras on Horovod.

    import horovod.tensorflow.keras as hvd
    from tf_mergecomp import MergeComp, MergeCompCallback
    compression = MergeComp("dgc", ratio=0.01)
    opt = hvd.DistributedOptimizer(opt, compression=compression)
    model.fit(..., callbacks=[MergeCompCallback(compression)])  # searches the partition

Importing the package installs the Horovod hook (see ``horovod_hook``).
"""

import os as _os

if _os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":  # Keras 3 on JAX/PyTorch
    raise ImportError("tf_mergecomp needs Keras on the TensorFlow backend; KERAS_BACKEND is %r "
                      "(valid here: 'tensorflow'; docs/keras3.md)" % _os.environ["KERAS_BACKEND"])

from tf_mergecomp import horovod_hook as _horovod_hook  # noqa: E402
from tf_mergecomp.consistency import RankMismatchError
from tf_mergecomp.mergecomp import MergeComp

_horovod_hook.install()

__version__ = "0.1.0"
__all__ = ["MergeComp", "MergeCompCallback", "RankMismatchError", "__version__"]


def __getattr__(name):
    # Loaded on first use: it subclasses the Keras 2 callback (tf_mergecomp/keras2.py),
    # which a Keras 3 program (tf_mergecomp.keras) does not load.
    if name == "MergeCompCallback":
        from tf_mergecomp.callback import MergeCompCallback

        return MergeCompCallback
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
