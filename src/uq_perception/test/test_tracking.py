"""Greedy IoU tracker."""

import numpy as np
import pytest

from uq_perception.tracking import IoUTracker


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


@pytest.mark.parametrize('kwargs,message', [
    (dict(iou_threshold=0.0), r'iou_threshold must be in \(0, 1\]'),
    (dict(max_missed=-1), 'max_missed must be >= 0'),
])
def test_invalid_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        IoUTracker(**kwargs)


@pytest.mark.parametrize('box', [[10, 10, np.nan, 5], [10, 10, -1, 5]])
def test_invalid_boxes_are_rejected(box):
    tracker = IoUTracker()
    tracker.update(np.array([[10, 10, 10, 10]], float))
    with pytest.raises(ValueError, match='finite with non-negative'):
        tracker.update(np.array([box], float))


def test_iou_threshold_is_inclusive_and_matching_is_greedy_by_iou():
    # A 10 x 10 box shifted by 5 along x overlaps its old place with IoU 50 / 150 = 1/3.
    tracker = IoUTracker(iou_threshold=1 / 3, max_missed=0)
    [tid] = tracker.update(np.array([[10.0, 10.0, 10.0, 10.0]]))
    assert tracker.update(np.array([[15.0, 10.0, 10.0, 10.0]]))[0] == tid
    assert tracker.update(np.array([[20.01, 10.0, 10.0, 10.0]]))[0] != tid
    # Two candidates for one track: the higher IoU wins it, whatever their order.
    tracker = IoUTracker(iou_threshold=0.3)
    [tid] = tracker.update(np.array([[50.0, 50.0, 10.0, 10.0]]))
    ids = tracker.update(np.array([[53.0, 50.0, 10.0, 10.0], [51.0, 50.0, 10.0, 10.0]]))
    assert ids[1] == tid and ids[0] != tid
