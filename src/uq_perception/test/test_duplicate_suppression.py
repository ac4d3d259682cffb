"""Class-agnostic duplicate suppression on hand-built boxes (ROS-free).

The real-scene cases (the shipped detector on rendered scenes) are in
test/test_duplicate_suppression_sim.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from uq_perception.duplicate_suppression import DuplicateSuppression

# The shipped detector's boxes on the novel_pair scenario (x, y, w, h in pixels, score):
# the mug and a weak second peak on its handle, 83 % of which lies inside the mug's box.
MUG = (223.0, 78.0, 54.0, 59.0, 0.76)
HANDLE = (257.0, 102.0, 24.0, 31.0, 0.31)


def boxes_and_scores(*rows: tuple[float, float, float, float, float]
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Centre-size boxes and scores from top-left ``(x, y, w, h, score)`` rows."""
    table = np.array(rows, dtype=np.float64).reshape(-1, 5)
    centre = table[:, :2] + table[:, 2:4] / 2
    return np.concatenate([centre, table[:, 2:4]], axis=1).astype(np.float32), \
        table[:, 4].astype(np.float32)


def kept(*rows: tuple[float, float, float, float, float],
         rule: DuplicateSuppression | None = None) -> list[bool]:
    boxes, scores = boxes_and_scores(*rows)
    return (rule or DuplicateSuppression()).keep(boxes, scores).tolist()


def test_a_weak_box_on_the_mug_handle_is_suppressed():
    assert kept(MUG, HANDLE) == [True, False]


def test_class_and_order_do_not_matter():
    # The rule sees boxes and scores only; the weaker box is dropped wherever it is listed.
    assert kept(HANDLE, MUG) == [False, True]


@pytest.mark.parametrize('weak_score', [0.2, 0.45, 0.76])
def test_touching_objects_side_by_side_are_kept(weak_score):
    # Two objects whose boxes share an edge, or overlap by a few pixels as adjacent objects'
    # boxes do: whatever their scores, neither is inside the other.
    left = (100.0, 100.0, 50.0, 50.0, 0.8)
    assert kept(left, (150.0, 100.0, 40.0, 50.0, weak_score)) == [True, True]
    assert kept(left, (146.0, 104.0, 42.0, 42.0, weak_score)) == [True, True]


def test_a_confident_small_object_in_front_of_a_large_one_is_kept():
    # Entirely inside the large box, but the detector is about as sure of it as of the
    # large object: another object, not a part.
    large = (100.0, 80.0, 120.0, 100.0, 0.8)
    assert kept(large, (140.0, 120.0, 30.0, 30.0, 0.7)) == [True, True]
    assert kept(large, (140.0, 120.0, 30.0, 30.0, 0.3)) == [True, False]


def test_the_part_rule_needs_both_containment_and_a_weak_score():
    rule = DuplicateSuppression(containment=0.7, score_ratio=0.5)
    strong = (0.0, 0.0, 100.0, 100.0, 1.0)
    # 70 % inside (x from 79 to 109 of 0..100), score ratio exactly 0.5: both at the
    # threshold, suppressed; one pixel further out or a slightly higher score, kept.
    assert kept(strong, (79.0, 10.0, 30.0, 10.0, 0.5), rule=rule) == [True, False]
    assert kept(strong, (80.0, 10.0, 30.0, 10.0, 0.5), rule=rule) == [True, True]
    assert kept(strong, (79.0, 10.0, 30.0, 10.0, 0.51), rule=rule) == [True, True]


def test_a_score_ratio_of_zero_turns_the_part_rule_off():
    assert kept(MUG, HANDLE, rule=DuplicateSuppression(score_ratio=0.0)) == [True, True]


def test_near_identical_boxes_are_one_object_whatever_their_scores():
    a = (100.0, 100.0, 50.0, 50.0, 0.8)
    same = (102.0, 101.0, 50.0, 51.0, 0.79)
    assert kept(a, same) == [True, False]
    # A box around the first one (the first inside it, not the reverse) is still the same
    # object when their IoU is high enough.
    around = (96.0, 96.0, 58.0, 58.0, 0.79)
    assert kept(a, around) == [True, False]
    assert kept(a, around, rule=DuplicateSuppression(same_object_iou=0.9)) == [True, True]


