"""GPU codec benchmark of the CUDA group launchers (no TensorFlow).

For each model's gradient shapes (gpu_check/shapes.json: ResNet50, BERT-base)
and each codec with its default memory, times one worker's encode + decode of
all the model's gradients
  - as one group: one launch set over the whole list (device pointer tables),
  - layer-wise: one launch set per tensor, tensor after tensor,
with CUDA events (median of --repeats after --warmup), and reports GB/s of
input gradient bytes next to device-to-device copy bandwidth measured in the
same run (before and after the codecs, so its drift shows); the encode alone
is timed too (``encode_ms``), so that the simulator's GPU profile
(benchmarks/gpu_profile.py) can price encode and decode apart. Writes
gpu_codecs.json (and .md) to --out, default $OUT when set.

    python3 -m gpu_check.bench                  # the full run (CuPy + a GPU)
    python3 -m gpu_check.bench --dry-run        # the plan only: no CuPy, no GPU
    python3 -m gpu_check.bench --list
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

SHAPES = Path(__file__).resolve().parent / "shapes.json"
RATIO = 0.01  # topk, dgc, randomk: the library's default ratio
DGC_SAMPLE_RATIO, DGC_MIN_SAMPLE = 0.01, 1024


def sparse_k(n, ratio):
    """compressors/_sparse.py's k = ceil(ratio * n), at least 1 when n >= 1."""
    return 0 if n == 0 else max(1, int(math.ceil(round(ratio * n, 9))))


# codec -> (group codec, memory, memory attributes, payload element bytes):
# each algorithm as the library runs it by default (signum is signsgd with
# the momentum memory, beta 0.9).
CODECS = {
    "none": ("none", "none", {}, 4),
    "fp16": ("fp16", "none", {}, 2),
    "signsgd": ("signsgd", "none", {}, 1),
    "signum": ("signsgd", "momentum", {"decay": 0.9, "gradient_scale": 0.1}, 1),
    "onebit": ("onebit", "residual", {}, 1),
    "efsignsgd": ("efsignsgd", "residual", {}, 1),
    "qsgd": ("qsgd", "none", {}, 1),
    "terngrad": ("terngrad", "none", {}, 1),
    "topk": ("topk", "residual", {}, 1),
    "dgc": ("dgc", "dgc", {"decay": 0.9}, 1),
    "randomk": ("randomk", "residual", {}, 4),
}
STATE_BUFFERS = {"none": 0, "residual": 1, "momentum": 1, "dgc": 2}


def load_shapes(path=SHAPES):
    data = json.loads(Path(path).read_text())
    return {name: [list(s) for s in shapes] for name, shapes in data.items()}


def codec_params(codec, sizes):
    """launchers.make_codec's keyword arguments for a group of these sizes."""
    group_codec, memory, memory_attrs, marker_bytes = CODECS[codec]
    params = dict(memory=memory, marker_bytes=marker_bytes, **memory_attrs)
    n = sum(sizes)
    if group_codec == "qsgd":
        params["levels"] = 64
    elif group_codec in ("topk", "dgc"):
        params["k"] = sparse_k(n, RATIO)
        if group_codec == "dgc":
            params["sample_size"] = max(DGC_MIN_SAMPLE, int(math.ceil(round(DGC_SAMPLE_RATIO * n, 9))))
    elif group_codec == "randomk":
        params["tensor_k"] = [sparse_k(s, RATIO) for s in sizes]
    return group_codec, params


def plan(models, codecs, shapes):
    """What a run measures: per model its tensor count and bytes, per codec its parameters."""
    entries = []
    for model in models:
        sizes = [math.prod(s) for s in shapes[model]]
        for codec in codecs:
            group_codec, params = codec_params(codec, sizes)
            summary = {k: v for k, v in params.items() if k != "tensor_k"}
            if "tensor_k" in params:
                summary["total_k"] = sum(params["tensor_k"])
            entries.append({"model": model, "codec": codec, "group_codec": group_codec,
                            "tensors": len(sizes), "bytes": 4 * sum(sizes), "params": summary})
    return entries


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,bert_base")
    parser.add_argument("--codecs", default=",".join(CODECS))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--modes", default="group,layerwise")
    parser.add_argument("--out", default=os.environ.get("OUT"),
                        help="directory for gpu_codecs.json/.md (default: $OUT)")
    parser.add_argument("--library", default=None, help="a built launcher library to use")
    parser.add_argument("--dry-run", action="store_true",
                        help="print and write the plan only (no CuPy, no GPU)")
    parser.add_argument("--list", action="store_true", help="list models and codecs")
    args = parser.parse_args(argv)
    shapes = load_shapes()
    args.models = [m for m in args.models.split(",") if m]
    args.codecs = [c for c in args.codecs.split(",") if c]
    args.modes = [m for m in args.modes.split(",") if m]
    for kind, chosen, valid in (("model", args.models, sorted(shapes)),
                                ("codec", args.codecs, list(CODECS)),
                                ("mode", args.modes, ["group", "layerwise"])):
        unknown = [c for c in chosen if c not in valid]
        if unknown or not chosen:
            parser.error("unknown %s %s; valid choices: %s" % (kind, ", ".join(unknown) or "(none)",
                                                                ", ".join(valid)))
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be >= 1 and --warmup >= 0")
    return args, shapes


