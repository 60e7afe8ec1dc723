"""Builds the CUDA launchers (every ``custom_ops/**/*_gpu.cu.cc``) into one
shared library with one nvcc invocation and binds their ``extern "C"`` entry
points with ctypes.

``build_emulated`` builds the same launchers with g++ against the CUDA
emulation (gpu_check/emulation: kernels run on the host, one host thread per
CUDA thread), optionally with UBSan or ThreadSanitizer: the same symbols, for
machines without a GPU or nvcc.

Nothing here imports CuPy or TensorFlow at module level: building, the symbol
list and the argument structs work on a machine with nvcc and no GPU.
``DeviceGroup`` and ``DevicePowersgdGroup`` lay tensors out as the launchers'
device tables, on either backend of gpu_check/array_backends.py (CuPy arrays,
or numpy arrays as the emulation's device memory).

    python3 gpu_check/launchers.py [--out build/gpu_check/libmergecomp_gpu.so]
    python3 gpu_check/launchers.py --emulated [--sanitize undefined|thread]
"""

import argparse
import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPS = ROOT / "custom_ops"
DEFAULT_LIBRARY = ROOT / "build" / "gpu_check" / "libmergecomp_gpu.so"

# Every extern "C" launcher the library must export (group_gpu_launchers.h,
# dense_gpu_launchers.h, sparse_gpu_launchers.h, powersgd_gpu_launchers.h).
GROUP_SYMBOLS = [
    "mergecomp_group_payload_bytes", "mergecomp_group_row_bytes", "mergecomp_group_context_size",
    "mergecomp_group_workspace_bytes", "mergecomp_group_encode_gpu", "mergecomp_group_decode_gpu",
    "mergecomp_group_error_string", "mergecomp_group_codec_names",
    "mergecomp_group_decode_gpu_async", "mergecomp_group_cast_to_float_gpu",
    "mergecomp_group_cast_from_float_gpu",
]
DENSE_SYMBOLS = ["mergecomp_dense_scratch_bytes"] + [
    "mergecomp_%s_%s_gpu" % (codec, way)
    for codec in ("fp16", "signsgd", "onebit", "efsignsgd", "qsgd", "terngrad")
    for way in ("encode", "decode")
]
SPARSE_SYMBOLS = [
    "mergecomp_topk_workspace_bytes", "mergecomp_topk_encode_gpu",
    "mergecomp_sparse_scatter_mean_gpu", "mergecomp_dgc_workspace_bytes",
    "mergecomp_dgc_encode_gpu", "mergecomp_randomk_workspace_bytes",
    "mergecomp_randomk_indices_gpu",
]
POWERSGD_SYMBOLS = [
    "mergecomp_grouped_matmul_gpu", "mergecomp_powersgd_compensate_gpu",
    "mergecomp_powersgd_gather_q_gpu", "mergecomp_powersgd_orthonormalize_gpu",
    "mergecomp_powersgd_finish_gpu",
]
EXPECTED_SYMBOLS = GROUP_SYMBOLS + DENSE_SYMBOLS + SPARSE_SYMBOLS + POWERSGD_SYMBOLS

# The group codecs (the CPU GroupCodec registry's names).
GROUP_CODECS = ["none", "fp16", "signsgd", "onebit", "efsignsgd", "qsgd", "terngrad", "topk",
                "dgc", "randomk"]
MEMORIES = {"none": 0, "residual": 1, "momentum": 2, "dgc": 3}
BAD_INDEX = 10001
BAD_ARGUMENT = 10002


def sources():
    return sorted(OPS.rglob("*_gpu.cu.cc"))


def find_nvcc():
    """nvcc from $NVCC, PATH or /usr/local/cuda/bin, else None."""
    for candidate in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def find_cxx():
    """g++ for the emulated build ($CXX or PATH), else None."""
    from gpu_check.emulation import build as emulated

    return emulated.find_cxx()


