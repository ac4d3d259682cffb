"""Conversions between the perception pipeline's results and ROS messages.

Pure field mapping, no math: the detector node and the evaluation tools share it so a
``DetectionArray`` means the same wherever it is produced. Where vision_msgs is installed,
:func:`detection_2d_array_message` gives the same detections as the ecosystem's standard
``vision_msgs/Detection2DArray`` (the values from
:mod:`uq_perception.detectors.detection_2d`).
"""

from __future__ import annotations

import array
from typing import Any

import numpy as np
from builtin_interfaces.msg import Duration
from geometry_msgs.msg import Point
from std_msgs.msg import ColorRGBA, Header
from visualization_msgs.msg import Marker, MarkerArray

from uq_msgs.msg import Detection, DetectionArray
from uq_perception.detectors.detection_2d import detection_2d_fields
from uq_perception.ntk.calibrated_score import NO_CALIBRATED_SCORE
from uq_perception.overlay import uncertainty_colour
from uq_perception.perception import FrameResult
from uq_perception.track_evidence import NO_TRACK_SCORE

# vision_msgs is optional (a robot has it from rosdep; ROS 2 from PyPI lacks it, see
# scripts/build_vision_msgs.sh): without it, VISION_MSGS_MISSING says why.
try:
    from vision_msgs.msg import Detection2D, Detection2DArray, ObjectHypothesisWithPose
    VISION_MSGS_MISSING = ''
except ImportError as _error:
    Detection2D = Detection2DArray = ObjectHypothesisWithPose = None
    VISION_MSGS_MISSING = f'vision_msgs is not installed ({_error})'


def _uncertainty_rows(frame: FrameResult) -> list[dict]:
    """Per detection, the ``Uncertainty`` fields as plain Python values."""
    unc = frame.uncertainty
    score = unc.calibrated_score if unc.calibrated_score is not None \
        else np.full(len(unc.gp_variance), NO_CALIBRATED_SCORE)
    # Arrays are converted whole, in as few NumPy calls as possible: in the node this runs
    # right after the forward pass, when each call is several times slower than in a loop.
    scalars = np.column_stack([unc.gp_variance, unc.predictive_entropy, unc.expected_entropy,
                               unc.mutual_information, unc.probabilities.max(axis=1), score])
    return [{'gp_variance': variance, 'predictive_entropy': total, 'expected_entropy': expected,
             'mutual_information': mutual, 'max_probability': top,
             'class_variance': array.array('f', row.tobytes()),
             'out_of_distribution': bool(ood), 'expert_id': int(expert),
             'calibrated_score': calibrated}
            for (variance, total, expected, mutual, top, calibrated), row, ood, expert in zip(
                scalars.tolist(), unc.class_variance.astype(np.float32),
                unc.out_of_distribution.tolist(), unc.expert_id.tolist(), strict=True)]


def _set_fields(message: Any, fields: dict) -> None:
    for name, value in fields.items():
        setattr(message, name, value)


def detection_array_message(frame: FrameResult, header: Header, backend: str,
                            model_id: str, embeddings: bool = True) -> DetectionArray:
    """A ``DetectionArray`` for ``frame``; ``header`` is the source image's header.

    The frame-level ``uncertainty`` is that of the most uncertain detection (largest GP
    variance), the one a cautious consumer should act on; zeros when nothing is detected
    (its ``calibrated_score`` -1 when the model has no score reference). Its track fields
    are those of no track (``track_score`` -1, ``track_views`` 0): the evidence is each
    detection's. The model's range, ``reference_variance_max`` and ``ood_threshold``, comes
    from ``frame`` (-1 where the model has none). With ``embeddings`` each detection
    carries its feature vector (for online teaching).
    """
    return _fill_detection_array(DetectionArray(), [Detection() for _ in range(len(frame))],
                                 frame, header, backend, model_id, embeddings)


class DetectionArrayBuilder:
    """Builds :func:`detection_array_message` into the same message objects frame after frame.

    For a publisher that serialises each message before the next is built (rclpy's
    ``publish`` converts it on the spot): constructing the nested messages is most of the
    cost of building one (docs/performance.md). The returned message is only valid until
    the next :meth:`build`.
    """

    def __init__(self) -> None:
        self._message = DetectionArray()
        self._detections: list[Detection] = []

    def build(self, frame: FrameResult, header: Header, backend: str,
              model_id: str, embeddings: bool = True) -> DetectionArray:
        while len(self._detections) < len(frame):
            self._detections.append(Detection())
        return _fill_detection_array(self._message, self._detections[:len(frame)], frame,
                                     header, backend, model_id, embeddings)


