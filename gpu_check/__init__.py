"""Framework-free GPU check of the CUDA codec launchers (``make gpu-check``).

Needs nvcc, and for the device checks CuPy and a GPU; never TensorFlow,
Horovod or the project's venv. ``launchers`` builds and binds the library,
``bench`` times the group codecs. Without a GPU, ``emulation`` builds the same
launchers with g++ against a CUDA emulation and ``array_backends`` gives the
checks numpy arrays as its device memory (``make test``,
``make gpu-emulate-sanitize``).
"""
