"""gpu-check's measured codec costs become a simulator profile (benchmarks/gpu_profile.py)."""

import json
import os

import pytest

from benchmarks import gpu_profile
from benchmarks import profile as profile_module
from benchmarks import simulate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER = os.path.join(REPO, "docs", "profiles", "resnet50_2xv100_paper.json")
MODELS = {"resnet50": (214, 25_583_592), "bert_base": (199, 109_482_240)}
# (fixed s per call, s per element, s per tensor) of a made-up GPU, encode and decode
TRUTH = {"efsignsgd": ((30e-6, 2e-11, 4e-6), (20e-6, 1e-11, 2e-6)),
         "topk": ((80e-6, 9e-11, 6e-6), (15e-6, 1e-12, 1e-6))}


def _report():
    """What gpu_check/bench.py writes, with times from TRUTH."""
    results = []
    for model, (tensors, elements) in MODELS.items():
        for codec, (encode, decode) in TRUTH.items():
            for mode in ("group", "layerwise"):
                calls = 1 if mode == "group" else tensors

                def seconds(c):
                    return c[0] * calls + c[1] * elements + c[2] * tensors
                results.append({"model": model, "codec": codec, "mode": mode,
                                "tensors": tensors, "elements": elements,
                                "bytes": 4 * elements,
                                "ms": 1e3 * (seconds(encode) + seconds(decode)),
                                "encode_ms": 1e3 * seconds(encode)})
    return {"device": "Test GPU", "results": results, "copy": {"resnet50": {"before_gbps": 3000}}}


def test_fit_recovers_each_parts_costs():
    fits = gpu_profile.codec_fits(_report())
    for codec, truths in TRUTH.items():
        assert fits[codec]["points"] == 4
        assert fits[codec]["max_relative_error"] < 1e-6
        for part, truth in zip(("encode", "decode"), truths):
            fitted = fits[codec][part]
            assert [fitted["fixed_s"], fitted["per_element_s"], fitted["per_tensor_s"]] == \
                pytest.approx(list(truth), rel=1e-6)


def test_profile_keeps_the_base_and_says_what_was_measured(tmp_path):
    report_path = tmp_path / "gpu_codecs.json"
    report_path.write_text(json.dumps(_report()))
    out = tmp_path / "gpu.json"
    assert gpu_profile.main([str(report_path), "--base", PAPER, "--out", str(out)]) == 0
    profile = profile_module.load(str(out))
    base = profile_module.load(PAPER)
    assert "Test GPU" in profile["source"] and base["source"] in profile["source"]
    assert profile["gpu_check"]["measured_codecs"] == ["efsignsgd", "topk"]
    assert "powersgd" in profile["gpu_check"]["codecs_from_base"]
    assert profile["codecs"]["topk"]["encode"]["fixed_s"] == pytest.approx(80e-6, rel=1e-6)
    assert profile["codecs"]["powersgd"] == base["codecs"]["powersgd"]
    assert profile["compute"] == base["compute"] and profile["tensors"] == base["tensors"]
    result = simulate.simulate(profile, [2, 64], ["pcie3"], codecs=["efsignsgd", "topk"],
                               log=lambda *_: None)
    assert {c["workers"] for c in result["cells"]} == {2, 64}


def test_a_dry_run_or_foreign_json_is_refused(tmp_path, capsys):
    dry = tmp_path / "dry.json"
    dry.write_text(json.dumps({"dry_run": True, "plan": []}))
    with pytest.raises(SystemExit):
        gpu_profile.main([str(dry), "--base", PAPER, "--out", str(tmp_path / "x.json")])
    assert "dry run" in capsys.readouterr().err
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"results": [{"ms": 1.0}]}))
    with pytest.raises(ValueError, match="encode_ms"):
        gpu_profile.load_report(str(old))
