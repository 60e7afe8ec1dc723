"""What a partition search's collectives cost the training after it, and what
restarting Horovod gives back.

    python -m benchmarks restart [--model resnet50] [--algorithm efsignsgd]

Runs ``horovodrun -np 2 --gloo`` on this machine (loopback). Each rank trains
one model with one ``MergeComp`` in a custom loop (``DistributedGradientTape``,
one ``tf.function`` per partition, one TensorFlow thread) through these phases,
timing one group's training step in the marked ones:

    one group*  | a search's worth | one group*  | restart | one group* | (again from
    "before"    | of other layouts | "after"     |         | "restarted" | the search)

A search's worth: layer-wise, 2, 3 and 4 groups and one group, each for
``search_steps`` steps, ``search_rounds`` times, as the confirm rounds run
them. The sequence after "before" runs ``repeats`` times, so "after" and
"restarted" alternate in the same processes. Per phase: the median step,
and the process's system and user CPU time per step (Horovod's background
thread spends its time in the kernel: sockets and sleeps).

Horovod's response cache keeps an entry for every collective name it ran and
coordinates all of them in every cycle; "after" carries the search's entries
(layer-wise: one per tensor), "restarted" only those of one group.
"""

import json
import os
import resource
import sys
import time

from benchmarks import launcher, report

SEARCH_LAYOUTS = ("layerwise", 2, 3, 4, 1)


def run(args):
    spec = {"model": args.model, "algorithm": args.algorithm, "batch_size": args.batch_size,
            "steps": args.steps, "search_steps": args.search_steps,
            "search_rounds": args.search_rounds, "repeats": args.repeats,
            "result_path": os.path.abspath(os.path.join(args.out, "restart.json"))}
    code, log_path = launcher.run_local_horovodrun("benchmarks.restart", spec, args.out,
                                                   args.num_proc, args.timeout)
    if code is None:
        code = "timeout after %.0f s" % args.timeout
    if code != 0:
        raise RuntimeError("horovodrun: %s; see %s" % (code, log_path))
    with open(spec["result_path"]) as f:
        result = json.load(f)
    text = table(result)
    with open(os.path.join(args.out, "restart.md"), "w") as f:
        f.write(text + "\n")
    return text


def table(result):
    """One row per timed phase of rank 0, in the order run."""
    before = result["phases"][0]["step_s"]
    rows = [[phase["name"], 1e3 * phase["step_s"], report.ratio(phase["step_s"], before),
             1e3 * phase["system_s"], 1e3 * phase["user_s"]] for phase in result["phases"]]
    return ("%s, %s, %d ranks, batch %d, one group's training step (medians of %d steps)\n\n"
            % (result["model"], result["algorithm"], result["size"], result["batch_size"],
               result["steps"])
            + report.markdown_table(
                ["phase", "step ms", "vs before", "system CPU ms/step", "user CPU ms/step"], rows)
            + "\n\nHorovod restarts took %s s; the search's worth of layouts %s s each time."
            % (", ".join("%.2f" % s for s in result["restart_s"]),
               ", ".join("%.0f" % s for s in result["search_s"])))


def worker_main(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    from benchmarks import worker

    worker._configure_threads()
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from tf_mergecomp import MergeComp
    from tf_mergecomp.search import restart as horovod_restart
    from tf_mergecomp.keras2 import keras
    from benchmarks import models

    hvd.init()
    keras.utils.set_random_seed(1234)
    model = models.build_model(spec["model"])
    features, labels = next(iter(models.synthetic_dataset(spec["model"], spec["batch_size"],
                                                          seed=hvd.rank(), model=model)))
    hvd.broadcast_variables(model.variables, root_rank=0)
    optimizer = keras.optimizers.SGD(learning_rate=0.001)
    compression = MergeComp(spec["algorithm"], partitions=1)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    train_step = models.tape_train_step(model, optimizer, loss_fn, compression)

    functions = {}

    def train(layout, steps, untimed=2):
        compression.set_partition(layout)
        if layout not in functions:
            functions[layout] = tf.function(lambda: train_step(features, labels))
        for _ in range(untimed):
            functions[layout]().numpy()
        seconds = []
        usage = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(steps):
            started = time.perf_counter()
            functions[layout]().numpy()
            seconds.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_SELF)
        return {"step_s": report.median(seconds),
                "system_s": (after.ru_stime - usage.ru_stime) / steps,
                "user_s": (after.ru_utime - usage.ru_utime) / steps}

    blocker = horovod_restart.restart_blocker()
    if blocker is not None:
        raise RuntimeError("this benchmark restarts Horovod, which it cannot here: " + blocker)
    result = {"model": spec["model"], "algorithm": spec["algorithm"], "size": hvd.size(),
              "batch_size": spec["batch_size"], "steps": spec["steps"], "phases": [],
              "restart_s": [], "search_s": []}
    result["phases"].append(dict(train(1, spec["steps"]), name="before"))
    for repeat in range(spec["repeats"]):
        started = time.perf_counter()
        for _ in range(spec["search_rounds"]):
            for layout in SEARCH_LAYOUTS:
                train(layout, spec["search_steps"], untimed=1)
        result["search_s"].append(time.perf_counter() - started)
        result["phases"].append(dict(train(1, spec["steps"]), name="after %d" % (repeat + 1)))
        started = time.perf_counter()
        horovod_restart.restart_horovod()
        result["restart_s"].append(time.perf_counter() - started)
        result["phases"].append(dict(train(1, spec["steps"]), name="restarted %d" % (repeat + 1)))
    if hvd.rank() == 0:
        with open(spec["result_path"], "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(worker_main(sys.argv[2]))
    print("usage: python -m benchmarks.restart --worker SPEC.json "
          "(or python -m benchmarks restart)", file=sys.stderr)
    sys.exit(2)
