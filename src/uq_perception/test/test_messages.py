"""Field mapping from the perception pipeline's results to uq_msgs (no ROS graph needed)."""

from __future__ import annotations

import numpy as np
import pytest
from std_msgs.msg import Header

from uq_perception.detectors.centernet import Detections
from uq_perception.messages import DetectionArrayBuilder, detection_array_message
from uq_perception.ntk import UncertaintyOutput
from uq_perception.perception import FrameResult
from uq_perception.track_evidence import TrackScores

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


def _with_evidence(frame: FrameResult) -> FrameResult:
    """``frame`` with track evidence: every other detection's track without a counted view."""
    import dataclasses

    count = len(frame)
    views = np.where(np.arange(count) % 2 == 0, np.arange(1, count + 1), 0)
    classes = frame.uncertainty.probabilities.argmax(axis=1)
    # Detection 0 labelled with the class it has, detection 3 with another one.
    labels = tuple(frame.class_names[classes[i]] if i == 0 else 'another class' if i == 3
                   else '' for i in range(count))
    return dataclasses.replace(frame, track_scores=TrackScores(
        np.where(views > 0, np.linspace(0.2, 0.9, count), -1.0), views,
        np.array([label != '' for label in labels]), labels))


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


def test_track_evidence_is_each_detections_and_not_the_frames():
    frame = _with_evidence(_frame(4))
    out = detection_array_message(frame, Header(), 'pytorch-cpu', 'm')
    evidence = frame.track_scores
    for i, det in enumerate(out.detections):
        u = det.uncertainty
        assert u.track_score == pytest.approx(evidence.score[i])
        assert u.track_views == evidence.views[i]
        # Labelled vouches only for a label that is the detection's class now.
        assert u.track_labelled == (i == 0), i
    assert out.detections[1].uncertainty.track_score == -1.0
    # The frame-level uncertainty is no track's, whichever detection it copies.
    frame_level = out.uncertainty
    assert (frame_level.track_score, frame_level.track_views, frame_level.track_labelled) == (
        -1.0, 0, False)
    # A pipeline that keeps no evidence gives every detection none.
    for det in detection_array_message(_frame(3), Header(), 'pytorch-cpu', 'm').detections:
        assert (det.uncertainty.track_score, det.uncertainty.track_views,
                det.uncertainty.track_labelled) == (-1.0, 0, False)


def test_frame_uncertainty_is_the_most_uncertain_detection():
    frame = _frame(5)
    out = detection_array_message(frame, Header(), 'pytorch-cpu', 'm')
    worst = int(np.argmax(frame.uncertainty.gp_variance))
    assert out.uncertainty == out.detections[worst].uncertainty
    # With track evidence, everything but the track fields.
    out = detection_array_message(_with_evidence(frame), Header(), 'pytorch-cpu', 'm')
    worst_fields = out.detections[worst].uncertainty
    for name in out.uncertainty.get_fields_and_field_types():
        if not name.startswith('track_'):
            assert getattr(out.uncertainty, name) == getattr(worst_fields, name), name
    # A copy, not the detection's own message: editing one must not change the other.
    assert out.uncertainty is not out.detections[worst].uncertainty


def test_no_detections_gives_an_empty_array_and_no_expert():
    out = detection_array_message(_frame(0), Header(), 'pytorch-cpu', 'm')
    assert len(out.detections) == 0
    assert out.uncertainty.expert_id == -1 and out.uncertainty.gp_variance == 0.0


def test_builder_reusing_messages_matches_fresh_messages_frame_after_frame():
    # More detections, fewer, none, then some again, with track evidence or without: nothing
    # of an earlier frame may remain.
    builder = DetectionArrayBuilder()
    header = Header(frame_id='camera')
    for count, evidence in ((4, True), (2, False), (0, True), (3, True), (5, False)):
        frame = _with_evidence(_frame(count)) if evidence else _frame(count)
        header.stamp.sec = count
        built = builder.build(frame, header, 'pytorch-cpu', 'model-x')
        assert built == detection_array_message(frame, header, 'pytorch-cpu', 'model-x')
        assert len(built.detections) == count


