"""Each rank allreduces a known tensor and checks the result itself."""

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

from tests.horovodrun import report

hvd.init()
value = tf.fill([5], float(hvd.rank() + 1))
summed = hvd.allreduce(value, op=hvd.Sum, name="smoke").numpy()
expected = sum(range(1, hvd.size() + 1))
assert np.allclose(summed, expected), (summed, expected)
report(rank=hvd.rank(), size=hvd.size(), summed=summed.tolist())
