"""Uncertainty overlay drawing (ROS-free): boxes coloured by epistemic uncertainty.

Colour runs from green (GP variance near zero) through yellow to red (at or above the OOD
threshold), so an operator sees at a glance which objects the robot does not know. Each
label shows the class, its probability, the GP standard deviation ``s`` and, where the model
has a score reference, the calibrated score ``q`` (the share of known validation objects
less uncertain than this one: the same scale for every model) and, where its track has
evidence, the track score ``trk`` (the mean of ``q`` over the object's views so far, which
a single odd view moves less); detections flagged out-of-distribution are drawn with a
thicker box and an "OOD" tag. A translucent band around each box spans its edges moved in
and out by one standard deviation (from the box coordinates' ``box_std``): a wide band is a
box whose extent the robot is unsure of.

Labels are meant to be read on any camera size: the font is sized for the image
(:func:`label_style`), each label is drawn once, on an opaque box of its uncertainty colour,
and :func:`layout_labels` places them so that they stay inside the image, never cover one
another or the corner note, and keep off the detection boxes where there is room (so the
boxes, and what a viewer draws around them, stay visible). The most uncertain detections
are placed first; a label that finds no free place is left out and counted in the note.

Drawing never raises on what a frame holds: a detection with a non-finite, negative or
absurdly large box, a non-finite or negative variance, non-finite probabilities or a class
index outside ``class_names`` is skipped, and so are those past :data:`MAX_DRAWN`; the
number skipped is written in the image's bottom-left corner. A non-finite or negative
``box_std`` only drops the band. Class names are shown printable and cut short.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
#: Label text height as a fraction of the image's shorter side: 9 px on a 320x240 image,
#: 40 px on 1920x1080, about the same share of a screen whatever the camera.
TEXT_HEIGHT_FRACTION = 1 / 27
#: Smallest label text height in pixels: Hershey glyphs lower than this cannot be read.
MIN_TEXT_HEIGHT = 8
#: Most labels per frame: placing each costs a search among the others.
MAX_LABELS = 64
FONT = cv2.FONT_HERSHEY_SIMPLEX
#: The corner note's colours: white on black, unlike any uncertainty colour.
NOTE_COLOURS = ((0, 0, 0), (255, 255, 255))

Rect = tuple[int, int, int, int]
"""``(x0, y0, x1, y1)`` pixel bounds, ``x1``/``y1`` exclusive."""


@dataclass(frozen=True)
class LabelStyle:
    """Font metrics of the labels for one image size (:func:`label_style`)."""

    scale: float
    thickness: int
    padding: int
    margin: int


@dataclass(frozen=True)
class Label:
    """One text drawn once, on an opaque box, at a fixed place.

    Attributes
    ----------
    text
        What is written (printable ASCII).
    origin
        ``(x, y)`` of the text's baseline start, as ``cv2.putText`` takes it.
    rect
        The background box: it holds every pixel of the text, inside the image.
    background, foreground
        RGB colours of the box and of the text.
    detection
        Index of the detection it describes; -1 for the corner note.
    """

    text: str
    origin: tuple[int, int]
    rect: Rect
    background: tuple[int, int, int]
    foreground: tuple[int, int, int]
    detection: int


@dataclass(frozen=True)
class OverlayLayout:
    """Where everything of one overlay goes (:func:`layout_labels`).

    Attributes
    ----------
    labels
        The detection labels placed, the most uncertain first.
    note
        The corner note (detections skipped, labels without room), or None.
    skipped
        Detections not drawn at all (invalid, or past :data:`MAX_DRAWN`).
    unlabelled
        Detections drawn without their label, for want of a free place.
    drawn
        Indices of the detections drawn.
    style
        The font metrics used.
    """

    labels: tuple[Label, ...]
    note: Label | None
    skipped: int
    unlabelled: int
    drawn: tuple[int, ...]
    style: LabelStyle


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


def label_style(height: int, width: int) -> LabelStyle:
    """Font metrics that make labels the same share of any image (module docstring)."""
    text_height = max(MIN_TEXT_HEIGHT, round(min(height, width) * TEXT_HEIGHT_FRACTION))
    thickness = max(1, round(text_height / 14))
    scale = cv2.getFontScaleFromHeight(FONT, text_height, thickness)
    padding = max(1, round(text_height / 5))
    return LabelStyle(scale=scale, thickness=thickness, padding=padding,
                      margin=max(2, round(text_height / 4)))


def text_colour(background: tuple[int, int, int]) -> tuple[int, int, int]:
    """Black or white, whichever reads better on ``background`` (Rec. 709 luma)."""
    luma = 0.2126 * background[0] + 0.7152 * background[1] + 0.0722 * background[2]
    return (0, 0, 0) if luma >= 110 else (255, 255, 255)


def _label_size(text: str, style: LabelStyle) -> tuple[int, int, int]:
    """Width, height above the baseline and depth below it of ``text``'s background box.

    OpenCV's metrics leave out half the stroke on every side; the padding is added to that.
    """
    (w, h), baseline = cv2.getTextSize(text, FONT, style.scale, style.thickness)
    stroke = style.thickness // 2 + 1
    pad = style.padding + stroke
    return w + 2 * pad, h + pad, baseline + pad


def _box_rect(box: np.ndarray) -> Rect:
    cx, cy, w, h = (float(v) for v in box)
    return (int(round(cx - w / 2)), int(round(cy - h / 2)),
            int(round(cx + w / 2)) + 1, int(round(cy + h / 2)) + 1)


def _hits(rect: Rect, others: np.ndarray) -> np.ndarray:
    """Per row of ``others`` (``(N, 4)`` rectangles), whether it intersects ``rect``."""
    return ((others[:, 0] < rect[2]) & (rect[0] < others[:, 2])
            & (others[:, 1] < rect[3]) & (rect[1] < others[:, 3]))


def _candidates(box: Rect, size: tuple[int, int], margin: int) -> list[tuple[int, int]]:
    """Top-left corners to try for a label of ``size`` next to ``box``, best first:
    above, below, then beside it, each aligned with either edge; inside the box last."""
    (x0, y0, x1, y1), (w, h) = box, size
    above, below = y0 - margin - h, y1 + margin
    left, right = x0 - margin - w, x1 + margin
    return [(x0, above), (x1 - w, above), (x0, below), (x1 - w, below),
            (right, y0), (left, y0), (right, y1 - h), (left, y1 - h),
            (x0 + margin, y0 + margin)]


def _place(size: tuple[int, int], candidates: list[tuple[int, int]], image: tuple[int, int],
           taken: list[Rect], boxes: np.ndarray) -> Rect | None:
    """The first candidate, moved inside the image, that covers no ``taken`` rectangle;
    one that also keeps off ``boxes`` is preferred. None when no candidate is free."""
    (w, h), (height, width) = size, image
    if w > width or h > height:
        return None
    occupied = np.asarray(taken, dtype=np.int64).reshape(-1, 4)
    fallback = None
    for x, y in candidates:
        x, y = min(max(x, 0), width - w), min(max(y, 0), height - h)
        rect = (x, y, x + w, y + h)
        if _hits(rect, occupied).any():
            continue
        if not _hits(rect, boxes).any():
            return rect
        fallback = fallback or rect
    return fallback


def _note_text(skipped: int, unlabelled: int) -> str:
    parts = []
    if skipped:
        parts.append(f'{skipped} detection(s) not drawn')
    if unlabelled:
        parts.append(f'{unlabelled} label(s) left out')
    return ', '.join(parts)


def _label_text(frame: FrameResult, i: int) -> str:
    unc = frame.uncertainty
    cls = int(np.argmax(unc.probabilities[i]))
    ood = 'OOD ' if bool(unc.out_of_distribution[i]) else ''
    text = (f'{ood}{_shown_name(frame.class_names[cls])} {unc.probabilities[i, cls]:.2f} '
            f's={math.sqrt(float(unc.gp_variance[i])):.2f}')
    score = _score(frame.uncertainty.calibrated_score, i)
    if score is not None:
        text = f'{text} q={score:.2f}'
    track = _score(None if frame.track_scores is None else frame.track_scores.score, i)
    return text if track is None else f'{text} trk={track:.2f}'


def _score(scores: object, i: int) -> float | None:
    """Detection ``i``'s score of ``scores`` (calibrated or track); None without scores,
    or for a row they lack or that is not a score in [0, 1]."""
    if scores is None:
        return None
    try:
        values = np.asarray(scores, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        return None
    score = float(values[i]) if i < len(values) else math.nan
    return score if 0.0 <= score <= 1.0 else None


def _make_label(text: str, x: int, bottom: int, style: LabelStyle, width: int,
                background: tuple[int, int, int], detection: int) -> Label:
    """The label of ``text`` whose box starts at ``x`` and ends at row ``bottom``."""
    w, above, below = _label_size(text, style)
    rect = (x, bottom - above - below, min(x + w, width), bottom)
    inset = style.padding + style.thickness // 2 + 1
    return Label(text, (x + inset, bottom - below), rect, background, text_colour(background),
                 detection)


def _place_labels(frame: FrameResult, drawn: np.ndarray, order: list[int],
                  texts: dict[int, str], style: LabelStyle, image: tuple[int, int],
                  reserved: list[Rect]) -> dict[int, Rect]:
    """Greedy placement in ``order`` (see :func:`layout_labels`)."""
    boxes = np.array([_box_rect(frame.detections.boxes[i]) for i in drawn],
                     dtype=np.int64).reshape(-1, 4)
    boxes[:, :2] -= style.margin
    boxes[:, 2:] += style.margin
    placed: dict[int, Rect] = {}
    for k in order[:MAX_LABELS]:
        w, above, below = _label_size(texts[k], style)
        size = (w, above + below)
        rect = _place(size, _candidates(_box_rect(frame.detections.boxes[drawn[k]]), size,
                                        style.margin),
                      image, list(placed.values()) + reserved, boxes)
        if rect is not None:
            placed[k] = rect
    return placed


def layout_labels(image_shape: tuple[int, ...], frame: FrameResult,
                  ood_threshold: float | None) -> OverlayLayout:
    """Decide what the overlay of ``frame`` on an image of ``image_shape`` draws, and where.

    Parameters
    ----------
    image_shape
        ``(height, width, ...)`` of the image drawn on.
    frame
        The detections and their uncertainty.
    ood_threshold
        GP variance at which the colour reaches red (:func:`uncertainty_colour`).

    Returns
    -------
    OverlayLayout
        Labels whose boxes lie inside the image and intersect neither each other nor the
        corner note; each keeps off every detection box (grown by a margin) where a free
        place exists. At most :data:`MAX_LABELS` detections get a label.
    """
    height, width = int(image_shape[0]), int(image_shape[1])
    style = label_style(height, width)
    invalid = _invalid_detections(frame)
    valid = np.flatnonzero(~invalid)
    drawn = valid[:MAX_DRAWN]
    skipped = int(invalid.sum()) + max(len(valid) - MAX_DRAWN, 0)
    unc = frame.uncertainty
    # The most uncertain objects are what the operator must read: they choose first.
    order = sorted(range(len(drawn)), key=lambda k: (
        not bool(unc.out_of_distribution[drawn[k]]), -float(unc.gp_variance[drawn[k]]), k))
    texts = {k: _label_text(frame, int(drawn[k])) for k in order}
    placed = _place_labels(frame, drawn, order, texts, style, (height, width), [])
    if skipped or len(placed) < len(drawn):
        # A note is needed: keep its corner free, sized for the longest text it can have,
        # and place the labels again around it.
        longest = _make_label(_note_text(skipped, len(drawn)), 0, height, style, width,
                              NOTE_COLOURS[0], -1)
        placed = _place_labels(frame, drawn, order, texts, style, (height, width),
                               [longest.rect])
    unlabelled = len(drawn) - len(placed)
    note_text = _note_text(skipped, unlabelled)
    note = (_make_label(note_text, 0, height, style, width, NOTE_COLOURS[0], -1)
            if note_text else None)
    labels = []
    for k in order:
        if k in placed:
            i = int(drawn[k])
            x0, _, _, y1 = placed[k]
            labels.append(_make_label(texts[k], x0, y1, style, width, uncertainty_colour(
                float(unc.gp_variance[i]), ood_threshold), i))
    return OverlayLayout(tuple(labels), note, skipped, unlabelled,
                         tuple(int(i) for i in drawn), style)


def draw_label(canvas: np.ndarray, label: Label, style: LabelStyle) -> None:
    """Fill ``label``'s box and write its text once, clipped to the box."""
    x0, y0, x1, y1 = label.rect
    region = canvas[y0:y1, x0:x1]
    region[:] = label.background
    cv2.putText(region, label.text, (label.origin[0] - x0, label.origin[1] - y0), FONT,
                style.scale, label.foreground, style.thickness, cv2.LINE_AA)