# The frame-level uncertainty of a frame without detections: the message defaults, no expert.
_NO_UNCERTAINTY = {'gp_variance': 0.0, 'predictive_entropy': 0.0, 'expected_entropy': 0.0,
                   'mutual_information': 0.0, 'max_probability': 0.0,
                   'out_of_distribution': False, 'expert_id': -1}
# The message value of a figure the model lacks (a GP artefact without score reference or
# OOD threshold): -1, outside the range of every such field (uq_msgs/DetectionArray).
_ABSENT = -1.0


def _message_value(value: float | None) -> float:
    return _ABSENT if value is None else float(value)


def _fill_detection_array(out: DetectionArray, detections: list[Detection],
                          frame: FrameResult, header: Header, backend: str,
                          model_id: str, embeddings: bool) -> DetectionArray:
    """Set every field of ``out`` and of the ``len(frame)`` messages in ``detections``."""
    out.header = header
    out.class_names = list(frame.class_names)
    out.inference_time_ms = float(frame.inference_ms)
    out.backend, out.model_id = backend, model_id
    out.reference_variance_max = _message_value(frame.reference_variance_max)
    out.ood_threshold = _message_value(frame.ood_threshold)
    uncertainties = _uncertainty_rows(frame)
    probabilities = frame.uncertainty.probabilities
    classes = probabilities.argmax(axis=1).tolist()
    probability_rows = [array.array('f', row.tobytes())
                        for row in probabilities.astype(np.float32)]
    boxes = frame.detections.boxes.tolist()
    box_stds = np.ascontiguousarray(frame.box_std, dtype=np.float32)
    scores = frame.detections.scores.tolist()
    track_ids = frame.track_ids.tolist()
    embedding_rows = ([array.array('f', row.tobytes())
                       for row in np.asarray(frame.detections.embeddings, np.float32)]
                      if embeddings else [array.array('f')] * len(detections))
    evidence = frame.track_scores
    if evidence is None:
        track_rows = [(NO_TRACK_SCORE, 0, False)] * len(detections)
    else:
        # Labelled counts for the consumer only when the person's label is the class the
        # detection now has: a label the detector has not taken (or a retargeted object)
        # must not vouch for what it still calls something else.
        track_rows = [(score, views, labelled and label == frame.class_names[classes[i]])
                      for i, (score, views, labelled, label) in enumerate(zip(
                          evidence.score.tolist(), evidence.views.tolist(),
                          evidence.labelled.tolist(),
                          evidence.labels or ('',) * len(detections), strict=True))]
    for i, detection in enumerate(detections):
        detection.class_id = frame.class_names[classes[i]]
        detection.class_index = classes[i]
        detection.score = scores[i]
        detection.class_probabilities = probability_rows[i]
        detection.center_x, detection.center_y, detection.width, detection.height = boxes[i]
        detection.box_std = box_stds[i]
        detection.track_id = track_ids[i]
        detection.embedding = embedding_rows[i]
        _set_fields(detection.uncertainty, uncertainties[i])
        (detection.uncertainty.track_score, detection.uncertainty.track_views,
         detection.uncertainty.track_labelled) = track_rows[i]
    out.detections = detections
    worst = frame.most_uncertain()
    if worst is None:
        _set_fields(out.uncertainty, _NO_UNCERTAINTY)
        out.uncertainty.class_variance = array.array('f')
        out.uncertainty.calibrated_score = \
            NO_CALIBRATED_SCORE if frame.reference_variance_max is None else 0.0
    else:
        _set_fields(out.uncertainty, uncertainties[worst])
    out.uncertainty.track_score, out.uncertainty.track_views = NO_TRACK_SCORE, 0
    out.uncertainty.track_labelled = False
    return out


