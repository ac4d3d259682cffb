"""Sim camera node over real DDS: images, camera info and ground truth with equal stamps."""

from __future__ import annotations

import math
import time

import pytest
import rclpy
from rclpy.exceptions import InvalidParameterValueException
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CameraInfo, Image

from uq_msgs.msg import DetectionArray
from uq_sim.objects import KNOWN_CLASSES
from uq_sim.sim_camera_node import SimCameraNode

# Private to this module (the cross-package tests use 100..199).




def _stamp(msg) -> tuple[int, int]:
    return msg.header.stamp.sec, msg.header.stamp.nanosec


def test_publishes_images_camera_info_and_ground_truth_with_the_same_stamp(ros_context):
    # Start at 19 s of the demo: the known objects and three unknown ones are on the table.
    node = SimCameraNode(context=ros_context, parameter_overrides=[
        Parameter('rate_hz', value=10.0), Parameter('start_time', value=19.0),
        Parameter('loop', value=False)])
    listener = rclpy.create_node('sim_camera_test_listener', context=ros_context)
    images: dict = {}
    infos: dict = {}
    truths: dict = {}
    best_effort = QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT)
    listener.create_subscription(Image, 'image', lambda m: images.setdefault(_stamp(m), m),
                                 best_effort)
    listener.create_subscription(CameraInfo, 'camera_info',
                                 lambda m: infos.setdefault(_stamp(m), m), best_effort)
    listener.create_subscription(DetectionArray, 'ground_truth',
                                 lambda m: truths.setdefault(_stamp(m), m), 10)
    executor = SingleThreadedExecutor(context=ros_context)
    executor.add_node(node)
    executor.add_node(listener)
    try:
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and len(set(images) & set(truths) & set(infos)) < 3:
            executor.spin_once(timeout_sec=0.1)
    finally:
        executor.shutdown()
        node.destroy_node()
        listener.destroy_node()

    common = sorted(set(images) & set(truths) & set(infos))
    assert len(common) >= 3, (len(images), len(infos), len(truths))
    for stamp in common:
        image, info, truth = images[stamp], infos[stamp], truths[stamp]
        assert image.encoding == 'rgb8' and (image.width, image.height) == (320, 240)
        assert image.step == 320 * 3 and len(image.data) == 240 * image.step
        assert image.header.frame_id == info.header.frame_id == truth.header.frame_id \
            == 'camera_optical_frame'
        assert max(image.data) > min(image.data), 'blank image'
        # Intrinsics from MuJoCo's fovy = 45 degrees at 240 px height.
        f = 120.0 / math.tan(math.radians(22.5))
        assert info.k[0] == pytest.approx(f) and info.k[4] == pytest.approx(f)
        assert (info.k[2], info.k[5]) == (159.5, 119.5)
        assert (info.width, info.height) == (320, 240)

        assert list(truth.class_names) == list(KNOWN_CLASSES)
        names = {d.class_id for d in truth.detections}
        assert {'box', 'sphere', 'mug', 'cylinder', 'torus', 'cone', 'tetrahedron'} <= names
        assert len({d.track_id for d in truth.detections}) == len(truth.detections)
        for d in truth.detections:
            if d.class_id in KNOWN_CLASSES:
                assert d.class_index == KNOWN_CLASSES.index(d.class_id)
            else:
                assert d.class_index == -1
            assert d.width >= 1 and d.height >= 1
            assert 0 <= d.center_x - d.width / 2 and d.center_x + d.width / 2 <= 320
            assert 0 <= d.center_y - d.height / 2 and d.center_y + d.height / 2 <= 240


def test_invalid_parameters_are_rejected_at_start_and_at_runtime(ros_context):
    # rclpy enforces the declared range itself; the other checks raise ValueError.
    with pytest.raises(InvalidParameterValueException):
        SimCameraNode(context=ros_context, parameter_overrides=[Parameter('rate_hz', value=0.0)])
    with pytest.raises(ValueError, match='frame_id'):
        SimCameraNode(context=ros_context, parameter_overrides=[Parameter('frame_id', value='')])
    node = SimCameraNode(context=ros_context, parameter_overrides=[Parameter('rate_hz', value=5.0)])
    try:
        result = node.set_parameters([Parameter('min_visible_fraction', value=1.5)])[0]
        assert not result.successful and 'min_visible_fraction' in result.reason
        assert node.get_parameter('min_visible_fraction').value == 0.0
        assert not node.set_parameters([Parameter('rate_hz', value=100.0)])[0].successful
        assert node.set_parameters([Parameter('rate_hz', value=20.0)])[0].successful
        assert node._timer.timer_period_ns == 50_000_000
        assert not node.set_parameters([Parameter('scenario', value='known_static')])[0] \
            .successful, 'scenario is read-only'
    finally:
        node.destroy_node()
