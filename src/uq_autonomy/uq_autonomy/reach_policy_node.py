"""Reach policy node: the autonomy's proposal for the grasp task, on ``autonomy/cmd_vel``.

Adapts :class:`uq_autonomy.reach_policy.ReachPolicy` to ROS:

- ``detections`` (uq_msgs/DetectionArray, in, best effort): the detector's output;
- ``camera_info`` (sensor_msgs/CameraInfo, in, best effort): intrinsics K;
- ``camera_pose`` (geometry_msgs/PoseStamped, in, transient local): optical frame in world;
- ``robot_pose`` (geometry_msgs/PoseStamped, in): the gripper's tool point; one with a
  non-finite position is dropped (counted, warned about) and leaves the gripper unknown
  until a valid one arrives;
- ``autonomy/cmd_vel`` (geometry_msgs/Twist, out, every ``period_s``): the proposal, zero
  while the camera, its pose, the gripper or a target detection is missing, when the last
  detections are older than ``detection_timeout_s``, or should the policy ever compute a
  non-finite command; ``linear.z`` negative at the goal (grasp);
- ``autonomy/target_track_id`` (std_msgs/Int32, out, with each proposal): the track the
  proposal reaches for, -1 whenever the proposal is zero for want of a goal; the
  arbitration node follows it under ``driving_detection: autonomy_target``.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import numpy as np
from geometry_msgs.msg import PoseStamped, Twist
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CameraInfo
from std_msgs.msg import Int32

from uq_autonomy.reach_policy import PinholeCamera, ReachPolicy, ReachPolicyConfig, quat_to_matrix
from uq_common.node_main import node_argument_parser, run_node
from uq_common.parameters import ParameterSpec, declare_parameters
from uq_msgs.msg import DetectionArray

NODE_NAME = 'reach_policy_node'

PARAMETERS = [
    ParameterSpec('target_class', 'ellipsoid', 'Class of the object to reach.', read_only=True,
                  check=lambda v: None if v else 'target_class must not be empty'),
    ParameterSpec('plane_height', 0.03, 'Height of the plane boxes are back-projected to, m.',
                  min_value=0.0, max_value=0.5, read_only=True),
    ParameterSpec('gain', 2.0, 'Speed per metre of distance to the goal, 1/s.',
                  min_value=0.01, max_value=50.0, read_only=True),
    ParameterSpec('max_speed', 0.2, 'Speed limit of the proposal, m/s.', min_value=0.0,
                  max_value=2.0, read_only=True),
    ParameterSpec('stop_radius', 0.015, 'No motion closer than this to the goal, m.',
                  min_value=0.0, max_value=0.2, read_only=True),
    ParameterSpec('release_after_frames', 3, 'The target track is let go once read as '
                  'another class in this many frames in a row.', min_value=1,
                  max_value=1000, read_only=True),
    ParameterSpec('detection_timeout_s', 0.5, 'Older detections give no goal, s.',
                  min_value=0.05, max_value=10.0, read_only=True),
    ParameterSpec('period_s', 0.05, 'Command publishing period, s.', min_value=0.005,
                  max_value=1.0, read_only=True),
]
_SENSOR_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=5,
                         reliability=ReliabilityPolicy.BEST_EFFORT,
                         durability=DurabilityPolicy.VOLATILE)
_COMMAND_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                          reliability=ReliabilityPolicy.BEST_EFFORT,
                          durability=DurabilityPolicy.VOLATILE)
_LATCHED_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                          reliability=ReliabilityPolicy.RELIABLE,
                          durability=DurabilityPolicy.TRANSIENT_LOCAL)


class ReachPolicyNode(Node):
    """Publishes the reach policy's velocity proposal."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        p = declare_parameters(self, PARAMETERS)
        self._params = p
        self._policy = ReachPolicy(ReachPolicyConfig(
            target_class=p['target_class'], plane_height=p['plane_height'], gain=p['gain'],
            max_speed=p['max_speed'], stop_radius=p['stop_radius'],
            release_after_frames=p['release_after_frames']))
        self._intrinsics: tuple[float, float, float, float] | None = None
        self._camera_pose: tuple[tuple[float, float, float], np.ndarray] | None = None
        self._gripper: np.ndarray | None = None
        self._last_detections = -np.inf
        self._invalid_poses = 0
        self._pub = self.create_publisher(Twist, 'autonomy/cmd_vel', _COMMAND_QOS)
        self._target_pub = self.create_publisher(Int32, 'autonomy/target_track_id', _COMMAND_QOS)
        self.create_subscription(DetectionArray, 'detections', self._on_detections, _SENSOR_QOS)
        self.create_subscription(CameraInfo, 'camera_info', self._on_camera_info, _SENSOR_QOS)
        self.create_subscription(PoseStamped, 'camera_pose', self._on_camera_pose, _LATCHED_QOS)
        self.create_subscription(PoseStamped, 'robot_pose', self._on_robot_pose, 10)
        self.create_timer(p['period_s'], self._on_timer)

    def _on_camera_info(self, msg: CameraInfo) -> None:
        k = msg.k
        if k[0] > 0.0 and k[4] > 0.0 and all(np.isfinite(k)):
            self._intrinsics = (k[0], k[4], k[2], k[5])

    def _on_camera_pose(self, msg: PoseStamped) -> None:
        o, q = msg.pose.position, msg.pose.orientation
        try:
            self._camera_pose = ((o.x, o.y, o.z), quat_to_matrix(q.x, q.y, q.z, q.w))
        except ValueError as exc:
            self.get_logger().error(f'camera_pose ignored: {exc}')

    def _on_robot_pose(self, msg: PoseStamped) -> None:
        position = (msg.pose.position.x, msg.pose.position.y)
        if not all(math.isfinite(v) for v in position):
            # Forgotten, not kept: steering by the last good pose would drive blind.
            self._gripper = None
            self._invalid_poses += 1
            self.get_logger().warn(f'robot_pose ignored: non-finite position {position} '
                                   f'({self._invalid_poses} so far); proposing zero until a '
                                   'valid one arrives', throttle_duration_sec=2.0)
            return
        self._gripper = np.array(position)

    @property
    def invalid_poses(self) -> int:
        """``robot_pose`` messages dropped for a non-finite position."""
        return self._invalid_poses

    def _on_detections(self, msg: DetectionArray) -> None:
        if self._intrinsics is None or self._camera_pose is None or self._gripper is None:
            return
        camera = PinholeCamera(*self._intrinsics, *self._camera_pose)
        self._policy.observe([(d.class_id, d.center_x, d.center_y, d.track_id)
                              for d in msg.detections], camera, self._gripper)
        self._last_detections = time.monotonic()

    def _on_timer(self) -> None:
        fresh = time.monotonic() - self._last_detections <= self._params['detection_timeout_s']
        driving = fresh and self._gripper is not None
        vx, vy, vz = self._policy.command(self._gripper) if driving else (0.0, 0.0, 0.0)
        if not all(math.isfinite(v) for v in (vx, vy, vz)):
            self.get_logger().error(f'non-finite command ({vx}, {vy}, {vz}) replaced by zero',
                                    throttle_duration_sec=2.0)
            vx, vy, vz = 0.0, 0.0, 0.0
        msg = Twist()
        msg.linear.x, msg.linear.y, msg.linear.z = vx, vy, vz
        self._pub.publish(msg)
        has_goal = driving and self._policy.goal is not None
        self._target_pub.publish(Int32(data=self._policy.target_track if has_goal else -1))


def main(args: list[str] | None = None) -> int:
    """Run the node (``--help`` lists the parameters without starting ROS)."""
    parser = node_argument_parser(
        NODE_NAME, __doc__.split('\n\n')[0], PARAMETERS, 'config/shared_autonomy.yaml',
        'topics: sub detections, camera_info, camera_pose, robot_pose; pub autonomy/cmd_vel, '
        'autonomy/target_track_id.')
    return run_node(ReachPolicyNode, parser, args)


if __name__ == '__main__':
    sys.exit(main())
