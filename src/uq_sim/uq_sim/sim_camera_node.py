"""Sim camera node: renders a scripted MuJoCo tabletop scenario and publishes it.

The node only adapts :mod:`uq_sim.scenario` and :class:`uq_sim.scene.SceneRenderer` to
ROS. At ``rate_hz`` a timer takes the ROS clock time, poses the scene at that scenario
time, renders it and publishes (all with the same stamp):

- ``image`` (sensor_msgs/Image, rgb8, frame ``frame_id``): sensor-data QoS (best effort,
  keep last 1);
- ``camera_info`` (sensor_msgs/CameraInfo): intrinsics from MuJoCo's vertical field of
  view and the image size, same QoS;
- ``ground_truth`` (uq_msgs/DetectionArray, reliable, depth 10): one detection per visible
  object with ``class_id`` = its class name (unknown names included), ``class_index`` =
  index in the six known classes or -1, the box of its visible pixels,
  ``track_id`` = object id, ``score`` = 1.

Topic names are relative: remap with ``--ros-args -r image:=/camera/image_raw``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rcl_interfaces.msg import SetParametersResult
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.time import Time
from sensor_msgs.msg import CameraInfo, Image
from std_msgs.msg import Header

from uq_common.image_codec import rgb_to_image_fields
from uq_common.node_main import node_argument_parser, run_node
from uq_common.parameters import ParameterSpec, declare_parameters, first_invalid
from uq_msgs.msg import Detection, DetectionArray
from uq_sim.objects import KNOWN_CLASSES
from uq_sim.scenario import SCENARIO_NAMES, get_scenario

NODE_NAME = 'sim_camera_node'

PARAMETERS = [
    ParameterSpec('rate_hz', 15.0, 'Frames rendered and published per second.',
                  min_value=0.1, max_value=60.0),
    ParameterSpec('scenario', 'tabletop_demo', 'Scripted scene sequence to play.',
                  choices=list(SCENARIO_NAMES), read_only=True),
    ParameterSpec('loop', True, 'Restart the scenario at its end (false: hold the last state).'),
    ParameterSpec('start_time', 0.0, 'Scenario time of the first frame, seconds.',
                  min_value=0.0, max_value=3600.0, read_only=True),
    ParameterSpec('width', 320, 'Image width, pixels.', min_value=32, max_value=1920,
                  read_only=True),
    ParameterSpec('height', 240, 'Image height, pixels.', min_value=32, max_value=1080,
                  read_only=True),
    ParameterSpec('frame_id', 'camera_optical_frame', 'frame_id of images and ground truth.',
                  read_only=True, check=lambda v: None if v else 'frame_id must not be empty'),
    ParameterSpec('publish_ground_truth', True, 'Publish the ground_truth topic.'),
    ParameterSpec('min_visible_fraction', 0.0,
                  'Ground truth leaves out objects less visible than this (0 keeps every '
                  'visible object and skips the occlusion passes).',
                  min_value=0.0, max_value=1.0),
]
_SPECS = {spec.name: spec for spec in PARAMETERS}
_SENSOR_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                         reliability=ReliabilityPolicy.BEST_EFFORT,
                         durability=DurabilityPolicy.VOLATILE)
_GROUND_TRUTH_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10,
                               reliability=ReliabilityPolicy.RELIABLE,
                               durability=DurabilityPolicy.VOLATILE)


def camera_info_message(header: Header, intr: Any) -> CameraInfo:
    """``sensor_msgs/CameraInfo`` of a rendered frame's intrinsics (no distortion)."""
    return CameraInfo(header=header, width=intr.width, height=intr.height,
                      distortion_model='plumb_bob', d=[0.0] * 5, k=intr.k,
                      r=[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0], p=intr.p)


