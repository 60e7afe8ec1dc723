"""The compression algorithms, one module each, found by registry name.

    from tf_mergecomp import compressors
    codec = compressors.get("topk", ratio=0.01)
"""

import importlib
import inspect

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
    """Returns a new compressor; bad parameters raise ValueError naming the valid ones."""
    if isinstance(name, Compressor):
        if params:
            raise ValueError("parameters %s given with a compressor instance" % sorted(params))
        return name
    cls = compressor_class(name)
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            "compressor %r got unknown parameter(s) %s; valid parameters: %s"
            % (name, ", ".join(unknown), ", ".join(accepted) or "none")
        )
    return cls(**params)


__all__ = ["ALLGATHER", "ALLREDUCE", "TENSOR_SEED_SHIFT", "Compressor", "NAMES", "compressor_class", "get"]
