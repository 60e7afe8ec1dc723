"""The examples stay runnable with horovodrun -np 2, and learn."""

import re

import pytest

from tests import horovodrun


@pytest.mark.multiworker
def test_keras_fit_example_learns_digits():
    _, output = horovodrun.run("examples/train_digits.py", np=2, args=["--epochs", "3", "--no-search"])
    accuracy = float(re.search(r"\[0\]<stdout>:test loss [\d.]+, test accuracy ([\d.]+)", output).group(1))
    assert accuracy > 0.8, output[-3000:]


@pytest.mark.multiworker
def test_custom_loop_example_searches_and_learns():
    _, output = horovodrun.run("examples/custom_loop.py", np=2, args=["--steps", "150"])
    assert "MergeComp search: chose " in output
    accuracy = float(re.search(r"\[0\]<stdout>:accuracy on all digits ([\d.]+)", output).group(1))
    assert accuracy > 0.8, output[-3000:]
