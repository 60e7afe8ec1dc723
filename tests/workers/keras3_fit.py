"""Keras 3 data parallelism through tf_mergecomp.keras, one scenario after another.

    keras3_fit.py SCENARIO[,SCENARIO...] [DIRECTORY]

Every rank trains on its own data (tests/workers/keras3_common.py) and reports,
per scenario, a checksum of its trainable weights and what the scenario checks.
Scenarios:
  control     a plain Keras 3 optimizer (no averaging), initial weights broadcast
  none        DistributedOptimizer(SGD(clipnorm), compression=None): Horovod allreduce
  efsignsgd   MergeComp("efsignsgd", partitions=1): one group, error feedback
  dgc_accum   MergeComp("dgc", partitions=1), gradient_accumulation_steps=2, use_ema
  lso         mixed_float16, DistributedOptimizer(LossScaleOptimizer(SGD, initial_scale=2**40),
              efsignsgd): overflowing steps skipped on every rank until the scale drops
  mixed       mixed_float16 policy: compile wraps the DistributedOptimizer in a LossScaleOptimizer
  tape        custom loop: DistributedGradientTape(tape, MergeComp("efsignsgd")) + tf.function
  resume      fit 2 epochs, against fit 1 epoch + per-rank .weights.h5 + load + fit 1 epoch;
              and rank 0's file loaded on every rank (state reset, one warning)
"""

import os
import sys

import numpy as np

from tests.horovodrun import report
from tests.workers.keras3_common import (classification_data, keras, loss_fn, small_classifier,
                                         tf, weights_checksum)

import horovod.tensorflow as hvd  # noqa: E402
import tf_mergecomp.keras as mck  # noqa: E402
from tf_mergecomp import MergeComp  # noqa: E402

hvd.init()
RANK = hvd.rank()
x, y = classification_data(RANK)
EPOCHS = 3
FIT = dict(batch_size=32, epochs=EPOCHS, verbose=0, shuffle=False)


def state_summary(mc):
    state = mc.existing_state_variables() or []
    values = [np.asarray(v.numpy()) for v in state]
    return {"state_sum": float(sum(np.abs(v).sum() for v in values)),
            "state_finite": bool(all(np.isfinite(v).all() for v in values)),
            "step": int(mc.step.numpy()), "groups": mc.num_groups,
            "collectives": int(mc.collectives_executed.numpy())}


def fit(model, optimizer, callbacks=(), **kwargs):
    model.compile(optimizer, loss=loss_fn(), metrics=["accuracy"])
    history = model.fit(x, y, callbacks=[mck.BroadcastGlobalVariablesCallback(0),
                                         mck.MetricAverageCallback()] + list(callbacks),
                        **dict(FIT, **kwargs))
    return history.history


