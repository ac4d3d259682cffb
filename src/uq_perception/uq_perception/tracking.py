"""Greedy IoU tracking of detections across frames (ROS-free).

Track identities let the arbitration and ask-for-help logic follow one object over time.
Matching is greedy by IoU (highest first), which is adequate at camera rate where objects
move little between frames; unmatched detections start new tracks and tracks unseen for
``max_missed`` frames are dropped.
"""

from __future__ import annotations

import numpy as np

from uq_perception.detection_metrics import box_iou


class IoUTracker:
    """Assigns persistent integer track ids to boxes, frame by frame.

    Parameters
    ----------
    iou_threshold : float
        Minimum IoU between a track's last box and a detection to continue the track.
    max_missed : int
        Frames a track survives without a matching detection.
    """

    def __init__(self, iou_threshold: float = 0.3, max_missed: int = 5) -> None:
        if not 0.0 < iou_threshold <= 1.0:
            raise ValueError(f'iou_threshold must be in (0, 1], got {iou_threshold}')
        if max_missed < 0:
            raise ValueError(f'max_missed must be >= 0, got {max_missed}')
        self.iou_threshold = iou_threshold
        self.max_missed = max_missed
        self._boxes = np.zeros((0, 4))
        self._ids = np.zeros(0, dtype=np.int64)
        self._missed = np.zeros(0, dtype=np.int64)
        self._next_id = 0

    def reset(self) -> None:
        """Forget every track (ids keep increasing so they are never reused)."""
        self._boxes, self._ids = np.zeros((0, 4)), np.zeros(0, dtype=np.int64)
        self._missed = np.zeros(0, dtype=np.int64)

    def update(self, boxes: np.ndarray) -> np.ndarray:
        """Match this frame's ``(K, 4)`` boxes to tracks; returns ``(K,)`` track ids."""
        boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        ids = np.full(len(boxes), -1, dtype=np.int64)
        matched_tracks: set[int] = set()
        if len(boxes) and len(self._ids):
            iou = box_iou(self._boxes, boxes)
            for flat in np.argsort(-iou, axis=None):
                t, d = np.unravel_index(flat, iou.shape)
                if iou[t, d] < self.iou_threshold:
                    break
                if t in matched_tracks or ids[d] >= 0:
                    continue
                ids[d] = self._ids[t]
                matched_tracks.add(int(t))
        new = ids < 0
        ids[new] = np.arange(self._next_id, self._next_id + int(new.sum()))
        self._next_id += int(new.sum())
        keep = [t for t in range(len(self._ids))
                if t not in matched_tracks and self._missed[t] < self.max_missed]
        self._boxes = np.concatenate([boxes, self._boxes[keep]])
        self._ids = np.concatenate([ids, self._ids[keep]])
        self._missed = np.concatenate([np.zeros(len(boxes), dtype=np.int64),
                                       self._missed[keep] + 1])
        return ids
