"""``uq eval help --quick``: the sim camera, detector, ask-for-help node and scripted labeller
as separate processes over DDS; the report must be consistent, and at least one novel object
must have been asked about, answered and learnt (not the targets: one short scenario)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_help_eval_asks_about_a_novel_object_and_learns_it(tmp_path):
    out = tmp_path / 'help'
    env = os.environ | {'PYTHONUNBUFFERED': '1'}
    domain = 100 + os.getpid() % 50
    result = subprocess.run(['uq', 'eval', 'help', '--quick', '--answer-delay', '1.0',
                             '--out', str(out), '--domain-id', str(domain)],
                            capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    logs = result.stdout + result.stderr
    assert result.returncode == 0, logs
    report = json.loads((out / 'help_eval.json').read_text())
    assert (out / 'timeline.png').stat().st_size > 0
    (run,) = report['runs']
    summary = report['summary']
    assert run['scenario'] == 'novel_pair' and run['frames'] > 0

    # Counts agree with the per-request and per-object lists.
    assert run['requests'] == len(run['per_request']) == sum(run['request_kinds'].values())
    assert run['useful_requests'] == sum(q['useful'] for q in run['per_request'])
    assert run['useful_requests'] == (run['request_kinds']['unknown_object']
                                      + run['request_kinds']['misclassified_known'])
    assert run['help_precision'] == pytest.approx(run['useful_requests'] / run['requests'],
                                                  abs=1e-3)
    assert 0 < run['novel_objects_asked'] <= run['novel_objects']
    assert run['recall'] == pytest.approx(run['novel_objects_asked'] / run['novel_objects'],
                                          abs=1e-3)
    assert run['queries_per_novel_object'] >= 1.0
    assert run['requests_on_novel_objects'] >= run['novel_objects_asked']
    assert summary['requests'] == run['requests']
    assert set(report['targets']) == {'help_precision', 'queries_per_novel_object', 'recall',
                                      'post_answer_accuracy'}

    # A novel object was answered by the scripted labeller with its true class and learnt:
    # its frames after the answer are classified as that class.
    answered = [v for v in run['per_answered_object'].values() if v['novel']]
    assert answered, logs
    assert all(v['label'] == v['class'] for v in answered)
    learnt = [v for v in answered if v['frames_after_answer'] > 0]
    assert learnt, 'the scenario ended before any frame followed an answer'
    assert any(v['accuracy'] > 0.5 for v in learnt), learnt
    assert run['post_answer_frames'] == sum(v['frames_after_answer'] for v in answered)
    helper_log = (out / 'logs' / 'novel_pair' / 'ask_for_help_node.log').read_text()
    assert 'learnt new class' in helper_log
