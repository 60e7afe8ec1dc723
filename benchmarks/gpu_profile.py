"""A GPU profile for the simulator from `make gpu-check`'s measured codec costs.

    python -m benchmarks.gpu_profile GPU_CODECS_JSON \
        [--base docs/profiles/resnet50_2xv100_paper.json] [--step-ms MS] [--out P.json]

`make gpu-check` (gpu_check/bench.py) times, on a GPU, each codec's group
launchers over the gradient shapes of ResNet50 and BERT-base, as one group
(one launch set over every tensor) and layer-wise (one per tensor), the whole
round trip and the encode alone. Each such time is a sum of calls, so it is
priced like the CPU profile's groups: per part (encode; decode = round trip -
encode), ``fixed_s`` per call + ``per_element_s`` per element +
``per_tensor_s`` per tensor (``step_model.fit_coefficients``), fitted to the
four measurements of a codec (2 models x 2 modes).

The profile takes everything else (the model's tensors and ready times, the
compute step, placement, Horovod, networks) from ``--base``, by default the
profile of the paper's setting built from published figures; only the codecs
that gpu-check measured get their costs replaced; ``--step-ms`` scales the
base's compute (forward, backward, optimizer and every ready time, by one
factor) to the device's own step of the model. ``source`` says both:
which device measured the codecs, and where the rest comes from. PowerSGD is
not timed by gpu-check's benchmark (its launchers are only checked against the
CPU's outputs), so it keeps the base profile's figures, as the notes say.
"""

import argparse
import copy
import os
import sys

DEFAULT_BASE = os.path.join("docs", "profiles", "resnet50_2xv100_paper.json")


def load_report(path):
    from benchmarks.profile import read_json

    report = read_json(path, "gpu-check report")
    if report.get("dry_run"):
        raise ValueError("%s is a dry run's plan: it measured nothing (run `make gpu-check` "
                         "on a host with a GPU)" % path)
    results = report.get("results")
    if not results or any("encode_ms" not in r for r in results):
        raise ValueError("%s has no per-mode results with encode_ms: written by an older "
                         "gpu-check, or not by gpu-check" % path)
    return report


def codec_fits(report):
    """{codec: {"encode": {...}, "decode": {...}, "points": n, "max_error": e}} fitted to
    every model and mode the report measured."""
    import numpy as np

    from tf_mergecomp.search.step_model import fit_coefficients

    by_codec = {}
    for row in report["results"]:
        tensors = int(row["tensors"])
        elements = float(row["elements"])
        calls = 1 if row["mode"] == "group" else tensors
        encode = row["encode_ms"] / 1e3
        decode = max(0.0, row["ms"] / 1e3 - encode)
        by_codec.setdefault(row["codec"], []).append(((calls, elements, tensors), encode, decode))
    fits = {}
    for codec, points in by_codec.items():
        features = np.array([p[0] for p in points], dtype=np.float64)
        entry = {"points": len(points)}
        worst = 0.0
        for part, column in (("encode", 1), ("decode", 2)):
            seconds = np.array([p[column] for p in points])
            coefficients = fit_coefficients(features, seconds)
            predicted = features @ coefficients
            scale = np.maximum(seconds, 1e-9)
            worst = max(worst, float(np.max(np.abs(predicted - seconds) / scale)))
            entry[part] = dict(zip(("fixed_s", "per_element_s", "per_tensor_s"),
                                   (float(c) for c in coefficients)))
        entry["max_relative_error"] = worst
        fits[codec] = entry
    return fits


def scale_compute(profile, step_s):
    """``profile``'s compute scaled to a local step of ``step_s`` seconds: the forward,
    backward and optimizer times and every gradient's ready time by one factor, so
    that backprop keeps its shape (a device that runs the same model faster)."""
    if not step_s > 0:
        raise ValueError("the step must be positive seconds, got %r" % (step_s,))
    compute = profile["compute"]
    factor = step_s / float(compute["step_s"])
    for key in ("forward_s", "backward_s", "optimizer_s", "step_s", "tail_s"):
        if key in compute:
            compute[key] = float(compute[key]) * factor
    compute["ready_s"] = [float(t) * factor for t in compute["ready_s"]]
    return factor


