"""PowerSGD: rank-r compression by one step of power iteration.

Algorithm (Vogels, Karimireddy & Jaggi 2019, "PowerSGD: Practical Low-Rank
Gradient Compression for Distributed Optimization"), per group:

  M = the flat buffer as a rows x cols matrix, cols = ceil(sqrt(n)),
      rows = ceil(n / cols), zero-padded after the n-th value;
  P = M Q;          P <- allreduce_mean(P);   P <- orthonormalise(P)
  Q_w = M^T P;      Q <- allreduce_mean(Q_w)
  result = (P Q^T) cropped to n (already the average over workers).

Q is kept between steps (warm start: one power-iteration step per training
step converges over steps). Orthonormalisation is Gram-Schmidt on P's columns,
applied twice; a column whose norm falls below 1e-30 becomes zero (so an
all-zero gradient gives a zero result, not NaN). NaN or Inf in M propagate to
the result (matrix products spread them over the group).

Error feedback ("sent"): this worker's own contribution P Q_w^T, built from the
shared orthonormal P and this worker's Q_w = M^T P. Its mean over workers is
the result, and the residual memory keeps M - P Q_w^T, the part of M outside
span(P): the choice of PowerSGD's paper (Algorithm 2, e <- M - P Q_w^T with the
aggregated P).

State: Q per group, a cols x r tf.Variable created on first use (under
tf.init_scope) from a deterministic seeded normal draw, so every worker starts
from the same Q; kept in ``self.q_variables`` (this object is a tf.Module, so
the variables checkpoint with it). Keys: "q_<group index>_<n>".

Wire format: two float32 allreduces per step, P (rows x r) and Q (cols x r):
4 * r * (rows + cols) bytes. The effective rank is min(rank, rows, cols).
Defaults: rank = 1 (rank < 1 is a ValueError).

Ops: MergecompPowersgdPadReshape and MergecompPowersgdOrthonormalize; the
matrix products use tf.linalg.matmul. The plain-TF reference pads with tf.pad
and orthonormalises with stock ops; it agrees with the op to float32 rounding
(sums are accumulated in a different order).
"""

import math
import zlib

import tensorflow as tf

from tf_mergecomp._ops import load
from tf_mergecomp.compressors import _random
from tf_mergecomp.compressors._sparse import static_length
from tf_mergecomp.compressors.base import (ALLREDUCE, Compressor, as_float32,
                                           check_positive_int)

MIN_NORM = 1e-30  # kPowersgdMinNorm in custom_ops/cc/kernels/powersgd_op.h


def matrix_shape(n):
    """(rows, cols) of the near-square matrix holding n values."""
    if n == 0:
        return 0, 0
    cols = int(math.ceil(math.sqrt(n)))
    return -(-n // cols), cols


def reference_orthonormalize(matrix):
    """Gram-Schmidt, twice, on the columns of a rows x r float32 matrix."""
    columns = []
    for j in range(matrix.shape[1]):
        column = matrix[:, j]
        for _ in range(2):
            for previous in columns:
                column = column - tf.reduce_sum(previous * column) * previous
        norm = tf.sqrt(tf.reduce_sum(tf.cast(column, tf.float64) ** 2))
        scale = tf.where(norm > MIN_NORM, 1.0 / norm, tf.zeros_like(norm))
        columns.append(column * tf.cast(scale, tf.float32))
    return tf.stack(columns, axis=1)


class PowerSGDCompressor(Compressor, tf.Module):
    name = "powersgd"
    collective = ALLREDUCE
    default_memory = "residual"

    def __init__(self, rank=1, backend="op"):
        tf.Module.__init__(self, name="powersgd")
        Compressor.__init__(self, backend)
        self.rank = check_positive_int("rank", rank)
        self.q_variables = {}

    @property
    def params(self):
        return {"rank": self.rank}

    def effective_rank(self, n):
        rows, cols = matrix_shape(n)
        return min(self.rank, rows, cols)

    def payload_nbytes(self, n):
        rows, cols = matrix_shape(n)
        return 4 * self.effective_rank(n) * (rows + cols)

    def collectives_per_group(self):
        return 2

    def compress(self, flat, seed):
        raise NotImplementedError("powersgd needs two collectives per step: call reduce()")

    def decompress(self, payload, ctx):
        raise NotImplementedError("powersgd needs two collectives per step: call reduce()")

    def combine(self, collected, ctx, world_size):
        raise NotImplementedError("powersgd needs two collectives per step: call reduce()")

    @staticmethod
    def _group_name(group, n):
        index = group[0] if isinstance(group, tuple) and group else group
        return "q_%s_%d" % (index, n)

    def q_variable(self, group, n):
        """The group's Q (cols x r), created on first use, identical on all workers."""
        key = self._group_name(group, n)
        if key not in self.q_variables:
            _, cols = matrix_shape(n)
            r = self.effective_rank(n)
            seed = zlib.crc32(key.encode("ascii"))
            with tf.init_scope():
                # Box-Muller on counter-based uniforms: a fixed function of the key.
                uniform = _random.random_uniform(tf.constant(seed, tf.int64), 2 * cols * r)
                radius = tf.sqrt(-2.0 * tf.math.log(1.0 - uniform[: cols * r]))
                angle = 2.0 * math.pi * uniform[cols * r:]
                initial = tf.reshape(radius * tf.cos(angle), [cols, r])
                self.q_variables[key] = tf.Variable(initial, trainable=False, name=key)
        return self.q_variables[key]

    def _matrix(self, values, rows, cols):
        if self.backend == "op":
            return load().mergecomp_powersgd_pad_reshape(values, rows=rows, cols=cols)
        n = values.shape[0]
        return tf.reshape(tf.pad(values, [[0, rows * cols - n]]), [rows, cols])

    def _orthonormalize(self, matrix):
        if self.backend == "op":
            return load().mergecomp_powersgd_orthonormalize(matrix)
        return reference_orthonormalize(matrix)

    def reduce(self, flat, seed, communicator, group, sizes=None):
        n = static_length(flat)
        dtype = flat.dtype
        if n == 0:
            empty = tf.zeros([0], dtype)
            return empty, lambda: empty
        rows, cols = matrix_shape(n)
        matrix = self._matrix(as_float32(flat), rows, cols)
        q = self.q_variable(group, n)
        p = tf.linalg.matmul(matrix, q)
        p = communicator.allreduce_mean(p, (group, "P"))
        p = self._orthonormalize(p)
        q_local = tf.linalg.matmul(matrix, p, transpose_a=True)
        q_mean = communicator.allreduce_mean(q_local, (group, "Q"))
        q.assign(q_mean)

        def crop(product):
            return tf.cast(tf.reshape(product, [-1])[:n], dtype)

        averaged = crop(tf.linalg.matmul(p, q_mean, transpose_b=True))
        return averaged, lambda: crop(tf.linalg.matmul(p, q_local, transpose_b=True))
