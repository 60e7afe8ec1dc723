"""The CUDA emulation (gpu_check/emulation) does what CUDA does, for what the
launcher checks rely on: the launch rewrite, block barriers and their votes,
one copy of shared memory per block, threads that leave a block early, warp
intrinsics, atomics, exactly rounded float intrinsics, __half conversions,
3-D indices, large grids, bad launch configurations and the runtime API; and
its sanitizer builds report a data race and a misaligned load (what
``make gpu-emulate-sanitize`` relies on). The kernels are
tests/cuda_emulation_selftest.cu.cc. Needs g++, no GPU.
"""

import ctypes
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from gpu_check.emulation import build, rewrite

ROOT = Path(__file__).resolve().parent.parent
SELFTEST = ROOT / "tests" / "cuda_emulation_selftest.cu.cc"
P, I64, INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int

pytestmark = pytest.mark.skipif(build.find_cxx() is None, reason="g++ not found")


def _library_path(sanitize=None):
    suffix = {None: "", "undefined": "_ubsan", "thread": "_tsan"}[sanitize]
    return build.build_sources([SELFTEST], build.BUILD / ("libcuda_emulation_selftest%s.so"
                                                          % suffix), sanitize=sanitize)


@pytest.fixture(scope="module")
def lib():
    return ctypes.CDLL(str(_library_path()))


def _run(lib, name, *args):
    fn = getattr(lib, "cuda_emulation_test_" + name)
    fn.restype = INT
    fn.argtypes = [P if isinstance(a, np.ndarray) or a is None else I64 for a in args]
    return fn(*[a.ctypes.data if isinstance(a, np.ndarray) else a for a in args])


# ---- the rewrite -------------------------------------------------------------------


def test_rewrite_turns_launches_into_calls_and_keeps_line_numbers():
    source = textwrap.dedent("""\
        void f() {
          ns::Kernel<kCodec><<<GridFor(n, m), kThreads, 0,
                               static_cast<cudaStream_t>(s)>>>(a, g(b, c));  // <<<x>>>
          const char* text = "k<<<1, 1>>>()";
          kernel<<<1, 2>>>();
          ::Global<<<dim3(1, 2), 3, 4>>>(args...);
        }
        """)
    out = rewrite.rewrite(source)
    assert out.count("\n") == source.count("\n")
    lines = out.splitlines()
    assert lines[1].strip().startswith(
        "::cuda_emulation::Launch(::cuda_emulation::LaunchConfig(GridFor(n, m), kThreads, 0,")
    assert "ns::Kernel<kCodec>(cuda_emulation_args...); }, a, g(b, c))" in out
    assert "// <<<x>>>" in out and '"k<<<1, 1>>>()"' in out  # comments and strings untouched
    assert "LaunchConfig(1, 2), [&](auto... cuda_emulation_args) { kernel(" in lines[4]
    assert lines[4].rstrip().endswith("});")
    assert "LaunchConfig(dim3(1, 2), 3, 4)" in lines[5] and "::Global(" in lines[5]
    assert "}, args...);" in lines[5]


def test_rewrite_gives_each_shared_declaration_its_own_block_storage():
    source = textwrap.dedent("""\
        __global__ void k() {
          __shared__ unsigned long long gt, eq;
          static __shared__ double partial[kThreads];
          extern __shared__ __align__(16) float dynamic[];
        }
        """)
    out = rewrite.rewrite(source, line_directive="/src/k.cu.cc")
    assert out.startswith('#line 1 "/src/k.cu.cc"\n')
    assert "auto& gt = ::cuda_emulation::BlockShared<unsigned long long>([] {});" in out
    assert "auto& eq = ::cuda_emulation::BlockShared<unsigned long long>([] {});" in out
    assert "auto& partial = ::cuda_emulation::BlockShared<double[kThreads]>([] {});" in out
    assert "float* const dynamic = ::cuda_emulation::DynamicShared<float>();" in out
    assert "__shared__" not in out.split("\n", 1)[1]


@pytest.mark.parametrize("source", ["k<<<1>>>(x);", "k<<<1, 2, 3, 4, 5>>>(x);", "k<<<1, 2>>>;",
                                    "k<<<1, 2(x);", "__shared__ int x[];"])
def test_rewrite_refuses_what_it_cannot_parse(source):
    with pytest.raises(rewrite.RewriteError):
        rewrite.rewrite(source)


def test_every_kernel_source_rewrites():
    """Every launch and __shared__ declaration of custom_ops/ is understood."""
    for path in sorted((ROOT / "custom_ops").rglob("*.c*")) + sorted(
            (ROOT / "custom_ops").rglob("*.h")):
        text = path.read_text()
        if rewrite.needs_rewrite(text):
            out = rewrite.rewrite(text, path.name)
            assert out.count("\n") == text.count("\n"), path
            assert not rewrite.needs_rewrite(out), path


