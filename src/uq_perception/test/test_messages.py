"""Field mapping from the perception pipeline's results to uq_msgs (no ROS graph needed)."""

from __future__ import annotations

import numpy as np
import pytest
from std_msgs.msg import Header

from uq_perception.detectors.centernet import Detections
from uq_perception.messages import DetectionArrayBuilder, detection_array_message
from uq_perception.ntk import UncertaintyOutput
from uq_perception.perception import FrameResult

CLASSES = ['box', 'sphere', 'mug']


def _frame(count: int) -> FrameResult:
    rng = np.random.default_rng(count)
    probabilities = rng.dirichlet(np.ones(len(CLASSES)), size=count)
    variance = rng.random(count)
    uncertainty = UncertaintyOutput(
        logits=rng.normal(size=(count, len(CLASSES))), gp_variance=variance,
        class_variance=np.repeat(variance[:, None], len(CLASSES), axis=1),
        probabilities=probabilities, predictive_entropy=rng.random(count),
        expected_entropy=rng.random(count), mutual_information=rng.random(count),
        out_of_distribution=variance > 0.5, expert_id=np.arange(count))
    detections = Detections(
        boxes=rng.uniform(5, 100, (count, 4)).astype(np.float32),
        scores=np.sort(rng.random(count)).astype(np.float32)[::-1],
        embeddings=rng.normal(size=(count, 8)).astype(np.float32),
        logits=uncertainty.logits.astype(np.float32))
    return FrameResult(detections, uncertainty, np.arange(10, 10 + count), CLASSES, 12.5,
                       11.0, rng.uniform(0.5, 4.0, (count, 4)).astype(np.float32))


def test_every_detection_field_comes_from_its_row():
    frame = _frame(4)
    header = Header(frame_id='camera')
    header.stamp.sec = 7
    out = detection_array_message(frame, header, 'pytorch-cpu', 'model-x')
    assert out.header == header and out.class_names == CLASSES
    assert (out.backend, out.model_id, out.inference_time_ms) == ('pytorch-cpu', 'model-x', 12.5)
    unc = frame.uncertainty
    assert len(out.detections) == 4
    for i, det in enumerate(out.detections):
        cls = int(np.argmax(unc.probabilities[i]))
        assert (det.class_id, det.class_index, det.track_id) == (CLASSES[cls], cls, 10 + i)
        assert det.score == pytest.approx(frame.detections.scores[i])
        np.testing.assert_allclose(det.class_probabilities, unc.probabilities[i], rtol=1e-6)
        np.testing.assert_allclose([det.center_x, det.center_y, det.width, det.height],
                                   frame.detections.boxes[i], rtol=1e-6)
        np.testing.assert_array_equal(det.box_std, frame.box_std[i])
        u = det.uncertainty
        np.testing.assert_allclose(
            [u.gp_variance, u.predictive_entropy, u.expected_entropy, u.mutual_information,
             u.max_probability],
            [unc.gp_variance[i], unc.predictive_entropy[i], unc.expected_entropy[i],
             unc.mutual_information[i], unc.probabilities[i].max()], rtol=1e-6)
        np.testing.assert_allclose(u.class_variance, unc.class_variance[i], rtol=1e-6)
        assert u.out_of_distribution == bool(unc.out_of_distribution[i])
        assert u.expert_id == i


def test_frame_uncertainty_is_the_most_uncertain_detection():
    frame = _frame(5)
    out = detection_array_message(frame, Header(), 'pytorch-cpu', 'm')
    worst = int(np.argmax(frame.uncertainty.gp_variance))
    assert out.uncertainty == out.detections[worst].uncertainty
    # A copy, not the detection's own message: editing one must not change the other.
    assert out.uncertainty is not out.detections[worst].uncertainty


def test_no_detections_gives_an_empty_array_and_no_expert():
    out = detection_array_message(_frame(0), Header(), 'pytorch-cpu', 'm')
    assert len(out.detections) == 0
    assert out.uncertainty.expert_id == -1 and out.uncertainty.gp_variance == 0.0


def test_builder_reusing_messages_matches_fresh_messages_frame_after_frame():
    # More detections, fewer, none, then some again: nothing of an earlier frame may remain.
    builder = DetectionArrayBuilder()
    header = Header(frame_id='camera')
    for count in (4, 2, 0, 3):
        frame = _frame(count)
        header.stamp.sec = count
        built = builder.build(frame, header, 'pytorch-cpu', 'model-x')
        assert built == detection_array_message(frame, header, 'pytorch-cpu', 'model-x')
        assert len(built.detections) == count
