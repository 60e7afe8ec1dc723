"""The host side of `make gpu-check`, without a GPU: the benchmark's plan,
argument checking and JSON output run with neither CuPy nor TensorFlow, and
the Makefile target needs no venv; the report's PyTorch columns, and the
PyTorch formulations on CPU tensors where torch is importable."""

import inspect
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
            "assert not {'tensorflow', 'cupy', 'torch'} & set(sys.modules); sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "gpu_codecs.json").read_text())
    assert report["dry_run"] and len(report["plan"]) == 4
    entry = next(e for e in report["plan"] if e["model"] == "bert_base" and e["codec"] == "randomk")
    assert entry["tensors"] == 199 and entry["bytes"] == 4 * 109_482_240
    assert entry["params"]["total_k"] > 0
    assert report["torch"] == {"requested": True, "only": ["powersgd"], "formulations": {
        "efsignsgd": "torch_efsignsgd", "randomk": "torch_randomk"}}
    assert (tmp_path / "gpu_codecs.md").exists()


def test_no_torch_dry_run_plans_no_pytorch(tmp_path):
    assert bench.main(["--dry-run", "--no-torch", "--models", "resnet50", "--codecs", "topk",
                       "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_codecs.json").read_text())
    assert report["torch"] == {"requested": False, "formulations": {}, "only": []}


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


def test_every_codec_has_a_pytorch_formulation():
    assert list(bench.TORCH_CODECS) == list(bench.CODECS)
    for codec, formulation in bench.TORCH_CODECS.items():
        assert callable(formulation) and formulation.__name__ == "torch_" + codec
        assert formulation.__doc__ and formulation.__doc__.startswith(codec + ":")
    # PowerSGD has no launcher row in the bench: PyTorch alone times its products
    assert list(bench.TORCH_ONLY) == ["powersgd"] and "powersgd" not in bench.CODECS


def _report(torch_timed):
    """A run's report (run()'s form) for ResNet50's topk, with or without PyTorch."""
    rows = []
    for mode, ms in (("group", 2.5), ("layerwise", 60.0)):
        row = {"model": "resnet50", "codec": "topk", "mode": mode, "tensors": 214,
               "elements": 25_583_592, "bytes": 102_334_368, "ms": ms, "min_ms": ms * 0.9,
               "max_ms": ms * 1.1, "encode_ms": ms / 2, "gbps": 102_334_368 / ms / 1e6,
               "x_copy": 102_334_368 / ms / 1e6 / 1800.0}
        if torch_timed:
            row.update(torch_ms=0.842, x_torch=0.842 / ms)
        rows.append(row)
    torch = ({"requested": True, "version": "2.11.0", "reason": None, "results": [
        {"model": "resnet50", "codec": "topk", "formulation": "torch_topk", "ms": 0.842},
        {"model": "resnet50", "codec": "powersgd", "formulation": "torch_powersgd",
         "what": "rank 4 products of the matrices", "ms": 3.2, "min_ms": 3.1, "max_ms": 3.4,
         "gbps": 32.0, "x_copy": 0.018},
        {"model": "resnet50", "codec": "dgc", "formulation": "torch_dgc",
         "error": "RuntimeError: out of memory"}]} if torch_timed else
        {"requested": True, "version": None, "reason": "PyTorch is not installed (No module "
         "named 'torch')", "results": []})
    return {"device": "NVIDIA H200", "ratio": 0.01, "repeats": 10, "warmup": 2, "rows": 1,
            "plan": [], "copy": {"resnet50": {"before_gbps": 1800.0, "after_gbps": 1790.0,
                                              "bytes": 102_334_368}},
            "results": rows, "speedups": [], "torch": torch}


