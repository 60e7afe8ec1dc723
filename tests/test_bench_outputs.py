"""The benchmark commands check where they write before any work, without TensorFlow,
and their help needs no TensorFlow."""

import os
import subprocess
import sys
import time

import pytest

from benchmarks import outputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Runs main(argv) in a fresh interpreter; prints its status and whether TensorFlow was imported.
_MAIN = ("import sys, json\nfrom benchmarks.__main__ import main\n"
         "try:\n    code = main(json.loads(sys.argv[1]))\nexcept SystemExit as e:\n    code = e.code\n"
         "print('status', code, 'tensorflow' in sys.modules)")


def _main(module, argv):
    import json

    env = dict(os.environ, PYTHONPATH=ROOT)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _MAIN.replace("benchmarks.__main__", module),
                           json.dumps(argv)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    return done, time.perf_counter() - started


@pytest.mark.parametrize("module", ["benchmarks.__main__", "benchmarks.launcher"])
def test_help_imports_no_tensorflow(module):
    done, _ = _main(module, ["--help"])
    assert "usage: python -m benchmarks" in done.stdout
    assert done.stdout.strip().endswith("status 0 False"), done.stdout + done.stderr


@pytest.mark.parametrize("command", ["ops", "cluster"])
def test_a_commands_help_prints_no_tensorflow_start_up_lines(command):
    # A command's options name the codecs (imported with TensorFlow): its start-up lines,
    # which TF_CPP_MIN_LOG_LEVEL does not reach, are kept out of the help.
    done, _ = _main("benchmarks.__main__", [command, "--help"])
    assert "usage: python -m benchmarks %s" % command in done.stdout
    assert done.stdout.strip().endswith("status 0 True"), done.stdout + done.stderr
    for start_up_line in ("oneDNN", "To enable the following instructions",
                          "Could not find cuda drivers", "absl::InitializeLog"):
        assert start_up_line not in done.stderr, done.stderr


@pytest.mark.parametrize("command", [["profile", "--model", "resnet50"], ["cluster"],
                                     ["simulate", "--profile", "p.json"], ["parity"],
                                     ["restart"], ["exchange"]])
def test_an_impossible_out_fails_at_once_naming_it(tmp_path, command):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    out = str(blocker / "results")
    done, seconds = _main("benchmarks.__main__", command + ["--out", out])
    assert done.stdout.strip().endswith("status 2 False"), done.stdout + done.stderr
    assert out in done.stderr
    assert seconds < 20  # in practice well under 2 s: no TensorFlow is imported


def test_folder_check_creates_and_rejects(tmp_path):
    assert outputs.check_folder(str(tmp_path / "new" / "dir")) == str(tmp_path / "new" / "dir")
    assert (tmp_path / "new" / "dir").is_dir()
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        outputs.check_folder(str(tmp_path / "f"))


def test_file_check_derives_a_name_in_a_folder(tmp_path):
    assert outputs.check_file(str(tmp_path), "profile_x.json") == str(tmp_path / "profile_x.json")
    assert outputs.check_file(str(tmp_path / "sub") + os.sep, "p.json") == str(tmp_path / "sub" / "p.json")
    assert outputs.check_file(str(tmp_path / "given.json"), "p.json") == str(tmp_path / "given.json")
    with pytest.raises(ValueError, match="a_file"):
        (tmp_path / "a_file").write_text("")
        outputs.check_file(str(tmp_path / "a_file" / "x.json"), "p.json")


def test_profile_out_folder_becomes_its_file(tmp_path):
    from benchmarks.__main__ import _check_out

    path = _check_out(["profile", "--model", "pkg.mod:fn", "--out", str(tmp_path)], "profile")
    assert path == str(tmp_path / "profile_pkg_mod_fn.json")
