"""The detector node runs an ONNX detector (model_format onnx) over real DDS: a YOLO-style
network exported here, its GP fitted on features extracted through the ONNX adapter,
detections published with that GP's uncertainty; wrong settings refuse to start or to
configure with a reason."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

pytest.importorskip('onnxruntime', reason='onnxruntime is part of the CPU install')

from lifecycle_msgs.msg import Transition  # noqa: E402 - after the skip
from lifecycle_msgs.srv import ChangeState  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from uq_common.image_codec import rgb_to_image_fields  # noqa: E402
from uq_msgs.msg import DetectionArray  # noqa: E402
from uq_perception.detector_node import DetectorNode  # noqa: E402
from uq_perception.detectors.contract import extract_features, gp_head_arguments  # noqa: E402
from uq_perception.ntk import Gating, LastLayerNTKGP, NTKGPConfig  # noqa: E402
from uq_perception.ntk.feature_transform import FeatureBlock, FeatureTransform  # noqa: E402
from uq_perception.runtime.onnx_adapter import OnnxDetector  # noqa: E402
from uq_perception.training.train import fit_gp  # noqa: E402

TIMEOUT_S = 30.0
SIZE = (96, 128)


@pytest.fixture(scope='module')
def onnx_files(tmp_path_factory, toy, tiny_yolo):
    """A YOLO-style ONNX detector (TinyYolo of seed 0 at SIZE, exported once for the test
    run: conftest.py) and a GP fitted on its features of a few frames."""
    folder = tmp_path_factory.mktemp('onnx_model')
    _, path, size = tiny_yolo
    assert size == SIZE
    detector = OnnxDetector(path)
    features = extract_features(detector, [toy.scene(seed, (120, 160)) for seed in range(8)],
                                0.05, 30)
    gp = LastLayerNTKGP(config=NTKGPConfig(num_experts=1), **gp_head_arguments(detector))
    gp.fit(features.embeddings)
    gp.calibrate_ood(features.embeddings)
    gp.save(folder / 'yolo_gp.npz')
    return path, folder / 'yolo_gp.npz', detector.model_id, detector.feature_dim


def _node(context, path, gp_path, **parameters) -> DetectorNode:
    values = {'model_format': 'onnx', 'model_path': str(path), 'gp_path': str(gp_path),
              'score_threshold': 0.05, 'max_detections': 5, 'persist_learnt_state': False,
              **parameters}
    return DetectorNode(context=context, parameter_overrides=[
        Parameter(name, value=value) for name, value in values.items()])


def _detections_of_one_frame(ros_context, path, gp_path, toy, **parameters) -> DetectionArray:
    """Start a detector node on the model and GP, configure and activate it over its
    lifecycle service, publish one scene over DDS, and return the first DetectionArray."""
    detector = _node(ros_context, path, gp_path, **parameters)
    client = Node('onnx_detector_test_client', context=ros_context)
    received: list[DetectionArray] = []
    client.create_subscription(DetectionArray, 'detections', received.append,
                               QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
    images = client.create_publisher(
        Image, 'image', QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE))
    change_state = client.create_client(ChangeState, 'detector_node/change_state')
    executor = MultiThreadedExecutor(num_threads=3, context=ros_context)
    executor.add_node(detector)
    executor.add_node(client)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    try:
        assert change_state.wait_for_service(timeout_sec=TIMEOUT_S)
        for transition in (Transition.TRANSITION_CONFIGURE, Transition.TRANSITION_ACTIVATE):
            future = change_state.call_async(
                ChangeState.Request(transition=Transition(id=transition)))
            deadline = time.monotonic() + TIMEOUT_S
            while not future.done() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert future.done() and future.result().success
        msg = Image(**rgb_to_image_fields(toy.scene(11, (150, 200))))
        msg.header.stamp.sec, msg.header.frame_id = 7, 'camera_optical_frame'
        deadline = time.monotonic() + TIMEOUT_S
        while not received and time.monotonic() < deadline:
            images.publish(msg)
            time.sleep(0.2)
        assert received, 'no DetectionArray within the timeout'
        return received[0]
    finally:
        executor.shutdown()
        thread.join(timeout=5)
        client.destroy_node()
        detector.destroy_node()


def test_onnx_model_publishes_detections_with_its_gp_over_dds(ros_context, onnx_files, toy):
    path, gp_path, model_id, feature_dim = onnx_files
    out = _detections_of_one_frame(ros_context, path, gp_path, toy)
    assert out.backend == 'onnxruntime' and out.model_id == model_id
    assert out.class_names == ['class_0', 'class_1', 'class_2']
    assert 1 <= len(out.detections) <= 5 and out.header.stamp.sec == 7
    for det in out.detections:
        assert len(det.embedding) == feature_dim
        assert np.isfinite(det.uncertainty.gp_variance) and det.uncertainty.gp_variance > 0
        assert 0.0 <= det.score <= 1.0 and 0 <= det.center_x <= 200


def test_a_per_scale_feature_transform_gives_fit_node_and_evaluator_one_variance(
        ros_context, tmp_path, onnx_files, toy):
    path, _, _, _ = onnx_files
    detector = OnnxDetector(path)
    # The YOLO-style net has a class head per scale: phi is one block per scale.
    blocks = detector.feature_blocks()
    assert len(blocks) == 3 and all(bias == stop for _, stop, bias in blocks)
    features = extract_features(detector, [toy.scene(seed, (120, 160)) for seed in range(8)],
                                0.05, 30)
    fitted = LastLayerNTKGP(config=NTKGPConfig(num_experts=1), **gp_head_arguments(detector))
    fitted.feature_transform = FeatureTransform.fitted(
        features.embeddings, [FeatureBlock(*b) for b in blocks])
    fitted.fit(features.embeddings)
    fitted.calibrate_ood(features.embeddings)
    gp_path = tmp_path / 'yolo_transformed_gp.npz'
    fitted.save(gp_path)
    out = _detections_of_one_frame(ros_context, path, gp_path, toy)
    assert out.detections
    embeddings = np.array([det.embedding for det in out.detections], np.float32)
    published = np.array([det.uncertainty.gp_variance for det in out.detections])
    evaluator = LastLayerNTKGP.load(gp_path).gp_variance(embeddings)
    np.testing.assert_allclose(published, fitted.gp_variance(embeddings), rtol=1e-6)
    np.testing.assert_allclose(evaluator, fitted.gp_variance(embeddings), rtol=1e-6)
    # The transform is what the node applied: without it the variances differ.
    plain = LastLayerNTKGP(config=NTKGPConfig(num_experts=1), **gp_head_arguments(detector))
    plain.fit(features.embeddings)
    assert not np.allclose(plain.gp_variance(embeddings), published, rtol=1e-3, atol=0.0)


def test_scale_gating_gives_fit_node_and_evaluator_one_variance_and_score(
        ros_context, tmp_path, onnx_files, toy):
    path, _, _, _ = onnx_files
    detector = OnnxDetector(path)
    blocks = [FeatureBlock(*b) for b in detector.feature_blocks()]

    def objects(seeds: range):
        found = extract_features(detector, [toy.scene(seed, (120, 160)) for seed in seeds],
                                 0.0, 300)
        return found.embeddings, np.argmax(found.logits, axis=1)

    (train, train_labels), (val, val_labels) = objects(range(20, 24)), objects(range(30, 34))
    # The fit of `uq gp fit` for a multi-scale head: one expert per scale.
    fitted, _ = fit_gp(detector.head(), detector.class_names, detector.model_id, train,
                       train_labels, val, val_labels, candidates=(('scale', 0),),
                       feature_transform=FeatureTransform.fitted(train, blocks),
                       scale_blocks=blocks, log=lambda _line: None)
    scales = fitted.scale_gating
    assert fitted.config.gating is Gating.SCALE and scales is not None
    # Every scale of the validation objects has its own threshold and score reference.
    assert min(scales.validation_counts) >= 20
    assert all(t is not None for t in scales.ood_thresholds)
    assert len(set(scales.ood_thresholds)) == 3 and None not in scales.references
    gp_path = tmp_path / 'yolo_scales_gp.npz'
    fitted.save(gp_path)
    # Suppression across classes at a low IoU leaves detections of several scales.
    out = _detections_of_one_frame(ros_context, path, gp_path, toy, score_threshold=0.0,
                                   max_detections=100, onnx_nms='agnostic', onnx_nms_iou=0.1)
    embeddings = np.array([det.embedding for det in out.detections], np.float32)
    published = [np.array([getattr(det.uncertainty, name) for det in out.detections])
                 for name in ('gp_variance', 'calibrated_score', 'out_of_distribution',
                              'expert_id')]
    expected = fitted.predict(embeddings)
    evaluated = LastLayerNTKGP.load(gp_path).predict(embeddings)
    assert len(set(published[3])) >= 2, 'the frame should have detections at several scales'
    for side in (expected, evaluated):
        np.testing.assert_allclose(published[0], side.gp_variance, rtol=1e-6)
        np.testing.assert_allclose(published[1], side.calibrated_score, atol=1e-6)
        np.testing.assert_array_equal(published[2], side.out_of_distribution)
        np.testing.assert_array_equal(published[3], side.expert_id)


def test_onnx_model_needs_the_onnxruntime_backend_and_its_own_gp(ros_context, onnx_files,
                                                                 capfd):
    path, gp_path, _, _ = onnx_files
    wrong_backend = _node(ros_context, path, gp_path, backend='pytorch-cpu')
    try:
        assert wrong_backend.trigger_configure() == TransitionCallbackReturn.FAILURE
    finally:
        wrong_backend.destroy_node()
    # The shipped GP names another model: refused at configure, not used silently.
    from uq_perception.detectors.model_files import default_gp_path

    other_gp = _node(ros_context, path, default_gp_path())
    try:
        assert other_gp.trigger_configure() == TransitionCallbackReturn.FAILURE
    finally:
        other_gp.destroy_node()
    log = capfd.readouterr().err
    assert 'an ONNX model runs on backend onnxruntime, not pytorch-cpu' in log
    assert 'detector_gp.npz: feature dimension mismatch: file has 64, expected 51' in log


@pytest.mark.parametrize('parameters, message', [
    ({'onnx_input_width': 320}, 'onnx_input_width and onnx_input_height must both be 0'),
    ({'onnx_mean': [0.5, 0.5]}, 'onnx_mean needs 3 values'),
    ({'onnx_class_names': 'a,,b'}, 'onnx_class_names: empty name'),
    ({'onnx_class_names': 'a,a,b'}, 'onnx_class_names must be unique'),
    ({'onnx_layout': 'ssd'}, 'onnx_layout must be one of'),
    ({'onnx_provider': 'opencl'}, 'onnx_provider must be one of'),
    ({'model_format': 'tflite'}, 'model_format must be one of'),
])
def test_invalid_onnx_settings_refuse_to_start(ros_context, onnx_files, parameters, message):
    path, gp_path, _, _ = onnx_files
    with pytest.raises(ValueError, match=message):
        _node(ros_context, path, gp_path, **parameters)
