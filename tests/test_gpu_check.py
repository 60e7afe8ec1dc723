"""The host side of `make gpu-check`, without a GPU: the benchmark's plan,
argument checking and JSON output run with neither CuPy nor TensorFlow, and
the Makefile target needs no venv."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_check import bench

ROOT = Path(__file__).resolve().parent.parent


def test_shapes_are_resnet50_and_bert_base():
    shapes = bench.load_shapes()
    counts = {name: sum(math.prod(s) for s in v) for name, v in shapes.items()}
    assert len(shapes["resnet50"]) == 214 and counts["resnet50"] == 25_583_592
    assert len(shapes["bert_base"]) == 199 and counts["bert_base"] == 109_482_240


def test_codec_params_follow_the_library_defaults():
    sizes = [1000, 1, 0, 300]
    assert bench.codec_params("topk", sizes)[1]["k"] == 14  # ceil(0.01 * 1301)
    dgc = bench.codec_params("dgc", sizes)[1]
    assert dgc["memory"] == "dgc" and dgc["sample_size"] == 1024 and dgc["decay"] == 0.9
    assert bench.codec_params("randomk", sizes)[1]["tensor_k"] == [10, 1, 0, 3]
    name, signum = bench.codec_params("signum", sizes)
    assert name == "signsgd" and signum["memory"] == "momentum"
    assert bench.codec_params("fp16", sizes)[1]["marker_bytes"] == 2


def test_dry_run_writes_the_plan_without_cupy_or_tensorflow(tmp_path):
    code = ("import sys; from gpu_check import bench; "
            "rc = bench.main(['--dry-run', '--codecs', 'efsignsgd,randomk', '--out', sys.argv[1]]); "
            "assert 'tensorflow' not in sys.modules and 'cupy' not in sys.modules; sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "gpu_codecs.json").read_text())
    assert report["dry_run"] and len(report["plan"]) == 4
    entry = next(e for e in report["plan"] if e["model"] == "bert_base" and e["codec"] == "randomk")
    assert entry["tensors"] == 199 and entry["bytes"] == 4 * 109_482_240
    assert entry["params"]["total_k"] > 0
    assert (tmp_path / "gpu_codecs.md").exists()


def test_out_defaults_to_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert bench.main(["--dry-run", "--models", "resnet50", "--codecs", "fp16"]) == 0
    assert json.loads((tmp_path / "gpu_codecs.json").read_text())["plan"][0]["codec"] == "fp16"


@pytest.mark.parametrize("argv, message", [
    (["--codecs", "zip"], "valid choices: none, fp16"),
    (["--models", "vgg"], "valid choices: bert_base, resnet50"),
    (["--repeats", "0"], "--repeats must be >= 1"),
])
def test_bad_arguments_name_the_valid_choices(capsys, argv, message):
    with pytest.raises(SystemExit):
        bench.main(argv + ["--dry-run"])
    assert message in capsys.readouterr().err


def test_gpu_check_target_needs_no_venv():
    result = subprocess.run(["make", "-n", "gpu-check", "GPU_PYTHON=python3"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, OUT="/tmp/gpu-out"))
    assert result.returncode == 0, result.stderr
    commands = result.stdout
    assert "python3 -m gpu_check.launchers" in commands
    assert "tests/test_cuda_launchers.py" in commands and "gpu_check.bench --out /tmp/gpu-out" in commands
    assert ".venv" not in commands and "pip" not in commands


def test_emulation_targets_need_no_venv_and_stay_out_of_make_test():
    result = subprocess.run(["make", "-n", "gpu-emulate", "gpu-emulate-sanitize",
                             "GPU_PYTHON=python3"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    commands = result.stdout
    assert "MERGECOMP_LAUNCHER_BACKEND=emulated" in commands
    assert "tests/test_cuda_launchers.py" in commands
    assert "tests/test_cuda_emulation.py" in commands
    assert "python3 -m gpu_check.emulation.sanitize" in commands
    assert ".venv" not in commands and "pip" not in commands
    test = subprocess.run(["make", "-n", "test", "VENV=/nonexistent"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60).stdout
    assert "sanitize" not in test


def _registry_report(gpu_for):
    """A kernel-registry report (gpu_check.tf_build.check's form) where the ops
    in gpu_for have GPU kernels for every declared dtype."""
    from gpu_check import tf_build

    floats = ["bfloat16", "float16", "float32", "float64"]
    ops = {}
    for name in tf_build.GPU_OPS:
        declared = ["float32"] if name == "MergecompPowersgdGroupQ" else floats
        gpu = name in gpu_for
        ops[name] = {"declared": declared, "gpu": declared if gpu else [],
                     "devices": ["CPU", "GPU"] if gpu else ["CPU"], "host_memory": []}
    return {"tensorflow": "2.15.1", "is_cuda_build": True, "cuda_version": "12.2", "ops": ops}


def test_gpu_build_summary_needs_a_gpu_kernel_for_every_group_op():
    from gpu_check import tf_build

    assert set(tf_build.GPU_OPS) == {
        "MergecompGroupEncode", "MergecompGroupDecode", "MergecompPowersgdGroupP",
        "MergecompPowersgdGroupQ", "MergecompPowersgdGroupFinish"}
    library = ROOT / "build" / "gpu-ops" / "lib.so"
    ok, line = tf_build.summarise(_registry_report(tf_build.GPU_OPS), library, 12.0)
    assert ok and line.startswith("gpu-build: OK: ") and "; CPU only: none;" in line
    assert "MergecompPowersgdGroupQ[float32]" in line
    ok, line = tf_build.summarise(_registry_report(["MergecompGroupEncode"]), library, 12.0)
    assert not ok and line.startswith("gpu-build: FAILED: ")
    assert ("CPU only: MergecompGroupDecode,MergecompPowersgdGroupP,MergecompPowersgdGroupQ,"
            "MergecompPowersgdGroupFinish;") in line
    assert "MergecompPowersgdGroupQ has no GPU kernel for float32" in line
