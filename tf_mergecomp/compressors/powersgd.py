"""PowerSGD: each gradient matrix compressed to rank r by one step of power iteration.

Algorithm (Vogels, Karimireddy & Jaggi 2019, "PowerSGD: Practical Low-Rank
Gradient Compression for Distributed Optimization", Algorithms 1 and 2), for
each tensor i of rank >= 2 of a group:

  M_i = the tensor after the memory's compensation (g_i + e_i) as a
        rows_i x cols_i row-major matrix: cols_i = its last dimension
        (TensorFlow's kernel layouts put output channels last), rows_i =
        n_i / cols_i; effective rank r_i = min(rank, rows_i, cols_i);
  P_i = M_i Q_i;         every P_i of the group, followed by the raw values of
                         its other tensors, in ONE allreduce-mean;
  P_i <- orthonormalise(P_i);
  Qlocal_i = M_i^T P_i;  every Qlocal_i in ONE allreduce-mean -> Qmean_i;
  result_i = P_i Qmean_i^T (already the average over workers), in the
             tensor's shape and dtype; Q_i <- Qmean_i (warm start).

Tensors of rank <= 1 (biases, scalars) and empty tensors are sent as they
are, so they are averaged exactly. A tensor's result does not depend on its
group. Orthonormalisation is Gram-Schmidt on P_i's columns, applied twice,
with float64 dot products and norms; a column whose norm falls below 1e-30
becomes zero (an all-zero gradient gives zeros, not NaN). NaN or Inf in M_i
make that tensor's result all NaN on every worker (``reduce_group``).

Error feedback ("sent"): this worker's own contribution P_i Qlocal_i^T, whose
mean over workers is the result; the residual memory keeps
e_i = M_i - P_i Qlocal_i^T, the part of M_i outside span(P_i) (Algorithm 2).
Tensors sent as they are keep e_i = 0.

State, in each tensor's engine variable after the memory's buffers
(tf_mergecomp/mergecomp.py): [e_i (n_i floats, residual memory), Q_i
(cols_i x r_i, row-major)]; tensors of rank <= 1 keep no Q. Q_i starts as a
normal draw seeded by the tensor's index in the gradient list (not its group),
so every worker starts from the same Q_i, and Q_i survives partition changes
and checkpoints.

Wire format: two float32 allreduces per group, P then Q (Q empty when the
group has no matrix): 4 * sum_i r_i * (rows_i + cols_i) + 4 * (elements of the
tensors sent as they are) bytes per worker (``payload_nbytes``).

Defaults: rank = 1 (rank < 1 is a ValueError).

Backends: "op" runs three fused ops per group, MergecompPowersgdGroupP, ...Q
and ...Finish (custom_ops/cc/kernels/powersgd_op.h), with the memories "none"
and "residual"; backend "reference", or another memory, runs the plain-TF path
(tf.linalg.matmul per tensor). The two agree to float32 rounding (sums are
accumulated in different orders).
"""

import collections
import math
import numbers
import zlib

import tensorflow as tf

from tf_mergecomp.ops import load
from tf_mergecomp._validation import check_positive_int
from tf_mergecomp.compressors import counter_random
from tf_mergecomp.compressors.base import ALLREDUCE, Compressor, as_float32

MIN_NORM = 1e-30  # kPowersgdMinNorm in custom_ops/cc/kernels/powersgd_op.h
# Memories the fused ops implement (state [e_i, Q_i] or [Q_i]).
FUSED_MEMORIES = ("none", "residual")

MatrixView = collections.namedtuple("MatrixView", ["rows", "cols", "rank"])


def matrix_view(shape, rank):
    """The rows x cols matrix and effective rank of a tensor of this shape, or
    None for a tensor sent as it is (rank <= 1, or no elements)."""
    shape = tf.TensorShape(shape)
    if not shape.is_fully_defined():
        raise ValueError("powersgd needs gradients of static shape, got %s" % (shape,))
    n = shape.num_elements()
    if shape.rank < 2 or n == 0:
        return None
    cols = shape[-1]
    rows = n // cols
    return MatrixView(rows, cols, min(rank, rows, cols))


