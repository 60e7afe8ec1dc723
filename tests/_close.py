"""Closeness to float32 rounding, for the GPU tests (test_cuda_launchers.py,
test_tf_gpu_ops.py). numpy only: test_cuda_launchers.py runs without
TensorFlow."""

import numpy as np


def assert_close(actual, expected, what, rtol=2e-5, dtype=np.float64):
    """The same entries non-finite, the finite ones close relative to the
    largest magnitude; both sides compared as `dtype`."""
    actual, expected = np.asarray(actual, dtype), np.asarray(expected, dtype)
    assert actual.shape == expected.shape, what
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isfinite(actual), finite, err_msg=what)
    scale = max(1.0, float(np.abs(expected[finite]).max())) if finite.any() else 1.0
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=rtol, atol=rtol * scale,
                               err_msg=what)