def build(report, base, report_path="gpu_codecs.json", step_s=None, step_source=None):
    """The base profile with the codec costs gpu-check measured; with ``step_s``, its
    compute scaled to that local step (``scale_compute``; ``step_source`` says where
    the step comes from)."""
    from benchmarks import profile as profile_module

    profile_module.validate(base)
    fits = codec_fits(report)
    profile = copy.deepcopy(base)
    if step_s is not None:
        factor = scale_compute(profile, step_s)
        profile.setdefault("notes", [])
        profile["notes"] = list(profile["notes"]) + [
            "compute: the base profile's forward, backward, optimizer and ready times scaled "
            "by %.4f to a %.1f ms step (%s)." % (factor, 1e3 * step_s,
                                                 step_source or "given with --step-ms")]
    measured = [c for c in fits if c in profile["codecs"]]
    if not measured:
        raise ValueError("the report's codecs (%s) are none of the base profile's (%s)"
                         % (", ".join(sorted(fits)), ", ".join(profile["codecs"])))
    device = report.get("device", "a GPU")
    for codec in measured:
        entry = profile["codecs"][codec]
        for part in ("encode", "decode"):
            entry[part] = dict(fits[codec][part])
        entry["measured"] = {"device": device, "points": fits[codec]["points"],
                             "max_relative_error": fits[codec]["max_relative_error"]}
    kept = [c for c in profile["codecs"] if c not in measured]
    profile["source"] = ("codec costs measured by make gpu-check on %s (%s)%s; everything else "
                         "from: %s" % (device, os.path.basename(report_path),
                                       "" if step_s is None else "; step %.1f ms (%s)" % (
                                           1e3 * step_s, step_source or "--step-ms"),
                                       base["source"]))
    profile["gpu_check"] = {"device": device, "report": os.path.basename(report_path),
                            "copy": report.get("copy", {}), "measured_codecs": measured,
                            "codecs_from_base": kept}
    profile.setdefault("notes", [])
    profile["notes"] = list(profile["notes"]) + [
        "gpu-check: encode and decode of %s fitted (fixed per call, per element, per tensor) "
        "to %s's group and layer-wise round trips%s." % (
            ", ".join(measured), device,
            "; %s keep the base profile's figures" % ", ".join(kept) if kept else "")]
    return profile_module.validate(profile)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="gpu_codecs.json written by `make gpu-check`")
    parser.add_argument("--base", default=DEFAULT_BASE,
                        help="the profile whose model, compute and networks are kept "
                             "(default %s)" % DEFAULT_BASE)
    parser.add_argument("--step-ms", type=float, default=None,
                        help="scale the base profile's compute to this local step (the "
                             "device's own step of the model), keeping backprop's shape")
    parser.add_argument("--step-source", default=None,
                        help="where --step-ms comes from, for the profile's source and notes")
    parser.add_argument("--out", default=os.path.join("bench_results", "profile_gpu.json"))
    args = parser.parse_args(argv)
    from benchmarks import profile as profile_module

    try:
        result = build(load_report(args.report), profile_module.load(args.base), args.report,
                       step_s=None if args.step_ms is None else args.step_ms / 1e3,
                       step_source=args.step_source)
    except ValueError as error:
        parser.error(str(error))
    profile_module.save(result, args.out)
    for codec in result["gpu_check"]["measured_codecs"]:
        entry = result["codecs"][codec]
        print("%-10s encode %7.1f us + %.4f ns/element + %5.1f us/tensor; decode %7.1f us + "
              "%.4f ns/element + %5.1f us/tensor (fit within %.0f%%)" % (
                  codec, 1e6 * entry["encode"]["fixed_s"], 1e9 * entry["encode"]["per_element_s"],
                  1e6 * entry["encode"]["per_tensor_s"], 1e6 * entry["decode"]["fixed_s"],
                  1e9 * entry["decode"]["per_element_s"], 1e6 * entry["decode"]["per_tensor_s"],
                  100 * entry["measured"]["max_relative_error"]))
    print("written: %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
