"""MergeComp's gradient layout (fixed at the first trace) and its compression state.

``StateVariables`` is a base class of ``MergeComp``: the variables are MergeComp's own
attribute ``_state``, so they checkpoint under MergeComp's keys.
"""

import tensorflow as tf

from tf_mergecomp import consistency
from tf_mergecomp import ops as op_library
from tf_mergecomp import reference


class _Layout:
    """Shapes and dtypes of the gradient list, in backprop order."""

    def __init__(self, shapes, dtypes):
        self.shapes = [tf.TensorShape(s) for s in shapes]
        self.dtypes = list(dtypes)
        self.sizes = [s.num_elements() for s in self.shapes]

    def describe(self):
        return {
            "tensors": len(self.shapes),
            "shapes": [s.as_list() for s in self.shapes],
            "dtypes": [d.name for d in self.dtypes],
        }


class StateVariables:
    """The state variables of a MergeComp (``self._layout``, ``self.memory``,
    ``self.compressor``, ``self.rank_state`` and ``self._state`` are MergeComp's)."""

    def set_gradient_layout(self, shapes, dtypes):
        """Fixes the gradient list this MergeComp reduces: shapes and dtypes in
        backprop order. The first trace does it; a later call with another
        list is refused (one MergeComp per optimizer or tape)."""
        layout = _Layout(shapes, dtypes)
        if self._layout is None:
            self._layout = layout
            return
        old, new = self._layout.describe(), layout.describe()
        if old != new:
            difference = consistency.first_difference(old, new)
            raise ValueError(
                "this MergeComp was first used with a different gradient list (%s: %r, now %r); "
                "use one MergeComp per optimizer or tape" % difference
            )

    def _state_device(self, gradients):
        """Where the compression state is created: with the gradients, where
        their group ops run (every group op, PowerSGD's included, has GPU
        kernels in a CUDA build of the op library; the plain-TF reference
        runs anywhere), so that a step copies no state between device and
        host; on the host when the op library has CPU kernels only."""
        codec = self.compressor
        if codec.backend != reference.PLAIN_BACKEND and not op_library.build_info().get("cuda"):
            return "/device:CPU:0"
        return gradients[0].device or None

    def state_variables(self, device="/device:CPU:0"):
        """One flat float32 variable per gradient tensor (backprop order), holding
        the memory's buffers back to back, then the codec's own state of the
        tensor, created on `device` (None: TensorFlow's default device); []
        when neither keeps anything. Created at the first call after the layout
        is set; later calls return them wherever they are."""
        names = self.memory.state_names
        codec = self.compressor
        codec_sizes = [codec.codec_state_size(shape) for shape in self._layout.shapes]
        if self._state is None and (names or any(codec_sizes)):
            with tf.init_scope(), tf.device(device):
                self._state = []
                for i in range(len(self._layout.shapes)):
                    self._state.append(tf.Variable(
                        self._initial_state_value(i), trainable=False,
                        name="%s_%d" % ("_".join(names) or "codec_state", i)))
                if self._piece_shards > 1 and names:  # levels.py: pieces beside it
                    self._piece_state = [tf.Variable(
                        tf.zeros([len(names) * -(-size // self._piece_shards)]),
                        trainable=False, name="piece_%s_%d" % ("_".join(names), i))
                        for i, size in enumerate(self._layout.sizes)]
            # A checkpoint restored before the first step has just been restored into
            # them: the ranks' decision about it (rank_state.py) applies now.
            self.rank_state.on_state_created()
        return list(self._state or [])

    def _initial_state_value(self, i):
        # On two levels (hierarchical.py) a rank keeps its piece of each tensor only.
        shape, size = self._layout.shapes[i], self._layout.sizes[i]
        size = -(-size // self._state_shards)
        initial = [tf.zeros([len(self.memory.state_names) * size], tf.float32)]
        codec_size = self.compressor.codec_state_size(shape)
        if codec_size:
            codec_state = self.compressor.initial_codec_state(shape, i)
            initial.append(tf.zeros([codec_size], tf.float32) if codec_state is None else codec_state)
        return tf.concat(initial, 0)

    def existing_state_variables(self):
        """The state variables once created (a list, [] when nothing keeps
        state), None before: unlike ``state_variables``, creates nothing."""
        if self._state is None:
            return None
        return list(self._state) + list(self._piece_state or [])

    def keeps_state(self):
        """Whether this MergeComp has per-tensor state at all (nothing to agree on otherwise)."""
        if self._layout is not None:
            return bool(self._state)
        return bool(self.memory.state_names) or self.compressor.keeps_codec_state

    def reset_state(self):
        """Sets the compression state (residuals, momenta, PowerSGD's Q) back to
        its initial value: zeros, and PowerSGD's initial Q. The step is kept."""
        with tf.init_scope():
            for i, variable in enumerate(self._state or []):
                with tf.device(variable.device):
                    variable.assign(self._initial_state_value(i))
            for variable in self._piece_state or []:
                variable.assign(tf.zeros_like(variable))
