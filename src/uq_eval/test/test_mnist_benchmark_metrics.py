"""Metrics against hand-computed cases and brute-force definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uq_perception.training import metrics


def test_accuracy_nll_brier_hand_computed() -> None:
    probs = np.array([[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]])
    labels = np.array([0, 1, 1])
    # argmax of a tie is the first class, so sample 0 counts as correct.
    assert metrics.accuracy(probs, labels) == pytest.approx(2 / 3)
    assert metrics.nll(probs, labels) == pytest.approx(
        -(math.log(0.5) + math.log(0.75) + math.log(0.1)) / 3)
    # (0.25 + 0.25) + (0.0625 + 0.0625) + (0.81 + 0.81)
    assert metrics.brier(probs, labels) == pytest.approx((0.5 + 0.125 + 1.62) / 3)


def test_nll_floors_zero_probability() -> None:
    assert metrics.nll([[1.0, 0.0]], [1], eps=1e-6) == pytest.approx(-math.log(1e-6))


def test_ece_one_sample_per_bin() -> None:
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7]])
    labels = np.array([0, 1, 1])
    # Confidences 0.9, 0.6, 0.7 fall in separate bins of width 0.1; gaps 0.1, 0.6, 0.3.
    assert metrics.ece(probs, labels, n_bins=10) == pytest.approx((0.1 + 0.6 + 0.3) / 3)
    # With two bins all three share (0.5, 1]: accuracy 2/3, mean confidence 2.2/3.
    assert metrics.ece(probs, labels, n_bins=2) == pytest.approx(abs(2 / 3 - 2.2 / 3))


def test_reliability_bins_edges_are_right_closed() -> None:
    probs = np.array([[0.7, 0.3], [0.3, 0.7], [1.0, 0.0]])
    labels = np.array([0, 0, 0])
    conf, acc, counts = metrics.reliability_bins(probs, labels, n_bins=10)
    assert counts[6] == 2 and counts[9] == 1 and counts.sum() == 3
    assert conf[6] == pytest.approx(0.7) and acc[6] == pytest.approx(0.5)
    assert np.isnan(conf[0]) and np.isnan(acc[0])


def test_ece_is_zero_for_confident_correct_predictions() -> None:
    probs = np.eye(4)
    assert metrics.ece(probs, np.arange(4)) == 0.0


def test_auroc_and_aupr_hand_computed() -> None:
    scores = np.array([0.1, 0.4, 0.35, 0.8])
    targets = np.array([0, 0, 1, 1])
    # Positive/negative pairs ordered correctly: (0.35, 0.1), (0.8, 0.1), (0.8, 0.4).
    assert metrics.auroc(scores, targets) == pytest.approx(3 / 4)
    # Thresholds 0.8, 0.4, 0.35, 0.1 give (P, R) = (1, .5), (.5, .5), (2/3, 1), (.5, 1).
    assert metrics.aupr(scores, targets) == pytest.approx(0.5 * 1 + 0.5 * 2 / 3)


def test_ties_count_one_half_and_are_not_split() -> None:
    assert metrics.auroc([0.5, 0.5], [False, True]) == pytest.approx(0.5)
    # The tied top pair enters as one threshold: precision 1/2 at recall 1.
    assert metrics.aupr([1.0, 1.0, 0.0], [1, 0, 0]) == pytest.approx(0.5)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=2, max_size=30))
def test_auroc_matches_pairwise_definition(pairs: list[tuple[int, bool]]) -> None:
    scores = np.array([p[0] for p in pairs], dtype=float)
    targets = np.array([p[1] for p in pairs])
    if targets.all() or not targets.any():
        with pytest.raises(ValueError, match='both positives and negatives'):
            metrics.auroc(scores, targets)
        return
    pos, neg = scores[targets], scores[~targets]
    diff = pos[:, None] - neg[None, :]
    expected = (np.sum(diff > 0) + 0.5 * np.sum(diff == 0)) / diff.size
    assert metrics.auroc(scores, targets) == pytest.approx(expected)
    assert metrics.auroc(-scores, targets) == pytest.approx(1.0 - expected)
    ap = metrics.aupr(scores, targets)
    assert 0.0 < ap <= 1.0
    assert (ap == pytest.approx(1.0)) == (pos.min() > neg.max())


@pytest.mark.parametrize(
    ('call', 'message'),
    [
        (lambda: metrics.ece([[np.nan, 1.0]], [0]), 'non-finite'),
        (lambda: metrics.nll([[0.5, 0.5]], [2]), r'labels must lie in \[0, 2\)'),
        (lambda: metrics.brier([0.5, 0.5], [0]), r'shape \(N, C\)'),
        (lambda: metrics.accuracy([[0.5, 0.5]], [0.0]), 'integers'),
        (lambda: metrics.auroc([1.0, 2.0], [1, 1]), 'both positives and negatives'),
        (lambda: metrics.aupr([1.0, np.inf], [0, 1]), 'non-finite'),
        (lambda: metrics.auroc([1.0, 2.0], [0, 2]), 'boolean or 0/1'),
        (lambda: metrics.ece([[0.5, 0.5]], [0], n_bins=0), 'n_bins'),
    ],
)
def test_invalid_inputs_raise(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
