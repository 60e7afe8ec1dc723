"""Writes group_golden.npz: what the CPU group ops (MergecompGroupEncode /
MergecompGroupDecode) produce for one group of mixed sizes (0- and 1-element
tensors included) on 3 simulated workers, for every group codec and memory
the library uses. The CUDA group launchers must reproduce it
(tests/test_cuda_launchers.py, on a GPU host without TensorFlow). Run from
the repository root after `make build`:

    .venv/bin/python tests/data/make_group_golden.py

Keys: "<case>__meta" (JSON), "<case>__sizes", and per worker w
"<case>__input<w>" (the group's gradients back to back), "__state<w>" /
"__state_after<w>" (each tensor's state buffers, tensor after tensor),
"__row<w>" (payload + markers, bytes), "__context<w>"; then "__rows" (what the
decoder was given), "__output" and "__nonfinite".
"""

import json
import os

import numpy as np
import tensorflow as tf

from tf_mergecomp import _ops, compressors, memory as memories

SIZES = [0, 1, 7, 300, 1, 2053, 64, 0, 517]
WORLD = 3
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


def worker_inputs(w, nonfinite):
    rng = np.random.default_rng(w)
    tensors = [(rng.standard_normal(n) * (1 + t)).astype(np.float32) for t, n in enumerate(SIZES)]
    if nonfinite is not None and nonfinite[0] == w:
        tensors[nonfinite[1]][0] = np.nan
    return tensors


def initial_state(w, buffers):
    rng = np.random.default_rng(100 + w)
    return [(0.1 * rng.standard_normal(buffers * n)).astype(np.float32) for n in SIZES]


def run_case(ops, key, algorithm, params, memory_name, nonfinite):
    codec = compressors.get(algorithm, **params)
    if memory_name is None:
        memory = memories.get(codec.default_memory, **codec.default_memory_params())
    else:
        memory = memories.get(memory_name)
    attrs = dict(codec=codec.group_codec, **codec.group_op_attrs(SIZES))
    memory_attrs = memory.op_attrs()
    buffers = len(memory.state_names)
    payload_dtype = tf.as_dtype(codec.payload_dtype)
    arrays = {}
    rows, contexts = [], []
    for w in range(WORLD):
        grads = [tf.constant(t) for t in worker_inputs(w, nonfinite)]
        state = initial_state(w, buffers) if buffers else []
        variables = [tf.Variable(s) for s in state]
        seed = 77 if codec.shared_seed else 1000 + w
        payload, context = ops.mergecomp_group_encode(
            grads, [v.handle for v in variables], tf.constant(seed, tf.int64),
            payload_type=payload_dtype, memory=memory.name, **memory_attrs, **attrs)
        rows.append(payload)
        contexts.append(context)
        arrays["input%d" % w] = np.concatenate([g.numpy() for g in grads])
        arrays["seed%d" % w] = np.array(seed, np.int64)
        if buffers:
            arrays["state%d" % w] = np.concatenate(state)
            arrays["state_after%d" % w] = np.concatenate([v.numpy() for v in variables])
        arrays["row%d" % w] = payload.numpy().view(np.uint8).copy()
        arrays["context%d" % w] = context.numpy()
    if codec.collective == compressors.ALLREDUCE:
        collected, num_rows = rows[0], 1
    else:
        collected, num_rows = tf.concat(rows, 0), WORLD
    outputs, flags = ops.mergecomp_group_decode(
        collected, contexts[0], T=[tf.float32] * len(SIZES), shapes=[[n] for n in SIZES],
        num_rows=num_rows, **attrs)
    arrays["rows"] = collected.numpy().view(np.uint8).copy()
    arrays["output"] = np.concatenate([o.numpy() for o in outputs])
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
        "nonfinite": nonfinite,
    }
    arrays["meta"] = np.array(json.dumps(meta))
    arrays["sizes"] = np.array(SIZES, np.int64)
    return {"%s__%s" % (key, name): value for name, value in arrays.items()}


def main():
    ops = _ops.load()
    arrays = {"cases": np.array(json.dumps(sorted(CASES)))}
    for key, (algorithm, params, memory_name, nonfinite) in CASES.items():
        arrays.update(run_case(ops, key, algorithm, params, memory_name, nonfinite))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "group_golden.npz")
    np.savez_compressed(path, **arrays)
    print("wrote", path, "(%d cases)" % len(CASES))


if __name__ == "__main__":
    main()
