"""The arbitration node as a user runs it: a separate process.

``--help`` answers without ROS; an invalid parameters file refuses to start with the reason;
the shipped ``config/arbitration.yaml`` starts the real executable, whose latched
AutonomyState is heard from this process over DDS, and which exits cleanly on SIGINT.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DOMAIN_ID = 42


def _env(domain_id: int) -> dict[str, str]:
    return os.environ | {'ROS_DOMAIN_ID': str(domain_id), 'PYTHONUNBUFFERED': '1'}


def _node_cmd(*extra: str) -> list[str]:
    return [sys.executable, '-m', 'uq_autonomy.arbitration_node', *extra]


def test_help_answers_without_ros():
    out = subprocess.run(_node_cmd('--help'), capture_output=True, text=True, timeout=60,
                         env=_env(DOMAIN_ID), cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert 'perception_deadline_s' in out.stdout and 'autonomy_state' in out.stdout
    assert '[INFO]' not in out.stdout + out.stderr  # no node was created


@pytest.mark.parametrize(('yaml_body', 'needle'), [
    ('thresholds:\n      calibrated_score:\n        down: [0.98, 0.9, 0.85]', 'down[1] > up[1]'),
    ('min_dwel_s: 1.0', 'unknown parameters for arbitration_node: min_dwel_s'),
    ('operator_deadband: -1.0', 'operator_deadband'),
], ids=['unordered-thresholds', 'misspelt-name', 'out-of-range'])
def test_invalid_parameters_file_refuses_to_start(tmp_path, yaml_body, needle):
    params = tmp_path / 'bad.yaml'
    params.write_text(f'arbitration_node:\n  ros__parameters:\n    {yaml_body}\n')
    out = subprocess.run(_node_cmd('--ros-args', '--params-file', str(params)),
                         capture_output=True, text=True, timeout=60, env=_env(DOMAIN_ID),
                         cwd=REPO)
    assert out.returncode == 1
    assert 'refusing to start' in out.stderr and needle in out.stderr, out.stderr


def test_shipped_config_starts_publishes_latched_state_and_stops_on_sigint():
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    from uq_msgs.msg import AutonomyState

    proc = subprocess.Popen(
        _node_cmd('--ros-args', '--params-file', str(REPO / 'config' / 'arbitration.yaml')),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(DOMAIN_ID),
        cwd=REPO)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout or []), daemon=True)
    reader.start()
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    listener = Node('arbitration_cli_listener', context=context)
    executor = SingleThreadedExecutor(context=context)
    states: list[AutonomyState] = []
    try:
        # Joining late: transient-local durability must still deliver the current state.
        listener.create_subscription(AutonomyState, 'autonomy_state', states.append, QoSProfile(
            depth=1, reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL))
        executor.add_node(listener)
        end = time.monotonic() + 20.0
        while not states and time.monotonic() < end and proc.poll() is None:
            executor.spin_once(timeout_sec=0.1)
        assert states, f'no AutonomyState from the node; its output: {"".join(output)}'
        state = states[-1]
        assert state.level == 0 and state.perception_stale
        assert list(state.up_thresholds) == pytest.approx([0.95, 0.93, 0.91])
        assert state.uncertainty_signal == 'calibrated_score'
    finally:
        executor.shutdown()
        listener.destroy_node()
        context.try_shutdown()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
        reader.join(timeout=5)
    assert code == 0, ''.join(output)
    assert 'Traceback' not in ''.join(output)

