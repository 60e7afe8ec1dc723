"""Prints Horovod's machine layout as this rank sees it, and checks one allreduce:
``rank R of S: local L/LS cross C/CS on HOST`` (tests/test_multihost.py)."""

import os
import socket

import horovod.tensorflow as hvd
import tensorflow as tf

hvd.init()
total = hvd.allreduce(tf.constant([float(hvd.rank())]), op=hvd.Sum)
print("rank %d of %d: local %d/%d cross %d/%d on %s, sum of ranks %d" % (
    hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
    hvd.cross_size(), os.environ.get("HOROVOD_HOSTNAME", socket.gethostname()),
    int(total.numpy()[0])), flush=True)
