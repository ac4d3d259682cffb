"""Greedy IoU tracker (box IoU itself is tested with the detection metrics)."""

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


@pytest.mark.parametrize('kwargs', [dict(iou_threshold=0.0), dict(max_missed=-1)])
def test_invalid_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        IoUTracker(**kwargs)


@pytest.mark.parametrize('box', [[10, 10, np.nan, 5], [10, 10, -1, 5]])
def test_invalid_boxes_are_rejected(box):
    tracker = IoUTracker()
    tracker.update(np.array([[10, 10, 10, 10]], float))
    with pytest.raises(ValueError, match='finite with non-negative'):
        tracker.update(np.array([box], float))