# ---- blocks ---------------------------------------------------------------------------


def test_barrier_orders_shared_memory_within_each_block(lib):
    blocks = 40
    values = np.arange(blocks * 128, dtype=np.int32) * 7
    out = np.zeros_like(values)
    assert _run(lib, "reverse", values, out, blocks) == 0
    np.testing.assert_array_equal(out, values.reshape(blocks, 128)[:, ::-1].ravel())


def test_each_block_has_its_own_shared_memory(lib):
    mismatches = np.zeros(1, np.int32)
    assert _run(lib, "shared_per_block", 64, 20, mismatches) == 0
    assert mismatches[0] == 0


def test_barrier_votes(lib):
    rng = np.random.default_rng(1)
    blocks = 6
    predicates = (rng.random((blocks, 128)) < 0.3).astype(np.int32)
    predicates[1] = 0
    predicates[2] = 5  # non-zero is true
    predicates[3, 17] = 1
    results = np.zeros((blocks, 4), np.int32)
    assert _run(lib, "votes", predicates, blocks, results) == 0
    np.testing.assert_array_equal(results[:, 0], predicates.any(axis=1))
    np.testing.assert_array_equal(results[:, 1], predicates.all(axis=1))
    np.testing.assert_array_equal(results[:, 2], (predicates != 0).sum(axis=1))
    assert not results[:, 3].any()  # every thread got the same results


@pytest.mark.parametrize("live", [1, 37, 127])
def test_threads_leaving_early_do_not_hold_up_a_barrier(lib, live):
    """As on Volta and later: a barrier waits for the threads still running."""
    blocks = 5
    sums = np.zeros(blocks, np.int32)
    assert _run(lib, "early_exit", blocks, live, sums) == 0
    expected = [sum(t + 1 + b for t in range(live)) for b in range(blocks)]
    np.testing.assert_array_equal(sums, expected)


def test_dynamic_shared_memory(lib):
    blocks, threads = 3, 96
    out = np.zeros(blocks * threads, np.int32)
    assert _run(lib, "dynamic_shared", out, blocks, threads) == 0
    t = np.arange(threads)
    expected = np.concatenate([2 * (threads - 1 - t) + b for b in range(blocks)])
    np.testing.assert_array_equal(out, expected)


def test_3d_grid_and_block_indices(lib):
    grid, block = (3, 2, 2), (4, 3, 2)
    out = np.full(12 * 24, -1, np.int32)
    assert _run(lib, "indices", out) == 0
    expected = [(bz << 20) | (by << 16) | (bx << 12) | (tz << 8) | (ty << 4) | tx
                for bz in range(grid[2]) for by in range(grid[1]) for bx in range(grid[0])
                for tz in range(block[2]) for ty in range(block[1]) for tx in range(block[0])]
    np.testing.assert_array_equal(out, expected)


# ---- warps ------------------------------------------------------------------------------


def test_warp_shuffles_and_votes(lib):
    out = np.zeros((64, 8), np.int32)
    assert _run(lib, "warp", out) == 0
    t = np.arange(64)
    v = t * 3 + 1
    lane, warp = t % 32, t // 32
    np.testing.assert_array_equal(out[:, 0], v[warp * 32 + 5])
    np.testing.assert_array_equal(out[:, 1], np.where(lane < 31, v[np.minimum(t + 1, 63)], v))
    np.testing.assert_array_equal(out[:, 2], np.where(lane >= 2, v[np.maximum(t - 2, 0)], v))
    np.testing.assert_array_equal(out[:, 3], v[t ^ 1])
    np.testing.assert_array_equal(out[:, 4], [v[w * 32:(w + 1) * 32].sum() for w in warp])
    ballots = [sum(1 << l for l in range(32) if v[w * 32 + l] % 4 == 1) for w in (0, 1)]
    np.testing.assert_array_equal(out[:, 5].view(np.uint32), [ballots[w] for w in warp])
    np.testing.assert_array_equal(out[:, 6], np.where(warp == 1, 1, 0) + 2)  # any, all
    np.testing.assert_array_equal(out[:, 7], v[(t & ~7) + 3])


def test_a_partial_warp_has_only_its_lanes(lib):
    out = np.zeros((48, 2), np.uint32)
    assert _run(lib, "partial_warp", out) == 0
    np.testing.assert_array_equal(out[:32, 0], 0xFFFFFFFF)
    np.testing.assert_array_equal(out[32:, 0], 0xFFFF)
    np.testing.assert_array_equal(out[:32, 1], 0x55555555)
    np.testing.assert_array_equal(out[32:, 1], 0x5555)


# ---- arithmetic -----------------------------------------------------------------------