def ground_truth_message(header: Header, frame: Any, scenario_name: str, render_ms: float,
                         min_visible_fraction: float = 0.0) -> DetectionArray:
    """The ``ground_truth`` DetectionArray of one rendered frame (see the module docstring).

    Shared by the node and by ``uq sim record``, so recorded bags carry exactly what the
    node publishes.
    """
    msg = DetectionArray(header=header, class_names=list(KNOWN_CLASSES),
                         inference_time_ms=float(render_ms), backend='simulator',
                         model_id=f'sim:{scenario_name}')
    msg.uncertainty.expert_id = -1
    for ann in frame.annotations:
        if ann.visible_fraction < min_visible_fraction:
            continue
        x, y, w, h = ann.bbox
        det = Detection(class_id=ann.class_name, score=1.0, center_x=x + w / 2.0,
                        center_y=y + h / 2.0, width=float(w), height=float(h),
                        track_id=ann.track_id)
        if ann.known:
            det.class_index = KNOWN_CLASSES.index(ann.class_name)
            det.class_probabilities = [float(c == ann.class_name) for c in KNOWN_CLASSES]
        else:
            det.class_index = -1
        det.uncertainty.expert_id = -1
        msg.detections.append(det)
    return msg


class SimCameraNode(Node):
    """Publishes rendered images, camera info and ground truth of a scripted scenario."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self._params = declare_parameters(self, PARAMETERS)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.add_post_set_parameters_callback(self._after_set_parameters)
        from uq_sim.scene import SceneRenderer  # loads MuJoCo and the GL context

        self._scenario = get_scenario(self._params['scenario'])
        self._renderer = SceneRenderer(self._params['width'], self._params['height'])
        self._renderer.load(self._scenario.spec)
        self._start: Time | None = None
        self._image_pub = self.create_publisher(Image, 'image', _SENSOR_QOS)
        self._info_pub = self.create_publisher(CameraInfo, 'camera_info', _SENSOR_QOS)
        self._truth_pub = self.create_publisher(DetectionArray, 'ground_truth',
                                                _GROUND_TRUTH_QOS)
        self._timer = self.create_timer(1.0 / self._params['rate_hz'], self._on_timer)
        self.get_logger().info(
            f"playing scenario '{self._scenario.name}' ({self._scenario.duration:.0f} s, "
            f"loop={self._params['loop']}) at {self._params['rate_hz']} Hz, "
            f"{self._params['width']}x{self._params['height']}")

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
            if parameter.name == 'rate_hz':
                self.destroy_timer(self._timer)
                self._timer = self.create_timer(1.0 / parameter.value, self._on_timer)

    # --- publishing ------------------------------------------------------------------
    def _on_timer(self) -> None:
        now = self.get_clock().now()
        if self._start is None:
            self._start = now
        elapsed = (now - self._start).nanoseconds * 1e-9 + self._params['start_time']
        started = time.perf_counter()
        try:
            self._scenario.apply(self._renderer, elapsed, loop=self._params['loop'])
            visibility = self._params['min_visible_fraction'] > 0.0
            frame = self._renderer.render(visibility=visibility)
        except (RuntimeError, ValueError) as exc:
            self.get_logger().error(f'rendering failed, frame skipped: {exc}',
                                    throttle_duration_sec=5.0)
            return
        render_ms = 1e3 * (time.perf_counter() - started)
        header = Header(stamp=now.to_msg(), frame_id=self._params['frame_id'])
        try:
            self._image_pub.publish(Image(header=header, **rgb_to_image_fields(frame.rgb)))
            self._info_pub.publish(self._camera_info(header, frame.intrinsics))
            if self._params['publish_ground_truth']:
                self._truth_pub.publish(self._ground_truth(header, frame, render_ms))
        except Exception:
            if not self.context.ok():
                return  # shut down (Ctrl-C) while this frame was rendered: nothing to publish to
            raise

    @staticmethod
    def _camera_info(header: Header, intr: Any) -> CameraInfo:
        return camera_info_message(header, intr)

    def _ground_truth(self, header: Header, frame: Any, render_ms: float) -> DetectionArray:
        return ground_truth_message(header, frame, self._scenario.name, render_ms,
                                    self._params['min_visible_fraction'])

    def destroy_node(self) -> None:
        """Stop the timer and free the renderer's GL resources, then destroy the node."""
        self.destroy_timer(self._timer)
        self._renderer.close()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    """Run the node (``--help`` lists the parameters without starting ROS)."""
    parser = node_argument_parser(
        NODE_NAME, __doc__.split('\n\n')[0], PARAMETERS, 'config/sim_camera.yaml',
        'topics: pub image, camera_info, ground_truth. Remap with --ros-args -r from:=to.')
    return run_node(SimCameraNode, parser, args)


if __name__ == '__main__':
    sys.exit(main())
