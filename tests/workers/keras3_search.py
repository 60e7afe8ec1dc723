"""Keras 3 fit with tf_mergecomp.keras.MergeCompCallback on two real Gloo workers.

    keras3_search.py CODEC SAVE_PATH

Reports the chosen partition, the candidates, what the search cost (traces,
tracings of Keras 3's train function), the losses and the weights checksum.
"""

import sys

from tests.horovodrun import report
from tests.workers.keras3_common import (classification_data, keras, loss_fn, small_classifier,
                                         weights_checksum)

import horovod.tensorflow as hvd  # noqa: E402
import tf_mergecomp.keras as mck  # noqa: E402
from tf_mergecomp import MergeComp  # noqa: E402

SEARCH = dict(steps_per_candidate=2, max_groups=3, finalists=2, rounds=3, warmup_steps=1,
              profiled_steps=3, resolve_rounds=2)

hvd.init()
x, y = classification_data(hvd.rank())
model = small_classifier(width=32)
mc = MergeComp(sys.argv[1])
model.compile(mck.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=mc), loss=loss_fn())
callback = mck.MergeCompCallback(mc, save_path=sys.argv[2], verbose=1, **SEARCH)
history = model.fit(x, y, batch_size=16, epochs=6, verbose=0, shuffle=False,
                    callbacks=[mck.BroadcastGlobalVariablesCallback(0), callback])
search = callback.search
report(done=search.done, steps_aside=mc.steps_aside,
       splits=None if mc.steps_aside else list(mc.splits),
       candidates=[str(r["layout"]) for r in search.history], cost=search.cost,
       final_collectives_per_step=search.final_collectives_per_step,
       groups=None if mc.steps_aside else mc.num_groups,
       collectives_per_group=mc.compressor.collectives_per_group(),
       losses=[float(v) for v in history.history["loss"]], checksum=weights_checksum(model))