def write_report(report, out):
    if not out:
        return None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_codecs.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "gpu_codecs.md").write_text(markdown(report))
    return out / "gpu_codecs.json"


def markdown(report):
    lines = ["# GPU group codecs (%s)" % report.get("device", "dry run"), ""]
    for model, copy in report.get("copy", {}).items():
        lines.append("%s: copy %.0f GB/s (before) / %.0f GB/s (after)"
                     % (model, copy["before_gbps"], copy["after_gbps"]))
    lines += ["", "| model | codec | mode | ms (median) | min-max ms | GB/s | x copy |",
              "|---|---|---|---|---|---|---|"]
    for r in report.get("results", []):
        lines.append("| %s | %s | %s | %.3f | %.3f-%.3f | %.1f | %.3f |" % (
            r["model"], r["codec"], r["mode"], r["ms"], r["min_ms"], r["max_ms"], r["gbps"],
            r["x_copy"]))
    for r in report.get("speedups", []):
        lines.append("- %s %s: one group %.2fx faster than layer-wise" % (
            r["model"], r["codec"], r["group_vs_layerwise"]))
    return "\n".join(lines) + "\n"


# ---- the GPU run ------------------------------------------------------------------


def _time(cp, fn, repeats, warmup):
    import numpy as np

    for _ in range(warmup):
        fn()
    cp.cuda.runtime.deviceSynchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return float(np.median(times)), float(min(times)), float(max(times))


class _Groups:
    """The launcher arguments of one codec over a model: one group of every
    tensor, and one group per tensor (layer-wise), sharing the same arrays."""

    def __init__(self, cp, launchers, lib, codec, sizes, grads, outputs):
        group_codec, params = codec_params(codec, sizes)
        buffers = STATE_BUFFERS[params["memory"]]
        state = [cp.zeros(buffers * n, cp.float32) for n in sizes] if buffers else None
        self.lib, self.cp = lib, cp
        self.sets = {}
        self._keep = []
        self.sets["group"] = [self._one(launchers, group_codec, params, sizes, grads, outputs,
                                        state)]
        layerwise = []
        for i, n in enumerate(sizes):
            p = dict(params)
            if group_codec in ("topk", "dgc"):
                p["k"] = sparse_k(n, RATIO)
                if group_codec == "dgc":
                    p["sample_size"] = max(DGC_MIN_SAMPLE, int(math.ceil(round(DGC_SAMPLE_RATIO * n, 9))))
            if group_codec == "randomk":
                p["tensor_k"] = [params["tensor_k"][i]]
            layerwise.append(self._one(launchers, group_codec, p, [n], [grads[i]], [outputs[i]],
                                       [state[i]] if state else None))
        self.sets["layerwise"] = layerwise

    def _one(self, launchers, group_codec, params, sizes, grads, outputs, state):
        cp, lib = self.cp, self.lib
        group = launchers.DeviceGroup(cp, sizes, inputs=grads, outputs=outputs, state=state)
        pair = launchers.make_codec(group_codec, **params)
        codec = group.bind(pair)
        row = cp.zeros(lib.mergecomp_group_row_bytes(codec, group.struct), cp.uint8)
        context = cp.zeros(max(1, lib.mergecomp_group_context_size(codec, group.struct)), cp.int32)
        workspace = cp.zeros(lib.mergecomp_group_workspace_bytes(codec, group.struct), cp.uint8)
        flags = cp.zeros(len(sizes), cp.int32)
        self._keep.append((group, pair, row, context, workspace, flags))
        return (codec, group.struct, row.data.ptr, context.data.ptr, workspace.data.ptr,
                flags.data.ptr)

    def run(self, mode, launchers, decode=True):
        lib = self.lib
        for codec, group, row, context, workspace, flags in self.sets[mode]:
            code = lib.mergecomp_group_encode_gpu(codec, group, 7, row, context, workspace, None)
            if code:
                raise launchers.LauncherError(lib, "encode", code)
            if not decode:
                continue
            code = lib.mergecomp_group_decode_gpu(codec, group, row, 1, context, flags, workspace,
                                                  None)
            if code:
                raise launchers.LauncherError(lib, "decode", code)