def test_detection_2d_array_is_the_same_frame_as_the_detection_array():
    pytest.importorskip('vision_msgs.msg', reason='vision_msgs is not installed '
                        '(scripts/build_vision_msgs.sh builds it from a source checkout)')
    import dataclasses

    from uq_perception.messages import detection_2d_array_message

    frame = _with_evidence(_frame(4))  # detections 1 and 3 without a track score
    scores = np.array([0.1, -1.0, 0.9, 0.5])  # one detection without a calibrated score
    frame = dataclasses.replace(frame, uncertainty=dataclasses.replace(
        frame.uncertainty, calibrated_score=scores))
    header = Header(frame_id='camera')
    header.stamp.sec, header.stamp.nanosec = 7, 11
    uq = detection_array_message(frame, header, 'pytorch-cpu', 'm')
    standard = detection_2d_array_message(frame, header)
    assert standard.header == header
    assert len(standard.detections) == len(uq.detections) == 4
    for det, mine in zip(standard.detections, uq.detections, strict=True):
        assert det.header == header and det.id == str(mine.track_id)
        assert [det.bbox.center.position.x, det.bbox.center.position.y, det.bbox.size_x,
                det.bbox.size_y] == [mine.center_x, mine.center_y, mine.width, mine.height]
        assert det.bbox.center.theta == 0.0
        ids = [r.hypothesis.class_id for r in det.results]
        assert ids[0] == mine.class_id
        probabilities = {r.hypothesis.class_id: r.hypothesis.score
                         for r in det.results[:len(CLASSES)]}
        assert probabilities == dict(zip(CLASSES, mine.class_probabilities, strict=True))
        reserved = {r.hypothesis.class_id: r.hypothesis.score
                    for r in det.results[len(CLASSES):]}
        assert reserved.pop('uq/out_of_distribution') == \
            float(mine.uncertainty.out_of_distribution)
        # float32, as the uq message carries them once serialised; absent scores left out.
        expected = {name: float(np.float32(value)) for name, value in (
            ('uq/calibrated_score', mine.uncertainty.calibrated_score),
            ('uq/track_score', mine.uncertainty.track_score)) if value >= 0}
        assert reserved == expected
        for result in det.results:
            pose = result.pose.pose
            assert (pose.position.x, pose.position.y, pose.position.z) == (
                mine.center_x, mine.center_y, 0.0)
            assert (pose.orientation.x, pose.orientation.y, pose.orientation.z,
                    pose.orientation.w) == (0.0, 0.0, 0.0, 1.0)
            covariance = np.asarray(result.pose.covariance).reshape(6, 6)
            assert np.diag(covariance)[:4].tolist() == [float(s) ** 2 for s in mine.box_std]
            assert np.count_nonzero(covariance - np.diag(np.diag(covariance))) == 0
            assert np.diag(covariance)[4:].tolist() == [0.0, 0.0]


def test_detection_2d_array_of_a_frame_without_detections_is_empty():
    pytest.importorskip('vision_msgs.msg', reason='vision_msgs is not installed '
                        '(scripts/build_vision_msgs.sh builds it from a source checkout)')
    from uq_perception.messages import detection_2d_array_message

    header = Header(frame_id='camera')
    out = detection_2d_array_message(_frame(0), header)
    assert out.header == header and len(out.detections) == 0


def test_detection_2d_builder_reusing_messages_matches_fresh_messages_frame_after_frame():
    pytest.importorskip('vision_msgs.msg', reason='vision_msgs is not installed '
                        '(scripts/build_vision_msgs.sh builds it from a source checkout)')
    import dataclasses

    from uq_perception.messages import Detection2DArrayBuilder, detection_2d_array_message

    # More detections, fewer, none, some again; a calibrated score or not (one hypothesis
    # more or less): nothing of an earlier frame may remain.
    builder = Detection2DArrayBuilder()
    header = Header(frame_id='camera')
    for count, scored in ((4, True), (2, False), (0, True), (3, True), (5, False)):
        frame = _frame(count)
        if scored:
            frame = dataclasses.replace(frame, uncertainty=dataclasses.replace(
                frame.uncertainty, calibrated_score=np.linspace(0, 1, count)))
        header.stamp.sec = count
        built = builder.build(frame, header)
        assert built == detection_2d_array_message(frame, header)
        assert len(built.detections) == count
        assert all(len(d.results) == len(CLASSES) + 1 + scored for d in built.detections)
