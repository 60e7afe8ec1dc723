"""Codecs by backend for the tests: "op" (the fused group ops) or "reference"
(the plain-TF path of tf_mergecomp/reference.py, the oracle)."""

from tf_mergecomp import compressors, reference

BACKENDS = ("op", "reference")


def get(name, backend="op", **params):
    codec = compressors.get(name, **params)
    return reference.plain(codec) if backend == "reference" else codec
