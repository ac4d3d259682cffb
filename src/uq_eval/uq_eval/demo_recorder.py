"""The demo's recording node: collects ground truth, detections and overlay frames.

Thin ROS adapter: it stores messages by image stamp and hands the matched frames to the
ROS-free :mod:`uq_eval.demo_report`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import Image

from uq_common.image_codec import image_to_rgb
from uq_eval.demo_report import RecordedFrame, summarise, write_report
from uq_msgs.msg import DetectionArray
from uq_sim.objects import KNOWN_CLASSES

GIF_FPS = 5.0
READY_TIMEOUT_S = 120.0


def _stamp_s(msg) -> float:
    return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9


def _boxes(msg: DetectionArray) -> np.ndarray:
    return np.array([[d.center_x, d.center_y, d.width, d.height] for d in msg.detections],
                    dtype=float).reshape(-1, 4)


class DemoRecorder(Node):
    """Subscribes to the detector's outputs, the diagnostics and the ground truth."""

    def __init__(self) -> None:
        super().__init__('uq_demo_recorder')
        reliable = QoSProfile(depth=200, reliability=ReliabilityPolicy.RELIABLE)
        self.truth: dict[float, DetectionArray] = {}
        self.detections: dict[float, tuple[DetectionArray, float]] = {}
        self.overlays: list[tuple[float, np.ndarray]] = []
        self.detector_active = False
        self.create_subscription(DetectionArray, 'ground_truth',
                                 lambda m: self.truth.__setitem__(_stamp_s(m), m), reliable)
        self.create_subscription(DetectionArray, 'detections', self._on_detections, reliable)
        self.create_subscription(Image, 'overlay', self._on_overlay, qos_profile_sensor_data)
        self.create_subscription(DiagnosticArray, '/diagnostics', self._on_diagnostics,
                                 reliable)

    def _on_detections(self, msg: DetectionArray) -> None:
        now = self.get_clock().now().nanoseconds * 1e-9
        self.detections[_stamp_s(msg)] = (msg, (now - _stamp_s(msg)) * 1e3)

    def _on_overlay(self, msg: Image) -> None:
        t = _stamp_s(msg)
        if not self.overlays or t - self.overlays[-1][0] >= 1.0 / GIF_FPS:
            self.overlays.append((t, image_to_rgb(msg.height, msg.width, msg.encoding,
                                                  msg.step, msg.data)))

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        self.detector_active = self.detector_active or any(
            'detector' in status.name for status in msg.status)

    def frames(self) -> list[RecordedFrame]:
        """Frames seen by both the ground truth and the detector, in time order."""
        common = sorted(set(self.truth) & set(self.detections))
        start = common[0] if common else 0.0
        out = []
        for t in common:
            truth, (det, latency_ms) = self.truth[t], self.detections[t]
            out.append(RecordedFrame(
                time_s=t - start,
                truth_names=[f'{d.class_id}_{d.track_id}' for d in truth.detections],
                truth_known=[d.class_index >= 0 for d in truth.detections],
                truth_boxes=_boxes(truth),
                det_boxes=_boxes(det),
                det_variance=np.array([d.uncertainty.gp_variance for d in det.detections]),
                det_class=[d.class_id for d in det.detections],
                det_ood=np.array([d.uncertainty.out_of_distribution for d in det.detections]),
                latency_ms=latency_ms))
        return out


def record_demo(out_dir: Path, duration_s: float, start_camera: Callable[[], None],
                processes: Callable[[], list]) -> dict[str, Path] | None:
    """Wait for the detector, start the camera, record ``duration_s``, write the report.

    Returns the written files, or ``None`` when a process died or nothing was recorded.
    """
    import imageio.v3 as iio

    rclpy.init()
    node = DemoRecorder()
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not node.detector_active and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
            if any(p.poll() is not None for p in processes()):
                print('[demo] the detector node exited; see its log', flush=True)
                return None
        if not node.detector_active:
            print('[demo] the detector node did not become active in time', flush=True)
            return None
        print('[demo] detector active; starting the sim camera', flush=True)
        start_camera()
        end = time.monotonic() + duration_s + 5.0  # camera start-up (MuJoCo, GL)
        next_report = time.monotonic() + 5.0
        while time.monotonic() < end:
            executor.spin_once(timeout_sec=0.1)
            if any(p.poll() is not None for p in processes()):
                print('[demo] a node exited early; see the logs', flush=True)
                return None
            if time.monotonic() >= next_report:
                next_report += 5.0
                print(f'[demo] {len(node.truth)} frames rendered, {len(node.detections)} '
                      'processed', flush=True)
        frames = node.frames()
        if not frames:
            print('[demo] no frame was both rendered and processed', flush=True)
            return None
        summary = summarise(frames)
        paths = write_report(summary, out_dir, set(KNOWN_CLASSES))
        if node.overlays:
            paths['gif'] = out_dir / 'overlay.gif'
            iio.imwrite(paths['gif'], [img for _, img in node.overlays],
                        duration=int(1000 / GIF_FPS), loop=0)
        return paths
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
