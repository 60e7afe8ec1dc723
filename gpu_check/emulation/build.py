"""Builds the CUDA launchers of custom_ops/ with g++ against the emulation:
the same ``extern "C"`` entry points as the nvcc build (gpu_check/launchers.py),
no GPU, no CUDA toolkit.

Every ``*_gpu.cu.cc`` and every header holding a launch or a ``__shared__``
declaration is rewritten (rewrite.py) into ``<build dir>/src/``, which comes
first on the include path, then custom_ops/ and this directory's headers
(cuda_runtime.h, ...). The translation units and the runtime (runtime/*.cc)
compile in parallel into objects that are kept and recompiled only when a
source, a header or the flags change; the library is relinked only then.

    python3 -m gpu_check.emulation.build [--sanitize undefined|thread] [--force]
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpu_check.emulation import rewrite

EMULATION = Path(__file__).resolve().parent
ROOT = EMULATION.parent.parent
OPS = ROOT / "custom_ops"
BUILD = ROOT / "build" / "gpu_check_emulated"
LIBRARY_NAMES = {None: "libmergecomp_gpu_emulated.so",
                 "undefined": "libmergecomp_gpu_emulated_ubsan.so",
                 "thread": "libmergecomp_gpu_emulated_tsan.so"}

# -ffp-contract=off: no fused multiply-add behind the kernels' back (their
# __fmul_rn / __fadd_rn are exact IEEE operations, intrinsics.h).
# -fno-strict-aliasing: the kernels reinterpret byte rows as floats and ints,
# and the float atomics work on the bits of floats.
COMPILE_FLAGS = ["-x", "c++", "-std=c++17", "-O2", "-ffp-contract=off", "-pthread", "-fPIC",
                 "-fno-strict-aliasing", "-Wno-unknown-pragmas"]
SANITIZER_FLAGS = {
    None: [],
    # UBSan, alignment included: a misaligned reinterpret_cast load, which
    # x86 executes and a GPU faults on (cudaErrorMisalignedAddress), stops the
    # process with the source line.
    "undefined": ["-fsanitize=alignment,undefined", "-fno-sanitize-recover=all", "-g",
                  "-fno-omit-frame-pointer"],
    "thread": ["-fsanitize=thread", "-g", "-fno-omit-frame-pointer"],
}


def find_cxx():
    """g++ from $CXX or PATH, else None."""
    for candidate in (os.environ.get("CXX"), shutil.which("g++")):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def default_library(sanitize=None):
    return BUILD / LIBRARY_NAMES[sanitize]


def kernel_sources():
    return sorted(OPS.rglob("*_gpu.cu.cc"))


def runtime_sources():
    return sorted((EMULATION / "runtime").glob("*.cc"))


def _emulation_files():
    files = set(EMULATION.rglob("*.h")) | set(EMULATION.rglob("*.cc"))
    return files | {EMULATION / "exports.map", EMULATION / "rewrite.py", Path(__file__).resolve()}


def _tree_files(root):
    return set(root.rglob("*.h")) | set(root.rglob("*.cc")) if root is not None else set()


def _newest(paths):
    return max((p.stat().st_mtime for p in paths), default=0.0)


def tool_environment():
    """The environment for compilers and binutils: without a sanitizer
    runtime preloaded into this process (sanitize.py's test runs)."""
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def _write_if_changed(path, text):
    if path.exists() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".%d.partial" % os.getpid())
    partial.write_text(text)
    os.replace(partial, path)


def rewrite_tree(sources, include_root, destination):
    """Writes the rewritten sources under `destination`: every source, and
    every header under include_root (at its relative path) that holds a
    launch or a __shared__ declaration. Returns the rewritten sources."""
    wanted, units = {}, []
    for path in sorted(_tree_files(include_root)):
        text = path.read_text()
        if rewrite.needs_rewrite(text):
            wanted[destination / path.relative_to(include_root)] = (path, text)
    for path in sources:
        inside = include_root is not None and include_root in path.parents
        target = destination / (path.relative_to(include_root) if inside else path.name)
        wanted[target] = (path, path.read_text())
        units.append(target)
    for target, (path, text) in wanted.items():
        relative = path.relative_to(ROOT) if ROOT in path.parents else path
        _write_if_changed(target, rewrite.rewrite(text, str(relative), path))
    if destination.exists():  # a header that no longer needs rewriting must not shadow the original
        for path in destination.rglob("*"):
            if path.is_file() and path not in wanted:
                path.unlink()
    return units


