"""One group vs layer-wise on one rank, tensor counts of mixed sizes (issue 44's regime).

    PYTHONPATH=. python -m benchmarks.group_vs_layerwise ALGORITHMS COUNTS
    e.g. efsignsgd,qsgd,onebit,terngrad 16,48,128,700   (env: T threads [1], R rounds [9],
    KEEP=1 keeps every output alive instead of one element of each)

Counts 16/48/128/700 use mean tensor sizes 1 MB / 250 KB / 64 KB / 6 KB, each
tensor 0.25-1.75x the mean. Both configs are one tf.function over the engine's
MergeComp.reduce_group with identity collectives (the ops benchmark's one-worker
communicator), timed round-robin, slots of >= 50 ms; printed: medians and the
range of the per-round ratios (the run's spread). Not yet wired into
``python -m benchmarks ops``.
"""
import sys, time, statistics, os
import tensorflow as tf
threads = int(os.environ.get("T", "1"))
tf.config.threading.set_intra_op_parallelism_threads(threads)
tf.config.threading.set_inter_op_parallelism_threads(threads)
from tf_mergecomp import MergeComp
from benchmarks.ops import _OneWorkerCommunicator

def sizes_for(count, mean_bytes):
    f = [0.25, 0.5, 1.0, 1.5, 1.75]
    return [max(1, int(mean_bytes / 4 * f[i % 5])) for i in range(count)]

algos = sys.argv[1].split(",")
counts = [int(x) for x in sys.argv[2].split(",")]
means = {16: 1 << 20, 48: 250_000, 128: 64_000, 700: 6_000}
rounds = int(os.environ.get("R", "9"))
keep = os.environ.get("KEEP", "0") == "1"
for count in counts:
    sizes = sizes_for(count, means.get(count, 250_000))
    gen = tf.random.Generator.from_seed(1)
    grads = [gen.normal([n]) for n in sizes]
    for algo in algos:
        mc = MergeComp(algo, partitions=1)
        mc.set_gradient_layout([g.shape for g in grads], [g.dtype for g in grads])
        comm = _OneWorkerCommunicator()
        step = tf.constant(1, tf.int64)
        def fin(outs):
            return outs if keep else tf.stack([o[0] for o in outs])
        @tf.function
        def one(gs):
            out, _ = mc.reduce_group(gs, comm, step)
            return fin(out)
        @tf.function
        def lw(gs):
            outs = []
            for i, g in enumerate(gs):
                out, _ = mc.reduce_group([g], comm, step, start=i, index=i)
                outs.append(out[0])
            return fin(outs)
        fns = {"one": one, "lw": lw}
        for f in fns.values():
            for _ in range(3): f(grads)
        t = {k: [] for k in fns}
        for r in range(rounds):
            for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                calls = 0; st = time.perf_counter()
                while True:
                    res = fns[k](grads); calls += 1
                    el = time.perf_counter() - st
                    if el > 0.05: break
                t[k].append(el / calls)
        m = {k: statistics.median(v) for k, v in t.items()}
        ratios = [a / b for a, b in zip(t["one"], t["lw"])]
        print("%4d %-10s one %.3f ms  lw %.3f ms  ratio %.3f  (per-round ratio %.2f..%.2f)" % (
            count, algo, m["one"] * 1e3, m["lw"] * 1e3, m["one"] / m["lw"], min(ratios), max(ratios)), flush=True)
