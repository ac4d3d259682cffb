"""Detection metrics against hand-computed cases: IoU, greedy matching, 101-point AP."""

from __future__ import annotations

import numpy as np
import pytest

from uq_perception.training.detection_metrics import average_precision, box_iou, match_detections


def test_box_iou_hand_cases():
    a = np.array([[1.0, 1.0, 2.0, 2.0]])  # [0, 2] x [0, 2]
    b = np.array([[2.0, 1.0, 2.0, 2.0],  # [1, 3] x [0, 2]: overlap 2, union 6
                  [1.0, 1.0, 2.0, 2.0],  # identical
                  [10.0, 10.0, 2.0, 2.0],  # disjoint
                  [1.0, 1.0, 1.0, 1.0]])  # inside: 1 / 4
    np.testing.assert_allclose(box_iou(a, b), [[1 / 3, 1.0, 0.0, 0.25]])
    assert box_iou(np.zeros((0, 4)), b).shape == (0, 4)
    assert box_iou(a, []).shape == (1, 0)
    assert box_iou([[0, 0, 0, 0]], [[0, 0, 0, 0]])[0, 0] == 0.0


@pytest.mark.parametrize('boxes,message', [
    (np.ones((2, 3)), r'must have shape \(N, 4\)'),
    ([[0, 0, -1, 1]], 'negative width or height'),
    ([[np.nan, 0, 1, 1]], 'non-finite'),
])
def test_box_iou_rejects_bad_boxes(boxes, message):
    with pytest.raises(ValueError, match=message):
        box_iou(boxes, [[0, 0, 1, 1]])


def test_match_is_greedy_by_score_not_by_iou():
    gt = np.array([[10.0, 10.0, 10.0, 10.0]])
    det = np.array([[11.0, 10.0, 10.0, 10.0],  # IoU 9/11 ~ 0.82, high score
                    [10.0, 10.0, 10.0, 10.0]])  # IoU 1.0, lower score
    matched, ignored = match_detections(det, np.array([0.9, 0.8]), gt)
    np.testing.assert_array_equal(matched, [0, -1])
    np.testing.assert_array_equal(ignored, [False, False])


def test_match_takes_the_best_free_box_and_respects_threshold():
    gt = np.array([[10.0, 10.0, 10.0, 10.0], [14.0, 10.0, 10.0, 10.0]])
    det = np.array([[13.0, 10.0, 10.0, 10.0],  # IoUs 0.54 and 0.82: takes gt 1
                    [10.0, 10.0, 10.0, 10.0],  # IoUs 1.0 and 0.43: takes gt 0
                    [30.0, 30.0, 5.0, 5.0]])  # nothing
    matched, _ = match_detections(det, np.array([0.9, 0.8, 0.7]), gt)
    np.testing.assert_array_equal(matched, [1, 0, -1])
    matched, _ = match_detections(det, np.array([0.9, 0.8, 0.7]), gt, iou_threshold=0.9)
    np.testing.assert_array_equal(matched, [-1, 0, -1])


def test_match_prefers_regular_ground_truth_over_ignored():
    gt = np.array([[10.0, 10.0, 10.0, 10.0], [12.0, 10.0, 10.0, 10.0]])
    ignore = np.array([True, False])
    det = np.array([[10.5, 10.0, 10.0, 10.0],  # IoU 0.90 with ignored, 0.74 with regular
                    [9.0, 10.0, 10.0, 10.0]])  # then only the ignored one is free
    matched, ignored = match_detections(det, np.array([0.9, 0.5]), gt, gt_ignore=ignore)
    np.testing.assert_array_equal(matched, [1, 0])
    np.testing.assert_array_equal(ignored, [False, True])


def test_match_rejects_inconsistent_inputs():
    with pytest.raises(ValueError, match='2 detection boxes but 3 scores'):
        match_detections(np.ones((2, 4)), np.ones(3), np.ones((1, 4)))
    with pytest.raises(ValueError, match=r'labels must have shape \(2,\)'):
        match_detections(np.ones((1, 4)), np.ones(1), np.ones((2, 4)), gt_ignore=[True])


def test_average_precision_hand_computed():
    # Ranked TP, FP, TP with 2 objects: precision envelope 1 up to recall 0.5 (51 of the
    # 101 levels), then 2/3 up to recall 1 (50 levels).
    ap = average_precision(np.array([0.9, 0.8, 0.7]), np.array([True, False, True]), 2)
    assert ap == pytest.approx((51 * 1.0 + 50 * 2 / 3) / 101)
    # Order comes from the scores, not from the array order.
    shuffled = average_precision(np.array([0.7, 0.9, 0.8]), np.array([True, True, False]), 2)
    assert shuffled == pytest.approx(ap)


def test_average_precision_edge_cases():
    assert average_precision(np.array([0.5, 0.4]), np.array([True, True]), 2) == 1.0
    # One of four objects found: recall levels 0..0.25 (26 levels) at precision 1.
    assert average_precision(np.array([0.5]), np.array([True]), 4) == pytest.approx(26 / 101)
    assert average_precision(np.array([]), np.array([], dtype=bool), 3) == 0.0
    assert np.isnan(average_precision(np.array([0.3]), np.array([False]), 0))


@pytest.mark.parametrize('args,message', [
    ((np.array([0.5, 0.4]), np.array([True, True]), 1), 'true positives exceed 1 objects'),
    ((np.array([0.5]), np.array([True, False]), 2), r'must have shape \(1,\)'),
    ((np.array([np.inf]), np.array([True]), 1), 'non-finite'),
    ((np.array([0.5]), np.array([True]), -1), 'num_ground_truth must be >= 0'),
])
def test_average_precision_rejects_bad_inputs(args, message):
    with pytest.raises(ValueError, match=message):
        average_precision(*args)
