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
(benchmarks/gpu_profile.py) can price encode and decode apart. Where PyTorch
with CUDA is there (and not --no-torch), each codec's PyTorch formulation
(TORCH_CODECS: the same work in plain torch ops on one flat buffer, as the
MergeComp paper's PyTorch code writes its codecs) is timed in the same run,
and each row reports ``torch_ms`` and ``x_torch`` = torch_ms / the row's ms
(> 1: the launchers are faster) next to ``x_copy``; PowerSGD's products are
timed in PyTorch alone (TORCH_ONLY). Writes gpu_codecs.json (and .md) to
--out, default $OUT when set.

    python3 -m gpu_check.bench                  # the full run (CuPy + a GPU)
    python3 -m gpu_check.bench --dry-run        # the plan only: no CuPy, no GPU
    python3 -m gpu_check.bench --no-torch       # the launchers only
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
    """compressors/sparse_payload.py's k = ceil(ratio * n), at least 1 when n >= 1."""
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
    parser.add_argument("--torch", action=argparse.BooleanOptionalAction, default=True,
                        help="time each codec's PyTorch formulation too, where PyTorch has "
                             "CUDA (default: on)")
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


def torch_line(torch_report):
    """The report's one line on PyTorch: its version and what x torch means,
    or why it was not timed; None for a dry run's plan."""
    if torch_report.get("version"):
        return ("PyTorch %s: each codec's formulation in plain torch ops on one flat buffer; "
                "torch ms is its median, x torch = torch ms / the row's ms (> 1: the launchers "
                "are faster)" % torch_report["version"])
    if torch_report.get("reason"):
        return "PyTorch: not timed (%s)" % torch_report["reason"]
    return None


def markdown(report):
    lines = ["# GPU group codecs (%s)" % report.get("device", "dry run"), ""]
    for model, copy in report.get("copy", {}).items():
        lines.append("%s: copy %.0f GB/s (before) / %.0f GB/s (after)"
                     % (model, copy["before_gbps"], copy["after_gbps"]))
    torch_report = report.get("torch") or {}
    line = torch_line(torch_report)
    if line:
        lines.append(line)
    results = report.get("results", [])
    with_torch = any("torch_ms" in r for r in results)
    header = ["model", "codec", "mode", "ms (median)", "min-max ms", "GB/s", "x copy"]
    if with_torch:
        header += ["torch ms", "x torch"]
    lines += ["", "| %s |" % " | ".join(header), "|%s" % ("---|" * len(header))]
    for r in results:
        cells = [r["model"], r["codec"], r["mode"], "%.3f" % r["ms"],
                 "%.3f-%.3f" % (r["min_ms"], r["max_ms"]), "%.1f" % r["gbps"],
                 "%.3f" % r["x_copy"]]
        if with_torch:
            cells += (["%.3f" % r["torch_ms"], "%.2f" % r["x_torch"]] if "torch_ms" in r
                      else ["-", "-"])
        lines.append("| %s |" % " | ".join(cells))
    for r in report.get("speedups", []):
        lines.append("- %s %s: one group %.2fx faster than layer-wise" % (
            r["model"], r["codec"], r["group_vs_layerwise"]))
    for r in torch_report.get("results", []):
        if "error" in r:
            lines.append("- %s %s: the PyTorch formulation failed: %s" % (
                r["model"], r["codec"], r["error"]))
        elif r["codec"] in TORCH_ONLY:
            lines.append("- %s %s (PyTorch only: %s): %.3f ms (%.3f-%.3f), %.1f GB/s, %.3fx copy"
                         % (r["model"], r["codec"], r["what"], r["ms"], r["min_ms"],
                            r["max_ms"], r["gbps"], r["x_copy"]))
    return "\n".join(lines) + "\n"


# ---- the same work as plain PyTorch ops ------------------------------------------
#
# Each codec as the MergeComp paper's PyTorch code writes it: one worker's
# encode + decode (with the codec's default memory, as CODECS gives it) of ONE
# flat float32 CUDA tensor of the model's total size, in plain torch ops. A
# formulation takes (torch, g, params), params as codec_params gives them for
# the model's sizes, allocates its buffers (the memory's state, the output,
# the random numbers) and returns the timed zero-argument step. Payloads are
# packed as the library's wire formats are: sign bits 8 to a byte, TernGrad's
# codes 4 to a byte, QSGD's (64 levels) one byte each; sparse payloads keep
# torch's int64 indices. None of them syncs with the host but DGC (its
# candidates' count, as torch.nonzero needs).

SIGN_SHIFTS = list(range(8))  # element j's bit is bit j % 8 of byte j // 8, as the library packs
TERN_SHIFTS = [0, 2, 4, 6]
POWERSGD_RANK = 4  # the PowerSGD paper's usual rank (the library's default is 1)


def _torch_pack(torch, codes, shifts):
    """uint8 codes (or a bool mask) of width 8 / len(shifts) bits, packed little-end first."""
    per = shifts.numel()
    pad = (-codes.numel()) % per
    if pad:
        codes = torch.cat([codes, codes.new_zeros(pad)])
    return (codes.view(-1, per).to(torch.uint8) << shifts).sum(1, dtype=torch.uint8)


def _torch_unpack(torch, packed, shifts, mask, n):
    """_torch_pack's inverse: uint8 codes of n elements."""
    return ((packed.unsqueeze(1) >> shifts) & mask).view(-1)[:n]


def _torch_sparse_k(params):
    return params["k"] if "k" in params else sum(params["tensor_k"])


def torch_none(torch, g, params):
    """none: the gradient is the payload; the decode copies it out."""
    out = torch.empty_like(g)

    def step():
        out.copy_(g)
    return step


def torch_fp16(torch, g, params):
    """fp16: ``g.half()``, cast back into the output."""
    out = torch.empty_like(g)

    def step():
        out.copy_(g.half())
    return step


def _torch_sign_step(torch, g, params, scaled):
    """Sign bits of p (g, or the memory's compensated g), decoded as +-1, +-scale
    (efsignsgd: mean |p|) or the two means (onebit), the residual updated."""
    n = g.numel()
    out = torch.empty_like(g)
    shifts = torch.tensor(SIGN_SHIFTS, dtype=torch.uint8, device=g.device)
    one = torch.ones((), dtype=g.dtype, device=g.device)
    memory = params["memory"]
    state = torch.zeros_like(g) if memory != "none" else None
    decay, gradient_scale = params.get("decay", 0.9), params.get("gradient_scale", 0.1)

    def step():
        if memory == "momentum":  # signum: m = 0.9 m + 0.1 g
            p = state.mul_(decay).add_(g, alpha=gradient_scale)
        elif memory == "residual":  # p = g + e, kept in e
            p = state.add_(g)
        else:
            p = g
        positive = p >= 0
        packed = _torch_pack(torch, positive, shifts)
        if scaled == "mean":  # efsignsgd
            high = torch.linalg.vector_norm(p, 1) / n
            low = -high
        elif scaled == "means":  # onebit
            count = positive.sum()
            positive_sum = torch.where(positive, p, 0).sum()
            high = positive_sum / count.clamp(min=1)
            low = (p.sum() - positive_sum) / (n - count).clamp(min=1)
        else:
            high, low = one, -one
        bits = _torch_unpack(torch, packed, shifts, 1, n).bool()
        torch.where(bits, high, low, out=out)
        if memory == "residual":  # e = p - decode(encode(p))
            state.sub_(out)
    return step


def torch_signsgd(torch, g, params):
    """signsgd: sign bits (``p >= 0``), packed 8 to a byte, unpacked to +-1."""
    return _torch_sign_step(torch, g, params, None)


def torch_signum(torch, g, params):
    """signum: momentum m = 0.9 m + 0.1 g, then signsgd's sign bits of m."""
    return _torch_sign_step(torch, g, params, None)


def torch_onebit(torch, g, params):
    """onebit: p = g + e; sign bits; the means of p's non-negative and negative
    entries; decode bit 1 -> mean+, bit 0 -> mean-; e = p - decoded."""
    return _torch_sign_step(torch, g, params, "means")


def torch_efsignsgd(torch, g, params):
    """efsignsgd: p = g + e; scale = mean |p|; sign bits; decode +-scale; e = p - decoded."""
    return _torch_sign_step(torch, g, params, "mean")


def torch_qsgd(torch, g, params):
    """qsgd: norm = ||g||; l = floor(s |g| / norm + u), u ~ U[0, 1) (torch's
    generator); code sign * l + s as uint8 [s = 64]; decode (code - s) norm / s."""
    levels = float(params.get("levels", 64))
    out, u = torch.empty_like(g), torch.empty_like(g)

    def step():
        norm = torch.linalg.vector_norm(g)
        u.uniform_()
        code = (g.abs().mul_(levels / norm).add_(u).floor_().clamp_(max=levels)
                .copysign_(g).add_(levels).to(torch.uint8))
        out.copy_(code).sub_(levels).mul_(norm / levels)
    return step


def torch_terngrad(torch, g, params):
    """terngrad: m = max |g|; t ~ Bernoulli(|g| / m); code 1 + sign(g) t in
    {0, 1, 2}, packed 4 to a byte; decode (code - 1) m."""
    n = g.numel()
    out, u = torch.empty_like(g), torch.empty_like(g)
    shifts = torch.tensor(TERN_SHIFTS, dtype=torch.uint8, device=g.device)
    codes = [torch.tensor(v, dtype=torch.uint8, device=g.device) for v in (0, 1, 2)]

    def step():
        magnitude = g.abs()
        top = magnitude.max()
        u.uniform_()
        keep = u.mul_(top) < magnitude
        code = torch.where(keep, torch.where(g >= 0, codes[2], codes[0]), codes[1])
        packed = _torch_pack(torch, code, shifts)
        out.copy_(_torch_unpack(torch, packed, shifts, 3, n)).sub_(1).mul_(top)
    return step


def torch_topk(torch, g, params):
    """topk: p = g + e (kept in e); ``torch.topk(p.abs(), k)``; the values
    gathered; e = p with the sent entries zeroed; decode: zeros, scattered."""
    k = _torch_sparse_k(params)
    out, e = torch.empty_like(g), torch.zeros_like(g)

    def step():
        e.add_(g)
        index = torch.topk(e.abs(), k, sorted=False).indices
        values = e.index_select(0, index)
        e.index_fill_(0, index, 0)
        out.zero_().index_copy_(0, index, values)
    return step


def torch_dgc(torch, g, params):
    """dgc: u = 0.9 u + g, v = v + u; a uniform sample (with replacement) of |v|,
    its r-th largest (``torch.topk``, r = ceil(s k / n)) the threshold, halved
    while fewer than k reach it (3 times at most); candidates by
    ``torch.nonzero`` (a host sync, and one per halving); more than k: the k
    largest of them; u and v zeroed where sent; decode: zeros, scattered."""
    n, k = g.numel(), _torch_sparse_k(params)
    samples = params.get("sample_size", DGC_MIN_SAMPLE)
    rank = max(1, min(samples, int(math.ceil(samples * k / n))))
    decay = params.get("decay", 0.9)
    out, u, v = torch.empty_like(g), torch.zeros_like(g), torch.zeros_like(g)
    sample = torch.empty(samples, dtype=torch.int64, device=g.device)

    def step():
        u.mul_(decay).add_(g)
        v.add_(u)
        magnitude = v.abs()
        sample.random_(0, n)
        threshold = torch.topk(magnitude.index_select(0, sample), rank, sorted=False).values.min()
        index = torch.nonzero(magnitude >= threshold).view(-1)
        for _ in range(3):
            if index.numel() >= k:
                break
            threshold = threshold / 2
            index = torch.nonzero(magnitude >= threshold).view(-1)
        if index.numel() > k:
            index = index.index_select(0, torch.topk(magnitude.index_select(0, index), k,
                                                     sorted=False).indices)
        values = v.index_select(0, index)
        v.index_fill_(0, index, 0)
        u.index_fill_(0, index, 0)
        out.zero_().index_copy_(0, index, values)
    return step


def torch_randomk(torch, g, params):
    """randomk: p = g + e (kept in e); k positions drawn with ``random_`` (with
    replacement, where the library draws k distinct positions per tensor: a
    lower bound on the cost), the values gathered, e zeroed there; decode:
    zeros, scattered."""
    k = _torch_sparse_k(params)
    out, e = torch.empty_like(g), torch.zeros_like(g)
    index = torch.empty(k, dtype=torch.int64, device=g.device)

    def step():
        e.add_(g)
        index.random_(0, g.numel())
        values = e.index_select(0, index)
        e.index_fill_(0, index, 0)
        out.zero_().index_copy_(0, index, values)
    return step


# codec (CODECS) -> its PyTorch formulation
TORCH_CODECS = {
    "none": torch_none, "fp16": torch_fp16, "signsgd": torch_signsgd, "signum": torch_signum,
    "onebit": torch_onebit, "efsignsgd": torch_efsignsgd, "qsgd": torch_qsgd,
    "terngrad": torch_terngrad, "topk": torch_topk, "dgc": torch_dgc, "randomk": torch_randomk,
}


def torch_powersgd(torch, g, shapes, rank=POWERSGD_RANK):
    """PowerSGD's products only (no launcher row to compare: the bench times no
    PowerSGD launchers): for each tensor of rank >= 2, viewed as the library
    views it (cols = its last dimension, rows = size / cols, r = min(rank, rows,
    cols)), P = M Q, P orthonormalised (``torch.linalg.qr``), Q = M^T P, and the
    decode P Q^T into the output; Q kept from step to step (the warm start).
    Vectors (sent as they are) and the residual are left out."""
    out = torch.zeros_like(g)
    generator = torch.Generator(device=g.device).manual_seed(0)
    matrices, offset = [], 0
    for shape in shapes:
        size = math.prod(shape)
        if len(shape) >= 2 and size > 0:
            cols = int(shape[-1])
            rows = size // cols
            r = min(rank, rows, cols)
            q = torch.randn(cols, r, generator=generator, device=g.device, dtype=g.dtype)
            p = torch.empty(rows, r, device=g.device, dtype=g.dtype)
            matrices.append((g[offset:offset + size].view(rows, cols), p, q,
                             out[offset:offset + size].view(rows, cols)))
        offset += size

    def step():
        for m, p, q, decoded in matrices:
            torch.matmul(m, q, out=p)
            p = torch.linalg.qr(p).Q
            torch.matmul(m.t(), p, out=q)
            torch.matmul(p, q.t(), out=decoded)
    return step


# what PyTorch alone is timed for, with no launcher row: name -> formulation
TORCH_ONLY = {"powersgd": torch_powersgd}


def torch_for_cuda(requested):
    """(torch, None) where PyTorch with a CUDA device is there and asked for,
    else (None, why not)."""
    if not requested:
        return None, "--no-torch"
    try:
        import torch
    except ImportError as error:
        return None, "PyTorch is not installed (%s)" % error
    if not torch.cuda.is_available():
        return None, "PyTorch %s has no CUDA device" % torch.__version__
    return torch, None


def _event_times(fn, repeats, warmup, synchronize, new_event, elapsed_ms):
    """Median, min and max ms of ``fn`` between two events on the current stream,
    after ``warmup`` untimed calls and a device synchronisation."""
    import numpy as np

    for _ in range(warmup):
        fn()
    synchronize()
    start, stop = new_event(), new_event()
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(elapsed_ms(start, stop))
    return float(np.median(times)), float(min(times)), float(max(times))


def _time_torch(torch, fn, repeats, warmup):
    """_time with torch.cuda events on torch's current stream (the device
    synchronised first, so no CuPy work is counted)."""
    return _event_times(fn, repeats, warmup, torch.cuda.synchronize,
                        lambda: torch.cuda.Event(enable_timing=True),
                        lambda start, stop: start.elapsed_time(stop))


# ---- the GPU run ------------------------------------------------------------------


def _time(cp, fn, repeats, warmup):
    return _event_times(fn, repeats, warmup, cp.cuda.runtime.deviceSynchronize, cp.cuda.Event,
                        cp.cuda.get_elapsed_time)


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


def result_line(row):
    """The printed line of one launcher row, its ratio to PyTorch last where timed."""
    line = "%-9s %-9s %-9s %8.3f ms %8.1f GB/s %6.3fx copy" % (
        row["model"], row["codec"], row["mode"], row["ms"], row["gbps"], row["x_copy"])
    if "x_torch" in row:
        line += "  %5.2fx torch" % row["x_torch"]
    return line


def torch_result_line(result):
    """The printed line of one PyTorch formulation's timing (mode "torch")."""
    if "error" in result:
        return "%-9s %-9s %-9s failed: %s" % (result["model"], result["codec"], "torch",
                                              result["error"])
    return "%-9s %-9s %-9s %8.3f ms %8.1f GB/s %6.3fx copy" % (
        result["model"], result["codec"], "torch", result["ms"], result["gbps"],
        result["x_copy"])


def _torch_result(torch, model, codec, formulation, make, args, nbytes, copy_gbps):
    """Times one PyTorch formulation (make() returns its step); a failure is
    reported as its error and leaves the launcher rows standing."""
    try:
        ms, low, high = _time_torch(torch, make(), args.repeats, args.warmup)
    except Exception as error:  # noqa: BLE001 - any failure of torch's is reported, not fatal
        return {"model": model, "codec": codec, "formulation": formulation,
                "error": "%s: %s" % (type(error).__name__, error)}
    finally:
        torch.cuda.empty_cache()
    gbps = nbytes / ms / 1e6
    return {"model": model, "codec": codec, "formulation": formulation, "bytes": nbytes,
            "ms": ms, "min_ms": low, "max_ms": high, "gbps": gbps, "x_copy": gbps / copy_gbps}


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
    torch, why_not = torch_for_cuda(args.torch)
    report["torch"] = {"requested": args.torch, "version": torch.__version__ if torch else None,
                       "reason": why_not, "results": []}
    print(torch_line(report["torch"]), flush=True)
    started = time.time()
    for model in args.models:
        sizes = [math.prod(s) for s in shapes[model]]
        nbytes = 4 * sum(sizes)
        flat = None
        if torch:
            generator = torch.Generator(device="cuda").manual_seed(0)
            flat = torch.randn(sum(sizes), device="cuda", dtype=torch.float32,
                               generator=generator)
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
            rows = []
            for mode in args.modes:
                ms, low, high = _time(cp, lambda: groups.run(mode, launchers), args.repeats,
                                      args.warmup)
                encode_ms = _time(cp, lambda: groups.run(mode, launchers, decode=False),
                                  args.repeats, args.warmup)[0]
                gbps = nbytes / ms / 1e6
                measured[(codec, mode)] = ms
                rows.append({
                    "model": model, "codec": codec, "mode": mode, "tensors": len(sizes),
                    "elements": sum(sizes), "bytes": nbytes, "ms": ms, "min_ms": low,
                    "max_ms": high, "encode_ms": encode_ms, "gbps": gbps,
                    "x_copy": gbps / copy_before})
            del groups
            cp.get_default_memory_pool().free_all_blocks()
            if torch:
                params = codec_params(codec, sizes)[1]
                timed = _torch_result(torch, model, codec, TORCH_CODECS[codec].__name__,
                                      lambda: TORCH_CODECS[codec](torch, flat, params), args,
                                      nbytes, copy_before)
                report["torch"]["results"].append(timed)
                for row in rows:
                    if "ms" in timed:
                        row["torch_ms"] = timed["ms"]
                        row["x_torch"] = timed["ms"] / row["ms"]
            for row in rows:
                report["results"].append(row)
                print(result_line(row), flush=True)
            if torch:
                print(torch_result_line(timed), flush=True)
            if ("group" in args.modes and "layerwise" in args.modes):
                report["speedups"].append({
                    "model": model, "codec": codec,
                    "group_vs_layerwise": measured[(codec, "layerwise")] / measured[(codec, "group")]})
        if torch:
            for name, make in TORCH_ONLY.items():
                timed = _torch_result(torch, model, name, make.__name__,
                                      lambda: make(torch, flat, shapes[model]), args, nbytes,
                                      copy_before)
                timed["what"] = "rank %d products of the matrices" % POWERSGD_RANK
                report["torch"]["results"].append(timed)
                print(torch_result_line(timed), flush=True)
            del flat
            torch.cuda.empty_cache()
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
            print("codec %s: group codec %s, memory %s, PyTorch %s" % (
                codec, group_codec, memory, TORCH_CODECS[codec].__name__))
        for name, make in TORCH_ONLY.items():
            print("PyTorch only %s: %s" % (name, make.__name__))
        return 0
    if args.dry_run:
        report = {"dry_run": True, "plan": plan(args.models, args.codecs, shapes),
                  "modes": args.modes, "repeats": args.repeats, "warmup": args.warmup,
                  "torch": {"requested": args.torch,
                            "formulations": ({c: TORCH_CODECS[c].__name__ for c in args.codecs}
                                             if args.torch else {}),
                            "only": list(TORCH_ONLY) if args.torch else []}}
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
