"""The grasp task's calibrated scores per object role (uq_eval.closed_loop.task_scores)."""

from __future__ import annotations

import json

import pytest

from uq_eval.closed_loop.task_scores import main, markdown, summarise


def test_summary_counts_reads_and_score_percentiles_per_role():
    rows = [{'role': 'target', 'class_read': 'ellipsoid', 'score': s} for s in (0.1, 0.5, 0.9)]
    rows += [{'role': 'target', 'class_read': None, 'score': None},
             {'role': 'lookalike', 'class_read': 'ellipsoid', 'score': 0.99},
             {'role': 'lookalike', 'class_read': 'cylinder', 'score': 0.95}]
    summary = summarise(rows, 'ellipsoid')
    target, lookalike = summary['target'], summary['lookalike']
    assert (target['objects'], target['detected'], target['read_as_target']) == (4, 3, 3)
    assert target['score']['p50'] == pytest.approx(0.5)
    assert target['score']['p100'] == pytest.approx(0.9)
    assert lookalike['read_as_target'] == 1
    assert lookalike['score_read_as_target']['p50'] == pytest.approx(0.99)
    assert summary['distractor'] == {'objects': 0, 'detected': 0, 'read_as_target': 0,
                                     'score': None, 'score_read_as_target': None}
    table = markdown(summary, 'ellipsoid', 'cmd')
    assert '| target | 4 | 3 | 3 | 0.180 / 0.500 / 0.820 / 0.900 |' in table


def test_the_shipped_detector_on_one_task_frame(tmp_path, capsys):
    out = tmp_path / 'scores.json'
    assert main(['--trials', '1', '--fractions', '0', '--json', str(out)]) == 0
    report = json.loads(out.read_text())
    target = report['summary']['target']
    assert target['objects'] == 1 and target['detected'] == 1
    assert 0.0 <= target['score']['p50'] <= 1.0
    assert report['command'].startswith('python -m uq_eval.closed_loop.task_scores --trials 1')
    assert '| target | 1 | 1 |' in capsys.readouterr().out


def test_a_fraction_outside_the_unit_interval_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(['--fractions', '1.5'])
    assert exit_info.value.code == 2
    assert 'a fraction in [0, 1]' in capsys.readouterr().err