def test_the_report_carries_the_pytorch_columns_where_timed(tmp_path):
    report = _report(torch_timed=True)
    bench.write_report(report, tmp_path)
    written = json.loads((tmp_path / "gpu_codecs.json").read_text())
    group = written["results"][0]
    assert group["torch_ms"] == 0.842 and group["x_torch"] == pytest.approx(0.3368)
    text = (tmp_path / "gpu_codecs.md").read_text()
    assert ("| model | codec | mode | ms (median) | min-max ms | GB/s | x copy | torch ms | "
            "x torch |") in text and "|---|---|---|---|---|---|---|---|---|" in text
    assert "| resnet50 | topk | group | 2.500 | 2.250-2.750 | 40.9 | 0.023 | 0.842 | 0.34 |" in text
    assert "| resnet50 | topk | layerwise | 60.000 |" in text and "| 0.842 | 0.01 |" in text
    assert "PyTorch 2.11.0: each codec's formulation" in text
    assert ("- resnet50 powersgd (PyTorch only: rank 4 products of the matrices): 3.200 ms "
            "(3.100-3.400), 32.0 GB/s, 0.018x copy") in text
    assert "- resnet50 dgc: the PyTorch formulation failed: RuntimeError: out of memory" in text
    line = bench.result_line(report["results"][0])
    assert line.endswith(" 0.023x copy   0.34x torch") and line.startswith("resnet50  topk ")
    assert bench.torch_result_line(report["torch"]["results"][1]).startswith(
        "resnet50  powersgd  torch        3.200 ms")
    assert "failed: RuntimeError" in bench.torch_result_line(report["torch"]["results"][2])


def test_the_report_omits_the_pytorch_columns_without_pytorch(tmp_path):
    report = _report(torch_timed=False)
    bench.write_report(report, tmp_path)
    assert "torch_ms" not in json.loads((tmp_path / "gpu_codecs.json").read_text())["results"][0]
    text = (tmp_path / "gpu_codecs.md").read_text()
    assert "torch ms" not in text and "x torch" not in text
    assert "| model | codec | mode | ms (median) | min-max ms | GB/s | x copy |\n|---|" in text
    assert "| resnet50 | topk | group | 2.500 | 2.250-2.750 | 40.9 | 0.023 |\n" in text
    assert [line for line in text.splitlines() if "PyTorch" in line] == [
        "PyTorch: not timed (PyTorch is not installed (No module named 'torch'))"]
    assert bench.result_line(report["results"][0]).endswith(" 0.023x copy")


def test_pytorch_is_skipped_when_missing_or_not_asked_for(monkeypatch):
    assert bench.torch_for_cuda(False) == (None, "--no-torch")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    torch, why_not = bench.torch_for_cuda(True)
    assert torch is None and why_not.startswith("PyTorch is not installed")


def _buffers(step):
    return inspect.getclosurevars(step).nonlocals