def marker_array_message(frame: FrameResult, header: Header, ood_threshold: float | None,
                         lifetime_s: float = 0.5) -> MarkerArray:
    """Image-plane box outlines and labels (in pixels, z = 0) for RViz/Foxglove.

    Markers live in the camera frame with x, y in pixels, so they line up with the image
    when viewed in a 2D image panel; a ``DELETEALL`` first clears the previous frame's.
    """
    markers = MarkerArray()
    markers.markers.append(Marker(header=header, action=Marker.DELETEALL))
    lifetime = Duration(sec=int(lifetime_s), nanosec=int((lifetime_s % 1) * 1e9))
    unc = frame.uncertainty
    for i in range(len(frame)):
        r, g, b = uncertainty_colour(float(unc.gp_variance[i]), ood_threshold)
        colour = ColorRGBA(r=r / 255.0, g=g / 255.0, b=b / 255.0, a=1.0)
        cx, cy, w, h = (float(v) for v in frame.detections.boxes[i])
        corners = [(cx - w / 2, cy - h / 2), (cx + w / 2, cy - h / 2),
                   (cx + w / 2, cy + h / 2), (cx - w / 2, cy + h / 2), (cx - w / 2, cy - h / 2)]
        box = Marker(header=header, ns='uq_boxes', id=i, type=Marker.LINE_STRIP,
                     action=Marker.ADD, color=colour, lifetime=lifetime,
                     points=[Point(x=x, y=y, z=0.0) for x, y in corners])
        box.scale.x = 3.0 if unc.out_of_distribution[i] else 1.0
        box.pose.orientation.w = 1.0
        cls = int(np.argmax(unc.probabilities[i]))
        text = Marker(header=header, ns='uq_labels', id=i, type=Marker.TEXT_VIEW_FACING,
                      action=Marker.ADD, color=colour, lifetime=lifetime,
                      text=(f'{"OOD " if unc.out_of_distribution[i] else ""}'
                            f'{frame.class_names[cls]} p={unc.probabilities[i, cls]:.2f} '
                            f'sigma={np.sqrt(unc.gp_variance[i]):.2f}'))
        text.pose.position.x, text.pose.position.y = cx, cy - h / 2 - 6.0
        text.pose.orientation.w = 1.0
        text.scale.z = 10.0
        markers.markers += [box, text]
    return markers


def detection_2d_array_message(frame: FrameResult, header: Header) -> Any:
    """``frame`` as a ``vision_msgs/Detection2DArray``, detections in the order of
    :func:`detection_array_message`'s; ``header`` (the image's) on the array and on every
    detection. The convention: :mod:`uq_perception.detectors.detection_2d`.

    Raises
    ------
    RuntimeError
        Where vision_msgs is not installed (:data:`VISION_MSGS_MISSING`).
    """
    return Detection2DArrayBuilder().build(frame, header)


class Detection2DArrayBuilder:
    """Builds :func:`detection_2d_array_message` into the same message objects frame after
    frame, as :class:`DetectionArrayBuilder` does (a frame holds one hypothesis message per
    class and detection: constructing them is most of the cost). The returned message is
    only valid until the next :meth:`build`.

    Raises
    ------
    RuntimeError
        Where vision_msgs is not installed (:data:`VISION_MSGS_MISSING`).
    """

    def __init__(self) -> None:
        if Detection2DArray is None:
            raise RuntimeError(VISION_MSGS_MISSING)
        self._message = Detection2DArray()
        self._detections: list[Any] = []
        self._results: list[list[Any]] = []

    def build(self, frame: FrameResult, header: Header) -> Any:
        unc = frame.uncertainty
        fields = detection_2d_fields(
            frame.detections.boxes, frame.box_std, unc.probabilities, frame.class_names,
            frame.track_ids, unc.out_of_distribution, unc.calibrated_score,
            None if frame.track_scores is None else frame.track_scores.score)
        while len(self._detections) < len(fields):
            self._detections.append(Detection2D())
            self._results.append([])
        for detection, pool, values in zip(self._detections, self._results, fields,
                                           strict=False):
            detection.header, detection.id = header, values.id
            detection.bbox.center.position.x = values.center_x
            detection.bbox.center.position.y = values.center_y
            detection.bbox.size_x, detection.bbox.size_y = values.size_x, values.size_y
            while len(pool) < len(values.results):
                result = ObjectHypothesisWithPose()
                result.pose.pose.orientation.w = 1.0
                pool.append(result)
            covariance = np.array(values.covariance, dtype=np.float64)
            for result, hypothesis in zip(pool, values.results, strict=False):
                result.hypothesis.class_id = hypothesis.class_id
                result.hypothesis.score = hypothesis.score
                result.pose.pose.position.x = values.center_x
                result.pose.pose.position.y = values.center_y
                result.pose.covariance = covariance
            detection.results = pool[:len(values.results)]
        self._message.header = header
        self._message.detections = self._detections[:len(fields)]
        return self._message
