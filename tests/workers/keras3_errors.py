"""Bad input to tf_mergecomp.keras, one process (no horovodrun): prints one RESULT line."""

import numpy as np

from tests.horovodrun import report
from tests.workers.keras3_common import keras, small_classifier

import horovod.tensorflow as hvd  # noqa: E402
import tf_mergecomp.keras as mck  # noqa: E402
from tf_mergecomp import MergeComp  # noqa: E402

hvd.init()
errors = {}


def refused(label, function):
    try:
        function()
    except (TypeError, ValueError, RuntimeError) as error:
        errors[label] = "%s: %s" % (type(error).__name__, error)
    else:
        errors[label] = None


refused("compression", lambda: mck.DistributedOptimizer(keras.optimizers.SGD(), compression="dgc"))
refused("optimizer", lambda: mck.DistributedOptimizer("sgd"))
twice = mck.DistributedOptimizer(keras.optimizers.SGD())
refused("twice", lambda: mck.DistributedOptimizer(twice))
refused("lso_outside", lambda: keras.optimizers.LossScaleOptimizer(
    mck.DistributedOptimizer(keras.optimizers.SGD())) and None)
lso = keras.optimizers.LossScaleOptimizer(mck.DistributedOptimizer(keras.optimizers.SGD()))
refused("wrap_lso_outside", lambda: mck.DistributedOptimizer(lso))
refused("jit", lambda: small_classifier().compile(
    mck.DistributedOptimizer(keras.optimizers.SGD()), loss="mse", jit_compile=True))
model = small_classifier()
model.compile(mck.DistributedOptimizer(keras.optimizers.SGD(), compression=MergeComp("dgc")),
              loss="mse")
auto_jit = model.jit_compile
refused("callback_other_mergecomp", lambda: model.fit(
    np.zeros((4, 8), "float32"), np.zeros((4, 4), "float32"), verbose=0, callbacks=[mck.MergeCompCallback(MergeComp("dgc"))]))
model.jit_compile = True
refused("jit_set_later", lambda: model.fit(np.zeros((4, 8), "float32"), np.zeros((4, 4), "float32"), verbose=0,
                                           callbacks=[mck.BroadcastGlobalVariablesCallback(0)]))
plain = keras.optimizers.SGD()
report(errors=errors, auto_jit=auto_jit,
       plain_untouched=not mck.is_distributed(plain), class_name=type(twice).__name__)
