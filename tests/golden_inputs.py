"""Inputs of the group golden's digest cases (tests/data/make_group_golden.py,
tests/test_cuda_launchers.py): too large to store, so both sides regenerate
them from a seed and compare SHA-256 digests. numpy only (the GPU check runs
without TensorFlow), and pure uint32 arithmetic (random.h's Mix32), so the
values do not depend on numpy's random streams or version.
"""

import hashlib

import numpy as np


def mix32(x):
    """random.h's Mix32 on a uint32 array."""
    x = np.asarray(x, np.uint32).copy()
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def hashed_values(seed, n, scale=1.0):
    """n float32 values uniform in [-scale/2, scale/2), 2^24 levels (so a
    large tensor holds ties), element i a function of (seed, i) only."""
    with np.errstate(over="ignore"):
        key = mix32(np.uint32(seed & 0xFFFFFFFF))
        bits = mix32(np.arange(n, dtype=np.uint32) ^ key)
    uniform = (bits >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / (1 << 24))
    return ((uniform - np.float32(0.5)) * np.float32(scale)).astype(np.float32)


def group_inputs(seed, sizes, scale=1.0):
    """One float32 array per tensor of `sizes`, tensor t scaled by (1 + t)."""
    return [hashed_values(seed * 1000 + t, n, scale * (1 + t)) for t, n in enumerate(sizes)]


def digest(*arrays):
    """SHA-256 (hex) of the arrays' bytes, back to back."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


# The digest cases' gradients and initial state: worker w's, for a group of `sizes`.
DIGEST_SEED = 20261204


def worker_gradients(w, sizes):
    return group_inputs(DIGEST_SEED + w, sizes)


def worker_state(w, sizes, buffers):
    """The memory's `buffers` float32 buffers of each tensor, back to back,
    uniform in [-0.1, 0.1)."""
    return [hashed_values(DIGEST_SEED + 1000 * (w + 1) + t, buffers * n, 0.2)
            for t, n in enumerate(sizes)]
