"""Uncertainty overlay drawing (ROS-free): boxes coloured by epistemic uncertainty.

Colour runs from green (GP variance near zero) through yellow to red (at or above the OOD
threshold), so an operator sees at a glance which objects the robot does not know. Each
label shows the class, its probability and the GP standard deviation sigma; detections
flagged out-of-distribution are drawn with a thicker box and an "OOD" tag. A translucent
band around each box spans its edges moved in and out by one standard deviation (from the
box coordinates' ``box_std``): a wide band is a box whose extent the robot is unsure of.

Drawing never raises on what a frame holds: a detection with a non-finite, negative or
absurdly large box, a non-finite or negative variance, non-finite probabilities or a class
index outside ``class_names`` is skipped, and so are those past :data:`MAX_DRAWN`; the
number skipped is written in the image's bottom-left corner. A non-finite or negative
``box_std`` only drops the band. Class names are shown printable and cut short.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from uq_perception.perception import FrameResult

# Opacity of the one-sigma box band: visible, yet the object stays recognisable under it.
BAND_OPACITY = 0.35
#: Most detections drawn per frame: past a few hundred the overlay is unreadable anyway and
#: drawing them would cost more than the frame budget.
MAX_DRAWN = 256
#: Box coordinates beyond this many pixels are invalid: no camera is that large, and OpenCV
#: takes 32-bit integer points.
MAX_COORDINATE = 1e5
#: Class names are cut to this many characters so a label cannot cover the image.
MAX_NAME_CHARS = 32


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
    """A copy of ``image_rgb`` with every valid detection of ``frame`` drawn on it."""
    return render_overlay(image_rgb, frame, ood_threshold)[0]


def _invalid_detections(frame: FrameResult) -> np.ndarray:
    """Per detection, True where it cannot be drawn (module docstring); arrays shorter
    than the box array leave the detections past their end invalid."""
    unc = frame.uncertainty
    boxes = np.asarray(frame.detections.boxes, dtype=np.float64).reshape(-1, 4)
    variance = np.asarray(unc.gp_variance, dtype=np.float64).reshape(-1)
    probabilities = np.asarray(unc.probabilities, dtype=np.float64)
    count = min(len(boxes), len(variance), len(probabilities), len(unc.out_of_distribution))
    invalid = np.ones(len(boxes), dtype=bool)
    if count == 0 or probabilities.ndim != 2 or not 0 < probabilities.shape[1] <= len(
            frame.class_names):
        return invalid
    boxes, variance, probabilities = boxes[:count], variance[:count], probabilities[:count]
    with np.errstate(invalid='ignore'):
        valid = (np.isfinite(boxes).all(axis=1) & (np.abs(boxes) <= MAX_COORDINATE).all(axis=1)
                 & (boxes[:, 2:] >= 0.0).all(axis=1) & np.isfinite(variance)
                 & (variance >= 0.0) & np.isfinite(probabilities).all(axis=1))
    invalid[:count] = ~valid
    return invalid


def _shown_name(name: object) -> str:
    """The class name as OpenCV's Hershey fonts can draw it: ASCII printable, short."""
    text = ''.join(c if c.isascii() and c.isprintable() else '?' for c in str(name)[:256])
    return text if len(text) <= MAX_NAME_CHARS else text[:MAX_NAME_CHARS - 3] + '...'


