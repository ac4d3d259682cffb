"""Uncertainty overlay drawing (ROS-free): boxes coloured by epistemic uncertainty.

Colour runs from green (GP variance near zero) through yellow to red (at or above the OOD
threshold), so an operator sees at a glance which objects the robot does not know. Each
label shows the class, its probability and the GP standard deviation sigma; detections
flagged out-of-distribution are drawn with a thicker box and an "OOD" tag.
"""

from __future__ import annotations

import cv2
import numpy as np

from uq_perception.perception import FrameResult


def uncertainty_colour(gp_variance: float, ood_threshold: float | None) -> tuple[int, int, int]:
    """RGB colour for a GP variance: green at 0, yellow at half the threshold, red above it.

    Without a calibrated threshold the scale saturates at a variance of 1 logit^2.
    """
    scale = ood_threshold if ood_threshold and ood_threshold > 0 else 1.0
    t = float(np.clip(gp_variance / scale, 0.0, 1.0))
    if t < 0.5:
        return (int(510 * t), 200, 0)
    return (255, int(200 * (2.0 - 2.0 * t)), 0)


def draw_overlay(image_rgb: np.ndarray, frame: FrameResult,
                 ood_threshold: float | None) -> np.ndarray:
    """A copy of ``image_rgb`` with every detection of ``frame`` drawn on it."""
    canvas = np.ascontiguousarray(image_rgb.copy())
    unc = frame.uncertainty
    for i in range(len(frame)):
        cx, cy, w, h = (float(v) for v in frame.detections.boxes[i])
        top_left = (int(round(cx - w / 2)), int(round(cy - h / 2)))
        bottom_right = (int(round(cx + w / 2)), int(round(cy + h / 2)))
        ood = bool(unc.out_of_distribution[i])
        colour = uncertainty_colour(float(unc.gp_variance[i]), ood_threshold)
        cv2.rectangle(canvas, top_left, bottom_right, colour, 3 if ood else 1)
        cls = int(np.argmax(unc.probabilities[i]))
        label = (f'{"OOD " if ood else ""}{frame.class_names[cls]} '
                 f'{unc.probabilities[i, cls]:.2f} s={np.sqrt(unc.gp_variance[i]):.2f}')
        text_origin = (top_left[0], max(top_left[1] - 3, 9))
        cv2.putText(canvas, label, text_origin, cv2.FONT_HERSHEY_PLAIN, 0.8, (0, 0, 0), 2,
                    cv2.LINE_AA)
        cv2.putText(canvas, label, text_origin, cv2.FONT_HERSHEY_PLAIN, 0.8, colour, 1,
                    cv2.LINE_AA)
    return canvas
