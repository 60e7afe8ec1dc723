"""The seeds of the codecs' random draws (QSGD, TernGrad, random-k).

Every group's encode op takes one int64 seed; tensor i of the group draws with
``seed + (i << TENSOR_SHIFT)``. The seed packs, from the high bits down:

    user seed (bits 48..61) | step (bits 24..47) | first tensor (12..23) | worker (0..11)

so that step, group and worker never collide for steps < 2**24 per user seed,
4096 tensors and 4095 workers. More tensors or workers are refused at trace
time (``check_layout``); steps wrap (``step_in_cycle``) rather than run into
the user seed's bits. A group is named by its first tensor's index, so codecs
that draw per tensor draw the same whatever the partition. Codecs whose draws
must agree on every rank (``shared_seed``) use worker 0; the others use their
rank + 1.

The seeds are host scalars: the encode kernels take them in host memory, so on
a GPU a step copies no seed from the device.
"""

import numbers

import tensorflow as tf

from tf_mergecomp import compressors

STEP_SHIFT = 24
USER_SEED_SHIFT = 48
TENSOR_SHIFT = compressors.TENSOR_SEED_SHIFT
TENSOR_LIMIT = 1 << (STEP_SHIFT - TENSOR_SHIFT)
WORKER_LIMIT = (1 << TENSOR_SHIFT) - 1
STEP_LIMIT = 1 << (USER_SEED_SHIFT - STEP_SHIFT)
USER_SEED_LIMIT = 1 << 14
HOST = "/device:CPU:0"


def check_user_seed(seed):
    """The user's seed as an int, or ValueError."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) \
            or not 0 <= seed < USER_SEED_LIMIT:
        raise ValueError("seed must be an integer in [0, %d), got %r" % (USER_SEED_LIMIT, seed))
    return int(seed)


def check_layout(num_tensors, world_size):
    """Refuses gradient lists and jobs whose indices do not fit their bits."""
    if num_tensors > TENSOR_LIMIT:
        raise ValueError(
            "MergeComp supports at most %d gradient tensors per optimizer (their index is part "
            "of every random draw's seed); this model has %d" % (TENSOR_LIMIT, num_tensors))
    if world_size > WORKER_LIMIT:
        raise ValueError(
            "MergeComp supports at most %d workers (the rank is part of every random draw's "
            "seed); this job has %d" % (WORKER_LIMIT, world_size))


def step_in_cycle(step_variable):
    """The step counter's value modulo ``STEP_LIMIT``, on the host."""
    with tf.device(HOST):
        return step_variable.read_value() % STEP_LIMIT


def group_seed(step, first_tensor, worker, user_seed):
    """The seed of the group whose first tensor is ``first_tensor``, drawn by
    ``worker`` (0 for draws shared by every rank, else rank + 1) at ``step``
    (an int64 host tensor from ``step_in_cycle``)."""
    constant = (first_tensor << TENSOR_SHIFT) + worker + (user_seed << USER_SEED_SHIFT)
    with tf.device(HOST):
        return step * (1 << STEP_SHIFT) + tf.constant(constant, tf.int64)
