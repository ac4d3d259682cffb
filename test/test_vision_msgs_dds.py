"""The detector's vision_msgs output over real DDS: ``detections_2d``
(``vision_msgs/Detection2DArray``) against ``detections`` (``uq_msgs/DetectionArray``) of the
same frame, matched by header stamp; and the node without vision_msgs.

The detector node runs in this process with the shipped model on its own executor thread;
a client node publishes frames and subscribes to both outputs, as any other ROS node would.
The tests that read ``detections_2d`` need vision_msgs (on a robot ``ros-jazzy-vision-msgs``;
here ``scripts/build_vision_msgs.sh``) and skip without it, saying so. The detector without
vision_msgs runs in a child process in which importing vision_msgs fails, whether it is
installed or not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image

from uq_common.image_codec import rgb_to_image_fields
from uq_msgs.msg import DetectionArray

HEIGHT, WIDTH = 96, 128
TIMEOUT_S = 20.0
# A child process loads torch and the model first; a loaded 2-core machine makes that slow.
START_TIMEOUT_S = 120.0
NO_VISION_MSGS = ('vision_msgs is not installed (scripts/build_vision_msgs.sh builds it from '
                  'a source checkout; docs/deployment.md)')
QOS = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)


def _vision_msgs() -> Any:
    return pytest.importorskip('vision_msgs.msg', reason=NO_VISION_MSGS)


def _noise(seed: int) -> np.ndarray:
    # The shipped model fires on noise (score_threshold 0.3 keeps a few, flagged OOD).
    return np.random.default_rng(seed).integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)


class Client:
    """Publishes frames with unique stamps; collects both outputs."""

    def __init__(self, context, vision_type: Any = None) -> None:
        self.node = Node('vision_msgs_test_client', context=context)
        self.detections: list[DetectionArray] = []
        self.standard: list[Any] = []
        self.node.create_subscription(DetectionArray, 'detections', self.detections.append, QOS)
        if vision_type is not None:
            self.node.create_subscription(vision_type, 'detections_2d', self.standard.append,
                                          QOS)
        self.images = self.node.create_publisher(Image, 'image', QOS)
        self._stamp = 0

    def frame(self, rgb: np.ndarray) -> Image:
        self._stamp += 1
        msg = Image(**rgb_to_image_fields(rgb))
        msg.header.stamp.sec, msg.header.frame_id = self._stamp, 'camera_optical_frame'
        return msg

    def pair(self, rgb: np.ndarray, timeout_s: float = TIMEOUT_S) -> tuple[DetectionArray, Any]:
        """Publish ``rgb`` (under a new stamp at each try: the first frames may be lost while
        discovery settles) until both outputs of one stamp are back; returns them."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = self.frame(rgb)
            self.images.publish(msg)
            found = _wait_for(lambda stamp=msg.header.stamp: self._both(stamp), 1.0)
            if found:
                return found
        raise AssertionError(f'no detections and detections_2d of one frame in {timeout_s} s')

    def _both(self, stamp) -> tuple[DetectionArray, Any] | None:
        uq = [m for m in self.detections if m.header.stamp == stamp]
        standard = [m for m in self.standard if m.header.stamp == stamp]
        return (uq[0], standard[0]) if uq and standard else None


def _wait_for(condition: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.02)
    return condition()


