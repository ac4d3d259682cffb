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
