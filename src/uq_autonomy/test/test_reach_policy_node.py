"""The reach policy node over real DDS: a peer plays camera, detector and robot; a gripper
pose with a non-finite position is dropped and counted, the proposal is zero (never NaN)
until a valid pose comes, then it steers again."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from geometry_msgs.msg import PoseStamped, Twist
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CameraInfo
from std_msgs.msg import Int32

from uq_autonomy.reach_policy_node import ReachPolicyNode
from uq_common.spin_thread import SpinThread
from uq_msgs.msg import Detection, DetectionArray

TIMEOUT_S = 10.0
F, CX, CY = 290.0, 159.5, 119.5


class Harness:
    """The node under test and a peer streaming a camera looking straight down from 1 m, a
    target detection 100 pixels right of the centre, and the gripper pose."""

    def __init__(self, context: Any) -> None:
        self.node = ReachPolicyNode(context=context,
                                    parameter_overrides=[Parameter('period_s', value=0.02)])
        self.peer = Node('reach_policy_test_peer', context=context)
        self.lock = threading.Lock()
        self.commands: list[tuple[float, float, float]] = []
        self.gripper = (0.0, 0.0)
        self.info_pub = self.peer.create_publisher(CameraInfo, 'camera_info', 10)
        self.det_pub = self.peer.create_publisher(DetectionArray, 'detections', 10)
        self.robot_pub = self.peer.create_publisher(PoseStamped, 'robot_pose', 10)
        camera_pose = self.peer.create_publisher(PoseStamped, 'camera_pose', QoSProfile(
            depth=1, reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL))
        down = PoseStamped()
        down.pose.position.z = 1.0
        down.pose.orientation.x, down.pose.orientation.w = 1.0, 0.0  # optical z to world -z
        camera_pose.publish(down)
        self.peer.create_subscription(Twist, 'autonomy/cmd_vel', self._on_cmd, QoSProfile(
            depth=100, reliability=ReliabilityPolicy.BEST_EFFORT))
        self.targets: list[int] = []
        self.peer.create_subscription(Int32, 'autonomy/target_track_id', self._on_target,
                                      QoSProfile(depth=100,
                                                 reliability=ReliabilityPolicy.BEST_EFFORT))
        self.peer.create_timer(0.05, self._stream)
        self._spinners: list[tuple[SingleThreadedExecutor, SpinThread]] = []
        for node in (self.node, self.peer):
            executor = SingleThreadedExecutor(context=context)
            executor.add_node(node)
            self._spinners.append((executor, SpinThread(executor)))

    def _stream(self) -> None:
        info = CameraInfo()
        info.k = [F, 0.0, CX, 0.0, F, CY, 0.0, 0.0, 1.0]
        self.info_pub.publish(info)
        pose = PoseStamped()
        pose.pose.position.x, pose.pose.position.y = self.gripper
        self.robot_pub.publish(pose)
        d = Detection(class_id='ellipsoid', center_x=CX + 100.0, center_y=CY, track_id=4)
        self.det_pub.publish(DetectionArray(detections=[d]))

    def _on_target(self, msg: Int32) -> None:
        with self.lock:
            self.targets.append(msg.data)

    def _on_cmd(self, msg: Twist) -> None:
        with self.lock:
            self.commands.append((msg.linear.x, msg.linear.y, msg.linear.z))

    def wait_command(self, predicate: Callable[[tuple[float, float, float]], bool],
                     what: str) -> None:
        with self.lock:
            since = len(self.commands)
        end = time.monotonic() + TIMEOUT_S
        while time.monotonic() < end:
            with self.lock:
                if any(predicate(c) for c in self.commands[since:]):
                    return
            time.sleep(0.02)
        raise AssertionError(f'timed out waiting for {what}')

    def close(self) -> None:
        for executor, spinner in self._spinners:
            spinner.stop()
            executor.shutdown()
        self.peer.destroy_node()
        self.node.destroy_node()


@pytest.fixture
def harness(ros_context: Any) -> Iterator[Harness]:
    h = Harness(ros_context)
    yield h
    h.close()


def test_a_non_finite_gripper_pose_is_dropped_and_the_proposal_is_zero(harness: Harness
                                                                       ) -> None:
    h = harness
    h.wait_command(lambda c: c[0] == pytest.approx(0.2), 'the proposal toward the target')
    for bad in ((math.nan, 0.0), (0.0, math.inf)):
        h.gripper = bad
        h.wait_command(lambda c: c == (0.0, 0.0, 0.0), f'a zero proposal with pose {bad}')
    time.sleep(0.2)
    with h.lock:
        assert all(math.isfinite(v) for c in h.commands for v in c)
    assert h.node.invalid_poses >= 2
    h.gripper = (0.0, 0.0)
    h.wait_command(lambda c: c[0] == pytest.approx(0.2), 'the proposal once the pose is valid')


def test_the_track_reached_for_is_announced_and_withdrawn_with_the_goal(harness: Harness
                                                                        ) -> None:
    h = harness
    h.wait_command(lambda c: c[0] == pytest.approx(0.2), 'the proposal toward the target')
    with h.lock:
        assert h.targets and h.targets[-1] == 4
    h.gripper = (math.nan, 0.0)  # no gripper, no proposal: no target either
    h.wait_command(lambda c: c == (0.0, 0.0, 0.0), 'a zero proposal')
    time.sleep(0.1)
    with h.lock:
        assert h.targets[-1] == -1
