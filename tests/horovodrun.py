"""Runs a script under ``horovodrun --gloo`` on this machine, for multi-worker tests.

Every rank's output is captured; a rank that fails, or a run that exceeds its
timeout, fails the test with all the output. Ranks print result lines as
``RESULT <json>``, which ``run()`` returns per rank.
"""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"
_RANK_LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")


def horovodrun_path():
    candidate = Path(sys.executable).with_name("horovodrun")
    return str(candidate) if candidate.exists() else "horovodrun"


def run(script, np=2, args=(), timeout=240, expect_failure=False, env=None, elastic=None,
        hosts=None):
    """Runs ``script`` on ``np`` ranks; returns {rank: [result dicts]}, output.

    ``script`` is a file in tests/workers/, or a path relative to the repository.
    ``elastic``: (min_np, max_np, host discovery script) runs an elastic job on
    localhost (over the loopback interface: elastic Gloo jobs hang here
    without ``--network-interface lo``); results are then collected for ranks
    up to max_np.
    ``hosts``: horovodrun's ``-H``; "localhost:2,127.0.0.1:2" makes two machines of two
    ranks on this one (Horovod then reports local size 2 and cross size 2).
    """
    path = WORKERS / script if "/" not in str(script) else REPO / script
    launcher = [horovodrun_path(), "-np", str(np)]
    if hosts is not None:
        launcher += ["-H", hosts]
    if elastic is None:
        launcher.append("--gloo")
    else:
        min_np, max_np, discovery = elastic
        launcher += ["--min-np", str(min_np), "--max-np", str(max_np),
                     "--host-discovery-script", str(discovery), "--network-interface", "lo"]
        np = max_np
    command = launcher + [sys.executable, str(path)] + [str(a) for a in args]
    full_env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2",
                    PYTHONUNBUFFERED="1")
    if importlib.util.find_spec("tf_keras") is not None:  # TensorFlow >= 2.16: Keras 2
        full_env.setdefault("TF_USE_LEGACY_KERAS", "1")
    for key, value in (env or {}).items():  # None: leave the variable out
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    # Its own process group: on a timeout the ranks (horovodrun's children,
    # and an elastic job's later ones) end with it instead of running on.
    process = subprocess.Popen(command, cwd=REPO, env=full_env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail("horovodrun %s timed out after %ss:\n%s"
                    % (script, timeout, (stdout + stderr)[-8000:]))
    done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    output = done.stdout + done.stderr
    if expect_failure:
        if done.returncode == 0:
            pytest.fail("horovodrun %s was expected to fail but exited 0:\n%s" % (script, output[-8000:]))
    elif done.returncode != 0:
        pytest.fail("horovodrun %s exited %d:\n%s" % (script, done.returncode, output[-12000:]))
    results = {rank: [] for rank in range(np)}
    for line in output.splitlines():
        match = _RANK_LINE.match(line)
        if match and match.group(3).startswith("RESULT "):
            results[int(match.group(1))].append(json.loads(match.group(3)[len("RESULT "):]))
    return results, output


def report(**values):
    """Called in a worker: prints one result line for the test to read."""
    print("RESULT " + json.dumps(values), flush=True)