def test_a_suppressed_box_suppresses_nothing():
    # B is a part of A and C a part of B but not of A: C stays, as it would without B.
    a = (0.0, 0.0, 100.0, 100.0, 0.9)
    b = (70.0, 0.0, 40.0, 40.0, 0.4)
    c = (100.0, 0.0, 10.0, 18.0, 0.2)
    assert kept(a, b, c) == [True, False, True]


def test_equal_scores_keep_the_first_and_never_apply_the_part_rule():
    a = (0.0, 0.0, 50.0, 50.0, 0.5)
    assert kept(a, a) == [True, False]
    assert kept(a, (10.0, 10.0, 20.0, 20.0, 0.5)) == [True, True]


def test_unusable_boxes_neither_suppress_nor_are_suppressed():
    boxes, scores = boxes_and_scores(MUG, HANDLE, HANDLE, MUG)
    boxes[0, 0] = np.nan       # the mug's box is unusable: the handle survives it
    scores[2] = np.inf         # an unusable score: kept, and suppresses nothing
    boxes[3, 2] = 0.0          # an empty box: kept
    assert DuplicateSuppression().keep(boxes, scores).tolist() == [True, True, True, True]


def test_no_or_one_detection():
    rule = DuplicateSuppression()
    assert rule.keep(np.zeros((0, 4), np.float32), np.zeros(0, np.float32)).shape == (0,)
    assert rule.keep(np.array([[10, 10, 5, 5]], np.float32), np.array([0.5])).tolist() == [True]


@pytest.mark.parametrize('boxes, scores', [
    (np.zeros((2, 3)), np.zeros(2)),
    (np.zeros(4), np.zeros(1)),
    (np.zeros((2, 4)), np.zeros(3)),
    (np.zeros((2, 4)), np.zeros((2, 1))),
])
def test_mismatched_shapes_are_refused(boxes, scores):
    with pytest.raises(ValueError, match='shape'):
        DuplicateSuppression().keep(boxes, scores)


@pytest.mark.parametrize('name, value', [
    ('same_object_iou', 0.0), ('same_object_iou', 1.01), ('same_object_iou', math.nan),
    ('containment', 0.0), ('containment', -0.5), ('containment', math.inf),
    ('score_ratio', 1.0), ('score_ratio', -0.01), ('score_ratio', math.nan),
    ('score_ratio', True), ('containment', '0.7'), ('same_object_iou', None),
])
def test_invalid_thresholds_are_refused(name, value):
    with pytest.raises(ValueError, match=name):
        DuplicateSuppression(**{name: value})


@pytest.mark.parametrize('name, value', [
    ('same_object_iou', 1.0), ('containment', 1.0), ('score_ratio', 0.0), ('score_ratio', 0.99),
    ('containment', 1),
])
def test_thresholds_at_their_bounds_are_accepted(name, value):
    assert getattr(DuplicateSuppression(**{name: value}), name) == value


def test_random_frames_keep_the_strongest_and_leave_no_kept_duplicate_pair():
    # By rule, over random frames: the strongest box is always kept, and no two kept boxes
    # satisfy either rule against each other.
    rng = np.random.default_rng(0)
    rule = DuplicateSuppression()
    for _ in range(200):
        count = int(rng.integers(2, 12))
        centre = rng.uniform(0, 200, size=(count, 2))
        size = rng.uniform(5, 80, size=(count, 2))
        boxes = np.concatenate([centre, size], axis=1)
        scores = rng.uniform(0.3, 1.0, size=count)
        keep = rule.keep(boxes, scores)
        assert keep[int(np.argmax(scores))]
        low, high = boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2
        for i in np.flatnonzero(keep):
            for j in np.flatnonzero(keep):
                if i == j or scores[i] < scores[j]:
                    continue
                extent = np.clip(np.minimum(high[i], high[j]) - np.maximum(low[i], low[j]), 0,
                                 None)
                inter = extent[0] * extent[1]
                area_i, area_j = np.prod(boxes[i, 2:]), np.prod(boxes[j, 2:])
                assert inter / (area_i + area_j - inter) < rule.same_object_iou
                assert not (inter / area_j >= rule.containment
                            and scores[j] <= rule.score_ratio * scores[i])
