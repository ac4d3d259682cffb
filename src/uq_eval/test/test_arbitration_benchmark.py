"""``uq bench arbitration`` as a user runs it: a separate process printing a JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BENCH_DOMAIN_ID = 43
FAILSAFE_SCHEDULING_ALLOWANCE_S = 0.25
# The flood section and its no-flood control run this long each: 2 s (40 oversized messages
# at the default 20 Hz) exercise the same path as the default 10 s, which took 20 of the
# test's 25 s.
FLOOD_DURATION_S = 2.0


def _env(domain_id: int) -> dict[str, str]:
    return os.environ | {'ROS_DOMAIN_ID': str(domain_id), 'PYTHONUNBUFFERED': '1'}


def test_bench_prints_a_json_report():
    cmd = [sys.executable, '-m', 'uq_common.cli', 'bench', 'arbitration',
           '--messages', '100', '--rate', '200', '--round-trips', '10',
           '--failsafe-trials', '1', '--domain-id', str(BENCH_DOMAIN_ID),
           '--flood-duration', str(FLOOD_DURATION_S)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                         env=_env(BENCH_DOMAIN_ID), cwd=REPO)
    # Exit 1 only means a latency target was missed on this (shared, loaded) machine; a
    # crash or a usage error is anything else.
    assert out.returncode in (0, 1), out.stderr
    report = json.loads(out.stdout)
    latency = report['decision_latency']
    for label in ('core', 'core_with_message_conversion', 'node_callback',
                  'node_end_to_end_transition'):
        assert latency[label]['count'] > 0 and latency[label]['p99_ms'] >= latency[label][
            'p50_ms'] > 0, label
    # Perception is taken best-effort: a loaded machine may drop a few, never most.
    assert 50 <= latency['node_callback']['count'] <= 100
    failsafe = report['failsafe']
    assert failsafe['bound_s'] == pytest.approx(0.55)
    (trial,) = failsafe['trials']
    assert trial['level_before'] == 3 and trial['reaction_s'] >= 0.5
    # Stale perception must bring teleoperation within deadline + one period of the node's
    # check timer. On overcommitted cores that timer itself fires late (0.568 s was seen with
    # a load average of 26 on 2 cores), which the benchmark reports as within_bound false
    # and exit code 1; a fall-back later still means the fail-safe is broken, not slow.
    assert trial['reaction_s'] <= failsafe['bound_s'] + FAILSAFE_SCHEDULING_ALLOWANCE_S, trial
    assert failsafe['within_bound'] == (trial['reaction_s'] <= failsafe['bound_s'])
    assert report['meets_p99_target'] == (latency['node_callback']['p99_ms'] <= 1.0)
    # The flood ran, with the default oversized messages, and is judged on its worst gap.
    flood = report['flood']
    assert flood['detections_per_message'] == 20000 and flood['sent'] > 0
    assert 0 <= flood['received_by_node'] <= flood['sent']
    assert flood['duration_s'] >= FLOOD_DURATION_S
    assert flood['meets_target'] == (flood['worst_cmd_vel_gap_s'] <= flood['target_gap_s'])
    # Exit 0 when every target is met (p99 latency, the fail-safe bound and the flood's
    # cmd_vel gap), 1 otherwise.
    assert out.returncode == (0 if report['meets_p99_target'] and failsafe['within_bound']
                              and flood['meets_target'] else 1), out.stderr
