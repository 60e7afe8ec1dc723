"""Parameter checks for the whole library: clear errors at construction.

Numbers may be Python or numpy scalars (``np.float32(0.1)``, ``np.int64(8)``);
booleans are refused where a number is expected.
"""

import inspect
import numbers

import numpy as np


def _is_bool(value):
    return isinstance(value, (bool, np.bool_))


def check_in_interval(name, value, interval):
    """``value`` as a float when it is a real number in ``interval``, written
    "(0, 1]" or "[0, 1)"; else ValueError naming the parameter and the range."""
    low, high = (float(bound) for bound in interval[1:-1].split(","))
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise ValueError("%s must be a number in %s, got %r" % (name, interval, value))
    number = float(value)
    above = number > low if interval[0] == "(" else number >= low
    below = number < high if interval[-1] == ")" else number <= high
    if not (above and below):
        raise ValueError("%s must be a number in %s, got %r" % (name, interval, value))
    return number


def check_positive_int(name, value):
    """``value`` as an int when it is an integer >= 1; else ValueError."""
    return check_int(name, value, 1)


def check_int(name, value, minimum):
    """``value`` as an int when it is an integer >= ``minimum``; else ValueError."""
    if _is_bool(value) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError("%s must be an integer >= %d, got %r" % (name, minimum, value))
    return int(value)


def from_registry(kind, choice, params, base, lookup):
    """What the registries' ``get()`` return: ``choice`` itself when it is an
    instance of ``base`` (then ``params`` must be empty: it is built already),
    else ``lookup(choice)(**params)``, where ``lookup`` maps a registry name to
    its class. Parameters the constructor does not take raise ValueError
    naming the valid ones; ``kind`` ("compressor", "memory") names the registry."""
    if isinstance(choice, base):
        if params:
            raise ValueError(
                "parameters %s given with a %s instance; give the registry name with "
                "them, or the instance %r alone" % (sorted(params), kind, choice))
        return choice
    cls = lookup(choice)
    accepted = [p.name for p in inspect.signature(cls.__init__).parameters.values()
                if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            "%s %r got unknown parameter(s) %s; valid parameters: %s"
            % (kind, choice, ", ".join(unknown), ", ".join(accepted) or "none"))
    return cls(**params)
