"""How much a figure read off test images depends on which images were drawn: a bootstrap over
the images of each task's test split, stratified by class.

Each task's split gets one fixed set of resamples (per class, its images drawn again with
replacement, as many as it has), shared by every target that scores the task, because every
target reads the same images. An accuracy is a `Score`: the figure on the images as drawn, and
the same figure on each resample. Gains, sums and ratios of Scores carry their resamples along,
resample by resample, so a pooled retention's resamples are the retention each resampled test
set would have given; tasks are resampled independently of each other. Comparisons, formatting
and JSON see the figure alone, so code that chooses (a ridge, a best source) chooses on it.

`with_intervals` turns a results tree's Scores into plain figures with a `<name>_ci95` sibling:
the 2.5th and 97.5th percentiles of the resamples (a percentile interval).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

RESAMPLES = 1000  # the interval's percentiles move by about 0.1 of its width between seeds at this count
LEVEL = 0.95


class Score(float):
    """A figure and its values on each resample of the test images (`resamples`)."""

    resamples: np.ndarray

    def __new__(cls, value: float, resamples: np.ndarray):
        score = super().__new__(cls, value)
        score.resamples = np.asarray(resamples, dtype=np.float64)
        return score

    def _combine(self, other, op):
        theirs = other.resamples if isinstance(other, Score) else float(other)
        with np.errstate(divide="ignore", invalid="ignore"):
            return Score(op(float(self), float(other)), op(self.resamples, theirs))

    def _combine_reflected(self, other, op):
        with np.errstate(divide="ignore", invalid="ignore"):
            return Score(op(float(other), float(self)), op(float(other), self.resamples))

    def __add__(self, other):
        return self._combine(other, lambda a, b: a + b) if _number(other) else NotImplemented

    def __radd__(self, other):
        return self._combine_reflected(other, lambda a, b: a + b) if _number(other) else NotImplemented

    def __sub__(self, other):
        return self._combine(other, lambda a, b: a - b) if _number(other) else NotImplemented

    def __rsub__(self, other):
        return self._combine_reflected(other, lambda a, b: a - b) if _number(other) else NotImplemented

    def __mul__(self, other):
        return self._combine(other, lambda a, b: a * b) if _number(other) else NotImplemented

    def __rmul__(self, other):
        return self._combine_reflected(other, lambda a, b: a * b) if _number(other) else NotImplemented

    def __truediv__(self, other):
        return self._combine(other, _divide) if _number(other) else NotImplemented

    def __rtruediv__(self, other):
        return self._combine_reflected(other, _divide) if _number(other) else NotImplemented

    def __neg__(self):
        return Score(-float(self), -self.resamples)

    def interval(self, level: float = LEVEL) -> list[float]:
        """[low, high]: the central `level` share of the resamples (NaN where none is finite)."""
        finite = self.resamples[np.isfinite(self.resamples)]
        if finite.size == 0:
            return [math.nan, math.nan]
        tail = 100 * (1 - level) / 2
        return [float(v) for v in np.percentile(finite, [tail, 100 - tail])]


def _number(value) -> bool:
    """A plain number (numpy's scalars included) or a Score. A numpy scalar on the left of an
    operator computes first and drops the resamples: the harness keeps Scores on the left."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _divide(a, b):
    if isinstance(b, float) and not isinstance(a, np.ndarray):
        return a / b if b != 0 else math.nan
    return np.divide(a, b)


def resample_weights(labels: np.ndarray, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """resamples x n: how often each image is drawn in each resample, stratified by class (a
    class of k images contributes k draws from its own images to every resample)."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    weights = np.zeros((resamples, labels.size))
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        drawn = rng.integers(0, members.size, size=(resamples, members.size))
        np.add.at(weights, (np.arange(resamples)[:, None], members[drawn]), 1.0)
    return weights


def mean_score(values, weights: np.ndarray | None) -> float | Score:
    """The mean of `values` (per image: 1 if right, else 0) as drawn, and on each resample when
    `weights` is given."""
    values = np.asarray(values, dtype=np.float64)
    value = float(values.mean())
    return value if weights is None else Score(value, weights @ values / values.size)


def mean_over(values, seed: int = 0) -> float | Score:
    """The mean of figures that are themselves the sample (pairs of descriptors, say), with
    resamples of the figures."""
    values = np.asarray(list(values), dtype=np.float64)
    if values.size == 0:
        return math.nan
    return mean_score(values, resample_weights(np.zeros(values.size), seed=seed))


def with_intervals(tree, interval_keys: bool = True):
    """A copy of `tree` (dicts, lists, tuples) with every Score a plain float; in a dict, each
    Score's key also gets a `<key>_ci95` sibling (not inside lists: a list's items have no names)."""
    if isinstance(tree, Score):
        return float(tree)
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out[key] = with_intervals(value, interval_keys)
            if interval_keys and isinstance(value, Score):
                out[f"{key}_ci95"] = value.interval()
        return out
    if isinstance(tree, (list, tuple)):
        return type(tree)(with_intervals(value, interval_keys) for value in tree)
    return tree
