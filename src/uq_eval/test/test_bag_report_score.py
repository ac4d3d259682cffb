"""The bag report's calibrated score: percentiles of the published scores, and a note instead
of figures when the model has no score reference (the detector publishes -1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from uq_eval.bags.evaluation import EvaluationData
from uq_eval.bags.report import compute_metrics, write_report


def _data(scores: list[float]) -> EvaluationData:
    detections = [{'stamp': float(i), 'track_id': i, 'class': 'mug', 'score': 0.9,
                   'gp_variance': 1e-4 * (i + 1), 'mutual_information': 1e-6,
                   'predictive_entropy': 0.1, 'max_probability': 0.9, 'calibrated_score': s}
                  for i, s in enumerate(scores)]
    return EvaluationData(class_names=['mug'], detections=detections)


def test_percentiles_of_the_calibrated_score_are_reported(tmp_path: Path) -> None:
    scores = [i / 100 for i in range(101)]
    data = _data(scores)
    metrics = compute_metrics(data)
    score = metrics['calibrated_score']
    assert score['count'] == 101
    assert (score['p50'], score['p90'], score['p99'], score['max']) == pytest.approx(
        (0.50, 0.90, 0.99, 1.0))
    md, _ = write_report(Path('x.mcap'), data, metrics, {}, tmp_path)
    assert ('- calibrated score (share of known validation objects with lower GP variance): '
            'p50 0.500, p90 0.900, p99 0.990') in md.read_text()


def test_a_model_without_score_reference_gets_a_note_not_figures(tmp_path: Path) -> None:
    data = _data([-1.0, -1.0, -1.0])
    metrics = compute_metrics(data)
    assert metrics['calibrated_score'] == {'count': 0}
    text = write_report(Path('x.mcap'), data, metrics, {}, tmp_path)[0].read_text()
    assert 'calibrated score: n/a (the model has no score reference' in text
    empty = EvaluationData(class_names=['mug'])
    text = write_report(Path('x.mcap'), empty, compute_metrics(empty), {}, tmp_path)[0] \
        .read_text()
    assert '- calibrated score: n/a (no detection)' in text
