"""Scores of the shared-autonomy evaluation, on hand-built timelines."""

import math

import numpy as np
import pytest

from uq_eval.closed_loop.loop import TimelineSample
from uq_eval.closed_loop.shared_autonomy_metrics import (
    HELP_POLICIES,
    OPERATOR_MODE,
    PINNED_LEVEL,
    POLICIES,
    operator_weight,
    paired_time_ratio,
    score_trial,
    stale_motion,
    summarise,
    time_ratios,
    wilson_interval,
)


def sample(t, level, alpha=0.5, operator_speed=0.0, elapsed=1.0, trial=3, stale=False,
           xy=(0.0, 0.0)):
    return TimelineSample(t, trial, 'running', elapsed, level, 1e-4, alpha, stale,
                          operator_speed, 0.1, 0.1, *xy, 0)


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


def test_wilson_interval():
    # 0 of n: the upper end is z^2 / (n + z^2), 11.35 % for 30 trials.
    low, high = wilson_interval(0, 30)
    assert low == 0.0 and high == pytest.approx(1.959964 ** 2 / (30 + 1.959964 ** 2))
    low, high = wilson_interval(27, 30)
    assert low < 0.9 < high and high < 1.0
    # The interval of the complement mirrors it.
    assert wilson_interval(3, 30) == pytest.approx(tuple(1 - v for v in (high, low)))
    assert all(math.isnan(v) for v in wilson_interval(0, 0))
    with pytest.raises(ValueError):
        wilson_interval(4, 3)


def test_a_trial_without_a_target_succeeds_by_holding_and_fails_by_any_grasp():
    samples = [sample(0.1, 0), sample(0.2, 0)]
    held = score_trial({'trial': 3, 'status': 'timeout', 'grasped': None, 'elapsed_s': 10.0,
                        'target_present': False}, samples, 0.02)
    assert held['success'] and not held['timeout'] and not held['wrong_grasp']
    grasped = score_trial({'trial': 3, 'status': 'failure', 'grasped': 'lookalike',
                           'elapsed_s': 3.0, 'target_present': False}, samples, 0.02)
    assert not grasped['success'] and grasped['wrong_grasp']
    late = score_trial({'trial': 3, 'status': 'timeout', 'grasped': None, 'elapsed_s': 45.0},
                       samples, 0.02)
    assert not late['success'] and late['timeout']
    s = summarise([dict(held, kind='target_absent'), dict(grasped, kind='target_absent'),
                   dict(late, kind='confident_lookalike')])
    assert s['success']['count'] == 1 and s['wrong_grasps']['count'] == 1
    assert s['timeouts']['count'] == 1 and math.isnan(s['mean_time_s'])
    assert s['per_kind']['target_absent']['success']['trials'] == 2


def test_stale_motion_counts_unattended_motion_after_the_stale_report_until_fresh():
    samples = [sample(0.0, 3, xy=(0.0, 0.0)),
               sample(0.4, 3, xy=(0.04, 0.0)),               # the fault is not noticed yet
               sample(0.6, 0, stale=True, xy=(0.05, 0.0)),   # reported; braking allowance
               sample(1.0, 0, stale=True, xy=(0.06, 0.0)),
               sample(1.5, 0, stale=True, xy=(0.08, 0.0)),
               sample(2.0, 0, stale=True, operator_speed=0.05, xy=(0.09, 0.0)),
               sample(2.2, 0, stale=True, xy=(0.19, 0.0)),   # the operator drove this step
               sample(2.5, 0, stale=True, xy=(0.21, 0.0)),   # coasting on its last command
               sample(3.0, 0, stale=True, xy=(0.23, 0.0)),   # 0.5 s quiet: counted
               sample(3.5, 0, xy=(0.5, 0.0))]                # fresh again: the window ends
    moved = stale_motion(samples, onset=0.1, allowance_s=0.3, deadband=0.02, deadline_s=0.5,
                         operator_quiet_s=0.4)
    assert moved['stale_motion_m'] == pytest.approx(0.02 + 0.01 + 0.02)
    assert moved['stale_window_s'] == pytest.approx(2.0)
    assert moved['stale_after_s'] == pytest.approx(0.5)
    never = stale_motion(samples[:2], onset=0.1, allowance_s=0.3, deadband=0.02,
                         deadline_s=0.5, operator_quiet_s=0.4)
    assert never['stale_after_s'] is None and never['stale_motion_m'] == 0.0
    faulted = [{'seed': k, 'success': True, 'status': 'success', 'time_s': 5.0,
                'lookalike': False, 'operator_share': 1.0, 'level_changes': 0,
                'stale_motion_m': m, 'fault_onset': 1.0} for k, m in enumerate((0.0, 0.03))]
    assert summarise(faulted)['moved_toward_stale_goal']['count'] == 1


def _stale_motion(samples):
    return stale_motion(samples, onset=0.1, allowance_s=0.3, deadband=0.02, deadline_s=0.5,
                        operator_quiet_s=0.4)


