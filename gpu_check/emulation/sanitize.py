"""The emulated launcher checks under UBSan and ThreadSanitizer
(``make gpu-emulate-sanitize``; docs/gpu.md, "The CUDA emulation").

For each sanitizer: builds the launchers with it (build.py: UBSan with
``-fsanitize=alignment,undefined -fno-sanitize-recover=all``, or
``-fsanitize=thread``), then runs tests/test_cuda_launchers.py on the emulated
backend in a fresh Python with the sanitizer's runtime preloaded (LD_PRELOAD of
g++'s libubsan / libtsan; ThreadSanitizer under ``setarch -R``, since it needs
its fixed memory layout). UBSan stops the process at its first report: the
test that was running is recorded with the report and the tests not yet run
are run again in a fresh process, until a run gets through.
ThreadSanitizer reports and carries on; it reports each source location once
per process, under the first test that reached it. What
each found is printed per test, with the reports' first lines; the full logs
stay in build/gpu_check_emulated/sanitize/. Exit status 1 when a sanitizer
reported anything or a test failed.

    python3 -m gpu_check.emulation.sanitize [undefined] [thread] [-- pytest args]
"""

import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from gpu_check.emulation import build
from gpu_check.emulation.pytest_progress import FAILED, FINISHED, PROGRESS

ROOT = build.ROOT
LOGS = build.BUILD / "sanitize"
TESTS = "tests/test_cuda_launchers.py"
RUNTIMES = {"undefined": "libubsan.so", "thread": "libtsan.so"}
NAMES = {"undefined": "UBSan", "thread": "ThreadSanitizer"}
MAX_RUNS = 40  # UBSan: one run per finding, and one that gets through


def runtime_library(sanitize):
    """The sanitizer runtime g++ links (to preload into Python)."""
    cxx = build.find_cxx()
    if cxx is None:
        raise RuntimeError("g++ not found")
    path = subprocess.run([cxx, "-print-file-name=" + RUNTIMES[sanitize]], capture_output=True,
                          text=True, check=True, env=build.tool_environment()).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        raise RuntimeError("g++ has no %s (install its sanitizer runtime)" % RUNTIMES[sanitize])
    return os.path.realpath(path)


def unavailable(sanitize):
    """Why the `sanitize` build cannot run here, or None."""
    try:
        runtime_library(sanitize)
    except (RuntimeError, subprocess.CalledProcessError, OSError) as error:
        return str(error)
    return None


def environment(sanitize):
    """Environment variables for a Python process that loads the `sanitize`
    build of an emulated library."""
    variables = {"LD_PRELOAD": runtime_library(sanitize), "PYTHONUNBUFFERED": "1"}
    if sanitize == "undefined":
        variables["UBSAN_OPTIONS"] = "print_stacktrace=1"
    else:
        # history_size: the other access's stack is found in longer runs;
        # ignore_noninstrumented_modules: Python and numpy are not built with TSan.
        variables["TSAN_OPTIONS"] = ("halt_on_error=0 history_size=7 "
                                     "ignore_noninstrumented_modules=1")
    return variables


def command_prefix(sanitize):
    """ThreadSanitizer maps its shadow memory at fixed addresses: run without
    address-space randomisation where setarch can turn it off."""
    if sanitize == "thread" and shutil.which("setarch"):
        return ["setarch", platform.machine(), "-R"]
    return []


def python_executable():
    """The interpreter binary itself: a preloaded sanitizer runtime in a
    launcher script (pyenv's shims are bash) breaks before Python starts."""
    return os.path.realpath(sys.executable)


def _split_by_test(log):
    """[(test node id or None, text)] of a log written with -s and the
    progress plugin (pytest_progress.py)."""
    sections, current, lines = [], None, []
    for line in log.splitlines(keepends=True):
        if line.startswith(PROGRESS):
            sections.append((current, "".join(lines)))
            current, lines = line[len(PROGRESS):].strip(), []
        elif not line.startswith((FINISHED, FAILED)):
            lines.append(line)
    sections.append((current, "".join(lines)))
    return sections


def _marked(log, marker):
    return [line[len(marker):].strip() for line in log.splitlines() if line.startswith(marker)]


