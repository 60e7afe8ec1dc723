"""The Makefile's TensorFlow versions: which ones build Horovod with the patch (docs/stack.md).

Runs ``make -n`` (prints the recipes, runs nothing) against a venv path that does not exist,
so every step of ``make setup`` is printed.
"""

import hashlib
import os
import re
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATCH = os.path.join(REPO, "patches", "horovod-0.28.1-tf2.19.patch")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")

# What a surrounding make (``make test TF_VERSION=2.15``) passes down to its commands: a
# sub-make would take the caller's choices as its own.
_INHERITED = ("MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "MAKELEVEL",
              "TF_VERSION", "KERAS", "VENV", "TF_USE_LEGACY_KERAS")


def _make_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED}
    env["HOME"] = str(tmp_path)
    return env


def _dry_run(tmp_path, *args):
    result = subprocess.run(
        ["make", "-n", "-C", REPO, "setup", "VENV=%s" % (tmp_path / "venv")] + list(args),
        capture_output=True, text=True, check=True,
        env=_make_env(tmp_path))
    return result.stdout + result.stderr


def _patch_tag():
    with open(PATCH, "rb") as f:
        return "-patch-" + hashlib.sha256(f.read()).hexdigest()[:12]


@pytest.mark.parametrize("version,release", [
    ("2.15", "2.15.1"), ("2.16", "2.16.2"), ("2.17", "2.17.1"), ("2.18", "2.18.1")])
def test_up_to_2_18_horovod_builds_unpatched(tmp_path, version, release):
    out = _dry_run(tmp_path, "TF_VERSION=" + version)
    assert '"tensorflow-cpu==%s"' % release in out
    assert "patch -d" not in out and "-patch-" not in out
    assert "/.cache/tf_mergecomp/horovod-0.28.1-tensorflow-cpu-%s/" % release in out
    assert "outside the supported" not in out


@pytest.mark.parametrize("version,release", [
    ("2.19", "2.19.1"), ("2.20", "2.20.0"), ("2.21", "2.21.0"), ("2.21.0", "2.21.0")])
def test_from_2_19_horovod_builds_with_the_patch(tmp_path, version, release):
    out = _dry_run(tmp_path, "TF_VERSION=" + version)
    assert '"tensorflow-cpu==%s"' % release in out
    assert '"tf-keras~=%s.0"' % ".".join(release.split(".")[:2]) in out
    assert 'patch -d "$src/horovod-0.28.1" -p1 --forward < "%s"' % PATCH in out
    # The patched wheel is cached apart from an unpatched one, under the patch's hash.
    assert "/.cache/tf_mergecomp/horovod-0.28.1-tensorflow-cpu-%s%s/" % (release, _patch_tag()) in out
    assert "outside the supported" not in out


def test_an_empty_horovod_patch_builds_unpatched(tmp_path):
    out = _dry_run(tmp_path, "TF_VERSION=2.21", "HOROVOD_PATCH=")
    assert "patch -d" not in out
    assert "/.cache/tf_mergecomp/horovod-0.28.1-tensorflow-cpu-2.21.0/" in out


def test_the_patch_changes_only_horovods_tensorflow_cmake_file():
    with open(PATCH) as f:
        text = f.read()
    assert re.findall(r"^\+\+\+ (\S+)", text, re.M) == ["b/horovod/tensorflow/CMakeLists.txt"]
    removed = re.findall(r"^-(?!--)(.*)$", text, re.M)
    assert removed == ['list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")']
    added = re.findall(r"^\+(?!\+\+)(.*)$", text, re.M)
    assert added and all(line.startswith("#") for line in added)  # comments only


def test_ci_runs_the_default_stack_and_keras_2_alone():
    with open(os.path.join(REPO, "Makefile")) as f:
        makefile = f.read()
    supported = re.search(r"^SUPPORTED_TF_MINOR_VERSIONS := (.*)$", makefile, re.M).group(1).split()
    default = re.search(r"^DEFAULT_TF_VERSION := (\S+)$", makefile, re.M).group(1)
    assert default.rsplit(".", 1)[0] == supported[-1]  # the default is the newest
    with open(os.path.join(REPO, ".ci", "run")) as f:
        ci = re.findall(r"^make test(?: TF_VERSION=(\S+))?$", f.read(), re.M)
    assert ci == ["", "2.15"]


def _train_dry_run(tmp_path, *args):
    return subprocess.run(
        ["make", "-n", "-C", REPO, "train", "VENV=%s" % (tmp_path / "venv")] + list(args),
        capture_output=True, text=True, env=_make_env(tmp_path))


def test_the_main_job_runs_keras_3_by_default_and_keras_2_on_request(tmp_path):
    keras3 = _train_dry_run(tmp_path)
    assert keras3.returncode == 0, keras3.stderr
    assert "env -u TF_USE_LEGACY_KERAS" in keras3.stdout
    assert "examples/train_digits_keras3.py" in keras3.stdout
    for args in (["KERAS=2"], ["TF_VERSION=2.15"]):
        keras2 = _train_dry_run(tmp_path, *args)
        assert keras2.returncode == 0, keras2.stderr
        assert "examples/train_digits.py" in keras2.stdout
        assert "train_digits_keras3" not in keras2.stdout


@pytest.mark.parametrize("args,message", [
    (["KERAS=4"], "choose KERAS=3"),
    (["KERAS=3", "TF_VERSION=2.15"], "KERAS=3 needs TensorFlow >= 2.16")])
def test_a_keras_choice_that_cannot_work_is_refused(tmp_path, args, message):
    result = _train_dry_run(tmp_path, *args)
    assert result.returncode != 0 and message in result.stderr
