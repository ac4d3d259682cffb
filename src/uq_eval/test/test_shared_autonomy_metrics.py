"""Scores of the shared-autonomy evaluation, on hand-built timelines."""

import math

import pytest

from uq_eval.closed_loop.loop import TimelineSample
from uq_eval.closed_loop.shared_autonomy_metrics import (
    operator_weight,
    paired_time_ratio,
    score_trial,
    summarise,
)


def sample(t, level, alpha=0.5, operator_speed=0.0, elapsed=1.0, trial=3):
    return TimelineSample(t, trial, 'running', elapsed, level, 1e-4, alpha, False,
                          operator_speed, 0.1, 0.1, 0.0, 0.0, 0)


def test_operator_weight_per_level():
    assert operator_weight(0, 0.9, 0.0, 0.02) == 1.0
    assert operator_weight(1, 0.9, 0.0, 0.02) == 1.0
    assert operator_weight(2, 0.7, 0.0, 0.02) == pytest.approx(0.3)
    assert operator_weight(3, 0.7, 0.01, 0.02) == 0.0
    assert operator_weight(3, 0.7, 0.05, 0.02) == 1.0  # takeover above the dead-band


def test_score_trial_counts_changes_and_ignores_the_reset_pause():
    samples = [sample(0.0, 0, elapsed=-0.5), sample(0.1, 0), sample(0.2, 1), sample(0.3, 3),
               sample(0.4, 3), sample(0.5, 0), sample(0.6, 0, trial=4)]
    row = score_trial({'trial': 3, 'status': 'success', 'elapsed_s': 4.2,
                       'lookalike': True, 'grasped': 'target'}, samples, 0.02)
    assert row['level_changes'] == 3
    assert row['operator_share'] == pytest.approx(3 / 5)
    assert row['max_level'] == 3 and row['success'] and row['time_s'] == 4.2


def test_summary_and_paired_ratio():
    a = [{'seed': 0, 'success': True, 'time_s': 4.0, 'lookalike': False, 'status': 'success',
          'operator_share': 0.2, 'level_changes': 3},
         {'seed': 1, 'success': True, 'time_s': 9.0, 'lookalike': True, 'status': 'success',
          'operator_share': 1.0, 'level_changes': 1}]
    b = [dict(a[0], time_s=2.0), dict(a[1], success=False, status='failure', time_s=3.0)]
    s = summarise(b)
    assert s['success_rate'] == 0.5 and s['lookalike_success_rate'] == 0.0
    assert s['failures'] == {'failure': 1}
    ratio = paired_time_ratio(a, b)
    assert ratio['pairs'] == 1 and ratio['ratio'] == pytest.approx(2.0)
    assert math.isnan(paired_time_ratio(a, [])['ratio'])
