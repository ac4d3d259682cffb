"""Sim robot node over real DDS: hostile reset_task and cmd_vel messages are refused and
the node keeps running its trial."""

from __future__ import annotations

import json
import math
import time

import rclpy
from geometry_msgs.msg import PoseStamped, Twist
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image
from std_msgs.msg import String

from uq_sim.grasp_task import GRIPPER_HOME
from uq_sim.sim_robot_node import SimRobotNode

HOSTILE_RESETS = ['{"seed": Infinity}', '[' * 100_000, '{"seed": 1.7}', '{"seed": true}',
                  '{"seed": 99999999999999999999}', '{"seed": 2, "pad": "' + 'x' * 1_000_000 + '"}']


def test_hostile_resets_and_non_finite_commands_leave_the_trial_running(ros_context):
    node = SimRobotNode(context=ros_context, parameter_overrides=[
        Parameter('seed', value=5), Parameter('reset_pause_s', value=0.0),
        Parameter('rate_hz', value=20.0)])
    client = rclpy.create_node('sim_robot_test_client', context=ros_context)
    reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)
    reset_pub = client.create_publisher(String, 'reset_task', reliable)
    cmd_pub = client.create_publisher(Twist, 'cmd_vel', 10)
    states: list[dict] = []
    poses: list[PoseStamped] = []
    client.create_subscription(String, 'task_state', lambda m: states.append(json.loads(m.data)),
                               latched)
    client.create_subscription(PoseStamped, 'robot_pose', poses.append, reliable)
    executor = SingleThreadedExecutor(context=ros_context)
    executor.add_node(node)
    executor.add_node(client)

    def spin_until(condition, timeout=20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not condition():
            executor.spin_once(timeout_sec=0.05)
        return condition()

    try:
        assert spin_until(lambda: states and reset_pub.get_subscription_count() > 0)
        for text in HOSTILE_RESETS:
            reset_pub.publish(String(data=text))
        nan = Twist()
        nan.linear.x, nan.linear.y = math.nan, math.inf
        for _ in range(20):
            cmd_pub.publish(nan)
            executor.spin_once(timeout_sec=0.02)
        assert spin_until(lambda: node._refused_resets == len(HOSTILE_RESETS))
        assert node._gripper.rejected_commands > 0
        assert spin_until(lambda: len(poses) >= 3)
        assert states[-1]['trial'] == 5 and states[-1]['status'] == 'running'
        assert all(math.isfinite(v) for p in poses
                   for v in (p.pose.position.x, p.pose.position.y))
        assert (poses[-1].pose.position.x, poses[-1].pose.position.y) == GRIPPER_HOME, \
            'the gripper moved'
        # Still alive: a valid request starts its trial.
        reset_pub.publish(String(data='{"seed": 7, "lookalike": false, "request_id": 42}'))
        assert spin_until(lambda: states[-1]['request_id'] == 42)
        assert states[-1]['trial'] == 7 and not states[-1]['lookalike']
    finally:
        executor.shutdown()
        node.destroy_node()
        client.destroy_node()


def test_camera_faults_tear_frames_and_silence_the_camera_while_the_gripper_moves(ros_context):
    node = SimRobotNode(context=ros_context, parameter_overrides=[
        Parameter('seed', value=3), Parameter('reset_pause_s', value=0.0),
        Parameter('rate_hz', value=10.0)])
    client = rclpy.create_node('sim_fault_test_client', context=ros_context)
    reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)
    fault_pub = client.create_publisher(String, 'sim_fault', reliable)
    reset_pub = client.create_publisher(String, 'reset_task', reliable)
    cmd_pub = client.create_publisher(Twist, 'cmd_vel', 10)
    images: list[tuple[float, int, int]] = []  # arrival, buffer length, declared length
    states: list[dict] = []
    poses: list[PoseStamped] = []
    client.create_subscription(
        Image, 'image', lambda m: images.append((time.monotonic(), len(m.data),
                                                 m.step * m.height)),
        QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT))
    client.create_subscription(String, 'task_state', lambda m: states.append(json.loads(m.data)),
                               latched)
    client.create_subscription(PoseStamped, 'robot_pose', poses.append, reliable)
    executor = SingleThreadedExecutor(context=ros_context)
    executor.add_node(node)
    executor.add_node(client)

    def spin_until(condition, timeout=20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not condition():
            executor.spin_once(timeout_sec=0.05)
        return condition()

    try:
        assert spin_until(lambda: len(images) >= 2 and fault_pub.get_subscription_count() > 0)
        for text in ('{"corrupt_frames": 0}', '{"camera_stop_s": 2, "corrupt_frames": 1}'):
            fault_pub.publish(String(data=text))
        assert spin_until(lambda: node._refused_faults == 2)
        fault_pub.publish(String(data='{"corrupt_frames": 3}'))
        start = len(images)
        assert spin_until(lambda: sum(n < d for _, n, d in images[start:]) == 3
                          and images[-1][1] == images[-1][2])
        # Three torn frames in a row (frames already on their way come before them).
        torn = ''.join('T' if n < d else '.' for _, n, d in images[start:])
        assert torn.strip('.') == 'TTT', torn
        # The camera stops for 1.5 s while a command moves the gripper.
        fault_pub.publish(String(data='{"camera_stop_s": 1.5}'))
        assert spin_until(lambda: node._camera_stopped_until > 0.0)
        stopped_at, before = time.monotonic(), len(images)
        moved_from = poses[-1].pose.position.x
        push = Twist()
        push.linear.x = 0.05
        while time.monotonic() < stopped_at + 1.2:
            cmd_pub.publish(push)
            executor.spin_once(timeout_sec=0.05)
        assert poses[-1].pose.position.x > moved_from + 0.02, 'the gripper stood still'
        assert spin_until(lambda: images[-1][0] > stopped_at + 1.5, timeout=5.0), \
            'the camera stays off'
        # Frames already on their way may still arrive; then the camera is silent.
        arrivals = [t for t, _, _ in images[before - 1:]]
        assert max(b - a for a, b in zip(arrivals, arrivals[1:], strict=False)) >= 1.2
        # A reset request may leave the target out and set the trial's time limit.
        reset_pub.publish(String(data='{"seed": 4, "lookalike_shape": 1, '
                                      '"target_absent": true, "timeout_s": 1, "request_id": 8}'))
        assert spin_until(lambda: states[-1]['request_id'] == 8
                          and states[-1]['status'] == 'timeout', timeout=10.0)
        assert states[-1]['target'] is None and states[-1]['grasped'] is None
    finally:
        executor.shutdown()
        node.destroy_node()
        client.destroy_node()
