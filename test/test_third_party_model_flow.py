"""A real third-party detector through the node, in separate processes: the YOLOv8n in
models/third_party/ (trained with Ultralytics on the simulator's renders, exported to ONNX,
its NTK-GP fitted with ``uq gp fit``; docs/third_party_detector.md) on a rendered frame.

What an operator relies on: the known objects found with their classes and the uncertainty
of each detection published, from the file's own class names; the unknown torus, which the
network takes for a known class, scored less familiar than every known object."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rclpy
from node_flow import SCENE_OBJECTS, Flow, render, start, stop
from sensor_msgs.msg import Image

from uq_common.image_codec import rgb_to_image_fields
from uq_perception.training.detection_metrics import box_iou

DOMAIN_ID = 63
START_TIMEOUT_S = 180.0
MODELS = Path(__file__).resolve().parents[1] / 'models' / 'third_party'
KNOWN, UNKNOWN = SCENE_OBJECTS[:3], SCENE_OBJECTS[3]


@pytest.fixture(scope='module')
def flow() -> Iterator[Flow]:
    os.environ['ROS_DOMAIN_ID'] = str(DOMAIN_ID)
    detector = start('detector_node', DOMAIN_ID, '-p', 'autostart:=true',
                     '-p', 'model_format:=onnx',
                     '-p', f'model_path:={MODELS / "yolov8n_sim.onnx"}',
                     '-p', f'gp_path:={MODELS / "yolov8n_sim_gp.npz"}',
                     '-p', 'onnx_layout:=yolo', '-p', 'persist_learnt_state:=false',
                     # The network finds the torus at a score of about 0.24, as an ellipsoid.
                     '-p', 'score_threshold:=0.2')
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    f = Flow(context)
    try:
        yield f
    finally:
        f.executor.shutdown()
        f.node.destroy_node()
        context.try_shutdown()
        logs = stop(detector)
        assert 'Traceback' not in logs, logs


def test_yolov8n_publishes_its_classes_with_the_gp_uncertainty(flow: Flow):
    rgb, truth = render()
    fields = rgb_to_image_fields(rgb)

    def publish_frame() -> None:
        image = Image(**fields)
        image.header.stamp = flow.node.get_clock().now().to_msg()
        image.header.frame_id = 'robot_camera'
        flow.images.publish(image)

    assert flow.spin_until(lambda: flow.detections, START_TIMEOUT_S, publish_frame), \
        'the node published no detections'
    answer = flow.detections[-1]
    assert list(answer.class_names) == ['box', 'sphere', 'cylinder', 'capsule', 'ellipsoid',
                                        'mug']
    dets = answer.detections
    boxes = np.array([[d.center_x, d.center_y, d.width, d.height] for d in dets])
    iou = box_iou(np.stack([truth[n] for n in SCENE_OBJECTS]), boxes)
    known_scores = []
    for row, name in enumerate(KNOWN):
        best = int(iou[row].argmax())
        assert iou[row, best] >= 0.5, f'{name} not found (best IoU {iou[row, best]:.2f})'
        u = dets[best].uncertainty
        assert dets[best].class_id == name, (name, dets[best].class_id)
        assert np.isfinite(u.gp_variance) and u.gp_variance > 0, (name, u)
        assert 0.0 <= u.calibrated_score <= 1.0, (name, u)
        assert len(u.class_variance) == len(answer.class_names)
        known_scores.append(u.calibrated_score)
    torus = int(iou[3].argmax())
    assert iou[3, torus] >= 0.5, f'the torus not found (best IoU {iou[3, torus]:.2f})'
    assert dets[torus].uncertainty.calibrated_score > max(known_scores), \
        (dets[torus].class_id, dets[torus].uncertainty, known_scores)
