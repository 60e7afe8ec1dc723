"""Writes dense_golden.npz: CPU-op payloads and decodes that the CUDA launchers
must reproduce (tests/test_cuda_launchers.py runs them where there is a GPU
but no TensorFlow). Run from the repository root after `make build`:

    .venv/bin/python tests/data/make_dense_golden.py
"""

import os

import numpy as np
import tensorflow as tf

from tf_mergecomp import compressors

N = 5003
WORLD = 3
CASES = {  # file key -> (registry name, params)
    "fp16": ("fp16", {}),
    "signsgd": ("signsgd", {}),
    "onebit": ("onebit", {}),
    "efsignsgd": ("efsignsgd", {}),
    "qsgd64": ("qsgd", {"levels": 64}),
    "qsgd5": ("qsgd", {"levels": 5}),
    "terngrad": ("terngrad", {}),
}


def inputs():
    return [np.random.default_rng(w).standard_normal(N).astype(np.float32) for w in range(WORLD)]


def main():
    arrays = {}
    xs = inputs()
    for key, (name, params) in CASES.items():
        codec = compressors.get(name, **params)
        payloads = []
        for w, x in enumerate(xs):
            payload, ctx = codec.compress(tf.constant(x), w + 11)
            payloads.append(payload)
            arrays["%s_payload%d" % (key, w)] = payload.numpy()
        if codec.collective == compressors.ALLREDUCE:
            continue
        combined = codec.combine(tf.concat(payloads, 0), ctx, WORLD)
        arrays["%s_combined" % key] = combined.numpy()
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dense_golden.npz")
    np.savez_compressed(path, **arrays)
    print("wrote", path)


if __name__ == "__main__":
    main()