def test_pytorch_formulations_on_the_cpu():
    """Each formulation's step on CPU tensors (a length that is not a multiple
    of 8: packing pads), twice, against the codec's definition."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    sizes = [1000, 1, 0, 300]
    n = sum(sizes)
    g = torch.randn(n)
    for codec, formulation in bench.TORCH_CODECS.items():
        params = bench.codec_params(codec, sizes)[1]
        step = formulation(torch, g, params)
        step()
        step()
        buffers = _buffers(step)
        out = buffers["out"]
        assert out.dtype == torch.float32 and out.shape == g.shape, codec
        assert bool(torch.isfinite(out).all()), codec
        if codec == "none":
            assert torch.equal(out, g)
        elif codec == "fp16":
            assert torch.equal(out, g.half().float())
        elif codec == "signsgd":
            assert torch.equal(out, torch.where(g >= 0, 1.0, -1.0))
        elif codec == "signum":
            m = 0.9 * (0.1 * g) + 0.1 * g
            assert torch.equal(out, torch.where(m >= 0, 1.0, -1.0))
        elif codec in ("efsignsgd", "onebit"):
            e = torch.zeros(n)
            for _ in range(2):
                q = g + e
                if codec == "efsignsgd":
                    scale = q.abs().mean()
                    decoded = torch.where(q >= 0, scale, -scale)
                else:
                    decoded = torch.where(q >= 0, q[q >= 0].mean(), q[q < 0].mean())
                e = q - decoded
            assert torch.allclose(out, decoded, atol=1e-5)
            assert torch.allclose(buffers["state"], e, atol=1e-5)
        elif codec == "qsgd":
            levels = out * 64 / torch.linalg.vector_norm(g)
            assert torch.allclose(levels, levels.round(), atol=1e-3)
            assert bool((levels.abs() <= 64.001).all())
            assert bool(((levels.abs() - g.abs() * 64 / g.norm()).abs() <= 1.001).all())
        elif codec == "terngrad":
            values = out / g.abs().max()
            assert set(values.unique().tolist()) <= {-1.0, 0.0, 1.0}
            assert bool(((values == 0) | (values.sign() == g.sign())).all())
        elif codec == "topk":
            k = params["k"]
            first = torch.topk(g.abs(), k).indices
            compensated = g + g.index_fill(0, first, 0)
            second = torch.topk(compensated.abs(), k).indices
            assert torch.equal(out.nonzero().view(-1), second.sort().values)
            assert torch.equal(out[second], compensated[second])
            assert torch.equal(buffers["e"], compensated.index_fill(0, second, 0))
        elif codec == "dgc":
            sent = out.nonzero().view(-1)
            assert 0 < sent.numel() <= params["k"]
            assert bool((buffers["v"][sent] == 0).all() and (buffers["u"][sent] == 0).all())
        elif codec == "randomk":
            sent = out.nonzero().view(-1)
            assert 0 < sent.numel() <= sum(params["tensor_k"])
            assert bool((buffers["e"][sent] == 0).all())
    # one step of random-k: the residual keeps exactly what was not sent
    step = bench.torch_randomk(torch, g, bench.codec_params("randomk", sizes)[1])
    step()
    assert torch.equal(_buffers(step)["e"] + _buffers(step)["out"], g)


def test_pytorch_powersgd_products_on_the_cpu():
    torch = pytest.importorskip("torch")
    shapes = [[3, 3, 4, 8], [8], [20, 30], [5, 2]]
    n = sum(math.prod(s) for s in shapes)
    g = torch.randn(n, generator=torch.Generator().manual_seed(1))
    step = bench.torch_powersgd(torch, g, shapes)
    for _ in range(3):
        step()
    matrices = _buffers(step)["matrices"]
    assert [tuple(m.shape) + (q.shape[1],) for m, _, q, _ in matrices] == [
        (36, 8, 4), (20, 30, 4), (5, 2, 2)]
    out = matrices[0][3]._base
    assert torch.equal(out[288:296], torch.zeros(8))  # vectors are left out
    m, decoded = g[296:896].view(20, 30), out[296:896].view(20, 30)
    assert torch.linalg.matrix_rank(decoded) <= 4 and (m - decoded).norm() < m.norm()
    assert torch.allclose(out[-10:], g[-10:], atol=1e-5)  # rank 2 of a 5 x 2 matrix: exact


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


def test_event_times_time_only_the_calls_after_warmup():
    clock = {"now": 0.0, "calls": 0, "synchronized_after": None}

    class Event:
        def record(self):
            self.at = clock["now"]

        def synchronize(self):
            pass

    def call():
        clock["calls"] += 1
        clock["now"] += clock["calls"]  # the i-th call takes i ms

    def synchronize():
        clock["synchronized_after"] = clock["calls"]

    median, least, most = bench._event_times(call, repeats=3, warmup=2, synchronize=synchronize,
                                             new_event=Event,
                                             elapsed_ms=lambda start, stop: stop.at - start.at)
    assert clock["synchronized_after"] == 2 and clock["calls"] == 5
    assert (median, least, most) == (4.0, 3.0, 5.0)
