"""Writes group_golden.npz: what the CPU group ops (MergecompGroupEncode /
MergecompGroupDecode) produce for groups of mixed sizes on simulated workers,
for every group codec and memory the library uses. The CUDA group launchers
must reproduce it (tests/test_cuda_launchers.py, on a GPU host without
TensorFlow, or on the CUDA emulation). Run from the repository root after
`make build`:

    .venv/bin/python tests/data/make_group_golden.py

Cases:
- CASES: one group of 9 tensors of sizes 0..2053 on 3 workers, every codec
  and memory, non-finite tensors.
- STRESS_CASES, after what the first GPU run found (top-k's and DGC's decode
  faulting with cudaErrorMisalignedAddress on 2+ worker rows: a row is
  8k + num_tensors bytes, so row w > 0 starts unaligned): 2 to 8 workers,
  odd tensor counts, tensors of 0, 1 and 3 elements; top-k with k = n and
  with fewer non-zero values than k (ties at zero), DGC with fewer
  candidates than k (padding slots); every allgather codec on several rows.
- DIGEST_CASES: a group holding a tensor of 2^20 + 1 elements. Its inputs are
  regenerated from a seed (tests/golden_inputs.py) and only SHA-256 digests
  of inputs, state, rows and outputs are stored.

Keys: "<case>__meta" (JSON: codec attributes, "world", "row_bytes",
"digest"), "<case>__sizes", and per worker w "<case>__input<w>" (the group's
gradients back to back), "__state<w>" / "__state_after<w>" (each tensor's
state buffers, tensor after tensor), "__row<w>" (payload + markers, bytes),
"__context<w>", "__seed<w>"; then "__rows" (what the decoder was given),
"__output" and "__nonfinite". A digest case stores "__input_sha256<w>",
"__state_sha256<w>", "__state_after_sha256<w>", "__row_sha256<w>",
"__rows_sha256" and "__output_sha256" instead of those arrays.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests import golden_inputs  # noqa: E402
from tf_mergecomp import ops as op_library, compressors, memory as memories  # noqa: E402
from tf_mergecomp.compressors import sparse_payload  # noqa: E402

SIZES = [0, 1, 7, 300, 1, 2053, 64, 0, 517]
WORLD = 3
ODD7 = [3, 0, 1, 517, 3, 0, 1]
ODD5 = [1, 3, 0, 257, 3]
BIG = [3, 0, 1, 2 ** 20 + 1, 3]
# case -> (algorithm, algorithm parameters, memory or None for the default,
#          (worker, tensor) made non-finite or None)
CASES = {
    "none": ("none", {}, None, None),
    "fp16": ("fp16", {}, None, None),
    "signsgd": ("signsgd", {}, None, None),
    "signum": ("signum", {}, None, None),
    "onebit": ("onebit", {}, None, None),
    "efsignsgd": ("efsignsgd", {}, None, None),
    "efsignsgd_nonfinite": ("efsignsgd", {}, None, (1, 3)),
    "qsgd": ("qsgd", {}, None, None),
    "qsgd5_residual": ("qsgd", {"levels": 5}, "residual", None),
    "terngrad": ("terngrad", {}, None, None),
    "topk": ("topk", {"ratio": 0.02}, None, None),
    "topk_nonfinite": ("topk", {"ratio": 0.02}, None, (0, 5)),
    "dgc": ("dgc", {"ratio": 0.02}, None, None),
    "randomk": ("randomk", {"ratio": 0.05}, None, None),
    "randomk_scaled": ("randomk", {"ratio": 0.05, "scale": True}, None, None),
    "fp16_dgc_memory": ("fp16", {}, "dgc", None),
}
# case -> (algorithm, parameters, memory, non-finite, sizes, workers, inputs):
# inputs "normal" (as CASES'), "sparse" (all zero but for fewer spikes than k,
# zero initial state; DGC's spikes over a 1e-6 floor so that its sampled
# threshold lands on them), "hashed" (DIGEST_CASES).
STRESS_CASES = {
    "topk_w2": ("topk", {"ratio": 0.02}, None, None, ODD7, 2, "normal"),
    "topk_w8_nonfinite": ("topk", {"ratio": 0.05}, None, (5, 3), ODD5, 8, "normal"),
    "topk_all_w4": ("topk", {"ratio": 1.0}, None, None, ODD5, 4, "normal"),
    "topk_few_nonzero_w3": ("topk", {"ratio": 0.1}, None, None, ODD7, 3, "sparse"),
    "dgc_w5": ("dgc", {"ratio": 0.02}, None, None, ODD7, 5, "normal"),
    "dgc_w7": ("dgc", {"ratio": 0.05}, None, None, ODD5, 7, "normal"),
    "dgc_few_candidates_w6": ("dgc", {"ratio": 0.1}, None, None, ODD7, 6, "sparse"),
    "dgc_few_candidates_w2": ("dgc", {"ratio": 0.05}, None, None, ODD5, 2, "sparse"),
    "signsgd_w8": ("signsgd", {}, None, None, ODD5, 8, "normal"),
    "onebit_w7": ("onebit", {}, None, None, ODD7, 7, "normal"),
    "efsignsgd_w4_nonfinite": ("efsignsgd", {}, None, (2, 3), ODD7, 4, "normal"),
    "qsgd5_w6": ("qsgd", {"levels": 5}, None, None, ODD7, 6, "normal"),
    "terngrad_w3": ("terngrad", {}, None, None, ODD5, 3, "normal"),
    "randomk_w2": ("randomk", {"ratio": 0.05}, None, None, ODD7, 2, "normal"),
}
DIGEST_CASES = {
    "topk_big_w2": ("topk", {"ratio": 0.01}, None, None, BIG, 2, "hashed"),
}
SPIKE_TRIES = 64  # data seeds tried per DGC worker for fewer candidates than k


def worker_inputs(w, nonfinite, sizes=SIZES, kind="normal", data_seed=0):
    if kind == "hashed":
        tensors = golden_inputs.worker_gradients(w, sizes)
    elif kind == "sparse":
        tensors = sparse_inputs(w, sizes, data_seed)
    else:
        rng = np.random.default_rng(w)
        tensors = [(rng.standard_normal(n) * (1 + t)).astype(np.float32)
                   for t, n in enumerate(sizes)]
    if nonfinite is not None and nonfinite[0] == w:
        tensors[nonfinite[1]][0] = np.nan
    return tensors


def sparse_inputs(w, sizes, data_seed, floor=0.0, spikes=None):
    """Zeros (or +-floor) with `spikes` values of magnitude 1 to 2 at random places."""
    rng = np.random.default_rng(1000 * data_seed + 50 + w)
    total = sum(sizes)
    flat = (floor * np.where(rng.random(total) < 0.5, -1.0, 1.0)).astype(np.float32)
    count = spikes if spikes is not None else max(1, total // 40)
    where = rng.choice(total, size=count, replace=False)
    flat[where] = (rng.uniform(1, 2, count) * np.where(rng.random(count) < 0.5, -1, 1))
    return [flat[start:start + n].copy()
            for start, n in zip(np.cumsum([0] + sizes[:-1]), sizes)]


def initial_state(w, buffers, sizes=SIZES, kind="normal"):
    if kind == "hashed":
        return golden_inputs.worker_state(w, sizes, buffers)
    if kind == "sparse":
        return [np.zeros(buffers * n, np.float32) for n in sizes]
    rng = np.random.default_rng(100 + w)
    return [(0.1 * rng.standard_normal(buffers * n)).astype(np.float32) for n in sizes]


def encode(ops, codec, memory, attrs, payload_dtype, grads, state, seed):
    variables = [tf.Variable(s) for s in state]
    memory_attrs = memory.op_attrs()
    payload, context = ops.mergecomp_group_encode(
        [tf.constant(g) for g in grads], [v.handle for v in variables],
        tf.constant(seed, tf.int64), payload_type=payload_dtype, memory=memory.name,
        **memory_attrs, **attrs)
    return payload, context, [v.numpy() for v in variables]


def padding_slots(row, k):
    """DGC's padding: slots of value 0 (a sent value is never exactly 0 here)."""
    return int((row[:4 * k].view(np.float32) == 0).sum())


