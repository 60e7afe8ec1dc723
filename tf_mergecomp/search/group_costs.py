"""The costs of a group of consecutive gradient tensors, per part (encode, collective,
decode), that the step-time model (step_model.py) runs on: fitted to measured groups,
measured ones where known, the cheapest codec's or an assigned codec's per group."""

import itertools

import numpy as np


class LinearGroupCosts:
    """Per part (encode, collective, decode): fixed + per_element * elements + per_tensor * tensors.

    Args:
      sizes: element counts of the N tensors in backprop order.
      coefficients: 3x3, rows encode / collective / decode, columns fixed
        seconds, seconds per element, seconds per tensor.
    """

    PARTS = ("encode", "collective", "decode")

    def __init__(self, sizes, coefficients):
        self.sizes = np.asarray(sizes, dtype=np.float64)
        self.cumulative = np.concatenate([[0.0], np.cumsum(self.sizes)])
        self.coefficients = np.asarray(coefficients, dtype=np.float64).reshape(3, 3)

    def __call__(self, lo, hi):
        lo = np.asarray(lo)
        hi = np.asarray(hi)
        elements = self.cumulative[hi] - self.cumulative[lo]
        tensors = (hi - lo).astype(np.float64)
        return tuple(c[0] + c[1] * elements + c[2] * tensors for c in self.coefficients)

    @classmethod
    def fit(cls, sizes, groups, seconds):
        """Least-squares fit, in relative error, with non-negative coefficients.

        groups: [(lo, hi)] measured; seconds: [[encode, collective, decode]] each.
        Relative error weights a 50 us group as much as a 500 ms one, so the
        fixed costs that decide how many groups pay are fitted, not drowned.
        """
        sizes = np.asarray(sizes, dtype=np.float64)
        cumulative = np.concatenate([[0.0], np.cumsum(sizes)])
        groups = np.asarray(groups, dtype=np.int64).reshape(-1, 2)
        seconds = np.asarray(seconds, dtype=np.float64).reshape(-1, 3)
        if len(groups) == 0:
            raise ValueError("no measured groups to fit")
        features = np.stack([np.ones(len(groups)),
                             cumulative[groups[:, 1]] - cumulative[groups[:, 0]],
                             (groups[:, 1] - groups[:, 0]).astype(np.float64)], axis=1)
        coefficients = np.stack([fit_coefficients(features, seconds[:, part])
                                 for part in range(3)])
        return cls(sizes, coefficients)

    def describe(self):
        return {part: {"fixed_s": row[0], "per_element_s": row[1], "per_tensor_s": row[2]}
                for part, row in zip(self.PARTS, self.coefficients.tolist())}


def fit_coefficients(features, seconds):
    """Non-negative (fixed, per element, per tensor) seconds fitted in relative
    error to measurements whose rows of ``features`` count (calls, elements,
    tensors): one call per group, or several for a measurement that sums calls."""
    features = np.asarray(features, dtype=np.float64).reshape(-1, 3)
    target = np.asarray(seconds, dtype=np.float64).reshape(-1)
    weights = 1.0 / np.maximum(target, max(1e-6, 1e-3 * float(np.median(target))))
    return _nonnegative_least_squares(features * weights[:, None], target * weights)


def _nonnegative_least_squares(a, b):
    """argmin |a x - b| with x >= 0, for a few columns: the best over active sets."""
    columns = a.shape[1]
    best, best_residual = np.zeros(columns), float(np.sum(b * b))
    for count in range(1, columns + 1):
        for active in itertools.combinations(range(columns), count):
            solution, _, _, _ = np.linalg.lstsq(a[:, active], b, rcond=None)
            if np.any(solution < 0):
                continue
            x = np.zeros(columns)
            x[list(active)] = solution
            residual = float(np.sum((a @ x - b) ** 2))
            if residual < best_residual:
                best, best_residual = x, residual
    return best


