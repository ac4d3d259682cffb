"""Sim robot node: a velocity-controlled gripper in the grasp task, seen by the camera.

The node adapts :class:`uq_sim.robot.VelocityGripper` (command integration, clamps,
staleness) and :mod:`uq_sim.grasp_task` (trial scenes, grasp decision) to ROS:

- ``cmd_vel`` (geometry_msgs/Twist, in): ``linear.x``, ``linear.y`` in m/s, table frame;
  ``linear.z`` below -0.02 m/s closes the gripper where it is (the grasp); the angular
  components are ignored. Non-finite commands
  are refused and logged; the previous command keeps ageing toward the timeout.
- ``reset_task`` (std_msgs/String, in, reliable): JSON ``{"seed": N, "lookalike": true |
  false | null, "request_id": K}`` starts trial N (null draws whether it has a
  look-alike); ``task_state`` echoes ``request_id`` (default -1) so a harness knows the
  state belongs to its request. Camera output
  pauses for ``reset_pause_s`` so downstream nodes see a gap between trials. A request
  that breaks :func:`uq_sim.grasp_task.parse_reset_request` (not a JSON object, seed not
  an integer in [0, 2^31 - 1], ...) is refused, counted and logged; the trial goes on.
  The request may also name a procedural look-alike shape, leave the target out and set
  the trial's time limit (:class:`uq_sim.grasp_task.ResetRequest`).
- ``sim_fault`` (std_msgs/String, in, reliable): a camera fault mid-trial
  (:mod:`uq_sim.sensor_faults`): the camera stops for a while, or sends torn frames. A
  malformed request is refused, counted and logged.
- every ``1 / physics_rate_hz``: the gripper is integrated and the task monitor advanced;
- every ``1 / rate_hz``: ``image``, ``camera_info``, ``ground_truth`` (as the sim camera
  node), ``robot_pose`` (geometry_msgs/PoseStamped, frame ``world``, the tool point),
  ``task_state`` (std_msgs/String, JSON: trial, status running/success/failure/timeout,
  grasped object, elapsed time, gripper, objects with ground-truth classes).
- ``camera_pose`` (geometry_msgs/PoseStamped, transient local): the camera's optical frame
  (x right, y down, z forward) in ``world``, for back-projection.

Command ages and the physics step use the steady clock, as the arbitration node's
deadlines do.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import numpy as np
from geometry_msgs.msg import Pose, PoseStamped, Twist
from rcl_interfaces.msg import SetParametersResult
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CameraInfo, Image
from std_msgs.msg import Header, String

from uq_common.image_codec import rgb_to_image_fields
from uq_common.node_main import node_argument_parser, run_node
from uq_common.parameters import ParameterSpec, declare_parameters, first_invalid
from uq_msgs.msg import Detection, DetectionArray
from uq_sim.geometry import mat_to_quat
from uq_sim.grasp_task import (
    GRIPPER_HOME,
    MAX_SEED,
    TaskMonitor,
    TrialSpec,
    make_trial,
    parse_reset_request,
)
from uq_sim.objects import KNOWN_CLASSES
from uq_sim.robot import GripperLimits, VelocityGripper
from uq_sim.sensor_faults import parse_fault_request

NODE_NAME = 'sim_robot_node'

PARAMETERS = [
    ParameterSpec('rate_hz', 10.0, 'Camera frames rendered and published per second.',
                  min_value=0.1, max_value=60.0, read_only=True),
    ParameterSpec('physics_rate_hz', 100.0, 'Gripper integration rate, Hz.',
                  min_value=10.0, max_value=1000.0, read_only=True),
    ParameterSpec('seed', 0, 'Trial drawn at start-up.', min_value=0, max_value=MAX_SEED,
                  read_only=True),
    ParameterSpec('lookalike', 'random', 'Look-alike in the first trial: random, yes, no.',
                  choices=['random', 'yes', 'no'], read_only=True),
    ParameterSpec('max_speed', 0.25, 'Gripper speed limit, m/s.', min_value=0.01,
                  max_value=2.0, read_only=True),
    ParameterSpec('max_accel', 1.0, 'Gripper acceleration limit, m/s^2.', min_value=0.05,
                  max_value=20.0, read_only=True),
    ParameterSpec('command_timeout_s', 0.5, 'A cmd_vel older than this counts as zero, s.',
                  min_value=0.05, max_value=10.0, read_only=True),
    ParameterSpec('timeout_s', 60.0, 'Trial time limit, s.', min_value=1.0, max_value=3600.0),
    ParameterSpec('reset_pause_s', 1.0, 'Camera silence after a reset, s.', min_value=0.0,
                  max_value=10.0),
    ParameterSpec('width', 320, 'Image width, pixels.', min_value=32, max_value=1920,
                  read_only=True),
    ParameterSpec('height', 240, 'Image height, pixels.', min_value=32, max_value=1080,
                  read_only=True),
    ParameterSpec('frame_id', 'camera_optical_frame', 'frame_id of images and ground truth.',
                  read_only=True, check=lambda v: None if v else 'frame_id must not be empty'),
]
_SPECS = {spec.name: spec for spec in PARAMETERS}
_SENSOR_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                         reliability=ReliabilityPolicy.BEST_EFFORT,
                         durability=DurabilityPolicy.VOLATILE)
_RELIABLE_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10,
                           reliability=ReliabilityPolicy.RELIABLE,
                           durability=DurabilityPolicy.VOLATILE)
_LATCHED_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                          reliability=ReliabilityPolicy.RELIABLE,
                          durability=DurabilityPolicy.TRANSIENT_LOCAL)
_MAX_SUBSTEP_S = 0.02  # a late physics tick is integrated in steps of at most this


def _lookalike_choice(value: Any) -> bool | None:
    return {'yes': True, 'no': False, True: True, False: False}.get(value)


class SimRobotNode(Node):
    """Runs grasp-task trials: integrates cmd_vel, renders the camera, judges grasps."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self._params = declare_parameters(self, PARAMETERS)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.add_post_set_parameters_callback(self._after_set_parameters)
        from uq_sim.scene import SceneRenderer  # loads MuJoCo and the GL context

        p = self._params
        self._gripper = VelocityGripper(GRIPPER_HOME, GripperLimits(
            max_speed=p['max_speed'], max_accel=p['max_accel'],
            command_timeout_s=p['command_timeout_s']))
        self._renderer = SceneRenderer(p['width'], p['height'])
        self._image_pub = self.create_publisher(Image, 'image', _SENSOR_QOS)
        self._info_pub = self.create_publisher(CameraInfo, 'camera_info', _SENSOR_QOS)
        self._truth_pub = self.create_publisher(DetectionArray, 'ground_truth', _RELIABLE_QOS)
        self._pose_pub = self.create_publisher(PoseStamped, 'robot_pose', _RELIABLE_QOS)
        self._task_pub = self.create_publisher(String, 'task_state', _LATCHED_QOS)
        self._camera_pose_pub = self.create_publisher(PoseStamped, 'camera_pose', _LATCHED_QOS)
        self._monitor: TaskMonitor | None = None
        self._paused_until = 0.0
        self._camera_stopped_until = 0.0
        self._corrupt_frames_left = 0
        self._refused_resets = 0
        self._refused_faults = 0
        self._start_trial(make_trial(p['seed'], _lookalike_choice(p['lookalike'])))
        self._last_step = time.monotonic()
        self.create_subscription(Twist, 'cmd_vel', self._on_cmd_vel, 10)
        self.create_subscription(String, 'reset_task', self._on_reset, _RELIABLE_QOS)
        self.create_subscription(String, 'sim_fault', self._on_fault, _RELIABLE_QOS)
        self._physics_timer = self.create_timer(1.0 / p['physics_rate_hz'], self._on_physics)
        self._render_timer = self.create_timer(1.0 / p['rate_hz'], self._on_render)
        self.get_logger().info(
            f"grasp task at {p['rate_hz']} Hz camera, {p['physics_rate_hz']} Hz physics; "
            f"limits {p['max_speed']} m/s, {p['max_accel']} m/s^2, command timeout "
            f"{p['command_timeout_s']} s")

    # --- trials ----------------------------------------------------------------------
    def _start_trial(self, trial: TrialSpec, request_id: int = -1,
                     timeout_s: float | None = None) -> None:
        self._renderer.load(trial.scene_spec())
        self._gripper.reset(GRIPPER_HOME)
        now = time.monotonic()
        self._monitor = TaskMonitor(trial, now + self._params['reset_pause_s'],
                                    timeout_s=timeout_s or self._params['timeout_s'],
                                    request_id=request_id)
        self._paused_until = now + self._params['reset_pause_s']
        self._camera_stopped_until, self._corrupt_frames_left = 0.0, 0
        self._publish_camera_pose()
        self._publish_task(now)
        where = 'absent' if trial.target is None else f'at {trial.target.xy}'
        self.get_logger().info(f'trial {trial.seed}: target {trial.target_class} {where}, '
                               f'look-alike {trial.lookalike}')

    def _on_reset(self, msg: String) -> None:
        try:
            request = parse_reset_request(msg.data)
            trial = make_trial(request.seed, request.lookalike,
                               lookalike_shape=request.lookalike_shape,
                               target_absent=request.target_absent)
        except (ValueError, RuntimeError) as exc:
            self._refused_resets += 1
            # The payload is shown cut short and as a repr: it may be huge or hold newlines.
            self.get_logger().error(
                f'reset_task refused ({exc}; {self._refused_resets} refused so far), the '
                f'trial goes on: {msg.data!r:.120}', throttle_duration_sec=2.0)
            return
        self._start_trial(trial, request.request_id, request.timeout_s)

    def _on_fault(self, msg: String) -> None:
        try:
            fault = parse_fault_request(msg.data)
        except ValueError as exc:
            self._refused_faults += 1
            self.get_logger().error(
                f'sim_fault refused ({exc}; {self._refused_faults} refused so far): '
                f'{msg.data!r:.120}', throttle_duration_sec=2.0)
            return
        if fault.camera_stop_s:
            self._camera_stopped_until = time.monotonic() + fault.camera_stop_s
        self._corrupt_frames_left += fault.corrupt_frames
        self.get_logger().warning(f'camera fault injected: {fault}')

    # --- commands and physics --------------------------------------------------------
    def _on_cmd_vel(self, msg: Twist) -> None:
        try:
            self._gripper.command(msg.linear.x, msg.linear.y, time.monotonic(), msg.linear.z)
        except ValueError as exc:
            self.get_logger().warning(
                f'{exc} ({self._gripper.rejected_commands} refused so far)',
                throttle_duration_sec=2.0)

    def _on_physics(self) -> None:
        now = time.monotonic()
        remaining = now - self._last_step
        self._last_step = now
        if now < self._paused_until:
            return
        steps = max(1, math.ceil(remaining / _MAX_SUBSTEP_S))
        for k in range(steps):
            self._gripper.step(remaining / steps, now - remaining * (steps - 1 - k) / steps)
        if self._monitor.status == 'running':
            before = self._monitor.status
            status = self._monitor.update(self._gripper.position[:2],
                                          float(np.linalg.norm(self._gripper.velocity)),
                                          self._gripper.grasp_commanded(now), now)
            if status != before:
                self.get_logger().info(f'trial {self._monitor.trial.seed}: {status} '
                                       f'(grasped {self._monitor.grasped})')
                self._publish_task(now)

    # --- publishing ------------------------------------------------------------------
    def _on_render(self) -> None:
        now_steady = time.monotonic()
        stamp = self.get_clock().now().to_msg()
        position = self._gripper.position
        self._pose_pub.publish(PoseStamped(header=Header(stamp=stamp, frame_id='world'),
                                           pose=self._pose(position, (0.0, 0.0, 0.0, 1.0))))
        self._publish_task(now_steady)
        if now_steady < max(self._paused_until, self._camera_stopped_until):
            return
        started = time.perf_counter()
        try:
            self._renderer.set_gripper_pose(position, math.pi / 2)
            frame = self._renderer.render(visibility=False)
        except (RuntimeError, ValueError) as exc:
            self.get_logger().error(f'rendering failed, frame skipped: {exc}',
                                    throttle_duration_sec=5.0)
            return
        render_ms = 1e3 * (time.perf_counter() - started)
        header = Header(stamp=stamp, frame_id=self._params['frame_id'])
        image = Image(header=header, **rgb_to_image_fields(frame.rgb))
        if self._corrupt_frames_left > 0:
            self._corrupt_frames_left -= 1
            image.data = image.data[:len(image.data) // 2]
        self._image_pub.publish(image)
        intr = frame.intrinsics
        self._info_pub.publish(CameraInfo(
            header=header, width=intr.width, height=intr.height, distortion_model='plumb_bob',
            d=[0.0] * 5, k=intr.k, r=[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0], p=intr.p))
        self._truth_pub.publish(self._ground_truth(header, frame, render_ms))

    def _publish_task(self, now: float) -> None:
        self._task_pub.publish(String(data=self._monitor.to_json(now, self._gripper.position)))

    def _publish_camera_pose(self) -> None:
        camera = self._renderer.spec.camera
        # MuJoCo camera axes (x right, y up, z backward) -> optical (x right, y down, z fwd).
        optical = camera.axes() @ np.diag([1.0, -1.0, -1.0])
        w, x, y, z = mat_to_quat(optical)
        self._camera_pose_pub.publish(PoseStamped(
            header=Header(stamp=self.get_clock().now().to_msg(), frame_id='world'),
            pose=self._pose(camera.pos, (x, y, z, w))))

    @staticmethod
    def _pose(position: Any, quat_xyzw: Any) -> Pose:
        pose = Pose()
        pose.position.x, pose.position.y, pose.position.z = (float(v) for v in position)
        (pose.orientation.x, pose.orientation.y, pose.orientation.z,
         pose.orientation.w) = (float(v) for v in quat_xyzw)
        return pose

    def _ground_truth(self, header: Header, frame: Any, render_ms: float) -> DetectionArray:
        msg = DetectionArray(header=header, class_names=list(KNOWN_CLASSES),
                             inference_time_ms=float(render_ms), backend='simulator',
                             model_id=f'sim:grasp_task:{self._monitor.trial.seed}')
        msg.uncertainty.expert_id = -1
        for ann in frame.annotations:
            x, y, w, h = ann.bbox
            det = Detection(class_id=ann.class_name, score=1.0, center_x=x + w / 2.0,
                            center_y=y + h / 2.0, width=float(w), height=float(h),
                            track_id=ann.track_id)
            det.class_index = KNOWN_CLASSES.index(ann.class_name) if ann.known else -1
            if ann.known:
                det.class_probabilities = [float(c == ann.class_name) for c in KNOWN_CLASSES]
            det.uncertainty.expert_id = -1
            msg.detections.append(det)
        return msg

    # --- parameters ------------------------------------------------------------------
    def _on_set_parameters(self, parameters: list) -> SetParametersResult:
        error = first_invalid(_SPECS, parameters)
        if error:
            return SetParametersResult(successful=False, reason=error)
        return SetParametersResult(successful=True)

    def _after_set_parameters(self, parameters: list) -> None:
        for parameter in parameters:
            if parameter.name in _SPECS:
                self._params[parameter.name] = parameter.value
        if self._monitor is not None:
            self._monitor.timeout_s = self._params['timeout_s']

    def destroy_node(self) -> None:
        """Stop the timers and free the renderer's GL resources, then destroy the node."""
        self.destroy_timer(self._physics_timer)
        self.destroy_timer(self._render_timer)
        self._renderer.close()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    """Run the node (``--help`` lists the parameters without starting ROS)."""
    parser = node_argument_parser(
        NODE_NAME, __doc__.split('\n\n')[0], PARAMETERS, 'config/shared_autonomy.yaml',
        'topics: sub cmd_vel, reset_task, sim_fault; pub image, camera_info, ground_truth, '
        'robot_pose, task_state, camera_pose. Remap with --ros-args -r from:=to.')
    return run_node(SimRobotNode, parser, args)


if __name__ == '__main__':
    sys.exit(main())
