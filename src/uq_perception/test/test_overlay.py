"""Overlay labels: legible at every image size, each drawn once, never on one another.

Frames with crowded detections (stacked, overlapping, on the image's edges and corners,
larger than the image, tiny) are rendered at camera sizes from 80x60 to 1920x1080, and the
rendered pixels are checked against the layout the overlay reports:

- every label box lies inside the image and holds all of its text;
- label boxes intersect neither each other nor the corner note;
- the pixels of each label box are exactly one ``cv2.putText`` of its text on its
  background, so nothing else was drawn there and the text was drawn once;
- each detection drawn has its label or is counted in the note.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import cv2
import numpy as np
import pytest

from uq_perception.detectors.centernet import Detections
from uq_perception.ntk.config import UncertaintyOutput
from uq_perception.overlay import (
    FONT,
    MAX_LABELS,
    Label,
    LabelStyle,
    OverlayLayout,
    label_style,
    layout_labels,
    render_overlay,
)
from uq_perception.perception import FrameResult
from uq_perception.track_evidence import TrackScores

CLASSES = ['mug', 'ellipsoid', 'sphere', 'cylinder', 'a class with a long name']
SIZES = [(60, 80), (240, 320), (480, 640), (720, 1280), (1080, 1920)]


def _frame(boxes: np.ndarray, variance: np.ndarray, ood: np.ndarray,
           classes: np.ndarray) -> FrameResult:
    k = len(boxes)
    probabilities = np.full((k, len(CLASSES)), 0.02)
    probabilities[np.arange(k), classes] = 1.0 - 0.02 * (len(CLASSES) - 1)
    uncertainty = UncertaintyOutput(
        logits=np.zeros((k, len(CLASSES))), gp_variance=np.asarray(variance, np.float64),
        class_variance=np.zeros((k, len(CLASSES))), probabilities=probabilities,
        predictive_entropy=np.zeros(k), expected_entropy=np.zeros(k),
        mutual_information=np.zeros(k), out_of_distribution=np.asarray(ood, bool),
        expert_id=np.zeros(k, dtype=np.int64))
    detections = Detections(np.asarray(boxes, np.float32), np.ones(k, np.float32),
                            np.zeros((k, 4), np.float32), np.zeros((k, len(CLASSES)),
                                                                   np.float32))
    return FrameResult(detections, uncertainty, np.full(k, -1), CLASSES, 1.0, 1.0,
                       np.full((k, 4), 2.0, np.float32))


def _crowded_frame(height: int, width: int, seed: int, clusters: int = 3) -> FrameResult:
    """Clusters of overlapping boxes, boxes stacked on one another, boxes on every edge and
    corner, one larger than the image and some a few pixels wide."""
    rng = np.random.default_rng(seed)
    boxes = []
    for _ in range(clusters):
        centre = rng.uniform([0.2 * width, 0.2 * height], [0.8 * width, 0.8 * height])
        for _ in range(int(rng.integers(4, 9))):
            size = rng.uniform(0.05, 0.3, 2) * (width, height)
            boxes.append([*(centre + rng.normal(0, 0.05, 2) * (width, height)), *size])
    boxes += [[0, 0, 0.2 * width, 0.2 * height], [width, 0, 0.2 * width, 0.2 * height],
              [0, height, 0.3 * width, 0.1 * height], [width, height, 0.1 * width, 0.3 * height],
              [width / 2, height / 2, 2 * width, 2 * height], [width / 2, 2, 3, 3],
              [width / 2, height / 2, 0.2 * width, 0.2 * height]] * 1
    boxes.append(boxes[-1])  # two identical detections
    k = len(boxes)
    frame = _frame(np.array(boxes), rng.uniform(0.0, 1e-3, k), rng.random(k) < 0.3,
                   rng.integers(0, len(CLASSES), k))
    if seed % 2:  # the longer labels of a model with a score reference
        frame = replace(frame, uncertainty=replace(frame.uncertainty,
                                                   calibrated_score=rng.uniform(0, 1, k)))
    return frame


def _single_put_text(label: Label, style: LabelStyle) -> np.ndarray:
    """The label's box as one putText of its text on its background gives it."""
    x0, y0, x1, y1 = label.rect
    patch = np.empty((y1 - y0, x1 - x0, 3), np.uint8)
    patch[:] = label.background
    cv2.putText(patch, label.text, (label.origin[0] - x0, label.origin[1] - y0), FONT,
                style.scale, label.foreground, style.thickness, cv2.LINE_AA)
    return patch


