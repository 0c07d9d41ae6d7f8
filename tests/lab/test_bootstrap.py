"""The report's intervals: a stratified bootstrap over test images, held against closed forms."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ptc.lab.zoo import report
from ptc.lab.zoo.bootstrap import Score, mean_over, mean_score, resample_weights, with_intervals

# resamples: the bootstrap's own spread of a standard deviation is ~1/sqrt(2 MANY) = 0.5%
MANY = 20000


def _classes(sizes, rates, seed=0):
    """0/1 outcomes with exactly round(rate * size) ones per class, and their labels."""
    rng = np.random.default_rng(seed)
    values, labels = [], []
    for label, (size, rate) in enumerate(zip(sizes, rates)):
        ones = np.zeros(size)
        ones[: round(rate * size)] = 1
        values.append(rng.permutation(ones))
        labels.append(np.full(size, label))
    return np.concatenate(values), np.concatenate(labels)


def _stratified_std(per_class_values, n):
    """Closed form: the standard deviation of a class-stratified resample's mean,
    sqrt(sum_c (n_c / n)^2 var_c / n_c), var_c the class's plug-in (divide-by-n_c) variance."""
    return math.sqrt(sum((v.size / n) ** 2 * v.var() / v.size for v in per_class_values))


def test_each_resample_draws_every_class_as_often_as_it_has_images():
    labels = np.array([0] * 5 + [1] * 3 + [2] * 7)
    weights = resample_weights(labels, 50, seed=3)
    for label, size in ((0, 5), (1, 3), (2, 7)):
        assert (weights[:, labels == label].sum(axis=1) == size).all()
    assert (weights == resample_weights(labels, 50, seed=3)).all()  # seeded: the same every run


def test_an_accuracys_spread_is_the_stratified_closed_form():
    sizes, rates = (60, 120, 40), (0.9, 0.5, 0.25)
    correct, labels = _classes(sizes, rates)
    score = mean_score(correct, resample_weights(labels, MANY, seed=1))
    assert float(score) == pytest.approx(correct.mean())
    expected = _stratified_std([correct[labels == c] for c in range(3)], correct.size)
    assert score.resamples.std() == pytest.approx(expected, rel=0.03)
    assert score.resamples.mean() == pytest.approx(correct.mean(), abs=0.1 * expected)
    low, high = score.interval()
    # 220 images: the resampled mean is close to normal, so the interval is about +-1.96 sd.
    assert low == pytest.approx(correct.mean() - 1.96 * expected, abs=0.15 * expected)
    assert high == pytest.approx(correct.mean() + 1.96 * expected, abs=0.15 * expected)


def test_a_gain_is_resampled_paired_image_by_image():
    """Before and after an edit are read off the same images: the gain's spread is that of the
    per-image difference, far below what two independent accuracies would give."""
    before, labels = _classes((100, 100), (0.5, 0.6))
    after = before.copy()
    flips = np.flatnonzero(before == 0)[:30]
    after[flips] = 1  # the edit fixes 30 images and breaks none
    weights = resample_weights(labels, MANY, seed=2)
    gain = 100 * (mean_score(after, weights) - mean_score(before, weights))
    assert isinstance(gain, Score) and float(gain) == pytest.approx(15.0)
    expected = 100 * _stratified_std([(after - before)[labels == c] for c in (0, 1)], before.size)
    assert gain.resamples.std() == pytest.approx(expected, rel=0.03)
    independent = 100 * math.hypot(
        _stratified_std([after[labels == c] for c in (0, 1)], 200),
        _stratified_std([before[labels == c] for c in (0, 1)], 200),
    )
    assert gain.resamples.std() < 0.6 * independent


def test_a_pooled_ratio_is_the_ratio_on_each_resample():
    weights = resample_weights(np.repeat([0, 1], 50), 200, seed=4)
    rng = np.random.default_rng(5)
    a, b, c = (mean_score(rng.integers(0, 2, 100), weights) for _ in range(3))
    ratio = (a - c) / (b - c + 1.0)
    assert float(ratio) == pytest.approx((float(a) - float(c)) / (float(b) - float(c) + 1.0))
    assert ratio.resamples == pytest.approx(
        (a.resamples - c.resamples) / (b.resamples - c.resamples + 1.0)
    )
    assert sum([a, b, c]).resamples == pytest.approx(a.resamples + b.resamples + c.resamples)
    # numpy scalars keep them too
    assert (a * np.int64(2)).resamples == pytest.approx(2 * a.resamples)


def test_comparisons_and_text_read_the_figure_and_intervals_become_siblings():
    weights = resample_weights(np.zeros(40), 100, seed=6)
    score = mean_score(np.r_[np.ones(30), np.zeros(10)], weights)
    assert score > 0.7 and not score > 0.75 and f"{score:.2f}" == "0.75"
    assert max([score, 0.5]) is score
    tree = with_intervals({"retention": score, "rows": [{"gain": score}], "n": 3})
    assert tree["retention"] == 0.75 and type(tree["retention"]) is float
    assert (
        tree["retention_ci95"] == score.interval()
        and tree["rows"][0]["gain_ci95"] == score.interval()
    )
    json.dumps(tree)  # plain JSON
    assert math.isnan(mean_over([]))
    pairs = mean_over([0.2, 0.4, 0.6, 0.8] * 10)
    assert float(pairs) == pytest.approx(0.5) and pairs.interval()[0] < 0.5 < pairs.interval()[1]


@pytest.mark.parametrize(
    "bounds, verdict",
    [((0.76, 0.80), report.MET), ((0.60, 0.73), report.NOT_MET), ((0.70, 0.78), report.UNSURE)],
)
def test_a_bar_is_met_only_when_the_interval_says_so(bounds, verdict):
    row = {"retention": sum(bounds) / 2, "retention_ci95": list(bounds)}
    assert report.at_least(row, "retention", 0.74) == verdict
    assert report.at_least({"retention": sum(bounds) / 2}, "retention", 0.74) in (
        report.MET,
        report.NOT_MET,
    )


def test_random_utd_within_its_bar_and_comparisons_by_overlap():
    assert report.within({"g": -0.2, "g_ci95": [-0.8, 0.5]}, "g", 1.0) == report.MET
    assert report.within({"g": -1.0, "g_ci95": [-1.7, -0.5]}, "g", 1.0) == report.UNSURE
    assert report.within({"g": -2.0, "g_ci95": [-2.5, -1.5]}, "g", 1.0) == report.NOT_MET
    a, b = {"x": 0.5, "x_ci95": [0.45, 0.6]}, {"y": 0.4, "y_ci95": [0.3, 0.5]}
    assert (
        report.above(a, "x", b, "y") == report.UNSURE
        and report.above(b, "y", {"z": 0.2}, "z") == report.MET
    )
    assert report.all_of(report.MET, report.UNSURE) == report.UNSURE
    assert report.all_of(report.MET, report.NOT_MET, report.UNSURE) == report.NOT_MET