def _compile(command):
    """Runs a compile whose last argument is the object: written under another
    name and renamed, so that a concurrent build never links half an object."""
    obj = command[-1]
    partial = "%s.%d.partial" % (obj, os.getpid())
    result = subprocess.run(command[:-1] + [partial], capture_output=True, text=True,
                            env=tool_environment())
    if result.returncode == 0:
        os.replace(partial, obj)
    else:
        Path(partial).unlink(missing_ok=True)
    return command, result


def build(out=None, sanitize=None, force=False, jobs=None, cxx=None, verbose=False):
    """Builds the emulated launchers library at `out` (default:
    build/gpu_check_emulated/, one library per sanitizer) unless it is newer
    than everything it is built from; returns its path. sanitize: None,
    "undefined" or "thread"."""
    out = Path(out) if out is not None else default_library(sanitize)
    return build_sources(kernel_sources(), out, include_root=OPS, sanitize=sanitize, force=force,
                         jobs=jobs, cxx=cxx, verbose=verbose)


def build_sources(sources, out, include_root=None, sanitize=None, force=False, jobs=None,
                  cxx=None, verbose=False):
    """Builds CUDA `sources` (with the headers under include_root, which is
    also on the include path) against the emulation into the shared library
    `out`, exporting the symbols exports.map names; returns `out`."""
    if sanitize not in SANITIZER_FLAGS:
        raise ValueError("sanitize must be one of %s" % sorted(map(str, SANITIZER_FLAGS)))
    sources = [Path(p).resolve() for p in sources]
    out = Path(out)
    cxx = cxx or find_cxx()
    if cxx is None:
        raise RuntimeError("g++ not found (set CXX or put it on PATH)")
    work = out.parent / (out.name + ".build")
    flags = COMPILE_FLAGS + SANITIZER_FLAGS[sanitize]
    stamp = json.dumps({"cxx": cxx, "flags": flags}, sort_keys=True)
    library_stamp = work / "library.json"  # the flags the library was linked from
    inputs = _emulation_files() | _tree_files(include_root) | set(sources)
    if (not force and out.exists() and library_stamp.exists()
            and library_stamp.read_text() == stamp and out.stat().st_mtime >= _newest(inputs)):
        return out

    started = time.time()
    source_root = work / "src"
    objects_dir = work / "obj"
    objects_stamp = objects_dir / "flags.json"  # the flags the objects were compiled with
    if force or not objects_stamp.exists() or objects_stamp.read_text() != stamp:
        shutil.rmtree(objects_dir, ignore_errors=True)
    objects_dir.mkdir(parents=True, exist_ok=True)
    objects_stamp.write_text(stamp)
    units = list(zip(rewrite_tree(sources, include_root, source_root), sources))
    units += [(p, p) for p in runtime_sources()]
    newest_header = _newest([p for p in inputs if p.suffix == ".h"]
                            + [EMULATION / "rewrite.py", Path(__file__).resolve()])
    includes = ["-I", str(source_root)]
    if include_root is not None:
        includes += ["-I", str(include_root)]
    includes += ["-I", str(EMULATION)]
    commands, objects = [], []
    for unit, original in units:
        tag = hashlib.sha1(str(unit).encode()).hexdigest()[:8]
        obj = objects_dir / ("%s-%s.o" % (unit.name.split(".")[0], tag))
        objects.append(obj)
        if obj.exists() and obj.stat().st_mtime >= max(original.stat().st_mtime, newest_header):
            continue
        commands.append([cxx] + flags + includes + ["-c", str(unit), "-o", str(obj)])
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        results = list(pool.map(_compile, commands))
    failures = [(c, r) for c, r in results if r.returncode != 0]
    if failures:
        message = "\n\n".join("%s\n%s" % (c[-3], r.stderr[-3000:]) for c, r in failures)
        raise RuntimeError("the emulated build failed:\n" + message)
    link = [cxx, "-shared", "-pthread"] + SANITIZER_FLAGS[sanitize] + [
        "-Wl,--version-script=" + str(EMULATION / "exports.map"), "-o"]
    partial = out.with_name(out.name + ".%d.partial" % os.getpid())
    result = subprocess.run(link + [str(partial)] + [str(o) for o in objects],
                            capture_output=True, text=True, env=tool_environment())
    if result.returncode != 0:
        raise RuntimeError("linking the emulated library failed:\n" + result.stderr[-3000:])
    os.replace(partial, out)
    library_stamp.write_text(stamp)
    if verbose:
        print("built %s: %d of %d units compiled, %.1f s" % (out, len(commands), len(units),
                                                               time.time() - started))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--sanitize", choices=["undefined", "thread"], default=None)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--jobs", type=int, default=None)
    args = parser.parse_args(argv)
    build(args.out, sanitize=args.sanitize, force=args.force, jobs=args.jobs, verbose=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