def render_overlay(image_rgb: np.ndarray, frame: FrameResult,
                   ood_threshold: float | None) -> tuple[np.ndarray, int]:
    """:func:`draw_overlay`, also returning how many detections were skipped.

    An image that is not ``(H, W, 3)`` uint8 comes back as a plain copy, every detection
    skipped.
    """
    canvas = np.ascontiguousarray(image_rgb.copy())
    if canvas.ndim != 3 or canvas.shape[2] != 3 or canvas.dtype != np.uint8 or canvas.size == 0:
        return canvas, len(frame.detections.boxes)
    invalid = _invalid_detections(frame)
    drawable = np.flatnonzero(~invalid)
    skipped = int(invalid.sum()) + max(len(drawable) - MAX_DRAWN, 0)
    unc = frame.uncertainty
    for i in drawable[:MAX_DRAWN]:
        cx, cy, w, h = (float(v) for v in frame.detections.boxes[i])
        top_left = (int(round(cx - w / 2)), int(round(cy - h / 2)))
        bottom_right = (int(round(cx + w / 2)), int(round(cy + h / 2)))
        ood = bool(unc.out_of_distribution[i])
        colour = uncertainty_colour(float(unc.gp_variance[i]), ood_threshold)
        draw_box_band(canvas, frame.detections.boxes[i], frame.box_std[i], colour)
        cv2.rectangle(canvas, top_left, bottom_right, colour, 3 if ood else 1)
        cls = int(np.argmax(unc.probabilities[i]))
        label = (f'{"OOD " if ood else ""}{_shown_name(frame.class_names[cls])} '
                 f'{unc.probabilities[i, cls]:.2f} s={np.sqrt(unc.gp_variance[i]):.2f}')
        text_origin = (top_left[0], max(top_left[1] - 3, 9))
        cv2.putText(canvas, label, text_origin, cv2.FONT_HERSHEY_PLAIN, 0.8, (0, 0, 0), 2,
                    cv2.LINE_AA)
        cv2.putText(canvas, label, text_origin, cv2.FONT_HERSHEY_PLAIN, 0.8, colour, 1,
                    cv2.LINE_AA)
    if skipped:
        note_origin = (3, canvas.shape[0] - 4)
        note = f'{skipped} detection(s) not drawn'
        cv2.putText(canvas, note, note_origin, cv2.FONT_HERSHEY_PLAIN, 0.8, (0, 0, 0), 2,
                    cv2.LINE_AA)
        cv2.putText(canvas, note, note_origin, cv2.FONT_HERSHEY_PLAIN, 0.8, (255, 255, 255), 1,
                    cv2.LINE_AA)
    return canvas, skipped


def draw_box_band(canvas: np.ndarray, box: np.ndarray, std: np.ndarray,
                  colour: tuple[int, int, int]) -> None:
    """Blend ``colour`` into ``canvas`` between the box shrunk and grown by one sigma.

    An edge at ``center -+ size / 2`` has the standard deviation ``sqrt(std_center^2 +
    std_size^2 / 4)`` (the coordinates' errors taken as independent). Nothing is drawn
    when every sigma is 0 (box uncertainty not estimated); a band wider than half the box
    fills it. Boxes partly or wholly outside the image are clipped. Nothing is drawn either
    when a value is not finite or a sigma is negative.
    """
    cx, cy, w, h = (float(v) for v in box)
    sx, sy, sw, sh = (float(v) for v in std)
    if not all(math.isfinite(v) for v in (cx, cy, w, h, sx, sy, sw, sh)) or min(
            sx, sy, sw, sh) < 0 or not (sx > 0 or sy > 0 or sw > 0 or sh > 0):
        return
    edge_x = float(np.hypot(sx, sw / 2))
    edge_y = float(np.hypot(sy, sh / 2))
    # Sigmas near the float limit make infinite edges; such a band would cover everything.
    edge_x, edge_y = min(edge_x, MAX_COORDINATE), min(edge_y, MAX_COORDINATE)
    height, width = canvas.shape[:2]
    # Pixel bounds of the grown box, clipped to the image; the band is blended there only.
    x0 = max(int(round(cx - w / 2 - edge_x)), 0)
    y0 = max(int(round(cy - h / 2 - edge_y)), 0)
    x1 = min(int(round(cx + w / 2 + edge_x)), width - 1)
    y1 = min(int(round(cy + h / 2 + edge_y)), height - 1)
    if x0 > x1 or y0 > y1:
        return
    band = np.ones((y1 - y0 + 1, x1 - x0 + 1), dtype=bool)
    if w / 2 > edge_x and h / 2 > edge_y:
        ix0 = max(int(round(cx - w / 2 + edge_x)), x0)
        iy0 = max(int(round(cy - h / 2 + edge_y)), y0)
        ix1 = min(int(round(cx + w / 2 - edge_x)), x1)
        iy1 = min(int(round(cy + h / 2 - edge_y)), y1)
        if ix0 <= ix1 and iy0 <= iy1:  # the shrunk box may lie wholly off the image
            band[iy0 - y0:iy1 - y0 + 1, ix0 - x0:ix1 - x0 + 1] = False
    region = canvas[y0:y1 + 1, x0:x1 + 1]
    region[band] = ((1.0 - BAND_OPACITY) * region[band]
                    + BAND_OPACITY * np.asarray(colour, dtype=np.float64)).astype(np.uint8)
