"""Writes powersgd_golden.npz: what the CPU PowerSGD group ops
(MergecompPowersgdGroupP, ...Q, ...Finish) produce for one group of mixed
shapes (matrices 1 x n and n x 1, a rank-3 tensor, an all-zero matrix, a
scalar, a vector and empty tensors) on 2 simulated workers. The CUDA
PowerSGD launchers must reproduce it to float32 rounding
(tests/test_cuda_launchers.py, on a GPU host without TensorFlow). Run from
the repository root after `make build`:

    .venv/bin/python tests/data/make_powersgd_golden.py

Keys: "<case>__meta" (JSON: shapes, rank, residual, dtype, the non-finite
(worker, tensor)); per worker w "<case>__input<w>" (the gradients back to
back, float32 values of the case's dtype), "__state<w>" / "__state_after<w>"
(each tensor's state variable, tensor after tensor), "__p<w>",
"__compensated<w>", "__p_orthonormal<w>", "__q_local<w>", "__output<w>"
(float32 values of the outputs), "__nonfinite<w>"; and "__p_mean", "__q_mean"
(what the allreduces gave every worker).
"""

import json
import os

import numpy as np
import tensorflow as tf

from tf_mergecomp import ops as op_library

SHAPES = [(16, 8), (), (0,), (5,), (1, 40), (40, 1), (3, 4, 6), (0, 7), (12, 12), (100, 30)]
ZERO_TENSOR = 8  # all zero gradient and state: Gram-Schmidt's zero columns
WORLD = 2
RANK = 2
# case -> (residual, dtype, (worker, tensor) made non-finite or None)
CASES = {
    "plain": (False, "float32", None),
    "residual": (True, "float32", None),
    "residual_float16": (True, "float16", None),
    "residual_nonfinite": (True, "float32", (1, 0)),
}


def layout(shapes, rank):
    """Per tensor: (size, low_rank, cols, rank) as powersgd_op.h's layout."""
    out = []
    for shape in shapes:
        size = int(np.prod(shape, dtype=np.int64))
        low = len(shape) >= 2 and size > 0
        cols = shape[-1] if low else 0
        out.append((size, low, cols, min(rank, size // cols, cols) if low else 0))
    return out


def worker_inputs(w, dtype, nonfinite):
    rng = np.random.default_rng(w)
    tensors = []
    for t, shape in enumerate(SHAPES):
        values = rng.standard_normal(shape).astype(np.float32) * (1 + t)
        if t == ZERO_TENSOR:
            values[...] = 0
        tensors.append(values.astype(dtype))
    if nonfinite is not None and nonfinite[0] == w:
        tensors[nonfinite[1]].flat[0] = np.inf
    return tensors


def initial_state(w, residual):
    rng = np.random.default_rng(100 + w)
    state = []
    for t, (size, low, cols, rank) in enumerate(layout(SHAPES, RANK)):
        e = (0.1 * rng.standard_normal(size if residual else 0)).astype(np.float32)
        # The initial Q is the same on every worker (the codec's, seeded).
        q = np.random.default_rng(200 + t).standard_normal(cols * rank).astype(np.float32)
        if t == ZERO_TENSOR:
            e[...] = 0
        state.append(np.concatenate([e, q]))
    return state


def run_case(ops, key, residual, dtype, nonfinite):
    tf_dtype = tf.as_dtype(dtype)
    arrays, ps, variables, grads, stage = {}, [], [], [], {}
    for w in range(WORLD):
        inputs = worker_inputs(w, dtype, nonfinite)
        state = initial_state(w, residual)
        variables.append([tf.Variable(s) for s in state])
        grads.append([tf.constant(g) for g in inputs])
        p, compensated = ops.mergecomp_powersgd_group_p(
            grads[w], [v.handle for v in variables[w]], rank=RANK, residual=residual)
        ps.append(p)
        stage[w] = {"compensated": compensated}
        arrays["input%d" % w] = np.concatenate([g.astype(np.float32).ravel() for g in inputs])
        arrays["state%d" % w] = np.concatenate(state)
        arrays["p%d" % w] = p.numpy()
        arrays["compensated%d" % w] = compensated.numpy()
    p_mean = tf.add_n(ps) / WORLD
    q_locals = []
    for w in range(WORLD):
        p_orthonormal, q_local = ops.mergecomp_powersgd_group_q(
            p_mean, stage[w]["compensated"], shapes=SHAPES, rank=RANK)
        stage[w]["p_orthonormal"], stage[w]["q_local"] = p_orthonormal, q_local
        q_locals.append(q_local)
        arrays["p_orthonormal%d" % w] = p_orthonormal.numpy()
        arrays["q_local%d" % w] = q_local.numpy()
    q_mean = tf.add_n(q_locals) / WORLD
    for w in range(WORLD):
        outputs, flags = ops.mergecomp_powersgd_group_finish(
            stage[w]["p_orthonormal"], stage[w]["q_local"], q_mean, stage[w]["compensated"],
            [v.handle for v in variables[w]], T=[tf_dtype] * len(SHAPES), shapes=SHAPES,
            rank=RANK, residual=residual)
        arrays["output%d" % w] = np.concatenate(
            [tf.cast(o, tf.float32).numpy().ravel() for o in outputs])
        arrays["nonfinite%d" % w] = flags.numpy()
        arrays["state_after%d" % w] = np.concatenate([v.numpy() for v in variables[w]])
    arrays["p_mean"] = p_mean.numpy()
    arrays["q_mean"] = q_mean.numpy()
    meta = {"shapes": [list(s) for s in SHAPES], "rank": RANK, "residual": residual,
            "dtype": dtype, "world": WORLD, "nonfinite": nonfinite}
    arrays["meta"] = np.array(json.dumps(meta))
    return {"%s__%s" % (key, name): value for name, value in arrays.items()}


def main():
    ops = op_library.load()
    arrays = {"cases": np.array(json.dumps(sorted(CASES)))}
    for key, (residual, dtype, nonfinite) in CASES.items():
        arrays.update(run_case(ops, key, residual, dtype, nonfinite))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "powersgd_golden.npz")
    np.savez_compressed(path, **arrays)
    print("wrote", path, "(%d cases)" % len(CASES))


if __name__ == "__main__":
    main()
