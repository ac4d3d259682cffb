"""The post-hoc OOD baselines, each against a value computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from uq_perception.training.ood_baselines import (
    FeatureBank,
    baseline_scores,
    energy_score,
    format_table,
    fpr_at_95_tpr,
    max_logit_score,
    msp_score,
    score_table,
)

LOGITS = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]])


def test_msp_with_softmax_and_sigmoid_heads():
    # Row 0: softmax max = e^2 / (e^2 + 1 + e^-1).
    top = math.exp(2) / (math.exp(2) + 1 + math.exp(-1))
    np.testing.assert_allclose(msp_score(LOGITS, 'softmax'), [1 - top, 1 - 1 / 3])
    sigmoid = [1 / (1 + math.exp(-2.0)), 1 / (1 + math.exp(-0.5))]
    np.testing.assert_allclose(msp_score(LOGITS, 'sigmoid'), [1 - sigmoid[0], 1 - sigmoid[1]])
    with pytest.raises(ValueError, match='softmax or sigmoid'):
        msp_score(LOGITS, 'relu')


def test_max_logit_and_energy():
    np.testing.assert_allclose(max_logit_score(LOGITS), [-2.0, -0.5])
    np.testing.assert_allclose(energy_score(LOGITS), [
        -math.log(math.exp(2) + 1 + math.exp(-1)), -(0.5 + math.log(3))])
    # Stable where a naive exp overflows.
    assert energy_score(np.array([[1000.0, 1000.0]]))[0] == pytest.approx(-(1000 + math.log(2)))


def test_mahalanobis_with_tied_covariance_by_hand():
    # Two classes at (0, 0) and (4, 0); within-class deviations +-1 along x, +-2 along y:
    # the tied covariance is diag(1, 4) (population form).
    features = np.array([[-1, 0], [1, 0], [0, -2], [0, 2],
                         [3, 0], [5, 0], [4, -2], [4, 2]], float)
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    bank = FeatureBank.fitted(features, labels)
    np.testing.assert_allclose(bank.class_means, [[0, 0], [4, 0]])
    np.testing.assert_allclose(np.linalg.inv(bank.tied_precision), np.diag([0.5, 2.0]),
                               rtol=1e-5)
    # (1, 2): to class 0, 1^2/0.5 + 2^2/2 = 4; to class 1, 3^2/0.5 + 4/2 = 20.
    np.testing.assert_allclose(bank.mahalanobis(np.array([[1.0, 2.0]])), [4.0], rtol=1e-5)


def test_knn_is_the_kth_distance_on_the_unit_sphere():
    bank = FeatureBank.fitted(np.array([[1, 0], [0, 2], [-3, 0]], float),
                              np.array([0, 1, 1]), k=2)
    # Query (5, 5) is at 45 degrees: distances on the unit circle to (1,0), (0,1), (-1,0) are
    # 2 sin(22.5), 2 sin(22.5), 2 sin(67.5); the 2nd smallest is 2 sin(22.5 degrees).
    assert bank.knn(np.array([[5.0, 5.0]]))[0] == pytest.approx(2 * math.sin(math.pi / 8))
    # k is capped at the bank's size.
    assert FeatureBank.fitted(np.eye(2), np.array([0, 1]), k=50).k == 2


def test_fpr_at_95_tpr_and_the_table():
    known = np.arange(100, dtype=float)          # the 95 % quantile is 94.05
    unknown = np.array([10.0, 94.0, 94.1, 200.0])
    assert fpr_at_95_tpr(known, unknown) == 0.5  # 10 and 94 pass as known
    rows = score_table({'a': known, 'b': -known}, {'a': unknown, 'b': -unknown})
    assert [r['score'] for r in rows] == ['a', 'b']
    # AUROC by hand: 10 beats 10.5 of 100 knowns (one tie), 94 beats 94.5, 94.1 beats 95, 200 all.
    assert rows[0]['auroc'] == pytest.approx((10.5 + 94.5 + 95 + 100) / 400, abs=1e-4)
    assert rows[1]['auroc'] == pytest.approx(1 - rows[0]['auroc'], abs=1e-4)
    assert 'FPR95' in format_table(rows) and '0.500' in format_table(rows)
    with pytest.raises(ValueError, match='both known and unknown'):
        fpr_at_95_tpr(known, np.zeros(0))


def test_every_baseline_scores_every_detection():
    rng = np.random.default_rng(0)
    bank = FeatureBank.fitted(rng.normal(size=(40, 5)), rng.integers(0, 3, 40))
    scores = baseline_scores(rng.normal(size=(7, 3)), rng.normal(size=(7, 5)), bank, 'sigmoid')
    assert list(scores) == ['msp', 'max_logit', 'energy', 'mahalanobis', 'knn']
    assert all(v.shape == (7,) and np.isfinite(v).all() for v in scores.values())
    with pytest.raises(ValueError, match='at least 2 training objects'):
        FeatureBank.fitted(np.zeros((1, 5)), np.zeros(1))
