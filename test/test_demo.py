"""`uq demo` end to end, as `make demo` runs it: the whole closed loop as separate processes
over DDS (sim robot, detector, arbitration, autonomy, scripted operator, ask-for-help node,
scripted labeller), one look-alike trial, in a reduced form (shorter time-out, a quicker
answer), writing into a temporary folder. Checks the outputs exist and agree with each other.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import imageio.v3 as iio
import pytest

REPO = Path(__file__).resolve().parents[1]
DOMAIN_ID = 67
ANSWER_DELAY_S = 0.5
TRIAL_TIMEOUT_S = 40.0
KNOWN = {'box', 'sphere', 'cylinder', 'mug', 'ellipsoid', 'rock'}


@pytest.fixture(scope='module')
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp('demo')
    result = subprocess.run(
        [sys.executable, '-m', 'uq_eval.closed_loop.demo', '--out', str(out), '--domain-id',
         str(DOMAIN_ID), '--trial-timeout', str(TRIAL_TIMEOUT_S), '--answer-delay',
         str(ANSWER_DELAY_S)],
        cwd=REPO, env=os.environ | {'PYTHONUNBUFFERED': '1'}, capture_output=True, text=True,
        timeout=300)
    print(result.stdout[-3000:], result.stderr[-3000:])
    assert result.returncode == 0, result.stderr[-3000:]
    return out, json.loads((out / 'summary.json').read_text())


def test_the_demo_writes_every_output(demo):
    out, _ = demo
    for name in ('summary.json', 'summary.md', 'timeline.png', 'overlay.gif'):
        assert (out / name).stat().st_size > 0, name
    for node in ('sim_robot_node', 'detector_node', 'arbitration_node', 'reach_policy_node',
                 'scripted_operator_node', 'ask_for_help_node', 'scripted_labeller_node'):
        assert (out / 'logs' / f'{node}.log').is_file(), node
    frames = iio.imread(out / 'overlay.gif', index=None)
    assert frames.ndim == 4 and len(frames) >= 3 and frames.shape[2] == 640
    assert '| help precision |' in (out / 'summary.md').read_text()


def test_the_task_figures_are_consistent(demo):
    _, summary = demo
    task = summary['task']
    assert task['status'] in ('success', 'failure', 'timeout')
    assert task['success'] == (task['status'] == 'success')
    assert task['lookalike'] is True
    assert set(task['levels_visited']) <= {0, 1, 2, 3} and task['levels_visited']
    assert 0.0 <= task['operator_share'] <= 1.0
    if task['success']:
        assert task['grasped'] == 'target' and 0.0 < task['time_s'] <= TRIAL_TIMEOUT_S
    assert summary['wall_time_s'] < 240.0


def test_the_help_figures_are_consistent(demo):
    _, summary = demo
    figures, requests = summary['help'], summary['help_requests']
    trial = [r for r in requests if r['t_s'] >= 0.0]
    assert figures['requests'] == len(trial)
    justified = [r for r in trial if r['true_class'] and (
        r['true_class'] not in KNOWN or r['detected_class'] != r['true_class'])]
    assert figures['justified'] == len(justified)
    answered = [r for r in trial if r['accepted']]
    assert figures['answered'] == len(answered)
    if trial:
        assert math.isclose(figures['precision'], len(justified) / len(trial))
    for r in answered:
        # The scripted labeller answers with the ground truth, after its delay.
        assert r['answer'] == r['true_class']
        assert r['answered_t_s'] - r['t_s'] >= ANSWER_DELAY_S - 0.05
    if answered:
        assert figures['answer_latency_s'] >= ANSWER_DELAY_S - 0.05


def test_the_look_alike_earns_a_help_request_that_is_answered(demo):
    _, summary = demo
    torus = [r for r in summary['help_requests'] if r['true_class'] == 'torus']
    assert torus, summary['help_requests']
    assert any(r['accepted'] and r['answer'] == 'torus' for r in torus)