@pytest.fixture
def running(ros_context) -> Iterator[Client]:
    """The detector (shipped model, autostart) and a client subscribed to both outputs."""
    vision = _vision_msgs()
    from uq_perception.detector_node import DetectorNode

    detector = DetectorNode(context=ros_context, parameter_overrides=[
        Parameter('backend', value='pytorch-cpu'), Parameter('autostart', value=True),
        Parameter('max_detections', value=5), Parameter('persist_learnt_state', value=False)])
    client = Client(ros_context, vision.Detection2DArray)
    executor = MultiThreadedExecutor(num_threads=3, context=ros_context)
    executor.add_node(detector)
    executor.add_node(client.node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    try:
        yield client
    finally:
        executor.shutdown()
        thread.join(timeout=5)
        client.node.destroy_node()
        detector.destroy_node()


def test_detections_2d_is_the_frame_of_detections_field_by_field(running: Client):
    uq, standard = running.pair(_noise(1))
    assert standard.header == uq.header
    assert len(uq.detections) > 0, 'the shipped model found nothing in the frame'
    assert len(standard.detections) == len(uq.detections)
    classes = list(uq.class_names)
    for det, mine in zip(standard.detections, uq.detections, strict=True):
        assert det.header == uq.header
        assert det.id == str(mine.track_id)
        assert [det.bbox.center.position.x, det.bbox.center.position.y, det.bbox.size_x,
                det.bbox.size_y, det.bbox.center.theta] == [
                    mine.center_x, mine.center_y, mine.width, mine.height, 0.0]
        hypotheses = [(r.hypothesis.class_id, r.hypothesis.score) for r in det.results]
        # The classes, most probable first, with the GP's probabilities ...
        assert hypotheses[0][0] == mine.class_id
        assert dict(hypotheses[:len(classes)]) == dict(
            zip(classes, mine.class_probabilities, strict=True))
        scores = [score for _, score in hypotheses[:len(classes)]]
        assert scores == sorted(scores, reverse=True)
        # ... then the calibrated score (the shipped model has a score reference), the track
        # score (a scored detection's track has at least one view) and the OOD flag.
        assert mine.uncertainty.track_views >= 1
        assert hypotheses[len(classes):] == [
            ('uq/calibrated_score', mine.uncertainty.calibrated_score),
            ('uq/track_score', mine.uncertainty.track_score),
            ('uq/out_of_distribution', 1.0 if mine.uncertainty.out_of_distribution else 0.0)]
        for result in det.results:
            position = result.pose.pose.position
            assert (position.x, position.y, position.z) == (mine.center_x, mine.center_y, 0.0)


def test_pose_covariance_is_the_published_box_sigma_squared(running: Client):
    uq, standard = running.pair(_noise(2))
    assert len(uq.detections) > 0
    for det, mine in zip(standard.detections, uq.detections, strict=True):
        sigma = np.asarray(mine.box_std, np.float64)
        assert (sigma > 0).all(), 'the shipped model estimates every box sigma'
        expected = np.zeros((6, 6))
        # Diagonal x, y, z, rot x: center_x, center_y, width, height (docs/detector_contract.md).
        expected[np.diag_indices(4)] = sigma ** 2
        for result in det.results:
            np.testing.assert_array_equal(np.reshape(result.pose.covariance, (6, 6)), expected)


def test_a_frame_without_detections_gives_an_empty_array(running: Client):
    uq, standard = running.pair(np.zeros((HEIGHT, WIDTH, 3), np.uint8))
    assert len(uq.detections) == 0
    assert len(standard.detections) == 0
    assert standard.header == uq.header


def test_detections_2d_is_off_with_publish_vision_msgs_false(ros_context, capfd):
    _vision_msgs()
    from uq_perception.detector_node import DetectorNode

    detector = DetectorNode(context=ros_context, parameter_overrides=[
        Parameter('backend', value='pytorch-cpu'), Parameter('autostart', value=True),
        Parameter('publish_vision_msgs', value=False),
        Parameter('persist_learnt_state', value=False)])
    client = Client(ros_context)
    executor = MultiThreadedExecutor(num_threads=3, context=ros_context)
    executor.add_node(detector)
    executor.add_node(client.node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    try:
        assert _answered(client, _noise(3))
        assert client.node.get_publishers_info_by_topic('detections_2d') == []
    finally:
        executor.shutdown()
        thread.join(timeout=5)
        client.node.destroy_node()
        detector.destroy_node()
    assert 'detections_2d (vision_msgs) not published: publish_vision_msgs is false' in \
        capfd.readouterr().err


def _answered(client: Client, rgb: np.ndarray, timeout_s: float = TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = client.frame(rgb)
        client.images.publish(msg)
        if _wait_for(lambda stamp=msg.header.stamp: any(d.header.stamp == stamp
                                                        for d in client.detections), 1.0):
            return True
    return False


# The detector in a child process where `import vision_msgs` fails.
_WITHOUT_VISION_MSGS = """
import sys
sys.modules['vision_msgs'] = None  # importing it now raises ImportError
from uq_perception.detector_node import main
sys.exit(main(sys.argv[1:]))
"""


def test_without_vision_msgs_the_node_says_so_once_and_publishes_the_rest(ros_context):
    process = subprocess.Popen(
        [sys.executable, '-c', _WITHOUT_VISION_MSGS, '--ros-args', '-p', 'autostart:=true',
         '-p', 'backend:=pytorch-cpu', '-p', 'persist_learnt_state:=false'],
        env=os.environ | {'ROS_DOMAIN_ID': str(ros_context.get_domain_id())},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    client = Client(ros_context)
    executor = MultiThreadedExecutor(num_threads=2, context=ros_context)
    executor.add_node(client.node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    try:
        assert _wait_for(lambda: client.node.count_publishers('detections') > 0,
                         START_TIMEOUT_S), 'the detector did not start'
        assert _answered(client, _noise(4))
        names = {name for name, _ in client.node.get_topic_names_and_types()}
        assert '/detections' in names and '/detections_2d' not in names
    finally:
        executor.shutdown()
        thread.join(timeout=5)
        client.node.destroy_node()
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    log = process.stdout.read() if process.stdout else ''
    said = [line for line in log.splitlines() if 'detections_2d' in line]
    assert len(said) == 1, log
    assert 'not published: vision_msgs is not installed' in said[0]
    assert 'Traceback' not in log, log
