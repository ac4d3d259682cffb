"""Scripted operator node: a simulated person on ``operator/cmd_vel``.

Adapts :class:`uq_sim.scripted_operator.ScriptedOperator` to ROS:

- ``task_state`` (std_msgs/String JSON, in, transient local): the true target's position
  (ground truth from ``sim_robot_node``); no goal once the trial has ended;
- ``robot_pose`` (geometry_msgs/PoseStamped, in): the gripper;
- ``autonomy_state`` (uq_msgs/AutonomyState, in, transient local): the level shown to the
  operator (seen ``reaction_delay_s`` late);
- ``operator/cmd_vel`` (geometry_msgs/Twist, out, every ``period_s``).

Bad input is dropped, counted and warned about (throttled), and the command is zero
rather than made up: a ``task_state`` that breaks
:func:`uq_sim.scripted_operator.parse_task_state` (the previous goal stays), a
``robot_pose`` with a non-finite position, a level above ASSISTANCE. With no
``robot_pose`` for ``pose_timeout_s`` the operator stops: it cannot steer blind.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from geometry_msgs.msg import PoseStamped, Twist
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from uq_common.node_main import node_argument_parser, run_node
from uq_common.parameters import ParameterSpec, declare_parameters
from uq_msgs.msg import AutonomyState
from uq_sim.scripted_operator import (
    OPERATOR_MODES,
    OperatorConfig,
    ScriptedOperator,
    parse_task_state,
)

NODE_NAME = 'scripted_operator_node'

PARAMETERS = [
    ParameterSpec('mode', 'supervise', 'teleoperation: always drive; supervise: drive while '
                  'the level is at most engage_below_level; hands_off: never drive.',
                  choices=list(OPERATOR_MODES), read_only=True),
    ParameterSpec('speed', 0.07, 'Operator speed, m/s.', min_value=0.001, max_value=1.0,
                  read_only=True),
    ParameterSpec('reaction_delay_s', 0.8, 'Delay before reacting to a level change, s.',
                  min_value=0.0, max_value=10.0, read_only=True),
    ParameterSpec('heading_noise', 0.25, 'Heading wander, rad (std).', min_value=0.0,
                  max_value=1.5, read_only=True),
    ParameterSpec('aim_error', 0.006, 'Goal offset per trial, m (std).', min_value=0.0,
                  max_value=0.1, read_only=True),
    ParameterSpec('engage_below_level', 2, 'Highest level at which a supervising operator '
                  'drives.', min_value=0, max_value=3, read_only=True),
    ParameterSpec('seed', 0, 'Noise seed.', min_value=0, max_value=2**31 - 1, read_only=True),
    ParameterSpec('period_s', 0.05, 'Command period, s.', min_value=0.005, max_value=1.0,
                  read_only=True),
    ParameterSpec('pose_timeout_s', 1.0, 'A robot_pose older than this stops the operator, s.',
                  min_value=0.05, max_value=60.0, read_only=True),
]
_COMMAND_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                          reliability=ReliabilityPolicy.BEST_EFFORT,
                          durability=DurabilityPolicy.VOLATILE)
_LATCHED_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                          reliability=ReliabilityPolicy.RELIABLE,
                          durability=DurabilityPolicy.TRANSIENT_LOCAL)


class ScriptedOperatorNode(Node):
    """Publishes the scripted operator's command."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        p = declare_parameters(self, PARAMETERS)
        self._operator = ScriptedOperator(OperatorConfig(
            mode=p['mode'], speed=p['speed'], reaction_delay_s=p['reaction_delay_s'],
            heading_noise=p['heading_noise'], aim_error=p['aim_error'],
            engage_below_level=p['engage_below_level']), seed=p['seed'])
        self._pose_timeout_s = p['pose_timeout_s']
        self._gripper: tuple[float, float] | None = None
        self._gripper_time = -float('inf')
        self._trial: int | None = None
        self._dropped = 0
        self._pub = self.create_publisher(Twist, 'operator/cmd_vel', _COMMAND_QOS)
        self.create_subscription(String, 'task_state', self._on_task, _LATCHED_QOS)
        self.create_subscription(PoseStamped, 'robot_pose', self._on_pose, 10)
        self.create_subscription(AutonomyState, 'autonomy_state', self._on_state, _LATCHED_QOS)
        self.create_timer(p['period_s'], self._on_timer)

    def _drop(self, what: str) -> None:
        self._dropped += 1
        self.get_logger().warning(f'{what} ({self._dropped} inputs dropped so far)',
                                  throttle_duration_sec=5.0)

    def _on_task(self, msg: String) -> None:
        try:
            task = parse_task_state(msg.data)
            if not task.running or task.target_xy is None:
                self._operator.clear_goal()
            elif task.trial != self._trial or task.elapsed_s <= 0.0:
                self._operator.set_goal(task.target_xy, task.trial)
        except ValueError as exc:
            self._drop(f'task_state dropped, the goal is unchanged: {exc}')
            return
        self._trial = task.trial

    def _on_pose(self, msg: PoseStamped) -> None:
        xy = (msg.pose.position.x, msg.pose.position.y)
        if not all(math.isfinite(v) for v in xy):
            self._drop(f'robot_pose with a non-finite position {xy} dropped')
            return
        self._gripper, self._gripper_time = xy, time.monotonic()

    def _on_state(self, msg: AutonomyState) -> None:
        if msg.level > AutonomyState.ASSISTANCE:
            self._drop(f'autonomy_state with unknown level {msg.level} dropped')
            return
        self._operator.observe_level(msg.level, time.monotonic())

    def _on_timer(self) -> None:
        now = time.monotonic()
        if self._gripper is None or now - self._gripper_time > self._pose_timeout_s:
            if self._gripper is not None:
                self.get_logger().warning(
                    f'no robot_pose for {self._pose_timeout_s} s: the operator stops',
                    throttle_duration_sec=5.0)
            vx, vy, vz = 0.0, 0.0, 0.0
        else:
            vx, vy, vz = self._operator.command(self._gripper, now)
        msg = Twist()
        msg.linear.x, msg.linear.y, msg.linear.z = vx, vy, vz
        self._pub.publish(msg)


def main(args: list[str] | None = None) -> int:
    """Run the node (``--help`` lists the parameters without starting ROS)."""
    parser = node_argument_parser(
        NODE_NAME, __doc__.split('\n\n')[0], PARAMETERS, 'config/shared_autonomy.yaml',
        'topics: sub task_state, robot_pose, autonomy_state; pub operator/cmd_vel.')
    return run_node(ScriptedOperatorNode, parser, args)


if __name__ == '__main__':
    sys.exit(main())
