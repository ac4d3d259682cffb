"""Separate-process node tests: a camera side that publishes rendered frames and collects every
output of the nodes, and the start and stop of installed node executables."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, Image
from visualization_msgs.msg import MarkerArray

from uq_msgs.msg import AutonomyState, DetectionArray

# Three known objects and an unknown torus, as a test scene of the simulator.
SCENE_OBJECTS = ('box', 'sphere', 'mug', 'torus')
POSITIONS = [(-0.2, 0.0), (0.0, 0.12), (0.2, -0.05), (0.03, -0.15)]


def render(names: tuple[str, ...] = SCENE_OBJECTS
           ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One rendered frame of ``names`` at fixed positions, and each object's box (cx, cy, w, h)."""
    from uq_sim.scene import compose_scene, render_scene

    placements = list(zip(names, POSITIONS, strict=True))
    frame = render_scene(compose_scene(placements, seed=0))
    boxes = {}
    for ann in frame.annotations:
        x, y, w, h = ann.bbox
        boxes[ann.class_name] = np.array([x + w / 2, y + h / 2, w, h], dtype=np.float32)
    return frame.rgb, boxes


class Flow:
    """Camera side and observer: publishes frames, collects every output of the nodes."""

    def __init__(self, context) -> None:
        self.node = rclpy.create_node('flow_test_camera', context=context)
        reliable = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)
        self.detections: list[DetectionArray] = []
        self.overlays: list[Image] = []
        self.markers: list[MarkerArray] = []
        self.diagnostics: list[DiagnosticArray] = []
        self.states: list[AutonomyState] = []
        self.node.create_subscription(DetectionArray, 'detections', self.detections.append,
                                      reliable)
        # The overlay is published best-effort (sensor data), as a camera image is.
        self.node.create_subscription(Image, 'overlay', self.overlays.append,
                                      qos_profile_sensor_data)
        self.node.create_subscription(MarkerArray, 'markers', self.markers.append, reliable)
        self.node.create_subscription(DiagnosticArray, '/diagnostics', self.diagnostics.append,
                                      reliable)
        self.node.create_subscription(AutonomyState, 'autonomy_state', self.states.append,
                                      QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE,
                                                 durability=DurabilityPolicy.TRANSIENT_LOCAL))
        self.images = self.node.create_publisher(Image, 'image', reliable)
        self.info = self.node.create_publisher(CameraInfo, 'camera_info', reliable)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)

    def spin_until(self, condition: Callable[[], bool], timeout_s: float = 60.0,
                   every: Callable[[], None] | None = None, period_s: float = 0.5) -> bool:
        deadline = time.monotonic() + timeout_s
        next_call = 0.0
        while time.monotonic() < deadline:
            if every is not None and time.monotonic() >= next_call:
                every()
                next_call = time.monotonic() + period_s
            self.executor.spin_once(timeout_sec=0.05)
            if condition():
                return True
        return condition()

    def diagnostic_values(self) -> list[tuple[str, dict[str, str]]]:
        return [(s.message, {kv.key: kv.value for kv in s.values})
                for d in self.diagnostics for s in d.status if 'uncertainty detector' in s.name]


def start(executable: str, domain_id: int, *args: str) -> subprocess.Popen:
    """An installed node executable in its own process on ``domain_id``."""
    path = shutil.which(executable)
    assert path, f'{executable} is not on PATH (source scripts/env.sh)'
    return subprocess.Popen([path, '--ros-args', *args, '--log-level', 'warn'],
                            env=os.environ | {'ROS_DOMAIN_ID': str(domain_id)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def stop(process: subprocess.Popen) -> str:
    """Stop a node as ``ros2 launch`` does (SIGINT, then kill) and return its output."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    return process.stdout.read() if process.stdout else ''
