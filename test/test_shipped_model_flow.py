"""The product's main flow in separate processes, with the shipped model on rendered frames.

This process publishes MuJoCo-rendered frames (and ``camera_info``) as a camera driver
would; ``detector_node`` and ``arbitration_node`` run as the installed executables, each in
its own process, on a private ROS domain. The test checks what an operator would see: the
known objects confident with their classes, the unknown object flagged out of distribution,
the overlay and markers published (this test subscribes to them, so their code runs), the
camera_info size in the diagnostics, an ``AutonomyState`` driven by the detections, and,
once the frames stop, the stale-input diagnostics and the fall-back to teleoperation.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
import rclpy
from node_flow import SCENE_OBJECTS, Flow, render, start, stop
from sensor_msgs.msg import CameraInfo, Image

from uq_common.image_codec import rgb_to_image_fields
from uq_msgs.msg import AutonomyState
from uq_perception.training.detection_metrics import box_iou

DOMAIN_ID = 61
# The node loads torch and the model first; a loaded 2-core machine makes that slow.
START_TIMEOUT_S = 180.0
TIMEOUT_S = 60.0
KNOWN, UNKNOWN = SCENE_OBJECTS[:3], SCENE_OBJECTS[3]


@pytest.fixture(scope='module')
def flow() -> Iterator[Flow]:
    os.environ['ROS_DOMAIN_ID'] = str(DOMAIN_ID)
    detector = start('detector_node', DOMAIN_ID, '-p', 'autostart:=true',
                     '-p', 'torch_threads:=1', '-p', 'stale_input_timeout:=1.0',
                     '-p', 'diagnostics_period:=0.5')
    arbitration = start('arbitration_node', DOMAIN_ID, '-p', 'image_width:=320',
                        '-p', 'image_height:=240')
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    f = Flow(context)
    try:
        yield f
    finally:
        f.executor.shutdown()
        f.node.destroy_node()
        context.try_shutdown()
        logs = stop(detector) + stop(arbitration)
        assert 'Traceback' not in logs, logs


def test_images_to_detections_to_autonomy_state_across_processes(flow: Flow):
    rgb, truth = render()
    fields = rgb_to_image_fields(rgb)
    sent = [0]
    stamps: set[tuple[int, int]] = set()

    def publish_frame() -> None:
        sent[0] += 1
        image = Image(**fields)
        # Stamped now: the arbitration node treats old frames as stale perception.
        image.header.stamp = flow.node.get_clock().now().to_msg()
        stamps.add((image.header.stamp.sec, image.header.stamp.nanosec))
        image.header.frame_id = 'robot_camera'
        flow.images.publish(image)
        flow.info.publish(CameraInfo(header=image.header, width=320, height=240))

    # Frames at 2 Hz until the node answers one and the overlay and markers have come.
    assert flow.spin_until(lambda: flow.detections and flow.overlays and flow.markers,
                           START_TIMEOUT_S, publish_frame), \
        (f'no answer: {len(flow.detections)} detections, {len(flow.overlays)} overlays, '
         f'{len(flow.markers)} markers, {len(flow.diagnostics)} diagnostics after '
         f'{sent[0]} frames')
    answered = flow.detections[-1]
    assert (answered.header.stamp.sec, answered.header.stamp.nanosec) in stamps

    # The shipped model on this scene: known objects confident with their classes, the
    # unknown torus flagged out of distribution (GP variance above the calibrated threshold).
    dets = answered.detections
    boxes = np.array([[d.center_x, d.center_y, d.width, d.height] for d in dets])
    names = KNOWN + (UNKNOWN,)
    iou = box_iou(np.stack([truth[n] for n in names]), boxes)
    for row, name in enumerate(names):
        best = int(iou[row].argmax())
        assert iou[row, best] >= 0.5, f'{name} not found (best IoU {iou[row, best]:.2f})'
        u = dets[best].uncertainty
        if name == UNKNOWN:
            assert u.out_of_distribution, f'{name}: gp_variance {u.gp_variance} not flagged'
        else:
            assert dets[best].class_id == name and not u.out_of_distribution, (name, u)
            assert u.max_probability > 0.5, (name, u)
    known_variance = max(dets[int(iou[r].argmax())].uncertainty.gp_variance for r in range(3))
    assert dets[int(iou[3].argmax())].uncertainty.gp_variance > known_variance

    # The overlay is the frame with boxes drawn on it; one marker (at least) per detection.
    overlay = flow.overlays[-1]
    assert (overlay.width, overlay.height) == (320, 240) and len(overlay.data) > 0
    assert np.frombuffer(bytes(overlay.data), np.uint8).reshape(240, -1)[:, :960].tobytes() \
        != fields['data'], 'the overlay has nothing drawn on it'
    assert len(flow.markers[-1].markers) >= len(dets) > 0

    # The arbitration node, in its own process, decides from these detections.
    assert flow.spin_until(lambda: any(not s.perception_stale for s in flow.states),
                           TIMEOUT_S, publish_frame), 'no AutonomyState from fresh perception'
    fresh = [s for s in flow.states if not s.perception_stale][-1]
    # The shipped default: the calibrated score, in [0, 1] for the shipped model.
    assert fresh.uncertainty_signal == 'calibrated_score'
    assert 0.0 <= fresh.uncertainty <= 1.0

    # Diagnostics report the camera_info size and the frames processed.
    assert flow.spin_until(lambda: any(v.get('camera_info') == '320x240'
                                       and int(v.get('frames_processed', 0)) > 0
                                       for _, v in flow.diagnostic_values()),
                           TIMEOUT_S, publish_frame)

    # The camera stops: the detector reports a stale input, the arbitration falls back to
    # teleoperation and says perception is stale.
    flow.diagnostics.clear()
    assert flow.spin_until(lambda: any('stale input' in message
                                       for message, _ in flow.diagnostic_values()), TIMEOUT_S)
    assert flow.spin_until(lambda: flow.states[-1].perception_stale
                           and flow.states[-1].level == AutonomyState.TELEOPERATION, TIMEOUT_S)