ATOMICS = np.dtype([("float_sum", np.float32), ("double_sum", np.float64),
                    ("index_sum", np.uint64), ("max", np.int32), ("min", np.int32),
                    ("bits_or", np.uint32), ("bits_and", np.uint32), ("cas_winner", np.int32),
                    ("wrapped", np.uint32), ("exchanged", np.int32)], align=True)


def test_atomics_struct_layout_matches(lib):
    fn = lib.cuda_emulation_test_atomics_bytes
    fn.restype = I64
    assert fn() == ATOMICS.itemsize


def test_atomics(lib):
    out = np.zeros(1, ATOMICS)
    out["min"], out["bits_and"], out["cas_winner"] = 5, 0xFFFFFFFF, -1
    blocks, threads = 40, 256
    n = blocks * threads
    assert _run(lib, "atomics", out, blocks, threads) == 0
    assert out["float_sum"][0] == n and out["double_sum"][0] == n / 2
    assert out["index_sum"][0] == n * (n - 1) // 2
    assert out["max"][0] == n - 1 and out["min"][0] == -(n - 1)
    assert out["bits_or"][0] == 0xFFFFFFFF and out["bits_and"][0] == 0xFFFFFF00
    assert 0 <= out["cas_winner"][0] < n
    assert out["wrapped"][0] == n % 10  # atomicInc wraps to 0 after 9
    assert out["exchanged"][0] == 7


def test_rounded_float_intrinsics_are_exact_and_not_fused(lib):
    rng = np.random.default_rng(7)
    n = 100_000
    a, b, c = (rng.standard_normal(n).astype(np.float32) * s for s in (1e3, 1e-3, 1.0))
    a[0] = b[0] = np.float32(1 + 2.0**-12)  # a * b = 1 + 2^-11 + 2^-24: fused and not differ
    c[0] = np.float32(-1.0)
    mul_add, fused, quotient = (np.zeros(n, np.float32) for _ in range(3))
    assert _run(lib, "rounding", a, b, c, n, mul_add, fused, quotient) == 0
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(mul_add, (a * b) + c)  # float32, rounded twice
        np.testing.assert_array_equal(quotient, (a - c) / b)
    assert mul_add[0] == 2.0**-11 and fused[0] == 2.0**-11 + 2.0**-24
    exact = (a.astype(np.float64) * b + c).astype(np.float32)  # a * b is exact in float64
    assert np.mean(fused == exact) > 0.999  # float64 rounding first may differ on ties


def test_half_conversions_round_as_cuda(lib):
    rng = np.random.default_rng(3)
    halves = np.arange(65536, dtype=np.uint16)
    finite = halves.view(np.float16)
    finite = finite[np.isfinite(finite)].astype(np.float32)
    up = np.nextafter(finite, np.float32(np.inf))
    down = np.nextafter(finite, np.float32(-np.inf))
    ordered = np.sort(np.unique(finite))
    midpoints = ((ordered[1:].astype(np.float64) + ordered[:-1]) / 2).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519.99, 65520, 1e6, -1e6,
                        2.0**-24, 2.0**-25, 2.0**-25 * 1.0000001, 2.0**-26, 5.96e-8, 6.1e-5,
                        1e-40], np.float32)
    values = np.concatenate([finite, up, down, midpoints, np.nextafter(midpoints, np.inf),
                             rng.standard_normal(200_000).astype(np.float32) * 1e3, special])
    with_nan = np.concatenate([values, np.array([np.nan, -np.nan], np.float32),
                               np.array([0x7F800001, 0xFFC00000], np.uint32).view(np.float32)])
    bits = np.zeros(with_nan.size, np.uint16)
    widened = np.zeros(65536, np.float32)
    assert _run(lib, "half", with_nan, with_nan.size, bits, halves, widened) == 0
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(bits[:values.size], expected)
    np.testing.assert_array_equal(bits[values.size:], 0x7FFF)  # CUDA's canonical NaN
    np.testing.assert_array_equal(widened.view(np.uint32),
                                  halves.view(np.float16).astype(np.float32).view(np.uint32))


# ---- launches and the runtime API -------------------------------------------------------


@pytest.mark.parametrize("which, error", [(0, 9), (1, 9), (2, 9), (3, 9), (4, 1), (5, 0)])
def test_a_bad_configuration_is_not_run_and_is_the_last_error(lib, which, error):
    """Block of 1025 threads, empty grid, grid.y of 65536, block.z of 65:
    cudaErrorInvalidConfiguration (9); 64 KB of dynamic shared memory:
    cudaErrorInvalidValue (1); a good launch runs (last case)."""
    flag = np.zeros(1, np.int32)
    assert _run(lib, "bad_launch", which, flag) == 1000 * error + (error == 0)