def _ink_inside_box(label: Label, style: LabelStyle) -> bool:
    """Whether every pixel of the text, written without any clipping, falls in its box."""
    x0, y0, x1, y1 = label.rect
    pad = 2 * (x1 - x0 + y1 - y0)  # far more than any glyph can stray
    canvas = np.zeros((y1 - y0 + 2 * pad, x1 - x0 + 2 * pad), np.uint8)
    cv2.putText(canvas, label.text, (label.origin[0] - x0 + pad, label.origin[1] - y0 + pad),
                FONT, style.scale, 255, style.thickness, cv2.LINE_AA)
    ys, xs = np.nonzero(canvas)
    return bool(len(xs)) and bool(
        (xs >= pad).all() and (xs < pad + x1 - x0).all() and (ys >= pad).all()
        and (ys < pad + y1 - y0).all())


def _check(layout: OverlayLayout, image: np.ndarray, out: np.ndarray) -> None:
    height, width = image.shape[:2]
    boxes = [label.rect for label in layout.labels]
    if layout.note is not None:
        boxes.append(layout.note.rect)
    for x0, y0, x1, y1 in boxes:
        assert 0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height, (x0, y0, x1, y1)
    for a, b in itertools.combinations(boxes, 2):
        assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]), (a, b)
    for label in layout.labels:
        x0, y0, x1, y1 = label.rect
        assert np.array_equal(out[y0:y1, x0:x1], _single_put_text(label, layout.style)), \
            f'label {label.text!r} is not one putText on its box'
        assert _ink_inside_box(label, layout.style), label.text
    described = [label.detection for label in layout.labels]
    assert len(set(described)) == len(described), 'a detection has two labels'
    assert len(described) + layout.unlabelled == len(layout.drawn)
    if layout.unlabelled:
        assert layout.note is not None
        assert f'{layout.unlabelled} label(s) left out' in layout.note.text


@pytest.mark.parametrize('height,width', SIZES)
@pytest.mark.parametrize('seed', [0, 1, 2])
def test_crowded_labels_are_drawn_once_apart_and_inside_the_image(height, width, seed):
    image = np.full((height, width, 3), 90, np.uint8)
    frame = _crowded_frame(height, width, seed)
    layout = layout_labels(image.shape, frame, 5e-4)
    out, skipped = render_overlay(image, frame, 5e-4)
    assert skipped == layout.skipped == 0
    _check(layout, image, out)
    if height >= 240:
        assert len(layout.labels) >= 6, [label.text for label in layout.labels]


def test_skipped_detections_and_missing_room_share_one_note_outside_every_label():
    height, width = 240, 320
    frame = _crowded_frame(height, width, 3, clusters=6)
    frame.detections.boxes[0, 0] = np.nan
    frame.uncertainty.gp_variance[1] = -1.0
    image = np.zeros((height, width, 3), np.uint8)
    layout = layout_labels(image.shape, frame, 5e-4)
    out, skipped = render_overlay(image, frame, 5e-4)
    assert skipped == layout.skipped == 2 and layout.unlabelled > 0
    assert layout.note is not None and layout.note.text.startswith('2 detection(s) not drawn')
    assert layout.note.rect[3] == height and layout.note.rect[0] == 0
    _check(layout, image, out)
    x0, y0, x1, y1 = layout.note.rect
    assert np.array_equal(out[y0:y1, x0:x1], _single_put_text(layout.note, layout.style))


def test_labels_keep_off_every_box_where_there_is_room():
    # The demo's table: four objects apart. A viewer that frames a box (the demo's help
    # request) must not run into a label either: labels keep a margin off every box.
    height, width = 240, 320
    boxes = np.array([[60, 120, 40, 50], [150, 110, 60, 40], [250, 150, 30, 30],
                      [110, 190, 80, 30]], np.float64)
    frame = _frame(boxes, np.array([1e-5, 6e-4, 2e-5, 3e-5]),
                   np.array([False, True, False, False]), np.array([0, 1, 2, 1]))
    layout = layout_labels((height, width, 3), frame, 5e-4)
    assert len(layout.labels) == 4 and layout.note is None
    margin = layout.style.margin
    for label in layout.labels:
        for cx, cy, w, h in boxes:
            grown = (cx - w / 2 - margin, cy - h / 2 - margin, cx + w / 2 + margin,
                     cy + h / 2 + margin)
            x0, y0, x1, y1 = label.rect
            assert not (x0 < grown[2] and grown[0] < x1 and y0 < grown[3] and grown[1] < y1), \
                (label.text, (cx, cy, w, h))
    assert layout.labels[0].text.startswith('OOD ellipsoid')  # the most uncertain first


