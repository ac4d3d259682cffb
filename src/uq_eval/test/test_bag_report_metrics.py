"""The bag report's ranking metrics against values worked out by hand.

The figures come from :func:`uq_eval.bags.report.compute_metrics` on matched detections
whose scores are chosen so that every AUROC differs from its mirror image (1 - AUROC): a
metric computed with its positives and negatives swapped cannot pass.
"""

from __future__ import annotations

import math

import pytest

from uq_eval.bags.evaluation import EvaluationData
from uq_eval.bags.report import compute_metrics


def _matched(known: bool, gp_variance: float, probabilities: tuple[float, float] = (0.5, 0.5),
             label: int = 0) -> dict:
    return {'known': known, 'gp_variance': gp_variance, 'probabilities': list(probabilities),
            'label': label}


def _entropy(p: float) -> float:
    return -(p * math.log(p) + (1.0 - p) * math.log(1.0 - p))


@pytest.fixture
def metrics() -> dict:
    # Known objects (class 0 or 1); entropies 0.199, 0.500, 0.673, 0.325 (nats).
    known = [
        _matched(True, 0.1, (0.95, 0.05), label=0),  # right
        _matched(True, 0.2, (0.80, 0.20), label=0),  # right
        _matched(True, 0.3, (0.60, 0.40), label=1),  # wrong, highest entropy
        _matched(True, 0.6, (0.90, 0.10), label=1),  # wrong, confidently
    ]
    unknown = [_matched(False, 0.5), _matched(False, 0.9)]
    data = EvaluationData(class_names=['mug', 'box'], matched=known + unknown,
                          ground_truth_frames=1, ground_truth_exhaustive=False)
    return compute_metrics(data)


def test_ood_auroc_ranks_unknown_objects_above_known_ones(metrics: dict) -> None:
    # Unknown 0.5 beats known 0.1, 0.2, 0.3 but not 0.6; unknown 0.9 beats all four: 7 of 8.
    assert metrics['matched_unknown'] == 2 and metrics['matched_known'] == 4
    assert metrics['ood_auroc'] == pytest.approx(7 / 8)


def test_misclassification_auroc_ranks_wrong_classes_above_right_ones(metrics: dict) -> None:
    assert _entropy(0.6) > _entropy(0.8) > _entropy(0.9) > _entropy(0.95)
    # Wrong (0.673, 0.325) against right (0.199, 0.500): 0.673 beats both, 0.325 beats
    # 0.199 only: 3 of 4 pairs.
    assert metrics['misclassification_auroc'] == pytest.approx(3 / 4)
    assert metrics['accuracy_matched'] == pytest.approx(0.5)


def test_perfect_separation_gives_one() -> None:
    matched = [_matched(True, 0.1, (0.99, 0.01)), _matched(True, 0.2, (0.7, 0.3), label=1),
               _matched(False, 0.8)]
    metrics = compute_metrics(EvaluationData(matched=matched, ground_truth_frames=1,
                                             ground_truth_exhaustive=False))
    assert metrics['ood_auroc'] == pytest.approx(1.0)
    assert metrics['misclassification_auroc'] == pytest.approx(1.0)