def run_case(ops, key, algorithm, params, memory_name, nonfinite, sizes=SIZES, world=WORLD,
             kind="normal"):
    codec = compressors.get(algorithm, **params)
    if memory_name is None:
        memory = memories.get(codec.default_memory, **codec.default_memory_params())
    else:
        memory = memories.get(memory_name)
    attrs = dict(codec=codec.group_codec, **codec.group_op_attrs(sizes))
    memory_attrs = memory.op_attrs()
    buffers = len(memory.state_names)
    payload_dtype = tf.as_dtype(codec.payload_dtype)
    digest = kind == "hashed"
    arrays = {}
    rows, contexts = [], []
    for w in range(world):
        seed = 77 if codec.shared_seed else 1000 + w
        state = initial_state(w, buffers, sizes, kind) if buffers else []
        grads = worker_inputs(w, nonfinite, sizes, kind)
        payload, context, state_after = encode(ops, codec, memory, attrs, payload_dtype, grads,
                                               state, seed)
        row = payload.numpy().view(np.uint8).copy()
        if kind == "sparse" and algorithm == "dgc":
            # Spikes just below k over a small floor: keep the first data seed
            # whose sampled threshold lands on the spikes (fewer candidates than k).
            k = attrs["k"]
            for data_seed in range(SPIKE_TRIES):
                grads = sparse_inputs(w, sizes, data_seed, floor=1e-6, spikes=k - 2)
                payload, context, state_after = encode(ops, codec, memory, attrs,
                                                       payload_dtype, grads, state, seed)
                row = payload.numpy().view(np.uint8).copy()
                if padding_slots(row, k) > 0:
                    break
            else:
                raise RuntimeError("%s: no data seed gives fewer candidates than k" % key)
        rows.append(payload)
        contexts.append(context)
        arrays["seed%d" % w] = np.array(seed, np.int64)
        arrays["context%d" % w] = context.numpy()
        flat_input = np.concatenate(grads)
        if digest:
            arrays["input_sha256%d" % w] = np.array(golden_inputs.digest(flat_input))
            arrays["row_sha256%d" % w] = np.array(golden_inputs.digest(row))
        else:
            arrays["input%d" % w] = flat_input
            arrays["row%d" % w] = row
        if buffers:
            before, after = np.concatenate(state), np.concatenate(state_after)
            if digest:
                arrays["state_sha256%d" % w] = np.array(golden_inputs.digest(before))
                arrays["state_after_sha256%d" % w] = np.array(golden_inputs.digest(after))
            else:
                arrays["state%d" % w] = before
                arrays["state_after%d" % w] = after
    if codec.collective == compressors.ALLREDUCE:
        collected, num_rows = rows[0], 1
    else:
        collected, num_rows = tf.concat(rows, 0), world
    outputs, flags = ops.mergecomp_group_decode(
        collected, contexts[0], T=[tf.float32] * len(sizes), shapes=[[n] for n in sizes],
        num_rows=num_rows, **attrs)
    output = np.concatenate([o.numpy() for o in outputs])
    if digest:
        arrays["rows_sha256"] = np.array(golden_inputs.digest(collected.numpy().view(np.uint8)))
        arrays["output_sha256"] = np.array(golden_inputs.digest(output))
    else:
        arrays["rows"] = collected.numpy().view(np.uint8).copy()
        arrays["output"] = output
    arrays["nonfinite"] = flags.numpy()
    meta = {
        "codec": codec.group_codec, "memory": memory.name,
        # Attributes are float32 in the op: the values the kernel saw.
        "decay": float(np.float32(memory_attrs.get("decay", 0.0))),
        "gradient_scale": float(np.float32(memory_attrs.get("gradient_scale", 1.0))),
        "marker_bytes": payload_dtype.size, "num_rows": num_rows,
        "levels": int(attrs.get("levels", 0)), "k": int(attrs.get("k", 0)),
        "sample_size": int(attrs.get("sample_size", 0)),
        "tensor_k": [int(k) for k in attrs.get("tensor_k", [])],
        "scale": bool(attrs.get("scale", False)), "state_buffers": buffers,
        "nonfinite": nonfinite, "world": world,
        "row_bytes": int(rows[0].numpy().view(np.uint8).size), "digest": digest,
    }
    if kind == "sparse" and algorithm == "dgc":
        meta["padding_slots"] = [padding_slots(r.numpy().view(np.uint8), attrs["k"])
                                 for r in rows]
    arrays["meta"] = np.array(json.dumps(meta))
    arrays["sizes"] = np.array(sizes, np.int64)
    return {"%s__%s" % (key, name): value for name, value in arrays.items()}


def main():
    ops = op_library.load()
    everything = sorted(list(CASES) + list(STRESS_CASES) + list(DIGEST_CASES))
    assert sparse_payload.sparse_k(10, 1.0) == 10  # topk_all: k = n
    arrays = {"cases": np.array(json.dumps(everything))}
    for key, (algorithm, params, memory_name, nonfinite) in CASES.items():
        arrays.update(run_case(ops, key, algorithm, params, memory_name, nonfinite))
    for key, spec in list(STRESS_CASES.items()) + list(DIGEST_CASES.items()):
        algorithm, params, memory_name, nonfinite, sizes, world, kind = spec
        arrays.update(run_case(ops, key, algorithm, params, memory_name, nonfinite, sizes, world,
                               kind))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "group_golden.npz")
    np.savez_compressed(path, **arrays)
    print("wrote", path, "(%d cases)" % len(everything))


if __name__ == "__main__":
    main()