def build_emulated(out=None, sanitize=None, force=False):
    """Builds the launchers with g++ against the CUDA emulation (default:
    build/gpu_check_emulated/libmergecomp_gpu_emulated[_ubsan|_tsan].so) unless
    the library is newer than every source; returns its path. sanitize: None,
    "undefined" (UBSan with alignment checks) or "thread" (ThreadSanitizer)."""
    from gpu_check.emulation import build as emulated

    return emulated.build(out, sanitize=sanitize, force=force)


def build_command(nvcc, out, arch=None, optimize="-O3"):
    command = [nvcc, "-std=c++17", "-shared", "-Xcompiler", "-fPIC", optimize, "-o", str(out),
               "-I" + str(OPS)]
    if arch:
        command.append("-arch=" + arch)
    return command + ["-x", "cu"] + [str(s) for s in sources()]


def _stale(out):
    if not out.exists():
        return True
    built = out.stat().st_mtime
    inputs = sources() + list(OPS.rglob("*.h")) + [Path(__file__)]
    return any(p.stat().st_mtime > built for p in inputs)


def build(out=DEFAULT_LIBRARY, nvcc=None, arch=None, optimize="-O3", force=False):
    """Builds the library at `out` unless it is newer than every source.

    arch: nvcc's -arch (e.g. "native", "sm_90"); default $MERGECOMP_CUDA_ARCH,
    else "native" when nvidia-smi is present (a GPU host), else nvcc's default.
    """
    out = Path(out)
    if not force and not _stale(out):
        return out
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found (set NVCC or put it on PATH)")
    if arch is None:
        arch = os.environ.get("MERGECOMP_CUDA_ARCH") or (
            "native" if shutil.which("nvidia-smi") else None)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    result = subprocess.run(build_command(nvcc, partial, arch, optimize), capture_output=True,
                            text=True)
    if result.returncode != 0 and arch == "native":
        # An nvcc that cannot query the device: its default architecture (PTX is JIT-compiled).
        result = subprocess.run(build_command(nvcc, partial, None, optimize), capture_output=True,
                                text=True)
    if result.returncode != 0:
        raise RuntimeError("nvcc failed:\n" + result.stderr[-4000:])
    partial.replace(out)
    return out


def exported_symbols(library):
    """The dynamic symbols `library` defines (nm -D)."""
    environment = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # no sanitizer
    listing = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True,
                             text=True, check=True, env=environment).stdout
    return {line.split()[-1] for line in listing.splitlines() if line.strip()}


class GpuGroup(ctypes.Structure):
    """MergecompGpuGroup (group_gpu_launchers.h)."""
    _fields_ = [("num_tensors", ctypes.c_int64), ("host_offsets", ctypes.POINTER(ctypes.c_int64)),
                ("offsets", ctypes.c_void_p), ("inputs", ctypes.c_void_p),
                ("outputs", ctypes.c_void_p), ("state", ctypes.c_void_p)]


class GpuCodec(ctypes.Structure):
    """MergecompGpuCodec (group_gpu_launchers.h)."""
    _fields_ = [("name", ctypes.c_char_p), ("memory", ctypes.c_int32), ("decay", ctypes.c_float),
                ("gradient_scale", ctypes.c_float), ("marker_bytes", ctypes.c_int32),
                ("scale", ctypes.c_int32), ("levels", ctypes.c_int64), ("k", ctypes.c_int64),
                ("sample_size", ctypes.c_int64),
                ("host_tensor_k", ctypes.POINTER(ctypes.c_int64)), ("tensor_k", ctypes.c_void_p)]


class GpuMatrices(ctypes.Structure):
    """MergecompGpuMatrices (powersgd_gpu_launchers.h)."""
    _fields_ = [("count", ctypes.c_int64), ("host_c_offsets", ctypes.POINTER(ctypes.c_int64))] + [
        (name, ctypes.c_void_p) for name in ("c_offsets", "m", "k", "r", "a_offsets", "b_offsets")]