def render_overlay(image_rgb: np.ndarray, frame: FrameResult,
                   ood_threshold: float | None) -> tuple[np.ndarray, int]:
    """:func:`draw_overlay`, also returning how many detections were skipped.

    An image that is not ``(H, W, 3)`` uint8 comes back as a plain copy, every detection
    skipped.
    """
    canvas = np.ascontiguousarray(image_rgb.copy())
    if canvas.ndim != 3 or canvas.shape[2] != 3 or canvas.dtype != np.uint8 or canvas.size == 0:
        return canvas, len(frame.detections.boxes)
    layout = layout_labels(canvas.shape, frame, ood_threshold)
    unc = frame.uncertainty
    line = layout.style.thickness
    for i in layout.drawn:
        box = frame.detections.boxes[i]
        x0, y0, x1, y1 = _box_rect(box)
        ood = bool(unc.out_of_distribution[i])
        colour = uncertainty_colour(float(unc.gp_variance[i]), ood_threshold)
        draw_box_band(canvas, box, frame.box_std[i], colour)
        cv2.rectangle(canvas, (x0, y0), (x1 - 1, y1 - 1), colour, 3 * line if ood else line)
    # Labels last, so no box or band is drawn over them.
    for label in layout.labels:
        draw_label(canvas, label, layout.style)
    if layout.note is not None:
        draw_label(canvas, layout.note, layout.style)
    return canvas, layout.skipped


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
