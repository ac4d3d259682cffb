"""Conversions between the perception pipeline's results and ROS messages.

Pure field mapping, no math: the detector node and the evaluation tools share it so a
``DetectionArray`` means the same wherever it is produced.
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
from uq_perception.overlay import uncertainty_colour
from uq_perception.perception import FrameResult


def _uncertainty_rows(frame: FrameResult) -> list[dict]:
    """Per detection, the ``Uncertainty`` fields as plain Python values."""
    unc = frame.uncertainty
    # Arrays are converted whole, in as few NumPy calls as possible: in the node this runs
    # right after the forward pass, when each call is several times slower than in a loop.
    scalars = np.column_stack([unc.gp_variance, unc.predictive_entropy, unc.expected_entropy,
                               unc.mutual_information, unc.probabilities.max(axis=1)])
    return [{'gp_variance': variance, 'predictive_entropy': total, 'expected_entropy': expected,
             'mutual_information': mutual, 'max_probability': top,
             'class_variance': array.array('f', row.tobytes()),
             'out_of_distribution': bool(ood), 'expert_id': int(expert)}
            for (variance, total, expected, mutual, top), row, ood, expert in zip(
                scalars.tolist(), unc.class_variance.astype(np.float32),
                unc.out_of_distribution.tolist(), unc.expert_id.tolist(), strict=True)]


def _set_fields(message: Any, fields: dict) -> None:
    for name, value in fields.items():
        setattr(message, name, value)


def detection_array_message(frame: FrameResult, header: Header, backend: str,
                            model_id: str) -> DetectionArray:
    """A ``DetectionArray`` for ``frame``; ``header`` is the source image's header.

    The frame-level ``uncertainty`` is that of the most uncertain detection (largest GP
    variance), the one a cautious consumer should act on; zeros when nothing is detected.
    """
    out = DetectionArray(header=header, class_names=list(frame.class_names),
                         inference_time_ms=float(frame.inference_ms), backend=backend,
                         model_id=model_id)
    uncertainties = _uncertainty_rows(frame)
    probabilities = frame.uncertainty.probabilities
    classes = probabilities.argmax(axis=1).tolist()
    probability_rows = [array.array('f', row.tobytes())
                        for row in probabilities.astype(np.float32)]
    boxes = frame.detections.boxes.tolist()
    scores = frame.detections.scores.tolist()
    track_ids = frame.track_ids.tolist()
    for i in range(len(frame)):
        # Fields are set on the default-built message: the generated constructor builds a
        # default nested Uncertainty even when one is passed, doubling the cost.
        detection = Detection()
        detection.class_id = frame.class_names[classes[i]]
        detection.class_index = classes[i]
        detection.score = scores[i]
        detection.class_probabilities = probability_rows[i]
        detection.center_x, detection.center_y, detection.width, detection.height = boxes[i]
        detection.track_id = track_ids[i]
        _set_fields(detection.uncertainty, uncertainties[i])
        out.detections.append(detection)
    worst = frame.most_uncertain()
    if worst is None:
        out.uncertainty.expert_id = -1
    else:
        _set_fields(out.uncertainty, uncertainties[worst])
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