def test_a_large_grid_stride_launch_is_quick(lib):
    """65535 blocks of 256 threads over 4M elements: one wake-up per host
    thread, not per block."""
    n = 1 << 22
    values = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    out = np.zeros(n, np.float32)
    started = time.perf_counter()
    assert _run(lib, "scale", values, n, out, 65535, 256) == 0
    seconds = time.perf_counter() - started
    np.testing.assert_array_equal(out, values * 2)
    assert seconds < 20, "%.1f s" % seconds


def test_runtime_api(lib):
    out = np.full(32, -7, np.int32)
    count = _run(lib, "runtime_api", out)
    assert count == 16
    sms, warp, devices, occupancy, malloc, alignment, copied, free, free_again, last, cleared, \
        event, bad_kind, host_function, stream, message = out[:16]
    assert (sms, warp, devices, occupancy) == (132, 32, 1, 8)
    assert malloc == 0 and alignment == 0 and copied == 1 and free == 0
    assert free_again == 1 and last == 1 and cleared == 0  # cudaErrorInvalidValue, then cleared
    assert event == 1 and bad_kind == 21 and host_function == 1 and stream == 0
    assert message == 0 and out[16] == -7


# ---- the sanitizer builds ------------------------------------------------------------------


def _skip_without(sanitize):
    from gpu_check.emulation import sanitize as sanitizing

    reason = sanitizing.unavailable(sanitize)
    if reason:
        pytest.skip(reason)


def _run_sanitized(sanitize, call):
    """Runs `call` (Python using `lib`) against the sanitized self-test
    library in a fresh interpreter with the sanitizer's runtime preloaded."""
    from gpu_check.emulation import sanitize as sanitizing

    library = _library_path(sanitize)
    script = textwrap.dedent("""\
        import ctypes, sys
        import numpy as np
        lib = ctypes.CDLL(sys.argv[1])
        P, INT = ctypes.c_void_p, ctypes.c_int
        """) + textwrap.dedent(call)
    env = dict(os.environ)
    env.update(sanitizing.environment(sanitize))
    return subprocess.run(sanitizing.command_prefix(sanitize) + [
        sanitizing.python_executable(), "-c", script, str(library)],
        capture_output=True, text=True, env=env, timeout=300)


def test_ubsan_build_stops_at_a_misaligned_load():
    _skip_without("undefined")
    result = _run_sanitized("undefined", """\
        data = np.zeros(16, np.uint8)
        out = np.zeros(1, np.float32)
        lib.cuda_emulation_test_misaligned.argtypes = [P, P]
        lib.cuda_emulation_test_misaligned(data.ctypes.data, out.ctypes.data)
        print("not stopped")
        """)
    assert result.returncode != 0 and "not stopped" not in result.stdout
    assert "cuda_emulation_selftest.cu.cc" in result.stderr
    assert "runtime error: load of misaligned address" in result.stderr


def test_thread_sanitizer_sees_a_race_between_cuda_threads_and_none_in_correct_kernels():
    _skip_without("thread")
    result = _run_sanitized("thread", """\
        counter = np.zeros(1, np.int32)
        lib.cuda_emulation_test_race.argtypes = [P, INT]
        lib.cuda_emulation_test_race(counter.ctypes.data, 64)
        sys.stderr.write("---- correct kernels ----\\n")
        sys.stderr.flush()
        values = np.arange(16 * 128, dtype=np.int32)
        out = np.zeros_like(values)
        lib.cuda_emulation_test_reverse.argtypes = [P, P, INT]
        lib.cuda_emulation_test_reverse(values.ctypes.data, out.ctypes.data, 16)
        mismatches = np.zeros(1, np.int32)
        lib.cuda_emulation_test_shared_per_block.argtypes = [INT, INT, P]
        lib.cuda_emulation_test_shared_per_block(32, 5, mismatches.ctypes.data)
        sums = np.zeros(4, np.int32)
        lib.cuda_emulation_test_early_exit.argtypes = [INT, INT, P]
        lib.cuda_emulation_test_early_exit(4, 50, sums.ctypes.data)
        warp = np.zeros(64 * 8, np.int32)
        lib.cuda_emulation_test_warp.argtypes = [P]
        lib.cuda_emulation_test_warp(warp.ctypes.data)
        assert (out == values.reshape(16, 128)[:, ::-1].ravel()).all() and mismatches[0] == 0
        print("ran")
        """)
    assert "ran" in result.stdout, result.stderr[-3000:]
    racy, _, correct = result.stderr.partition("---- correct kernels ----")
    assert "WARNING: ThreadSanitizer: data race" in racy
    assert "RacyKernel" in racy and "cuda_emulation_selftest.cu.cc" in racy
    assert "WARNING: ThreadSanitizer" not in correct, correct[:3000]