def run(args, shapes):
    try:
        import cupy as cp
    except ImportError as error:
        raise SystemExit("gpu_check.bench needs CuPy and a CUDA GPU (%s); --dry-run prints the "
                         "plan without them" % error)

    from gpu_check import launchers

    lib = launchers.load(args.library or launchers.build())
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    device = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    report = {"device": device, "ratio": RATIO, "repeats": args.repeats, "warmup": args.warmup,
              "rows": 1, "plan": plan(args.models, args.codecs, shapes), "copy": {},
              "results": [], "speedups": []}
    started = time.time()
    for model in args.models:
        sizes = [math.prod(s) for s in shapes[model]]
        nbytes = 4 * sum(sizes)
        rng = cp.random.default_rng(0)
        grads = [rng.standard_normal(n, dtype=cp.float32) for n in sizes]
        outputs = [cp.empty(n, cp.float32) for n in sizes]
        source, target = cp.empty(sum(sizes), cp.float32), cp.empty(sum(sizes), cp.float32)

        def copy():
            target.data.copy_from_device_async(source.data, nbytes)

        copy_before = nbytes / _time(cp, copy, args.repeats, args.warmup)[0] / 1e6
        measured = {}
        for codec in args.codecs:
            groups = _Groups(cp, launchers, lib, codec, sizes, grads, outputs)
            for mode in args.modes:
                ms, low, high = _time(cp, lambda: groups.run(mode, launchers), args.repeats,
                                      args.warmup)
                encode_ms = _time(cp, lambda: groups.run(mode, launchers, decode=False),
                                  args.repeats, args.warmup)[0]
                gbps = nbytes / ms / 1e6
                measured[(codec, mode)] = ms
                report["results"].append({
                    "model": model, "codec": codec, "mode": mode, "tensors": len(sizes),
                    "elements": sum(sizes), "bytes": nbytes, "ms": ms, "min_ms": low,
                    "max_ms": high, "encode_ms": encode_ms, "gbps": gbps,
                    "x_copy": gbps / copy_before})
                print("%-9s %-9s %-9s %8.3f ms %8.1f GB/s %6.3fx copy" % (
                    model, codec, mode, ms, gbps, gbps / copy_before), flush=True)
            del groups
            cp.get_default_memory_pool().free_all_blocks()
            if ("group" in args.modes and "layerwise" in args.modes):
                report["speedups"].append({
                    "model": model, "codec": codec,
                    "group_vs_layerwise": measured[(codec, "layerwise")] / measured[(codec, "group")]})
        copy_after = nbytes / _time(cp, copy, args.repeats, args.warmup)[0] / 1e6
        report["copy"][model] = {"before_gbps": copy_before, "after_gbps": copy_after,
                                 "bytes": nbytes}
        print("%s: copy %.0f GB/s before, %.0f GB/s after" % (model, copy_before, copy_after))
        del grads, outputs, source, target
        cp.get_default_memory_pool().free_all_blocks()
    report["seconds"] = time.time() - started
    return report


def main(argv=None):
    args, shapes = parse_args(argv)
    if args.list:
        for model in sorted(shapes):
            sizes = [math.prod(s) for s in shapes[model]]
            print("model %s: %d tensors, %.1f MB" % (model, len(sizes), 4e-6 * sum(sizes)))
        for codec, (group_codec, memory, _, _) in CODECS.items():
            print("codec %s: group codec %s, memory %s" % (codec, group_codec, memory))
        return 0
    if args.dry_run:
        report = {"dry_run": True, "plan": plan(args.models, args.codecs, shapes),
                  "modes": args.modes, "repeats": args.repeats, "warmup": args.warmup}
        for entry in report["plan"]:
            print("%(model)s %(codec)s: %(tensors)d tensors, %(bytes)d bytes, %(params)s" % entry)
    else:
        report = run(args, shapes)
    path = write_report(report, args.out)
    if path:
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