_UBSAN_REPORT = re.compile(r"^(\S+:\d+:\d+: runtime error: .*)$", re.M)
_TSAN_REPORT = re.compile(r"^WARNING: ThreadSanitizer: (.*)$", re.M)
_TSAN_SUMMARY = re.compile(r"^SUMMARY: ThreadSanitizer: (.*)$", re.M)


def _tidy(report):
    """A report line without addresses and with paths from the repository root."""
    report = re.sub(r"0x[0-9a-f]+", "0x...", report)
    return report.replace(str(ROOT) + os.sep, "")


def findings(log):
    """[(test, one-line report)] of a sanitized run's log."""
    found = []
    for test, text in _split_by_test(log):
        for match in _UBSAN_REPORT.finditer(text):
            found.append((test, "UBSan: " + _tidy(match.group(1))))
        for match in _TSAN_SUMMARY.finditer(text):
            found.append((test, "TSan: " + _tidy(match.group(1))))
        if not _TSAN_SUMMARY.search(text):
            for match in _TSAN_REPORT.finditer(text):
                found.append((test, "TSan: " + _tidy(match.group(1))))
    return found


def run_tests(sanitize, pytest_args=(), log_dir=LOGS):
    """Runs the launcher tests under `sanitize`; returns (findings, failed
    tests, tests run, runs, seconds)."""
    started = time.time()
    build.build(sanitize=sanitize, verbose=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    for old in log_dir.glob("%s-*.log" % sanitize):  # an earlier run's logs
        old.unlink()
    env = dict(os.environ)
    env.update(environment(sanitize))
    env.update({"MERGECOMP_LAUNCHER_BACKEND": "emulated",
                "MERGECOMP_EMULATION_SANITIZE": sanitize})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    found, failed, done = [], [], []
    for run in range(1, MAX_RUNS + 1):
        log_path = log_dir / ("%s-%d.log" % (sanitize, run))
        command = command_prefix(sanitize) + [
            python_executable(), "-m", "pytest", TESTS, "-q", "-s", "-p", "no:cacheprovider",
            "-p", "gpu_check.emulation.pytest_progress"] + [
            "--deselect=" + test for test in done] + list(pytest_args)
        with open(log_path, "w") as log_file:
            result = subprocess.run(command, cwd=ROOT, env=env, stdout=log_file,
                                    stderr=subprocess.STDOUT)
        log = log_path.read_text(errors="replace")
        new = findings(log)
        found += new
        failed += _marked(log, FAILED)
        finished = _marked(log, FINISHED)
        started_tests = _marked(log, PROGRESS)
        crashed = result.returncode < 0 or not re.search(r"\d+ (passed|failed|skipped)", log)
        print("%s run %d: exit status %d, %d test(s) run, %d report(s), log %s" % (
            NAMES[sanitize], run, result.returncode, len(finished), len(new),
            log_path.relative_to(ROOT) if ROOT in log_path.parents else log_path), flush=True)
        done += finished
        if not crashed:
            break
        unfinished = [t for t in started_tests if t not in finished]
        if not unfinished:
            found.append((None, "the test process died outside a test (exit status %d)"
                          % result.returncode))
            break
        if not new:
            found.append((unfinished[-1], "the test process died (exit status %d)"
                          % result.returncode))
        done.append(unfinished[-1])  # not run again
    return found, failed, len(done), run, time.time() - started


def summarize(sanitize, found, failed, tests, runs, seconds):
    lines = ["%s: %d report(s), %d failed test(s); %d tests in %d run(s), %.0f s" % (
        NAMES[sanitize], len(found), len(failed), tests, runs, seconds)]
    seen = set()
    for test, report in found:
        key = (test, report)
        if key in seen:
            continue
        seen.add(key)
        lines.append("  %s: %s" % (test or "(outside a test)", report))
    for test in failed:
        lines.append("  FAILED %s" % test)
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    names, pytest_args = argv[:split], argv[split + 1:]
    if any(name not in RUNTIMES for name in names):
        print("usage: python3 -m gpu_check.emulation.sanitize [undefined] [thread] "
              "[-- pytest arguments]", file=sys.stderr)
        return 2
    status, summaries = 0, []
    for sanitize in names or ["undefined", "thread"]:
        found, failed, tests, runs, seconds = run_tests(sanitize, pytest_args)
        summaries.append(summarize(sanitize, found, failed, tests, runs, seconds))
        status |= bool(found or failed)
    print("\n".join(summaries))
    return status


if __name__ == "__main__":
    sys.exit(main())