class PowersgdGpuGroup(ctypes.Structure):
    """MergecompPowersgdGpuGroup (powersgd_gpu_launchers.h)."""
    _fields_ = [("num_tensors", ctypes.c_int64), ("residual", ctypes.c_int32),
                ("host_offsets", ctypes.POINTER(ctypes.c_int64)),
                ("host_q_size", ctypes.c_int64)] + [
        (name, ctypes.c_void_p) for name in ("offsets", "m_offsets", "p_offsets", "q_offsets",
                                             "cols", "ranks", "kinds", "gradients", "outputs",
                                             "state")]


# Gradient dtypes as the PowerSGD launchers' kinds (0: float32; else MERGECOMP_CAST_*).
CAST_KINDS = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}


def powersgd_layout(shapes, rank):
    """PowersgdGroupLayout (powersgd_op.h) of `shapes`: a dict of per-tensor
    lists (size, low_rank, rows, cols, rank, m/p/q offsets) and the payload sizes."""
    tensors, m_size, p_size, q_size = [], 0, 0, 0
    for shape in shapes:
        size = 1
        for d in shape:
            size *= int(d)
        t = {"size": size, "low_rank": len(shape) >= 2 and size > 0, "rows": 0, "cols": 0,
             "rank": 0, "m_offset": 0, "p_offset": 0, "q_offset": 0}
        if t["low_rank"]:
            t["m_offset"] = m_size
            m_size += size
            t["cols"] = int(shape[-1])
            t["rows"] = size // t["cols"]
            t["rank"] = min(rank, t["rows"], t["cols"])
            t["p_offset"], t["q_offset"] = p_size, q_size
            p_size += t["rows"] * t["rank"]
            q_size += t["cols"] * t["rank"]
        tensors.append(t)
    for t in tensors:
        if not t["low_rank"]:
            t["p_offset"] = p_size
            p_size += t["size"]
    return {"tensors": tensors, "compensated": m_size, "p": p_size, "q": q_size}


