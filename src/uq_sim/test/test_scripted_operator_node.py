"""Scripted operator node over real DDS: hostile task_state, robot_pose and autonomy_state
messages never become a non-finite command, and a lost robot_pose stops the operator."""

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

from uq_msgs.msg import AutonomyState
from uq_sim.scripted_operator_node import ScriptedOperatorNode

TASK = {'trial': 3, 'status': 'running', 'target': 'target', 'elapsed_s': 0.0,
        'objects': [{'name': 'target', 'x': 0.1, 'y': -0.1}]}
HOSTILE_TASKS = [json.dumps(dict(TASK, trial=-1)), json.dumps(dict(TASK, trial=4, elapsed_s='x')),
                 json.dumps(dict(TASK, objects=[{'name': 'target', 'x': 'a', 'y': 0}])),
                 json.dumps(dict(TASK, objects=[{'name': 'target', 'x': math.nan, 'y': 0}])),
                 json.dumps(dict(TASK, objects=['target'])), '[' * 100_000, 'null']


def _pose(x: float, y: float) -> PoseStamped:
    msg = PoseStamped()
    msg.pose.position.x, msg.pose.position.y = x, y
    return msg


def test_hostile_inputs_give_zero_commands_and_a_lost_pose_stops_the_operator(ros_context):
    node = ScriptedOperatorNode(context=ros_context, parameter_overrides=[
        Parameter('mode', value='teleoperation'), Parameter('pose_timeout_s', value=0.3)])
    client = rclpy.create_node('scripted_operator_test_client', context=ros_context)
    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)
    task_pub = client.create_publisher(String, 'task_state', latched)
    pose_pub = client.create_publisher(PoseStamped, 'robot_pose', 10)
    state_pub = client.create_publisher(AutonomyState, 'autonomy_state', latched)
    commands: list[Twist] = []
    client.create_subscription(Twist, 'operator/cmd_vel', commands.append,
                               QoSProfile(depth=100, reliability=ReliabilityPolicy.BEST_EFFORT))
    executor = SingleThreadedExecutor(context=ros_context)
    executor.add_node(node)
    executor.add_node(client)

    def spin(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.02)

    def moving() -> bool:
        return bool(commands) and math.hypot(commands[-1].linear.x, commands[-1].linear.y) > 0

    try:
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline and not commands:
            executor.spin_once(timeout_sec=0.05)
        for text in HOSTILE_TASKS:
            task_pub.publish(String(data=text))
            spin(0.1)
        state_pub.publish(AutonomyState(level=200))
        for _ in range(5):
            pose_pub.publish(_pose(math.nan, 0.0))
            spin(0.05)
        assert node._dropped >= len(HOSTILE_TASKS) + 6, node._dropped
        assert not moving(), 'no valid goal and pose yet'
        # Valid inputs: the operator drives toward the target.
        task_pub.publish(String(data=json.dumps(TASK)))
        for _ in range(10):
            pose_pub.publish(_pose(0.0, 0.2))
            spin(0.05)
        assert moving()
        spin(0.6)  # no robot_pose for longer than pose_timeout_s
        assert not moving(), 'the operator steers blind'
        assert all(math.isfinite(v) for c in commands
                   for v in (c.linear.x, c.linear.y, c.linear.z))
    finally:
        executor.shutdown()
        node.destroy_node()
        client.destroy_node()
