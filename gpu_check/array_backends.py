"""Device arrays for the launcher checks, on a GPU or on the CUDA emulation.

Two backends with one small interface (asarray, empty, zeros, full, get, ptr,
is_array, synchronize, library):

- ``CupyBackend``: CuPy arrays on a CUDA device; the library is the nvcc
  build (launchers.build).
- ``HostBackend``: numpy arrays standing for device memory, each 256-byte
  aligned as cudaMalloc's, a pointer being ``arr.ctypes.data``; the library
  is the g++ build against the emulation (launchers.build_emulated), whose
  "device" memory is host memory. ``sanitize`` picks its sanitized build.

``select()`` picks one: $MERGECOMP_LAUNCHER_BACKEND ("cuda" or "emulated")
when set, else CuPy with a device and nvcc, else the emulation where g++ is,
else None (``unavailable_reason()`` says why). Nothing here imports CuPy
unless the CUDA backend is asked for or probed.
"""

import os

import numpy as np

from gpu_check import launchers

BACKEND_VARIABLE = "MERGECOMP_LAUNCHER_BACKEND"
SANITIZE_VARIABLE = "MERGECOMP_EMULATION_SANITIZE"  # "undefined" or "thread" (sanitize.py)
ALIGNMENT = 256


class CupyBackend:
    name = "cuda"

    def __init__(self, cp=None):
        if cp is None:
            import cupy as cp
        self.cp = cp

    def asarray(self, values, dtype=None):
        return self.cp.asarray(np.asarray(values, dtype))

    def empty(self, n, dtype):
        return self.cp.empty(n, dtype)

    def zeros(self, n, dtype):
        return self.cp.zeros(n, dtype)

    def full(self, n, value, dtype):
        return self.cp.full(n, value, dtype)

    def get(self, array):
        return array.get()

    def ptr(self, array):
        return array.data.ptr

    def is_array(self, value):
        return isinstance(value, self.cp.ndarray)

    def synchronize(self):
        self.cp.cuda.runtime.deviceSynchronize()

    def library(self):
        return launchers.build()


class HostBackend:
    """numpy arrays as the emulation's device memory."""

    name = "emulated"

    def __init__(self, sanitize=None):
        self.sanitize = sanitize

    @staticmethod
    def _aligned(n, dtype):
        dtype = np.dtype(dtype)
        raw = np.empty(n * dtype.itemsize + ALIGNMENT, np.uint8)
        start = -raw.ctypes.data % ALIGNMENT
        return raw[start:start + n * dtype.itemsize].view(dtype)

    def asarray(self, values, dtype=None):
        values = np.asarray(values, dtype)
        array = self._aligned(values.size, values.dtype).reshape(values.shape)
        array[...] = values  # a copy, as a transfer to a device is
        return array

    def empty(self, n, dtype):
        array = self._aligned(n, dtype)
        array.view(np.uint8)[:] = 0xA5  # undefined contents, not zeros
        return array

    def zeros(self, n, dtype):
        array = self._aligned(n, dtype)
        array[...] = 0
        return array

    def full(self, n, value, dtype):
        array = self._aligned(n, dtype)
        array[...] = value
        return array

    def get(self, array):
        return np.array(array, copy=True)

    def ptr(self, array):
        return array.ctypes.data

    def is_array(self, value):
        return isinstance(value, np.ndarray)

    def synchronize(self):
        pass  # every launch of the emulation has finished when it returns

    def library(self):
        return launchers.build_emulated(sanitize=self.sanitize)


def as_backend(backend_or_cupy):
    """A backend, or CuPy's module wrapped in CupyBackend (the older calling
    convention of DeviceGroup(cp, ...))."""
    if hasattr(backend_or_cupy, "ptr"):
        return backend_or_cupy
    return CupyBackend(backend_or_cupy)


def _cuda_device_present():
    try:
        import cupy as cp
    except ImportError:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # CuPy without a driver raises its own runtime errors
        return False


def _emulated():
    return HostBackend(sanitize=os.environ.get(SANITIZE_VARIABLE) or None)


def select():
    """The backend the launcher checks run on, or None."""
    wanted = os.environ.get(BACKEND_VARIABLE, "")
    if wanted == "cuda":
        return CupyBackend()
    if wanted == "emulated":
        return _emulated()
    if wanted:
        raise ValueError("%s must be cuda or emulated, not %r" % (BACKEND_VARIABLE, wanted))
    if launchers.find_nvcc() is not None and _cuda_device_present():
        return CupyBackend()
    if launchers.find_cxx() is not None:
        return _emulated()
    return None


def unavailable_reason():
    return "no CUDA device with CuPy and nvcc, and no g++ for the CUDA emulation"
