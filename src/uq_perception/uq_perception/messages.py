"""Conversions between the perception pipeline's results and ROS messages.

Pure field mapping, no math: the detector node and the evaluation tools share it so a
``DetectionArray`` means the same wherever it is produced.
"""

from __future__ import annotations

import numpy as np
from builtin_interfaces.msg import Duration
from geometry_msgs.msg import Point
from std_msgs.msg import ColorRGBA, Header
from visualization_msgs.msg import Marker, MarkerArray

from uq_msgs.msg import Detection, DetectionArray, Uncertainty
from uq_perception.overlay import uncertainty_colour
from uq_perception.perception import FrameResult


def uncertainty_message(frame: FrameResult, i: int) -> Uncertainty:
    """The ``Uncertainty`` of detection ``i``."""
    unc = frame.uncertainty
    return Uncertainty(
        gp_variance=float(unc.gp_variance[i]),
        class_variance=unc.class_variance[i].astype(np.float32).tolist(),
        predictive_entropy=float(unc.predictive_entropy[i]),
        expected_entropy=float(unc.expected_entropy[i]),
        mutual_information=float(unc.mutual_information[i]),
        max_probability=float(unc.probabilities[i].max()),
        out_of_distribution=bool(unc.out_of_distribution[i]),
        expert_id=int(unc.expert_id[i]),
    )


def detection_array_message(frame: FrameResult, header: Header, backend: str,
                            model_id: str) -> DetectionArray:
    """A ``DetectionArray`` for ``frame``; ``header`` is the source image's header.

    The frame-level ``uncertainty`` is that of the most uncertain detection (largest GP
    variance), the one a cautious consumer should act on; zeros when nothing is detected.
    """
    out = DetectionArray(header=header, class_names=list(frame.class_names),
                         inference_time_ms=float(frame.inference_ms), backend=backend,
                         model_id=model_id)
    unc = frame.uncertainty
    for i in range(len(frame)):
        cls = int(np.argmax(unc.probabilities[i]))
        cx, cy, w, h = (float(v) for v in frame.detections.boxes[i])
        out.detections.append(Detection(
            class_id=frame.class_names[cls], class_index=cls,
            score=float(frame.detections.scores[i]),
            class_probabilities=unc.probabilities[i].astype(np.float32).tolist(),
            center_x=cx, center_y=cy, width=w, height=h,
            box_std=[0.0, 0.0, 0.0, 0.0],
            track_id=int(frame.track_ids[i]),
            uncertainty=uncertainty_message(frame, i),
        ))
    worst = frame.most_uncertain()
    out.uncertainty = (uncertainty_message(frame, worst) if worst is not None
                       else Uncertainty(expert_id=-1))
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
