"""The suites of `uq eval shared-autonomy`, its policies and report, and the rule that
chooses confident look-alikes."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from uq_eval.closed_loop.lookalike_selection import (
    MIN_FRAME_SHARE,
    MIN_PASSED_VIEWS,
    REACH_FRACTIONS,
    SELECTION_SEED_BASE,
    SELECTION_VIEWS,
    load_selection,
    passes_rule,
    passes_views,
    reads_as_target,
    screen,
    selection_seed,
)
from uq_eval.closed_loop.shared_autonomy_eval import (
    FAULTS,
    _replayed,
    _report,
    labeller_delay,
    markdown,
    plot_hard_trial,
    plot_wrong_grasps,
    trial_plan,
)
from uq_eval.closed_loop.shared_autonomy_metrics import POLICIES, summarise

# A fixed range of candidate shapes, screened again here with the shipped detector: it
# holds a shape that passes the rule and shapes that do not.
FIXED_SHAPES = range(237, 240)


def uq_exit(capsys, *argv: str) -> tuple[int, str]:
    """Run ``uq`` in this process; its exit code and stderr."""
    from uq_common.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(list(argv))
    return stopped.value.code, capsys.readouterr().err


@pytest.mark.parametrize('argv, problem', [
    (['--suite', 'medium'], "invalid choice: 'medium'"),
    (['--suite'], 'expected one argument'),
    (['--suite', 'hard', '--trials', '0'], '--trials'),
    (['--trials', 'many'], '--trials'),
    (['--suite', 'all', '--trials', '-3'], '--trials'),
    (['--policies', 'gated_helper'], "invalid choice: 'gated_helper'"),
    (['--labeller-delay', '-1'], '--labeller-delay'),
    (['--labeller-delay', 'nan'], '--labeller-delay'),
    (['--labeller-delay', 'soon'], '--labeller-delay'),
    (['--labeller-delay'], 'expected one argument'),
])
def test_bad_suite_arguments_exit_2_with_one_line(capsys, argv, problem):
    code, err = uq_exit(capsys, 'eval', 'shared-autonomy', *argv)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and problem in err, err


def test_quick_with_another_suite_and_overlapping_seeds_exit_2_with_one_line(capsys, tmp_path):
    from uq_common.cli import main

    for argv in (['--quick', '--suite', 'hard'],
                 ['--suite', 'hard', '--seed', str(SELECTION_SEED_BASE - 5), '--trials', '30']):
        assert main(['eval', 'shared-autonomy', '--out', str(tmp_path), *argv]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
    assert 'other seeds than the look-alikes were chosen in' in err
    assert not (tmp_path / 'trials.jsonl').exists()


def test_a_labeller_delay_without_the_labeller_exits_2_with_one_line(capsys, tmp_path):
    from uq_common.cli import main

    assert main(['eval', 'shared-autonomy', '--out', str(tmp_path), '--policies', 'gated',
                 'full_autonomy', '--labeller-delay', '2']) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and 'gated_help' in err, err
    assert not (tmp_path / 'trials.jsonl').exists()


def test_the_policies_default_to_all_four_and_the_delay_to_the_loop_configuration():
    from uq_eval.closed_loop.shared_autonomy_eval import configure

    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args([])
    assert args.policies == list(POLICIES) and 'gated_help' in args.policies
    assert labeller_delay(args) == 1.0  # config/shared_autonomy.yaml, scripted_labeller_node
    assert labeller_delay(parser.parse_args(['--labeller-delay', '0'])) == 0.0
    assert parser.parse_args(['--policies', 'gated', 'gated_help']).policies == \
        ['gated', 'gated_help']


def test_a_gated_help_trial_counts_for_a_resumed_run_only_with_its_labeller_delay():
    assert _replayed({'policy': 'gated', 'seed': 0}, 2.0)
    assert _replayed({'policy': 'gated_help', 'labeller_delay_s': 2.0}, 2.0)
    assert not _replayed({'policy': 'gated_help', 'labeller_delay_s': 1.0}, 2.0)
    assert not _replayed({'policy': 'gated_help'}, 1.0)


def test_the_plans_pair_seeds_and_mix_the_trial_kinds():
    hard = trial_plan('hard', 9, 10, [4, 7])
    assert [t['seed'] for t in hard] == list(range(10, 19))
    assert [t['kind'] for t in hard].count('target_absent') == 3
    assert all(t['extra']['target_absent'] for t in hard if t['kind'] == 'target_absent')
    assert [t['extra']['lookalike_shape'] for t in hard[:3]] == [4, 7, 4]
    faults = trial_plan('faults', 6, 0, None)
    assert [t['fault'] for t in faults] == list(FAULTS) * 2
    assert [t['seed'] for t in trial_plan('easy', 4, 3, None)] == [3, 4, 5, 6]
    with pytest.raises(ValueError, match='at least one confident look-alike'):
        trial_plan('hard', 3, 0, [])


def test_the_hard_suite_cycles_over_the_shipped_shapes_in_both_kinds_of_trial():
    shapes = load_selection()['passed']
    assert len(set(shapes)) >= 3, shapes
    plan = trial_plan('hard', 30, 0, shapes)
    for kind in ('confident_lookalike', 'target_absent'):
        mine = [t['extra']['lookalike_shape'] for t in plan if t['kind'] == kind]
        # In turn, so that every shape plays each kind of trial about as often.
        assert mine == [shapes[k % len(shapes)] for k in range(len(mine))], (kind, mine)
        assert set(mine) == set(shapes)


def test_a_shape_passes_in_enough_of_its_selection_trials_and_the_screen_stops_early():
    assert MIN_PASSED_VIEWS <= SELECTION_VIEWS
    fails = SELECTION_VIEWS - MIN_PASSED_VIEWS + 1  # failed trials that settle it
    assert passes_views([True] * MIN_PASSED_VIEWS) is True
    assert passes_views([False] * fails) is False
    assert passes_views([True] * (MIN_PASSED_VIEWS - 1)) is None
    assert passes_views([False] * (fails - 1)) is None
    assert passes_views([False] * (fails - 1) + [True] * MIN_PASSED_VIEWS) is True


def test_the_rule_counts_confident_target_readings():
    assert reads_as_target('ellipsoid', 0.9, 'ellipsoid')
    assert not reads_as_target('ellipsoid', 0.89, 'ellipsoid')
    assert not reads_as_target('box', 0.99, 'ellipsoid') and not reads_as_target(None, 0, 'e')
    frames = len(REACH_FRACTIONS)
    needed = -(-MIN_FRAME_SHARE * frames // 1)  # ceil
    assert passes_rule([True] * int(needed) + [False] * (frames - int(needed)))
    assert not passes_rule([True] * (int(needed) - 1) + [False] * (frames - int(needed) + 1))
    with pytest.raises(ValueError):
        passes_rule([])


def test_the_shipped_selection_is_what_the_rule_gives_on_a_fixed_range():
    """Screen a fixed range of candidates with the shipped detector: each verdict follows
    the rule from its frames, and the shipped file holds the same frames and verdicts."""
    from uq_eval.bags.evaluation import load_shipped_perception
    from uq_sim.grasp_task import TARGET_CLASS

    shipped = load_selection()
    rows = screen(FIXED_SHAPES, load_shipped_perception(), TARGET_CLASS)
    by_shape = {row['shape']: row for row in shipped['rows']}
    assert any(r['passed'] for r in rows) and not all(r['passed'] for r in rows)
    for row in rows:
        views = row['views']
        assert [v['trial_seed'] for v in views] == [selection_seed(row['shape'], j)
                                                   for j in range(len(views))]
        assert all(v['passed'] == passes_rule([f['as_target'] for f in v['frames']])
                   for v in views)
        verdicts = [v['passed'] for v in views]
        # Screened until the verdict is known, not further.
        assert passes_views(verdicts[:-1]) is None
        assert row['passed'] == passes_views(verdicts)
        assert row['passed'] == (row['shape'] in shipped['passed'])
        # The same frames read the same way as in the shipped file (the class probability
        # may differ in its last digits between machines).
        for view, kept in zip(views, by_shape[row['shape']]['views'], strict=True):
            assert [f['class'] for f in view['frames']] == [f['class'] for f in kept['frames']]
            assert [f['as_target'] for f in view['frames']] == \
                [f['as_target'] for f in kept['frames']]


def _trial_row(policy: str, seed: int, status: str, time_s: float, help_requests: int = 0,
               help_answered: int = 0) -> dict:
    """A journal row with a short timeline, as the harness writes them."""
    t = [0.0, 0.5, 1.0, 1.5]
    return {'seed': seed, 'policy': policy, 'kind': 'confident_lookalike', 'lookalike': True,
            'lookalike_shape': 238, 'target_present': True, 'status': status,
            'grasped': {'success': 'target', 'failure': 'lookalike'}[status],
            'success': status == 'success', 'wrong_grasp': status == 'failure',
            'timeout': False, 'time_s': time_s, 'operator_share': 0.5, 'level_changes': 2,
            'max_level': 3, 'help_requests': help_requests, 'help_answered': help_answered,
            'suspect_hold_share': 0.5 if policy.startswith('gated') else 0.0,
            'timeline': {'t': t, 'level': [0, 1, 1, 3], 'uncertainty': [None, 0.7, 0.8, 0.6],
                         'blend_alpha': [0.5] * 4, 'stale': [False] * 4,
                         'operator_speed': [0.0] * 4, 'autonomy_speed': [0.1] * 4,
                         'gripper': [[0.0, 0.1 * k] for k in range(4)],
                         'suspect_hold': [False, True, True, False],
                         'track_score': [None, 0.75, 0.8, 0.7],
                         'help_requests': [0, 0, help_requests, help_requests],
                         'objects': [{'name': 'target', 'class': 'ellipsoid', 'x': 0.2,
                                      'y': 0.3},
                                     {'name': 'lookalike', 'class': 'procedural_superquadric',
                                      'x': 0.0, 'y': 0.2}]}}


def test_the_report_puts_gated_help_beside_the_three_other_policies(tmp_path):
    results = {'hard': {
        'teleoperation': [_trial_row('teleoperation', k, 'success', 8.0) for k in range(2)],
        'full_autonomy': [_trial_row('full_autonomy', k, 'failure', 3.0) for k in range(2)],
        'gated': [_trial_row('gated', 0, 'success', 6.0), _trial_row('gated', 1, 'failure', 4.0)],
        'gated_help': [_trial_row('gated_help', 0, 'success', 5.0, 1, 1),
                       _trial_row('gated_help', 1, 'success', 7.0, 2, 1)]}}
    args = argparse.Namespace(quick=False, suite='hard', trials=2, seed=0,
                              policies=list(POLICIES), labeller_delay=None)
    report = _report(results, args, 1.0)
    body = report['suites']['hard']
    assert list(body['policies']) == list(POLICIES)
    assert body['policies']['gated_help'] == summarise(results['hard']['gated_help'])
    assert body['policies']['gated_help']['help_answered_per_trial'] == 1.0
    assert body['time_ratios']['gated_help_over_teleoperation']['ratio'] == \
        pytest.approx(6.0 / 8.0)
    assert body['time_ratios']['gated_help_over_gated']['pairs'] == 1
    assert report['labeller_delay_s'] == 1.0
    assert all('timeline' not in r for r in report['trials']['hard']['gated_help'])
    json.dumps(report)
    text = markdown(report)
    assert '| gated_help | 2/2 (100 %' in text and '| 1.5 (1.0) |' in text
    assert 'gated help / gated, on the 1 trials' in text
    assert 'gated 50 %, gated_help 50 %' in text
    # The trials a gated policy got wrong: one row per seed (here seed 1 of gated), beside
    # the other gated policy's run of it; the hard trial shows every policy but one.
    assert plot_wrong_grasps('hard', results['hard'], tmp_path / 'wrong.png')
    assert (tmp_path / 'wrong.png').stat().st_size > 0
    assert not plot_wrong_grasps('hard', {'gated': results['hard']['teleoperation']},
                                 tmp_path / 'none.png')
    assert plot_hard_trial(results['hard'], tmp_path / 'hard.png')
    # A journal from before the suspect gate: no suspect or track-score columns.
    old = {policy: [dict(r, timeline={k: v for k, v in r['timeline'].items()
                                      if k not in ('suspect_hold', 'track_score',
                                                   'help_requests')})
                    for r in rows] for policy, rows in results['hard'].items()}
    assert plot_wrong_grasps('hard', old, tmp_path / 'old.png')
    assert math.isfinite(report['suites']['hard']['policies']['gated']['suspect_hold_share'])
