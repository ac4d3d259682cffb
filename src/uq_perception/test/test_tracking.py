"""Greedy IoU tracker and box IoU."""

import numpy as np
import pytest

from uq_perception.tracking import IoUTracker, box_iou


def test_box_iou_hand_computed():
    a = np.array([[5.0, 5.0, 10.0, 10.0]])
    b = np.array([[10.0, 5.0, 10.0, 10.0], [50.0, 50.0, 2.0, 2.0], [5.0, 5.0, 10.0, 10.0]])
    np.testing.assert_allclose(box_iou(a, b), [[50 / 150, 0.0, 1.0]])


def test_zero_area_boxes_have_zero_iou():
    assert box_iou(np.zeros((1, 4)), np.zeros((1, 4)))[0, 0] == 0.0


def test_ids_persist_while_objects_move_slowly_and_new_objects_get_new_ids():
    tracker = IoUTracker(iou_threshold=0.3, max_missed=2)
    first = tracker.update(np.array([[10, 10, 10, 10], [50, 50, 10, 10]], float))
    second = tracker.update(np.array([[52, 50, 10, 10], [11, 10, 10, 10], [90, 90, 8, 8]],
                                     float))
    assert list(second[:2]) == [first[1], first[0]]
    assert second[2] not in first


def test_track_survives_max_missed_frames_then_is_forgotten():
    tracker = IoUTracker(iou_threshold=0.3, max_missed=1)
    [tid] = tracker.update(np.array([[10, 10, 10, 10]], float))
    tracker.update(np.zeros((0, 4)))
    assert tracker.update(np.array([[10, 10, 10, 10]], float))[0] == tid
    tracker.update(np.zeros((0, 4)))
    tracker.update(np.zeros((0, 4)))
    assert tracker.update(np.array([[10, 10, 10, 10]], float))[0] != tid


@pytest.mark.parametrize('kwargs', [dict(iou_threshold=0.0), dict(max_missed=-1)])
def test_invalid_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        IoUTracker(**kwargs)
