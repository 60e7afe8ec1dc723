"""The compression algorithms, one module each, found by registry name.

    from tf_mergecomp import compressors
    codec = compressors.get("topk", ratio=0.01)
"""

import importlib

from tf_mergecomp._validation import from_registry
from tf_mergecomp.compressors.base import ALLGATHER, ALLREDUCE, TENSOR_SEED_SHIFT, Compressor

# name -> (module, class); modules are imported on first use.
_REGISTRY = {
    "none": ("none", "NoneCompressor"),
    "fp16": ("fp16", "FP16Compressor"),
    "qsgd": ("qsgd", "QSGDCompressor"),
    "terngrad": ("terngrad", "TernGradCompressor"),
    "onebit": ("onebit", "OneBitCompressor"),
    "signsgd": ("signsgd", "SignSGDCompressor"),
    "signum": ("signum", "SignumCompressor"),
    "efsignsgd": ("efsignsgd", "EFSignSGDCompressor"),
    "topk": ("topk", "TopKCompressor"),
    "dgc": ("dgc", "DGCCompressor"),
    "randomk": ("randomk", "RandomKCompressor"),
    "powersgd": ("powersgd", "PowerSGDCompressor"),
}

NAMES = tuple(_REGISTRY)


def compressor_class(name):
    if name not in _REGISTRY:
        raise ValueError(
            "unknown compressor %r; valid choices: %s" % (name, ", ".join(NAMES))
        )
    module_name, class_name = _REGISTRY[name]
    module = importlib.import_module("tf_mergecomp.compressors." + module_name)
    return getattr(module, class_name)


def get(name, **params):
    """Returns a new compressor, or ``name`` itself when it is one; bad parameters
    raise ValueError naming the valid ones."""
    return from_registry("compressor", name, params, Compressor, compressor_class)


__all__ = ["ALLGATHER", "ALLREDUCE", "TENSOR_SEED_SHIFT", "Compressor", "NAMES", "compressor_class", "get"]
