"""The suites of `uq eval shared-autonomy` and the rule that chooses confident look-alikes."""

from __future__ import annotations

import pytest

from uq_eval.closed_loop.lookalike_selection import (
    MIN_FRAME_SHARE,
    REACH_FRACTIONS,
    SELECTION_SEED_BASE,
    SELECTION_VIEWS,
    load_selection,
    passes_rule,
    reads_as_target,
    screen,
    selection_seed,
)
from uq_eval.closed_loop.shared_autonomy_eval import FAULTS, trial_plan

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
        assert row['passed'] == (len(views) == SELECTION_VIEWS and all(v['passed']
                                                                       for v in views))
        assert row['passed'] == (row['shape'] in shipped['passed'])
        # The same frames read the same way as in the shipped file (the class probability
        # may differ in its last digits between machines).
        for view, kept in zip(views, by_shape[row['shape']]['views'], strict=True):
            assert [f['class'] for f in view['frames']] == [f['class'] for f in kept['frames']]
            assert [f['as_target'] for f in view['frames']] == \
                [f['as_target'] for f in kept['frames']]