def reference_orthonormalize(matrix):
    """Gram-Schmidt, twice, on the columns of a rows x r float32 matrix (the
    fused op's arithmetic: float64 dot products and norms, float32 updates)."""
    columns = []
    for j in range(matrix.shape[1]):
        column = matrix[:, j]
        for _ in range(2):
            for previous in columns:
                dot = tf.reduce_sum(tf.cast(previous, tf.float64) * tf.cast(column, tf.float64))
                column = column - tf.cast(dot, tf.float32) * previous
        norm = tf.sqrt(tf.reduce_sum(tf.cast(column, tf.float64) ** 2))
        scale = tf.where(norm > MIN_NORM, 1.0 / norm, tf.zeros_like(norm))
        columns.append(column * tf.cast(scale, tf.float32))
    return tf.stack(columns, axis=1)


def _concat(parts):
    if not parts:
        return tf.zeros([0], tf.float32)
    return tf.concat(parts, 0) if len(parts) > 1 else parts[0]


def _split(flat, sizes):
    if len(sizes) == 1:
        return [flat]
    return tf.split(flat, sizes) if sizes else []


class PowerSGDCompressor(Compressor):
    name = "powersgd"
    collective = ALLREDUCE
    default_memory = "residual"
    reduces_own_groups = True

    def __init__(self, rank=1):
        super().__init__()
        self.rank = check_positive_int("rank", rank)

    @property
    def params(self):
        return {"rank": self.rank}

    def matrix_view(self, shape):
        return matrix_view(shape, self.rank)

    def codec_state_size(self, shape):
        view = self.matrix_view(shape)
        return 0 if view is None else view.cols * view.rank

    def initial_codec_state(self, shape, tensor_index):
        """Q_i: cols x r standard normal values (row-major), a function of the
        tensor's index in the gradient list and its shape."""
        view = self.matrix_view(shape)
        if view is None:
            return None
        count = view.cols * view.rank
        seed = zlib.crc32(b"powersgd_q_%d" % tensor_index)
        # Box-Muller on counter-based uniforms: the same on every worker.
        uniform = counter_random.random_uniform(tf.constant(seed, tf.int64), 2 * count)
        radius = tf.sqrt(-2.0 * tf.math.log(1.0 - uniform[:count]))
        angle = 2.0 * math.pi * uniform[count:]
        return radius * tf.cos(angle)

    def payload_nbytes(self, shapes):
        """Bytes this worker sends (both allreduces) for a group of tensors of
        these shapes (a list of shapes); an int n stands for one 1-D tensor of
        n elements, which is sent as it is (4n bytes)."""
        if isinstance(shapes, numbers.Integral):
            shapes = [[shapes]]
        total = 0
        for shape in shapes:
            view = self.matrix_view(shape)
            if view is None:
                total += 4 * tf.TensorShape(shape).num_elements()
            else:
                total += 4 * view.rank * (view.rows + view.cols)
        return total

    def collectives_per_group(self):
        return 2

    def _flat_path_error(self):
        return NotImplementedError(
            "powersgd compresses each tensor as a matrix with two collectives per group: "
            "call reduce_group() with the group's tensors")

    def compress(self, flat, seed):
        raise self._flat_path_error()

    def decompress(self, payload, ctx):
        raise self._flat_path_error()

    def combine(self, collected, ctx, world_size):
        raise self._flat_path_error()

    def reduce(self, flat, seed, communicator, group, sizes=None, nonfinite=None):
        raise self._flat_path_error()

    def reduce_group(self, grads, state_vars, memory, seed, communicator, key):
        """The group's averaged gradients (shapes and dtypes of ``grads``) and an
        int32 flag per tensor: 1 where some worker's tensor was not finite (its
        averaged P_i then is not either, on every worker): that output is all
        NaN and its residual and Q stay as they were. state_vars: as in
        ``Compressor.reduce_group``. ``seed`` is unused: nothing is drawn after
        Q's initialisation."""
        del seed
        for g in grads:
            self.matrix_view(g.shape)  # static shapes, or a clear error
        if self.backend == "op" and memory.name in FUSED_MEMORIES:
            return self._reduce_group_fused(grads, state_vars, memory, communicator, key)
        return self._reduce_group_reference(grads, state_vars, memory, communicator, key)

    def _reduce_group_fused(self, grads, state_vars, memory, communicator, key):
        ops = load()
        residual = memory.name == "residual"
        handles = [v.handle for v in state_vars]
        shapes = [g.shape for g in grads]
        p, compensated = ops.mergecomp_powersgd_group_p(grads, handles, rank=self.rank,
                                                        residual=residual)
        p_mean = communicator.allreduce_mean(p, (key, "P"))
        p_orthonormal, q_local = ops.mergecomp_powersgd_group_q(p_mean, compensated,
                                                                shapes=shapes, rank=self.rank)
        q_mean = communicator.allreduce_mean(q_local, (key, "Q"))
        return ops.mergecomp_powersgd_group_finish(
            p_orthonormal, q_local, q_mean, compensated, handles, T=[g.dtype for g in grads],
            shapes=shapes, rank=self.rank, residual=residual)

    def _reduce_group_reference(self, grads, state_vars, memory, communicator, key):
        """The same math per tensor in plain TF, on the same state layout."""
        names = memory.state_names
        views = [self.matrix_view(g.shape) for g in grads]
        sizes = [g.shape.num_elements() for g in grads]
        compensated, memory_states, matrices, qs = [], [], [], []
        for i, (g, n, view) in enumerate(zip(grads, sizes, views)):
            variable = state_vars[i] if state_vars else None
            state = {name: variable[b * n:(b + 1) * n] for b, name in enumerate(names)}
            m, state = memory.compensate(tf.reshape(as_float32(g), [-1]), state)
            compensated.append(m)
            memory_states.append(state)
            if view is not None:
                matrices.append(tf.reshape(m, [view.rows, view.cols]))
                qs.append(tf.reshape(variable[len(names) * n:], [view.cols, view.rank]))
        low_rank = [view for view in views if view is not None]
        raw = [m for m, view in zip(compensated, views) if view is None]

        p_parts = [tf.reshape(tf.linalg.matmul(m, q), [-1]) for m, q in zip(matrices, qs)]
        p_mean = communicator.allreduce_mean(_concat(p_parts + raw), (key, "P"))
        parts = _split(p_mean, [v.rows * v.rank for v in low_rank] + [int(r.shape[0]) for r in raw])
        ps = [reference_orthonormalize(tf.reshape(part, [v.rows, v.rank]))
              for part, v in zip(parts, low_rank)]
        averaged_raw = parts[len(low_rank):]
        q_locals = [tf.linalg.matmul(m, p, transpose_a=True) for m, p in zip(matrices, ps)]
        q_mean = communicator.allreduce_mean(_concat([tf.reshape(q, [-1]) for q in q_locals]),
                                             (key, "Q"))
        q_means = [tf.reshape(part, [v.cols, v.rank])
                   for part, v in zip(_split(q_mean, [v.cols * v.rank for v in low_rank]), low_rank)]

        outputs, flags = [], []
        matrix_index = raw_index = 0
        for i, (g, view) in enumerate(zip(grads, views)):
            state = memory_states[i]
            if view is None:
                averaged, sent, new_q = averaged_raw[raw_index], compensated[i], []
                raw_index += 1
            else:
                p, j = ps[matrix_index], matrix_index
                averaged = tf.linalg.matmul(p, q_means[j], transpose_b=True)
                sent = tf.reshape(tf.linalg.matmul(p, q_locals[j], transpose_b=True), [-1])
                new_q = [tf.reshape(q_means[j], [-1])]
                matrix_index += 1
            nonfinite = tf.logical_not(tf.reduce_all(tf.math.is_finite(averaged)))
            if view is not None:
                nonfinite = tf.logical_or(
                    nonfinite, tf.logical_not(tf.reduce_all(tf.math.is_finite(q_means[j]))))
            averaged = tf.where(nonfinite, tf.fill(tf.shape(averaged), float("nan")), averaged)
            outputs.append(tf.cast(tf.reshape(averaged, g.shape), g.dtype))
            flags.append(nonfinite)
            if memory.needs_sent:
                state = memory.update(compensated[i], sent, state)
            if state_vars:
                variable = state_vars[i]
                variable.assign(tf.where(nonfinite, variable,
                                         _concat([state[name] for name in names] + new_q)))
        return outputs, tf.cast(tf.stack(flags), tf.int32)