class MeasuredGroupCosts:
    """Measured groups' own costs where known, a fitted cost function elsewhere.

    measured: {(lo, hi): seconds of ``parts``}; parts: which of encode,
    collective and decode those seconds are, in that order (default all three);
    the other parts of a measured group come from the fit.
    """

    def __init__(self, fitted, measured, parts=LinearGroupCosts.PARTS):
        unknown = [p for p in parts if p not in LinearGroupCosts.PARTS]
        if unknown or not parts or len(set(parts)) != len(parts):
            raise ValueError("parts must be distinct names among %s, got %r"
                             % (", ".join(LinearGroupCosts.PARTS), tuple(parts)))
        self.fitted = fitted
        self._columns = [LinearGroupCosts.PARTS.index(p) for p in parts]
        self.measured = {(int(lo), int(hi)): tuple(float(v) for v in value)
                         for (lo, hi), value in measured.items()}
        if any(len(v) != len(parts) for v in self.measured.values()):
            raise ValueError("each measured group needs %d seconds (%s)"
                             % (len(parts), ", ".join(parts)))
        keys = sorted(self.measured)
        self._keys = np.array([_group_key(lo, hi) for lo, hi in keys], dtype=np.int64)
        self._values = np.array([self.measured[k] for k in keys],
                                dtype=np.float64).reshape(-1, len(parts))

    def __call__(self, lo, hi):
        lo = np.asarray(lo)
        hi = np.asarray(hi)
        shape = np.broadcast(lo, hi).shape
        parts = [np.broadcast_to(np.asarray(p, dtype=np.float64), shape).copy()
                 for p in self.fitted(lo, hi)]
        if len(self._keys):
            query = _group_key(lo, hi)
            index = np.minimum(np.searchsorted(self._keys, query), len(self._keys) - 1)
            found = self._keys[index] == query
            for value, part in enumerate(self._columns):
                parts[part][found] = self._values[index[found], value]
        return tuple(parts)


class CheapestCodecCosts:
    """Per-group codec choice: each group's parts from the codec whose encode,
    collective and decode add up to the least (``costs_by_codec``: one cost
    function per codec, the compressor's first, which wins ties). ``choices(lo, hi)``
    gives the index of the codec chosen per group; ``fitted`` is the compressor's fit."""

    def __init__(self, costs_by_codec):
        self.costs_by_codec = list(costs_by_codec)
        if not self.costs_by_codec:
            raise ValueError("costs_by_codec needs at least one codec's costs")
        self.fitted = getattr(self.costs_by_codec[0], "fitted", None)

    def _all(self, lo, hi):
        shape = np.broadcast(np.asarray(lo), np.asarray(hi)).shape
        return np.stack([np.stack([np.broadcast_to(np.asarray(p, dtype=np.float64), shape)
                                   for p in costs(lo, hi)]) for costs in self.costs_by_codec])

    def choices(self, lo, hi):
        parts = self._all(lo, hi)  # [codecs, 3, ...]
        totals = parts.sum(axis=1)
        return np.argmin(totals, axis=0)

    def __call__(self, lo, hi):
        parts = self._all(lo, hi)
        chosen = np.argmin(parts.sum(axis=1), axis=0)
        picked = np.take_along_axis(parts, chosen[None, None, ...].repeat(3, axis=1), axis=0)[0]
        return tuple(picked[i] for i in range(3))


class AssignedCodecCosts:
    """Group costs for given codec assignments: ``assignments`` is a [layouts,
    groups] array of codec indices into ``costs_by_codec``, matching the
    [layouts, groups] ``lo``/``hi`` the step model asks about."""

    def __init__(self, costs_by_codec, assignments):
        self.costs_by_codec = list(costs_by_codec)
        self.assignments = np.asarray(assignments, dtype=np.int64)
        self.fitted = getattr(self.costs_by_codec[0], "fitted", None)

    def __call__(self, lo, hi):
        lo, hi = np.asarray(lo), np.asarray(hi)
        if lo.shape != self.assignments.shape:
            raise ValueError("assignments are %r but the groups asked for are %r"
                             % (self.assignments.shape, lo.shape))
        result = [np.zeros(lo.shape) for _ in range(3)]
        for index, costs in enumerate(self.costs_by_codec):
            mask = self.assignments == index
            if not mask.any():
                continue
            parts = costs(lo, hi)
            for part in range(3):
                result[part][mask] = np.broadcast_to(
                    np.asarray(parts[part], dtype=np.float64), lo.shape)[mask]
        return tuple(result)


def _group_key(lo, hi):
    return np.asarray(lo, dtype=np.int64) * (1 << 32) + np.asarray(hi, dtype=np.int64)