def scenario(name, directory):
    result = {"scenario": name}
    if name == "control":
        model = small_classifier()
        history = fit(model, keras.optimizers.SGD(0.1))
    elif name == "none":
        model = small_classifier()
        opt = mck.DistributedOptimizer(keras.optimizers.SGD(0.1, clipnorm=0.5))
        history = fit(model, opt)
    elif name == "efsignsgd":
        model = small_classifier()
        mc = MergeComp("efsignsgd", partitions=1)
        history = fit(model, mck.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=mc))
        result.update(state_summary(mc))
    elif name == "dgc_accum":
        model = small_classifier()
        mc = MergeComp("dgc", partitions=1, ratio=0.1)
        opt = keras.optimizers.SGD(0.1, momentum=0.5, gradient_accumulation_steps=2, use_ema=True)
        history = fit(model, mck.DistributedOptimizer(opt, compression=mc))
        result.update(state_summary(mc))
        ema = [np.asarray(v) for v in opt._model_variables_moving_average]
        result["ema_checksum"] = float(sum(np.float64(v).sum() * (i + 1)
                                           for i, v in enumerate(ema)))
        result["iterations"] = int(opt.iterations.numpy())
    elif name == "lso":
        # float16 activations: gradients at a loss scale of 2**40 overflow until it drops.
        keras.mixed_precision.set_dtype_policy("mixed_float16")
        try:
            model = small_classifier()
            mc = MergeComp("efsignsgd")
            opt = mck.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(
                keras.optimizers.SGD(0.05), initial_scale=2.0 ** 40), compression=mc)
            history = fit(model, opt)
        finally:
            keras.mixed_precision.set_dtype_policy("float32")
        result.update(state_summary(mc))
        result["scale"] = float(opt.dynamic_scale.numpy())
    elif name == "mixed":
        keras.mixed_precision.set_dtype_policy("mixed_float16")
        try:
            model = small_classifier()
            mc = MergeComp("efsignsgd")
            opt = mck.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=mc)
            history = fit(model, opt)
        finally:
            keras.mixed_precision.set_dtype_policy("float32")
        result.update(state_summary(mc))
        result["outer"] = type(model.optimizer).__name__
        result["outer_distributed"] = mck.is_distributed(model.optimizer)
        result["scale"] = float(model.optimizer.dynamic_scale.numpy())
    elif name == "tape":
        model = small_classifier()
        mc = MergeComp("efsignsgd")
        opt = keras.optimizers.SGD(0.05)
        opt.build(model.trainable_variables)
        mck.broadcast_variables(model, 0)
        compute_loss = loss_fn()

        @tf.function
        def step(features, labels):
            with tf.GradientTape() as tape:
                loss = compute_loss(labels, model(features, training=True))
            tape = mck.DistributedGradientTape(tape, compression=mc)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply(grads, model.trainable_variables)
            return loss

        losses = []
        for _ in range(EPOCHS):
            for start in range(0, len(x), 32):
                losses.append(float(step(x[start:start + 32], y[start:start + 32])))
        history = {"loss": [losses[0], losses[-1]]}
        result.update(state_summary(mc))
    elif name == "resume":
        return resume(directory)
    else:
        raise SystemExit("unknown scenario %r" % name)
    result["checksum"] = weights_checksum(model)
    result["loss"] = [float(v) for v in history["loss"]]
    result["accuracy"] = [float(v) for v in history.get("accuracy", [])]
    return result


def build_resumable():
    model = small_classifier()
    mc = MergeComp("efsignsgd", partitions=2)
    model.compile(mck.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), compression=mc),
                  loss=loss_fn())
    return model, mc


def resume(directory):
    callbacks = [mck.BroadcastGlobalVariablesCallback(0)]
    straight, _ = build_resumable()
    straight.fit(x, y, callbacks=callbacks, **dict(FIT, epochs=2))
    first, mc_first = build_resumable()
    first.fit(x, y, callbacks=[mck.BroadcastGlobalVariablesCallback(0)], **dict(FIT, epochs=1))
    own = os.path.join(directory, "rank%d.weights.h5" % RANK)
    first.save_weights(own)
    hvd.allreduce(tf.constant(0), name="written")
    results = {"scenario": "resume", "straight": weights_checksum(straight)}
    for label, path in (("own", own), ("rank0", os.path.join(directory, "rank0.weights.h5"))):
        model, mc = build_resumable()
        model.optimizer.build(model.trainable_variables)
        model.load_weights(path)
        # No broadcast: every rank loaded the same weights, or its own (equal) ones.
        model.fit(x, y, **dict(FIT, epochs=1))
        results[label] = weights_checksum(model)
        results[label + "_outcome"] = mc.rank_state.last_outcome
        results[label + "_step"] = int(mc.step.numpy())
    results["saved_step"] = int(mc_first.step.numpy())
    return results


names = sys.argv[1].split(",")
directory = sys.argv[2] if len(sys.argv) > 2 else "."
for name in names:
    report(**scenario(name, directory))
