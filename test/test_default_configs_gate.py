"""The shipped default configurations gate autonomy on what the shipped detector sees.

``sim_camera_node``, ``detector_node`` and ``arbitration_node`` run as separate processes
over real DDS on a private domain, each with the parameter files the launch files give it
and nothing else: ``config/<name>.yaml`` for the sim profile, then ``config/robot/<name>.yaml``
on top of it for the robot profile. The test sets only what is not configuration: the
scenario the camera plays, the detector's lifecycle start (``autostart``, which
``uq_stack.launch.py`` sets too) and a ROS home of its own (no learnt
labels from elsewhere). Per profile, with one detector and one arbitration node:

- ``known_static`` (four known objects): the level climbs to assistance;
- ``unknown_static`` (two of the objects unknown): within 3 s of the first detections the
  arbitration node publishes teleoperation from fresh perception, and holds it while the
  scene stays (a climb would start after one ``min_dwell_s``).

Thresholds written in the units of another model, or placeholders orders of magnitude
above the shipped detector's variances, climb to assistance on ``unknown_static``: this
test fails on them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from gating_observer import GatingObserver

WORKSPACE = Path(__file__).resolve().parents[1]
CONFIG = WORKSPACE / 'config'
# One domain per run: two runs at once on one host must not drive each other's nodes.
DOMAIN_ID = 100 + (zlib.crc32(b'test_default_configs_gate') + os.getpid()) % 100
START_TIMEOUT_S = 180.0   # torch import and model load on a loaded 2-core machine
HAND_BACK_S = 3.0         # unknown objects in view -> teleoperation within this
HOLD_S = 5.0              # ... and held at least this long after
CLIMB_TIMEOUT_S = 60.0    # three dwell periods of fresh perception, with margin
NODES = {'sim_camera_node': 'uq_sim', 'detector_node': 'uq_perception',
         'arbitration_node': 'uq_autonomy'}


def parameter_files(node: str, profile: str) -> list[str]:
    """The files the launch files give ``node`` in ``profile`` (sim: the base file)."""
    stem = node.removesuffix('_node')
    files = [CONFIG / f'{stem}.yaml']
    if profile == 'robot' and (CONFIG / 'robot' / f'{stem}.yaml').is_file():
        files.append(CONFIG / 'robot' / f'{stem}.yaml')
    return [arg for path in files for arg in ('--params-file', str(path))]


class Processes:
    """Node processes of the test, each with its own log; stopped with SIGINT."""

    def __init__(self, log_dir: Path, ros_home: Path) -> None:
        self.log_dir = log_dir
        self.env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN_ID), ROS_HOME=str(ros_home),
                        PYTHONUNBUFFERED='1')
        self.running: dict[str, subprocess.Popen] = {}

    def start(self, node: str, profile: str, *extra: str) -> None:
        package = NODES[node]
        executable = WORKSPACE / 'install' / package / 'lib' / package / node
        assert executable.is_file(), f'{executable} not installed (make setup)'
        log = (self.log_dir / f'{node}.log').open('a')
        self.running[node] = subprocess.Popen(
            [str(executable), '--ros-args', *parameter_files(node, profile), *extra],
            env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def stop(self, node: str) -> int:
        process = self.running.pop(node)
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            return process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait(timeout=10)

    def dead(self) -> list[str]:
        return [name for name, p in self.running.items() if p.poll() is not None]

    def log(self, node: str) -> str:
        return (self.log_dir / f'{node}.log').read_text(errors='replace')[-3000:]

    def stop_all(self) -> None:
        for node in list(self.running):
            self.stop(node)


@pytest.fixture(params=['sim', 'robot'])
def stack(request: pytest.FixtureRequest, tmp_path: Path
          ) -> Iterator[tuple[str, Processes, GatingObserver]]:
    profile = request.param
    processes = Processes(tmp_path, tmp_path / 'ros_home')
    observer = GatingObserver('default_configs_observer', DOMAIN_ID)
    try:
        processes.start('detector_node', profile, '-p', 'autostart:=true')
        processes.start('arbitration_node', profile)
        yield profile, processes, observer
    finally:
        observer.close()
        processes.stop_all()


def _alive(processes: Processes) -> Callable[[], None]:
    def check() -> None:
        assert not processes.dead(), f'died: {processes.dead()}'
    return check


def _play(processes: Processes, observer: GatingObserver, profile: str, scenario: str) -> float:
    """Start the camera on ``scenario``; returns when the first detections of it arrived."""
    with observer.lock:
        observer.detections.clear()
    processes.start('sim_camera_node', profile, '-p', f'scenario:={scenario}')
    first = observer.wait_for(lambda: observer.detections and observer.detections[0],
                              START_TIMEOUT_S, _alive(processes))
    assert first, f'no detections of {scenario}; detector log:\n{processes.log("detector_node")}'
    return first


def test_the_shipped_configs_hand_back_on_unknown_objects_and_assist_on_known_ones(stack):
    profile, processes, observer = stack

    start = _play(processes, observer, profile, 'known_static')
    climbed = observer.wait_for(
        lambda: next((s for t, s in observer.states if t >= start and s.level == 3), None),
        CLIMB_TIMEOUT_S, _alive(processes))
    assert climbed, f'{profile}: known_static never reached assistance:\n' \
        f'{observer.story(start)}'
    print(f'{profile} known_static: assistance {climbed.reason!r}')
    processes.stop('sim_camera_node')
    observer.wait_for(lambda: observer.states[-1][1].perception_stale, 10.0,
                      _alive(processes))

    start = _play(processes, observer, profile, 'unknown_static')
    handed_back = observer.wait_for(
        lambda: next((t for t, s in observer.states
                      if t >= start and s.level == 0 and not s.perception_stale), None),
        HAND_BACK_S + 2.0, _alive(processes))
    time.sleep(max(0.0, start + HAND_BACK_S + HOLD_S - time.monotonic()))
    seen = observer.story(start)
    assert handed_back is not None and handed_back - start <= HAND_BACK_S, \
        f'{profile}: no teleoperation from fresh perception within {HAND_BACK_S} s:\n{seen}'
    assert all(s.level == 0 for t, s in observer.after(start)), \
        f'{profile}: unknown_static left teleoperation:\n{seen}'
    fresh = [s for _, s in observer.after(start) if not s.perception_stale]
    assert fresh and all(s.uncertainty_signal == 'calibrated_score' for s in fresh)
    print(f'{profile} unknown_static: teleoperation {handed_back - start:.2f} s after the '
          f'first detections, held {HOLD_S:g} s; most uncertain detection: calibrated_score '
          f'{fresh[-1].uncertainty:.4g}')
    assert processes.stop('sim_camera_node') == 0