class DevicePowersgdGroup:
    """powersgd_layout(shapes, rank) as MergecompPowersgdGpuGroup tables.
    backend: an array backend (gpu_check/array_backends.py) or CuPy's module;
    gradients / outputs: lists of its arrays (any of CAST_KINDS' dtypes) or
    None; state: its float32 arrays or None."""

    def __init__(self, backend, shapes, rank, residual, gradients=None, outputs=None, state=None,
                 dtypes=None):
        import numpy as np

        from gpu_check.array_backends import as_backend

        self.backend = backend = as_backend(backend)
        self.layout = layout = powersgd_layout(shapes, rank)
        tensors = layout["tensors"]
        n = len(tensors)
        offsets = [0]
        for t in tensors:
            offsets.append(offsets[-1] + t["size"])
        q_offsets, running = [], 0
        for t in tensors:
            q_offsets.append(t["q_offset"] if t["low_rank"] else running)
            if t["low_rank"]:
                running = t["q_offset"] + t["cols"] * t["rank"]
        q_offsets.append(running)
        dtypes = dtypes or ["float32"] * n
        self._host_offsets = (ctypes.c_int64 * (n + 1))(*offsets)
        self._keep = {}

        def table(key, values, dtype=np.int64):
            self._keep[key] = backend.asarray(np.asarray(values, dtype))
            return backend.ptr(self._keep[key])

        def pointers(key, arrays):
            if arrays is None:
                return None
            return table(key, [backend.ptr(a) for a in arrays], np.uint64)

        self.struct = PowersgdGpuGroup(
            num_tensors=n, residual=int(bool(residual)),
            host_offsets=ctypes.cast(self._host_offsets, ctypes.POINTER(ctypes.c_int64)),
            host_q_size=layout["q"], offsets=table("offsets", offsets),
            m_offsets=table("m", [t["m_offset"] for t in tensors]),
            p_offsets=table("p", [t["p_offset"] for t in tensors]),
            q_offsets=table("q", q_offsets), cols=table("cols", [t["cols"] for t in tensors]),
            ranks=table("ranks", [t["rank"] for t in tensors]),
            kinds=table("kinds", [CAST_KINDS[d] for d in dtypes]),
            gradients=pointers("gradients", gradients), outputs=pointers("outputs", outputs),
            state=pointers("state", state))

    def matrices(self, product):
        """GpuMatrices of the low-rank tensors for "p" (P_i = M_i Q_i, B the
        packed Q) or "q_local" (Qlocal_i = M_i^T P_i, transpose_a)."""
        import numpy as np

        low = [t for t in self.layout["tensors"] if t["low_rank"]]
        p = product == "p"
        c_offsets = [t["p_offset"] if p else t["q_offset"] for t in low]
        c_offsets.append(c_offsets[-1] + (low[-1]["rows"] if p else low[-1]["cols"])
                         * low[-1]["rank"] if low else 0)
        values = {"m": [t["rows"] if p else t["cols"] for t in low],
                  "k": [t["cols"] if p else t["rows"] for t in low],
                  "r": [t["rank"] for t in low], "a_offsets": [t["m_offset"] for t in low],
                  "b_offsets": [t["q_offset"] if p else t["p_offset"] for t in low]}
        tables = {name: self.backend.asarray(np.asarray(v + [0], np.int64))
                  for name, v in values.items()}
        tables["c_offsets"] = self.backend.asarray(np.asarray(c_offsets, np.int64))
        host = (ctypes.c_int64 * len(c_offsets))(*c_offsets)
        self._keep["matrices_" + product] = (tables, host)
        return GpuMatrices(count=len(low),
                           host_c_offsets=ctypes.cast(host, ctypes.POINTER(ctypes.c_int64)),
                           **{name: self.backend.ptr(t) for name, t in tables.items()})


def load(path=DEFAULT_LIBRARY):
    """The library at `path` with argument and result types declared."""
    lib = ctypes.CDLL(str(path))
    P, I64, INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    group, codec = ctypes.POINTER(GpuGroup), ctypes.POINTER(GpuCodec)
    for name in ("payload_bytes", "row_bytes", "context_size", "workspace_bytes"):
        fn = getattr(lib, "mergecomp_group_" + name)
        fn.argtypes, fn.restype = [codec, group], I64
    lib.mergecomp_group_encode_gpu.argtypes = [codec, group, I64, P, P, P, P]
    lib.mergecomp_group_encode_gpu.restype = INT
    lib.mergecomp_group_decode_gpu.argtypes = [codec, group, P, I64, P, P, P, P]
    lib.mergecomp_group_decode_gpu.restype = INT
    lib.mergecomp_group_error_string.argtypes, lib.mergecomp_group_error_string.restype = (
        [INT], ctypes.c_char_p)
    lib.mergecomp_group_codec_names.restype = ctypes.c_char_p
    lib.mergecomp_dense_scratch_bytes.restype = I64
    lib.mergecomp_grouped_matmul_gpu.argtypes = [ctypes.POINTER(GpuMatrices), P, INT, P, P, P]
    lib.mergecomp_grouped_matmul_gpu.restype = INT
    psgd = ctypes.POINTER(PowersgdGpuGroup)
    for name, args in (("compensate", [psgd, P, P, P]), ("gather_q", [psgd, P, P]),
                       ("orthonormalize", [psgd, P, P]),
                       ("finish", [psgd, P, P, P, P, P, P])):
        fn = getattr(lib, "mergecomp_powersgd_%s_gpu" % name)
        fn.argtypes, fn.restype = args, INT
    return lib