def test_the_stale_window_closes_at_fresh_perception_and_a_second_stale_spell_is_not_it():
    # stale -> fresh -> stale: the window is the first stale spell only. The robot moving
    # while perception is fresh (the operator or the autonomy on a fresh goal) and in a later
    # stale spell (after the window closed) is no motion toward the faulted goal.
    first = [sample(0.0, 3, xy=(0.0, 0.0)),
             sample(0.5, 0, stale=True, xy=(0.01, 0.0)),   # reported; braking allowance
             sample(1.0, 0, stale=True, xy=(0.02, 0.0)),
             sample(1.5, 0, stale=True, xy=(0.05, 0.0))]   # counted from 0.8 s: 0.03
    fresh = [sample(2.0, 2, xy=(0.30, 0.0)),               # fresh: the window ends here
             sample(2.5, 3, xy=(0.60, 0.0))]
    second = [sample(3.0, 0, stale=True, xy=(0.90, 0.0)),
              sample(3.5, 0, stale=True, xy=(1.20, 0.0)),
              sample(4.0, 0, stale=True, xy=(1.50, 0.0))]
    moved = _stale_motion(first + fresh + second)
    assert moved['stale_motion_m'] == pytest.approx(0.03)
    assert moved['stale_window_s'] == pytest.approx(0.5)
    assert moved['stale_after_s'] == pytest.approx(0.4)
    assert _stale_motion(first + fresh + second) == _stale_motion(first + fresh[:1])


def test_nothing_after_the_first_fresh_sample_changes_the_stale_motion():
    # The rule as a property: once perception is fresh again after the window opened
    # (braking allowance 0.3 s after the first stale report), any later timeline (more stale
    # spells, fresh motion, operator commands) leaves the figures as they are.
    rng = np.random.default_rng(3)
    for _ in range(200):
        t, x, head = 0.0, 0.0, [sample(0.0, 3)]
        first_stale = float(rng.uniform(0.1, 0.6))
        t = first_stale
        head.append(sample(t, 0, stale=True, xy=(x, 0.0)))
        while t < first_stale + 0.3 or rng.random() < 0.5:  # stale past the allowance
            t, x = t + float(rng.uniform(0.05, 0.5)), x + float(rng.uniform(0.0, 0.05))
            head.append(sample(t, 0, stale=True, xy=(x, 0.0)))
        t, x = t + 0.1, x + 0.2
        head.append(sample(t, 2, xy=(x, 0.0)))             # the first fresh sample
        tail = []
        for _ in range(int(rng.integers(1, 12))):
            t, x = t + float(rng.uniform(0.05, 0.5)), x + float(rng.uniform(0.0, 0.3))
            tail.append(sample(t, 0, stale=bool(rng.random() < 0.7), xy=(x, 0.0),
                               operator_speed=float(rng.choice([0.0, 0.0, 0.05]))))
        alone, followed = _stale_motion(head), _stale_motion(head + tail)
        assert followed == pytest.approx(alone), (head, tail)


def test_every_policy_has_a_level_and_an_operator_mode_and_gated_help_is_gated():
    assert set(PINNED_LEVEL) == set(OPERATOR_MODE) == set(POLICIES)
    assert PINNED_LEVEL['gated_help'] is None and OPERATOR_MODE['gated_help'] == 'supervise'
    assert set(HELP_POLICIES) == {'gated_help'}


def test_paired_time_ratios_of_the_gated_policies_over_every_policy_before_them():
    def rows(times):
        return [{'seed': k, 'success': t is not None, 'time_s': t or 45.0}
                for k, t in enumerate(times)]
    by_policy = {'teleoperation': rows([8.0, 8.0, 8.0]), 'full_autonomy': rows([2.0, None, 2.0]),
                 'gated': rows([4.0, 6.0, None]), 'gated_help': rows([3.0, 5.0, 4.0])}
    ratios = time_ratios(by_policy)
    assert set(ratios) == {'gated_over_teleoperation', 'gated_over_full_autonomy',
                           'gated_help_over_teleoperation', 'gated_help_over_full_autonomy',
                           'gated_help_over_gated'}
    assert ratios['gated_help_over_gated']['pairs'] == 2
    assert ratios['gated_help_over_gated']['ratio'] == pytest.approx(8.0 / 10.0)
    assert ratios['gated_help_over_full_autonomy']['ratio'] == pytest.approx(7.0 / 4.0)
    # Only the policies played.
    assert set(time_ratios({'gated_help': by_policy['gated_help'],
                            'full_autonomy': by_policy['full_autonomy']})) == \
        {'gated_help_over_full_autonomy'}


def test_help_requests_answers_and_suspect_holds_per_trial_and_policy():
    samples = [sample(0.1, 0), sample(0.2, 1), sample(0.3, 1), sample(0.4, 1)]
    for s, held, asked in zip(samples, (False, True, True, False), (0, 0, 1, 1), strict=True):
        s.suspect_hold, s.help_requests = held, asked
    row = score_trial({'trial': 3, 'status': 'failure', 'grasped': 'lookalike',
                       'elapsed_s': 3.0}, samples, 0.02)
    assert row['help_requests'] == 1 and row['suspect_hold_share'] == pytest.approx(0.5)
    other = dict(row, help_requests=3, help_answered=2, suspect_hold_share=0.0)
    s = summarise([dict(row, help_answered=1), other])
    assert s['help_requests_per_trial'] == pytest.approx(2.0)
    assert s['help_answered_per_trial'] == pytest.approx(1.5)
    assert s['suspect_hold_share'] == pytest.approx(0.25)
    # Rows of a journal from before these fields.
    old = {k: v for k, v in row.items() if k not in ('help_requests', 'suspect_hold_share')}
    s = summarise([old])
    assert s['help_requests_per_trial'] == 0.0 and math.isnan(s['suspect_hold_share'])
