"""Restarts Horovod three times, the rendezvous server holding a stale global
scope before the first (filled by rank 0) while rank 1 restarts a second late."""

import os
import time
import urllib.request

import horovod.tensorflow as hvd
import tensorflow as tf

from tests.horovodrun import report
from tf_mergecomp import rendezvous
from tf_mergecomp.search import restart as horovod_restart

hvd.init()
server = "%s:%s" % (os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                    os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
stale_before = False
if hvd.rank() == 0:
    for key in ("0", "1", "rank_0", "rank_1"):
        request = urllib.request.Request("http://%s/global/%s" % (server, key),
                                         data=b"no address", method="PUT")
        urllib.request.urlopen(request, timeout=5).read()
    stale_before = rendezvous.scope_is_stale(server, "global")
hvd.allreduce(tf.constant(0.0), name="stale_filled")
problems, summed = [], None
for restart in range(3):
    if hvd.rank() == 1 and restart == 0:
        time.sleep(1.0)
    problems.append(horovod_restart.restart_horovod())
    summed = hvd.allreduce(tf.fill([3], float(hvd.rank() + 1)), op=hvd.Sum,
                           name="after_restart_%d" % restart).numpy().tolist()
report(rank=hvd.rank(), restarts=len(problems), problems=problems, summed=summed,
       stale_before=stale_before)