class LauncherError(RuntimeError):
    def __init__(self, lib, what, code):
        self.code = code
        message = lib.mergecomp_group_error_string(code).decode()
        super().__init__("%s failed with code %d: %s" % (what, code, message))


def make_codec(name, memory="none", decay=0.0, gradient_scale=1.0, marker_bytes=1, scale=False,
               levels=0, k=0, sample_size=0, tensor_k=None):
    """A GpuCodec plus the arrays it points to (keep the returned tuple alive).

    tensor_k: random-k's k_i per tensor (host list); its device copy is made
    by DeviceGroup.bind.
    """
    codec = GpuCodec(name=name.encode(), memory=MEMORIES[memory], decay=decay,
                     gradient_scale=gradient_scale, marker_bytes=marker_bytes, scale=int(scale),
                     levels=levels, k=k, sample_size=sample_size)
    host_k = None
    if tensor_k is not None:
        host_k = (ctypes.c_int64 * max(1, len(tensor_k)))(*tensor_k)
        codec.host_tensor_k = ctypes.cast(host_k, ctypes.POINTER(ctypes.c_int64))
    return codec, host_k


class DeviceGroup:
    """A group of float32 tensors as MergecompGpuGroup tables.

    backend: an array backend (gpu_check/array_backends.py) or CuPy's module;
    sizes: element counts; inputs/outputs/state: lists of its float32 arrays
    (state may be None for memory none).
    """

    def __init__(self, backend, sizes, inputs=None, outputs=None, state=None):
        import numpy as np

        from gpu_check.array_backends import as_backend

        self.backend = as_backend(backend)
        self.sizes = [int(s) for s in sizes]
        self.host_offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self._host_offsets_c = (ctypes.c_int64 * len(self.host_offsets))(*self.host_offsets)
        self.offsets = self.backend.asarray(self.host_offsets)
        self.inputs = inputs
        self.outputs = outputs
        self.state = state
        self._tables = {}
        self.struct = GpuGroup(
            num_tensors=len(self.sizes),
            host_offsets=ctypes.cast(self._host_offsets_c, ctypes.POINTER(ctypes.c_int64)),
            offsets=self.backend.ptr(self.offsets),
            inputs=self._table("inputs", inputs), outputs=self._table("outputs", outputs),
            state=self._table("state", state))

    def _table(self, key, arrays):
        import numpy as np

        if arrays is None:
            return None
        # Empty tensors still get a valid pointer (never dereferenced).
        pointers = [self.backend.ptr(a) for a in arrays]
        table = self.backend.asarray(np.array(pointers, dtype=np.uint64))
        self._tables[key] = table
        return self.backend.ptr(table)

    def bind(self, codec_pair):
        """Uploads random-k's tensor_k and sets codec.tensor_k; returns the codec."""
        import numpy as np

        codec, host_k = codec_pair
        if host_k is not None:
            self._tables["tensor_k"] = self.backend.asarray(
                np.array([host_k[i] for i in range(len(self.sizes))], dtype=np.int64))
            codec.tensor_k = self.backend.ptr(self._tables["tensor_k"])
        return codec


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--arch", default=None, help="nvcc -arch (default: native on a GPU host)")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--emulated", action="store_true",
                        help="g++ against the CUDA emulation instead of nvcc")
    parser.add_argument("--sanitize", choices=["undefined", "thread"], default=None,
                        help="with --emulated: the UBSan or ThreadSanitizer build")
    args = parser.parse_args(argv)
    if args.emulated:
        path = build_emulated(args.out, sanitize=args.sanitize, force=args.force)
    else:
        path = build(args.out or DEFAULT_LIBRARY, arch=args.arch, force=args.force)
    missing = sorted(set(EXPECTED_SYMBOLS) - exported_symbols(path))
    if missing:
        print("missing launchers: " + ", ".join(missing), file=sys.stderr)
        return 1
    print("built %s (%d launchers)" % (path, len(EXPECTED_SYMBOLS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