def test_labels_show_the_calibrated_score_where_the_model_has_one():
    boxes = np.array([[60, 60, 40, 40], [200, 60, 40, 40], [60, 180, 40, 40],
                      [200, 180, 40, 40]], np.float64)
    frame = _frame(boxes, np.full(4, 1e-4), np.zeros(4, bool), np.array([0, 1, 2, 3]))
    without = layout_labels((240, 320, 3), frame, 5e-4)
    assert all(' q=' not in label.text for label in without.labels)
    # -1 is the message's "no reference"; NaN and values past 1 are no scores either.
    scored = replace(frame, uncertainty=replace(
        frame.uncertainty, calibrated_score=np.array([0.97, -1.0, np.nan, 1.5])))
    texts = {label.detection: label.text for label in
             layout_labels((240, 320, 3), scored, 5e-4).labels}
    assert texts[0].endswith(' q=0.97') and all(' q=' not in texts[i] for i in (1, 2, 3))
    short = replace(frame, uncertainty=replace(frame.uncertainty,
                                               calibrated_score=np.array([0.5])))
    image = np.zeros((240, 320, 3), np.uint8)
    _check(layout_labels(image.shape, short, 5e-4), image, render_overlay(image, short,
                                                                          5e-4)[0])


def test_labels_show_the_track_score_where_the_track_has_one():
    boxes = np.array([[60, 60, 40, 40], [200, 60, 40, 40], [60, 180, 40, 40]], np.float64)
    frame = _frame(boxes, np.full(3, 1e-4), np.zeros(3, bool), np.array([0, 1, 2]))
    frame = replace(frame, uncertainty=replace(frame.uncertainty,
                                               calibrated_score=np.array([0.97, 0.5, 0.1])),
                    track_scores=TrackScores(np.array([0.83, -1.0, np.nan]),
                                             np.array([4, 0, 1]), np.zeros(3, bool)))
    texts = {label.detection: label.text for label in
             layout_labels((240, 320, 3), frame, 5e-4).labels}
    assert texts[0].endswith(' q=0.97 trk=0.83')
    assert texts[1].endswith(' q=0.50') and texts[2].endswith(' q=0.10')
    image = np.zeros((240, 320, 3), np.uint8)
    _check(layout_labels(image.shape, frame, 5e-4), image, render_overlay(image, frame,
                                                                          5e-4)[0])


def test_the_font_is_sized_for_the_image():
    heights = []
    for height, width in SIZES[1:]:
        style = label_style(height, width)
        (_, text_height), _ = cv2.getTextSize('Mg', FONT, style.scale, style.thickness)
        heights.append(text_height)
        assert 0.025 <= text_height / min(height, width) <= 0.05, (height, width, text_height)
    assert heights == sorted(heights) and heights[-1] >= 3 * heights[0]
    # The smallest images keep a readable minimum.
    (_, tiny), _ = cv2.getTextSize('Mg', FONT, label_style(60, 80).scale, 1)
    assert tiny >= 7


def test_at_most_max_labels_are_placed_and_the_rest_are_counted():
    height, width = 1080, 1920
    rng = np.random.default_rng(5)
    k = MAX_LABELS + 40
    centres = rng.uniform(0, 1, (k, 2)) * (width, height)
    frame = _frame(np.column_stack([centres, np.full((k, 2), 30.0)]), rng.uniform(0, 1e-3, k),
                   np.zeros(k, bool), rng.integers(0, len(CLASSES), k))
    image = np.zeros((height, width, 3), np.uint8)
    layout = layout_labels(image.shape, frame, 5e-4)
    assert len(layout.labels) <= MAX_LABELS and layout.unlabelled >= 40
    _check(layout, image, render_overlay(image, frame, 5e-4)[0])
