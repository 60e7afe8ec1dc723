"""Error-feedback memories: residual, dgc, momentum (tf_mergecomp/memory)."""

import numpy as np
import pytest
import tensorflow as tf

from tf_mergecomp import memory


def vec(*values):
    return tf.constant(np.array(values, np.float32))


def test_registry_and_unknown_name():
    assert memory.NAMES == ("none", "residual", "dgc", "momentum")
    assert isinstance(memory.get("dgc", momentum=0.5), memory.Memory)
    with pytest.raises(ValueError, match="valid choices: none, residual, dgc, momentum"):
        memory.get("adam")


def test_none_memory_passes_through():
    mem = memory.get("none")
    g = vec(1, 2)
    out, state = mem.compensate(g, {})
    assert out is g and state == {} and mem.update(g, g, {}) == {}
    assert mem.state_names == () and not mem.needs_sent


def test_residual_compensates_and_keeps_what_was_not_sent():
    mem = memory.get("residual")
    assert mem.state_names == ("residual",) and mem.needs_sent
    state = {"residual": vec(0.5, -1, 0, 2)}
    g = vec(1, 1, 1, 1)
    compensated, state_after = mem.compensate(g, state)
    np.testing.assert_array_equal(compensated.numpy(), [1.5, 0, 1, 3])
    np.testing.assert_array_equal(state_after["residual"].numpy(), state["residual"].numpy())
    sent = vec(1.5, 0, 0, 3)  # a sparse codec sent entries 0 and 3 exactly
    new = mem.update(compensated, sent, state_after)["residual"].numpy()
    np.testing.assert_array_equal(new, [0, 0, 1, 0])
    # Invariant: sent + residual == compensated (nothing lost, nothing made up).
    np.testing.assert_array_equal(new + sent.numpy(), compensated.numpy())


def test_residual_accumulates_over_steps():
    mem = memory.get("residual")
    state = {"residual": tf.zeros([3])}
    total_sent = np.zeros(3)
    for step in range(4):
        g = vec(1, 2, 3)
        compensated, state = mem.compensate(g, state)
        # Send only the largest entry each step.
        mask = np.zeros(3, np.float32)
        mask[int(np.argmax(np.abs(compensated.numpy())))] = 1
        sent = compensated * mask
        state = mem.update(compensated, sent, state)
        total_sent += sent.numpy()
    np.testing.assert_allclose(total_sent + state["residual"].numpy(), 4 * np.array([1, 2, 3]))


def test_dgc_momentum_correction_accumulation_and_masking():
    mem = memory.get("dgc", momentum=0.5)
    assert mem.state_names == ("momentum", "accumulation") and mem.params == {"momentum": 0.5}
    state = {"momentum": vec(2, 2, 2), "accumulation": vec(1, 1, 1)}
    g = vec(1, -1, 0)
    v, state = mem.compensate(g, state)
    np.testing.assert_array_equal(state["momentum"].numpy(), [2, 0, 1])   # 0.5 * 2 + g
    np.testing.assert_array_equal(v.numpy(), [3, 1, 2])                    # 1 + u
    np.testing.assert_array_equal(state["accumulation"].numpy(), v.numpy())
    sent = vec(3, 0, 0)  # entry 0 was sent
    state = mem.update(v, sent, state)
    # Momentum-factor masking: sent entries lose their momentum and accumulation.
    np.testing.assert_array_equal(state["momentum"].numpy(), [0, 0, 1])
    np.testing.assert_array_equal(state["accumulation"].numpy(), [0, 1, 2])


def test_dgc_with_zero_momentum_is_residual():
    dgc, residual = memory.get("dgc", momentum=0.0), memory.get("residual")
    g = vec(0.3, -2, 5)
    d_state = {"momentum": tf.zeros([3]), "accumulation": vec(1, 1, 1)}
    r_state = {"residual": vec(1, 1, 1)}
    v, d_state = dgc.compensate(g, d_state)
    p, r_state = residual.compensate(g, r_state)
    np.testing.assert_array_equal(v.numpy(), p.numpy())
    sent = v * vec(0, 1, 0)
    np.testing.assert_array_equal(dgc.update(v, sent, d_state)["accumulation"].numpy(),
                                  residual.update(p, sent, r_state)["residual"].numpy())


def test_momentum_memory():
    mem = memory.get("momentum", beta=0.75)
    assert mem.state_names == ("momentum",) and not mem.needs_sent
    state = {"momentum": vec(4, 0)}
    m, state = mem.compensate(vec(0, 8), state)
    np.testing.assert_array_equal(m.numpy(), [3, 2])  # 0.75 m + 0.25 g
    np.testing.assert_array_equal(state["momentum"].numpy(), [3, 2])
    assert mem.update(m, vec(1, 1), state) is state  # nothing fed back


@pytest.mark.parametrize("name,param", [("dgc", "momentum"), ("momentum", "beta")])
@pytest.mark.parametrize("value", (1.0, -0.1, 2, True, "0.9", None))
def test_bad_parameters(name, param, value):
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        memory.get(name, **{param: value})


def test_unknown_parameter_names_the_valid_ones():
    with pytest.raises(ValueError, match="valid parameters: none"):
        memory.get("residual", momentum=0.9)
    with pytest.raises(ValueError, match="valid parameters: momentum"):
        memory.get("dgc", beta=0.9)


def test_parameters_with_an_instance_are_refused():
    mem = memory.get("dgc", momentum=0.5)
    assert memory.get(mem) is mem
    with pytest.raises(ValueError, match=r"parameters \['momentum'\] given with a memory "
                                         r"instance; give the registry name with them"):
        memory.get(mem, momentum=0.9)
